//! Triggers: registration, the state-change dispatcher (change feed → state triggers, acked
//! in batches) and the retry loop handlers get.

use super::*;

impl Engine {
    /// A trigger from a worker: its function's namespace must be granted to the worker, and
    /// so must that of the trigger it replaces under the same id.
    pub fn register_trigger(&self, owner: &str, reg: RegisterTrigger) -> Result<(), ErrorBody> {
        let principal = self.principal_of(owner)?;
        principal.may_register("trigger", &reg.function_id)?;
        let replaced = read(&self.triggers)
            .get(&reg.id)
            .filter(|t| t.owner != owner)
            .map(|t| t.reg.function_id.clone());
        if let Some(function_id) = replaced {
            principal
                .may_register("trigger", &function_id)
                .map_err(|e| {
                    ErrorBody::new(
                        e.code,
                        format!(
                            "trigger `{}` belongs to another worker: {}",
                            reg.id, e.message
                        ),
                    )
                })?;
        }
        self.register_trigger_for(owner, reg, None)
    }

    pub(super) fn register_trigger_for(
        &self,
        owner: &str,
        reg: RegisterTrigger,
        lambda: Option<Arc<dyn LambdaTarget>>,
    ) -> Result<(), ErrorBody> {
        if reg.id.is_empty() {
            return Err(ErrorBody::invalid("trigger `id` must not be empty"));
        }
        Self::validate_function_id(&reg.function_id)?;
        let cfg = &reg.config;
        let opt = |field: &str| -> Result<Option<String>, ErrorBody> {
            match cfg.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(ErrorBody::invalid(format!(
                    "trigger config field `{field}` must be a string, got {}",
                    crate::protocol::kind_of(other)
                ))),
            }
        };
        let req = |field: &str| -> Result<String, ErrorBody> {
            opt(field)?.ok_or_else(|| {
                ErrorBody::invalid(format!(
                    "`{}` trigger config is missing field `{field}`",
                    reg.trigger_type
                ))
            })
        };
        let kind = match reg.trigger_type.as_str() {
            "state" => {
                let changed = opt("changed")?;
                if let Some(path) = &changed {
                    crate::state::check_path(path).map_err(|e| {
                        ErrorBody::invalid(format!("`state` trigger config `changed`: {e}"))
                    })?;
                }
                TriggerKind::State {
                    scope: opt("scope")?,
                    key: opt("key")?,
                    condition_function_id: opt("condition_function_id")?,
                    changed,
                }
            }
            "queue" => {
                let queue = opt("queue")?.or(opt("name")?).ok_or_else(|| {
                    ErrorBody::invalid("`queue` trigger config is missing field `queue`")
                })?;
                if cfg.get("type").is_some() || cfg.get("message_group_field").is_some() {
                    let qc = QueueConfig::from_json(cfg).map_err(ErrorBody::from)?;
                    if let Some(engine) = self.arc() {
                        tokio::spawn(async move {
                            if let Err(e) = engine.declare_queue(qc).await {
                                tracing::error!(error = %e, "queue declaration from trigger failed");
                            }
                        });
                    }
                } else {
                    self.ensure_consumer(&queue);
                }
                TriggerKind::Queue { queue }
            }
            "stream" => TriggerKind::Stream {
                stream_name: req("stream_name")?,
                group_id: opt("group_id")?,
                item_id: opt("item_id")?,
            },
            "durable:subscriber" => TriggerKind::Durable {
                topic: req("topic")?,
            },
            other => {
                return Err(ErrorBody::new(
                    codes::TRIGGER_TYPE_NOT_FOUND,
                    format!(
                        "trigger type `{other}` is not known (state, queue, stream, durable:subscriber)"
                    ),
                ));
            }
        };
        write(&self.triggers).insert(
            reg.id.clone(),
            TriggerEntry {
                reg,
                owner: owner.to_string(),
                kind,
                lambda,
            },
        );
        Ok(())
    }

    pub fn unregister_trigger(&self, owner: &str, id: &str) -> bool {
        let mut t = write(&self.triggers);
        if t.get(id).is_some_and(|e| e.owner == owner) {
            t.remove(id);
            true
        } else {
            false
        }
    }

    pub fn list_triggers(&self) -> Value {
        let mut out: Vec<Value> = read(&self.triggers)
            .values()
            .map(|t| {
                json!({
                    "id": t.reg.id,
                    "trigger_type": t.reg.trigger_type,
                    "function_id": t.reg.function_id,
                    "config": t.reg.config,
                    "worker_id": t.owner,
                })
            })
            .collect();
        out.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        json!({ "triggers": out })
    }

    /// True when a write to `scope` can skip its change record: the start-up grace is over
    /// (changes made in it wait for triggers that re-register) and no state trigger, of a
    /// worker or a Lambda mapping, watches the scope. A trigger sees the changes committed
    /// after it registered, as before; the dispatcher would drop the others anyway.
    pub fn scope_unwatched(&self, scope: &str) -> bool {
        if self.started.elapsed() < self.config.trigger_grace {
            return false;
        }
        !read(&self.triggers).values().any(|t| match &t.kind {
            TriggerKind::State { scope: s, .. } => {
                s.as_deref().is_none_or(|s| glob_match(s, scope))
            }
            _ => false,
        })
    }

    pub(super) fn state_triggers_for(&self, rec: &ChangeRecord) -> Vec<(String, Option<String>)> {
        read(&self.triggers)
            .values()
            .filter(|t| t.lambda.is_none())
            .filter_map(|t| match &t.kind {
                TriggerKind::State {
                    scope,
                    key,
                    condition_function_id,
                    changed,
                } => state_trigger_takes(
                    scope.as_deref(),
                    key.as_deref(),
                    changed.as_deref(),
                    (&rec.scope, &rec.key),
                    rec.old_value.as_ref(),
                    rec.new_value.as_ref(),
                )
                .then(|| (t.reg.function_id.clone(), condition_function_id.clone())),
                _ => None,
            })
            .collect()
    }

    /// Fire the state triggers of one committed change. The writer never waits for this;
    /// a failing handler is logged and does not undo the write.
    /// Run every state trigger matching `rec`. Each handler (and its condition) is retried
    /// with backoff until it succeeds or the retry window ends; the returned tasks finish
    /// then, with `false` if the engine closed first (the event must then stay unacked).
    pub(super) fn fire_state_change(&self, rec: ChangeRecord) -> Vec<JoinHandle<bool>> {
        let targets = self.state_triggers_for(&rec);
        if targets.is_empty() {
            return Vec::new();
        }
        let Some(engine) = self.arc() else {
            return Vec::new();
        };
        let event = json!({
            "type": "state",
            "event_type": rec.kind.as_str(),
            "scope": rec.scope,
            "key": rec.key,
            "old_value": rec.old_value,
            "new_value": rec.new_value,
        });
        let parent = TraceContext::from_headers(rec.traceparent.as_deref(), rec.baggage.as_deref());
        let mut handles = Vec::new();
        for (function_id, condition) in targets {
            let engine = engine.clone();
            let event = event.clone();
            let parent = parent.clone();
            let what = format!("state trigger {function_id} ({}/{})", rec.scope, rec.key);
            handles.push(tokio::spawn(async move {
                retry_with_backoff(&engine, &what, || async {
                    if let Some(cond) = &condition {
                        let verdict = engine
                            .invoke(
                                cond,
                                event.clone(),
                                &parent,
                                None,
                                Some(engine.config.condition_timeout),
                            )
                            .await?;
                        let fire = match &verdict {
                            Value::Bool(b) => *b,
                            v => v.get("result").and_then(Value::as_bool).unwrap_or(false),
                        };
                        if !fire {
                            return Ok(());
                        }
                    }
                    engine
                        .invoke(&function_id, event.clone(), &parent, None, None)
                        .await
                        .map(|_| ())
                })
                .await
            }));
        }
        handles
    }

    // ---------------------------------------------------------------- streams
}

/// Acknowledge dispatched changes at most this often (acks are disk writes, or a DynamoDB
/// write per shard on AWS; a crash before the ack only means those triggers fire again,
/// which at-least-once allows). At 200 ms the AWS backend wrote 6 checkpoints per tool call.
pub(super) const ACK_INTERVAL: Duration = Duration::from_secs(1);

/// Change-feed records handed to their triggers, waiting for every handler to settle (only
/// what their acknowledgement needs: the handlers hold their own copies).
pub(super) struct Dispatched {
    records: Vec<ChangeRecord>,
    handlers: Vec<JoinHandle<bool>>,
}

/// Most dispatched batches waiting for their handlers before reading stops (backpressure).
pub(super) const MAX_UNSETTLED_BATCHES: usize = 64;

pub(super) async fn run_state_dispatcher(engine: Weak<Engine>) {
    let grace = match engine.upgrade() {
        Some(e) => {
            if !e.wait_ready().await {
                return;
            }
            e.config.trigger_grace
        }
        None => return,
    };
    tokio::time::sleep(grace).await;
    let mut unsettled: std::collections::VecDeque<Dispatched> = Default::default();
    let mut settled: Vec<ChangeRecord> = Vec::new();
    let mut last_ack = tokio::time::Instant::now();
    loop {
        // Acknowledge in order, and only what every handler settled: a record whose handler
        // is still retrying holds back the acknowledgement of everything after it, so a
        // restart hands it out again.
        while unsettled
            .front()
            .is_some_and(|d| d.handlers.iter().all(JoinHandle::is_finished))
        {
            let Some(d) = unsettled.pop_front() else {
                break;
            };
            for h in d.handlers {
                if !h.await.unwrap_or(false) {
                    // The engine is closing: leave the rest unacknowledged.
                    return;
                }
            }
            settled.extend(d.records);
        }
        let Some(e) = engine.upgrade() else { return };
        let feed = e.changes.clone();
        drop(e);
        if !settled.is_empty() && (last_ack.elapsed() >= ACK_INTERVAL || settled.len() >= 1024) {
            match feed.ack(&settled).await {
                Ok(()) => settled.clear(),
                Err(err) => tracing::error!(error = %err, "change feed ack failed"),
            }
            last_ack = tokio::time::Instant::now();
        }
        if unsettled.len() >= MAX_UNSETTLED_BATCHES {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        // Short waits while handlers run, so their settlement is noticed soon; settled
        // records are acknowledged when their interval is up, not a whole wait later.
        let wait = if !unsettled.is_empty() {
            Duration::from_millis(20)
        } else if !settled.is_empty() {
            ACK_INTERVAL
                .saturating_sub(last_ack.elapsed())
                .max(Duration::from_millis(20))
        } else {
            ACK_INTERVAL
        };
        let batch = match feed.next_batch(256, wait).await {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(error = %err, "change feed read failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if !batch.is_empty() {
            let Some(e) = engine.upgrade() else { return };
            let mut handlers = Vec::new();
            for rec in &batch {
                handlers.extend(e.fire_state_change(rec.clone()));
            }
            handlers.extend(e.fire_lambda_state_batch(&batch));
            unsettled.push_back(Dispatched {
                records: batch.iter().map(ChangeRecord::acknowledgement).collect(),
                handlers,
            });
        }
    }
}

/// Errors a retry cannot fix: the caller may not, or the event itself is malformed.
pub(super) fn retry_cannot_help(e: &ErrorBody) -> bool {
    e.code == codes::FORBIDDEN || e.code == codes::INVALID_MESSAGE
}

/// Run `attempt` until it succeeds, with exponential backoff (200 ms doubling up to 10 s),
/// for at most `trigger_retry_window`. `true`: settled (succeeded, or given up and logged);
/// `false`: the engine closed first.
pub(super) async fn retry_with_backoff<F, Fut>(
    engine: &Arc<Engine>,
    what: &str,
    mut attempt: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), ErrorBody>>,
{
    let deadline = tokio::time::Instant::now() + engine.config.trigger_retry_window;
    let mut delay = Duration::from_millis(200);
    let mut closing = engine.closing();
    for n in 1u32.. {
        if *closing.borrow() {
            return false;
        }
        let err = match attempt().await {
            Ok(()) => return true,
            Err(e) => e,
        };
        if retry_cannot_help(&err) || tokio::time::Instant::now() + delay > deadline {
            tracing::error!(what, attempts = n, error = %err, "handler failed for good; event given up");
            return true;
        }
        tracing::warn!(what, attempt = n, error = %err, retry_in_ms = delay.as_millis() as u64, "handler failed; retrying");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = closing.wait_for(|c| *c) => return false,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    true
}
