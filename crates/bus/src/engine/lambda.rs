//! Lambdas attached to the engine: invocations, queue batches and state-change batches
//! delivered through the local Runtime API host.

use super::*;

impl Engine {
    /// Run a Lambda function under the local Runtime API: ask it what it serves
    /// (`{"describe": true}`), register its functions, and map its triggers the way AWS
    /// event-source mappings would (queues → SQS batches, state → DynamoDB stream batches).
    pub async fn attach_lambda(&self, f: Arc<dyn LambdaTarget>) -> Result<Value, ErrorBody> {
        let desc = f
            .invoke(&crate::lambda::describe_event())
            .await
            .map_err(|e| {
                ErrorBody::new(
                    codes::INVOCATION_ERROR,
                    format!("describe `{}`: {e}", f.name()),
                )
            })?;
        let owner = format!("lambda:{}", f.name());
        write(&self.workers).insert(
            owner.clone(),
            WorkerInfo {
                id: owner.clone(),
                kind: WorkerKind::Lambda,
                outbox: None,
                remote_addr: None,
                connected_at_ms: now_ms(),
                name: desc
                    .get("worker")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                metadata: f.metadata(),
                principal: Principal::admin(),
            },
        );
        let functions: Vec<RegisterFunction> =
            serde_json::from_value(desc.get("functions").cloned().unwrap_or(json!([]))).map_err(
                |e| ErrorBody::invalid(format!("describe `{}`: bad `functions`: {e}", f.name())),
            )?;
        let triggers: Vec<RegisterTrigger> = serde_json::from_value(
            desc.get("triggers").cloned().unwrap_or(json!([])),
        )
        .map_err(|e| ErrorBody::invalid(format!("describe `{}`: bad `triggers`: {e}", f.name())))?;
        for def in functions {
            let func = f.clone();
            let handler: Handler = Arc::new(move |inv: Invocation| {
                let func = func.clone();
                Box::pin(async move {
                    let envelope = json!({
                        "function_id": inv.function_id,
                        "data": inv.data,
                        "traceparent": inv.trace.traceparent(),
                        "baggage": inv.trace.baggage_header(),
                    });
                    let answer = func.invoke(&envelope).await.map_err(lambda_error)?;
                    match answer.get("error") {
                        Some(e) if !e.is_null() => Err(serde_json::from_value(e.clone())
                            .unwrap_or_else(|_| {
                                ErrorBody::new(codes::INVOCATION_ERROR, e.to_string())
                            })),
                        _ => Ok(answer.get("result").cloned().unwrap_or(Value::Null)),
                    }
                })
            });
            self.register_local(&owner, def, handler)?;
        }
        for t in triggers {
            if t.trigger_type == "queue" && t.config.get("type").is_some() {
                // Declared before we return, so nothing is enqueued to an undeclared queue.
                let qc = QueueConfig::from_json(&t.config).map_err(ErrorBody::from)?;
                self.declare_queue(qc).await?;
            }
            let batched = matches!(t.trigger_type.as_str(), "queue" | "state");
            let queue = (t.trigger_type == "queue")
                .then(|| {
                    t.config
                        .get("queue")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .flatten();
            self.register_trigger_for(&owner, t, batched.then(|| f.clone()))?;
            if let Some(q) = queue {
                // The consumer switches to batch delivery on its next round.
                self.ensure_consumer(&q);
            }
        }
        lock(&self.lambdas).push(f);
        Ok(desc)
    }

    /// Deliver one receive batch to a Lambda as an SQS event; honour `batchItemFailures`.
    pub(super) async fn deliver_lambda_batch(
        &self,
        cfg: &QueueConfig,
        f: &dyn LambdaTarget,
        batch: Vec<Delivery>,
    ) {
        let event = crate::events::sqs_event(&batch, &cfg.name);
        let failed: Option<Vec<String>> = match f.invoke(&event).await {
            Ok(resp) => Some(crate::events::batch_item_failures(&resp)),
            Err(e) => {
                tracing::warn!(function = %f.name(), error = %e, "SQS batch invocation failed");
                None
            }
        };
        for d in batch {
            let ok = failed
                .as_ref()
                .is_some_and(|ids| !ids.contains(&d.message.id));
            let outcome = if ok {
                self.queues.ack(&d).await
            } else {
                let dead = d.attempt > cfg.max_retries;
                let why = match &failed {
                    Some(_) => "reported in batchItemFailures".to_string(),
                    None => "the batch invocation failed".to_string(),
                };
                self.queues
                    .fail(&d, &why, cfg.backoff(d.attempt), dead)
                    .await
            };
            if let Err(e) = outcome {
                tracing::error!(queue = %cfg.name, error = %e, "queue bookkeeping failed");
            }
        }
    }

    /// State changes for Lambda-mapped state triggers: one DynamoDB stream event per function
    /// per batch; on a partial failure the batch is retried from the first failed sequence
    /// number (up to 3 times), as the DynamoDB mapping does.
    pub(super) fn fire_lambda_state_batch(&self, batch: &[ChangeRecord]) -> Vec<JoinHandle<bool>> {
        let mut per_function: Vec<(Arc<dyn LambdaTarget>, Vec<ChangeRecord>)> = Vec::new();
        for t in read(&self.triggers).values() {
            let (
                Some(f),
                TriggerKind::State {
                    scope,
                    key,
                    changed,
                    ..
                },
            ) = (&t.lambda, &t.kind)
            else {
                continue;
            };
            let records: Vec<ChangeRecord> = batch
                .iter()
                .filter(|r| {
                    state_trigger_takes(
                        scope.as_deref(),
                        key.as_deref(),
                        changed.as_deref(),
                        (&r.scope, &r.key),
                        r.old_value.as_ref(),
                        r.new_value.as_ref(),
                    )
                })
                .cloned()
                .collect();
            if records.is_empty() {
                continue;
            }
            match per_function.iter_mut().find(|(g, _)| Arc::ptr_eq(g, f)) {
                Some((_, rs)) => {
                    for r in records {
                        if !rs.contains(&r) {
                            rs.push(r);
                        }
                    }
                }
                None => per_function.push((f.clone(), records)),
            }
        }
        let Some(engine) = self.arc() else {
            return Vec::new();
        };
        let mut handles = Vec::new();
        for (f, mut records) in per_function {
            records.sort_by_key(|r| (r.seq, r.position.clone()));
            let engine = engine.clone();
            handles.push(tokio::spawn(async move {
                // The failed record and everything after it go again, as an event-source
                // mapping retries a stream shard from its first failure.
                let pending = Mutex::new(records);
                let what = format!("stream batch to Lambda {}", f.name());
                retry_with_backoff(&engine, &what, || async {
                    let current = lock(&pending).clone();
                    let event = crate::events::dynamodb_event(&current, "state");
                    let failed_from = match f.invoke(&event).await {
                        Ok(resp) => {
                            crate::events::batch_item_failures(&resp)
                                .first()
                                .and_then(|seq| {
                                    current
                                        .iter()
                                        .position(|r| crate::events::sequence_number(r) == *seq)
                                })
                        }
                        Err(e) => return Err(lambda_error(e)),
                    };
                    match failed_from {
                        None => Ok(()),
                        Some(i) => {
                            lock(&pending).drain(..i);
                            Err(ErrorBody::new(
                                codes::INVOCATION_ERROR,
                                "the Lambda reported a batch item failure",
                            ))
                        }
                    }
                })
                .await
            }));
        }
        handles
    }
}

pub(super) fn lambda_error(e: LambdaError) -> ErrorBody {
    match e {
        LambdaError::TimedOut(_) => ErrorBody::new(codes::TIMEOUT, e.to_string()),
        other => ErrorBody::new(codes::INVOCATION_ERROR, other.to_string()),
    }
}
