//! Queues: enqueue, consumers (started on demand, retired when idle), delivery to the
//! queue's trigger function, settling (ack, retry with backoff, dead letter).

use super::*;

impl Engine {
    /// Put an invocation on a queue; answers with the message id at once.
    pub async fn enqueue(
        &self,
        queue: &str,
        function_id: Option<&str>,
        data: Value,
        parent: &TraceContext,
        group: Option<&str>,
        deduplication_id: Option<String>,
    ) -> Result<String, ErrorBody> {
        crate::queue::validate_queue_name(queue).map_err(ErrorBody::from)?;
        let cfg = match self.queues.config(queue).await {
            Some(c) => c,
            None => {
                let c = QueueConfig::standard(queue);
                self.queues.declare(&c).await.map_err(ErrorBody::from)?;
                c
            }
        };
        let msg = QueueMessage {
            id: uuid::Uuid::new_v4().to_string(),
            queue: queue.to_string(),
            group: cfg.group_of(group, &data),
            function_id: function_id.map(str::to_owned),
            data,
            traceparent: parent.traceparent(),
            baggage: parent.baggage_header(),
            deduplication_id,
            attempts: 0,
            enqueued_at_ms: now_ms(),
            last_error: None,
        };
        let id = self
            .queues
            .send(msg)
            .await
            .map_err(|e| ErrorBody::new(codes::ENQUEUE_ERROR, e.to_string()))?;
        self.ensure_consumer(queue);
        Ok(id)
    }

    /// Declare (or re-declare) a queue and make sure it is being consumed. A running consumer
    /// is never aborted (on SQS that could strand a message it had just received, invisible
    /// for the whole visibility timeout); it picks the new settings up on its next round.
    pub async fn declare_queue(&self, cfg: QueueConfig) -> Result<(), ErrorBody> {
        self.queues.declare(&cfg).await.map_err(ErrorBody::from)?;
        self.ensure_consumer(&cfg.name);
        Ok(())
    }

    pub(super) fn ensure_consumer(&self, queue: &str) {
        let mut consumers = lock(&self.consumers);
        if consumers.get(queue).is_some_and(|(_, h)| !h.is_finished()) {
            return;
        }
        let weak = self.me.clone();
        let name = queue.to_string();
        let generation = self.call_seq.fetch_add(1, Ordering::Relaxed);
        consumers.insert(
            queue.to_string(),
            (
                generation,
                tokio::spawn(run_queue_consumer(weak, name, generation)),
            ),
        );
    }

    /// Number of (stream, group) pairs with a subscriber.
    pub fn subscription_count(&self) -> usize {
        read(&self.stream_subs).len()
    }

    /// Number of queue consumers running.
    pub fn consumer_count(&self) -> usize {
        lock(&self.consumers)
            .values()
            .filter(|(_, h)| !h.is_finished())
            .count()
    }

    /// An idle consumer's way out: nothing consumes its queue by trigger, and the queue holds
    /// nothing. It leaves the map first and looks once more, so a message sent meanwhile
    /// either sees no consumer (and starts one) or is seen here (and starts one).
    pub(super) async fn retire_consumer(&self, queue: &str, generation: u64) -> bool {
        let empty = |s: &crate::queue::QueueStats| s.pending + s.in_flight == 0;
        if !self.queues.exact_stats()
            || self.queue_trigger_function(queue).is_some()
            || !self.queues.stats(queue).await.is_ok_and(|s| empty(&s))
        {
            return false;
        }
        {
            let mut consumers = lock(&self.consumers);
            if consumers.get(queue).is_some_and(|(g, _)| *g == generation) {
                consumers.remove(queue);
            }
        }
        if !self.queues.stats(queue).await.is_ok_and(|s| empty(&s)) {
            self.ensure_consumer(queue);
        }
        true
    }

    pub(super) fn queue_lambda(&self, queue: &str) -> Option<Arc<dyn LambdaTarget>> {
        read(&self.triggers)
            .values()
            .find(|t| {
                matches!(&t.kind, TriggerKind::Queue { queue: q } if q == queue)
                    && t.lambda.is_some()
            })
            .and_then(|t| t.lambda.clone())
    }

    pub(super) fn queue_trigger_function(&self, queue: &str) -> Option<String> {
        read(&self.triggers)
            .values()
            .find(|t| matches!(&t.kind, TriggerKind::Queue { queue: q } if q == queue))
            .map(|t| t.reg.function_id.clone())
    }

    /// Returns whether the message succeeded (FIFO batches stop a group at its first failure).
    pub(super) async fn deliver(&self, cfg: &QueueConfig, d: Delivery) -> bool {
        let function_id = d
            .message
            .function_id
            .clone()
            .or_else(|| self.queue_trigger_function(&cfg.name));
        let Some(function_id) = function_id.filter(|f| self.has_function(f)) else {
            // Nobody consumes it yet (e.g. workers still reconnecting): not an attempt.
            let _ = self.queues.release(&d, Duration::from_millis(500)).await;
            return false;
        };
        let parent = TraceContext::from_headers(
            d.message.traceparent.as_deref(),
            d.message.baggage.as_deref(),
        );
        // Keep the message hidden while a long handler runs (SQS visibility).
        let visibility = Duration::from_millis(cfg.visibility_timeout_ms.max(1000));
        let heartbeat = self.queues.needs_heartbeat().then(|| {
            let (queues, d) = (self.queues.clone(), d.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(visibility / 2).await;
                    if let Err(e) = queues.extend(&d, visibility).await {
                        tracing::warn!(error = %e, "visibility extension failed");
                    }
                }
            })
        });
        // The handler learns which attempt this is and whether it is the last, so a step can
        // end its run cleanly before its message is dead-lettered.
        // (Not the durable topic's copies: those are the publisher's event, handed on as is.)
        let mut data = d.message.data.clone();
        if let Some(obj) = data.as_object_mut().filter(|_| cfg.name != DURABLE_QUEUE) {
            obj.insert(
                crate::queue::DELIVERY_FIELD.into(),
                serde_json::json!({"attempt": d.attempt, "last": d.attempt > cfg.max_retries}),
            );
        }
        let result = self
            .invoke(
                &function_id,
                data,
                &parent,
                None,
                Some(Duration::from_millis(cfg.visibility_timeout_ms)),
            )
            .await;
        if let Some(h) = heartbeat {
            h.abort();
        }
        let ok = result.is_ok();
        match result {
            Ok(_) => self.settle(cfg, &d, Settle::Ack).await,
            // The step's own function went away meanwhile: not an attempt. (A handler that
            // answers function_not_found about a function *it* called did fail, and counts.)
            Err(e) if e.code == codes::FUNCTION_NOT_FOUND && !self.has_function(&function_id) => {
                let _ = self.queues.release(&d, Duration::from_millis(500)).await;
            }
            Err(e) => {
                let dead = d.attempt > cfg.max_retries;
                if dead {
                    tracing::warn!(queue = %cfg.name, message_id = %d.message.id, attempts = d.attempt, error = %e, "dead-lettered");
                }
                self.settle(cfg, &d, Settle::Fail(e.to_string(), dead))
                    .await
            }
        }
        ok
    }

    /// Record a delivery's outcome, retrying through a backend outage for up to half the
    /// visibility timeout: a handled message whose ack is lost would be delivered again.
    pub(super) async fn settle(&self, cfg: &QueueConfig, d: &Delivery, what: Settle) {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(cfg.visibility_timeout_ms / 2).max(Duration::from_secs(2));
        let mut pause = Duration::from_millis(100);
        loop {
            let r = match &what {
                Settle::Ack => self.queues.ack(d).await,
                Settle::Fail(why, dead) => {
                    self.queues
                        .fail(d, why, cfg.backoff(d.attempt), *dead)
                        .await
                }
            };
            match r {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::warn!(queue = %cfg.name, error = %e, "queue bookkeeping failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(queue = %cfg.name, message_id = %d.message.id, error = %e, "queue bookkeeping failed; the message will be delivered again");
                    return;
                }
            }
        }
    }

    pub async fn publish_durable(
        &self,
        topic: &str,
        data: Value,
        parent: &TraceContext,
    ) -> Result<usize, ErrorBody> {
        let subscribers: Vec<String> = read(&self.triggers)
            .values()
            .filter(|t| matches!(&t.kind, TriggerKind::Durable { topic: tp } if tp == topic))
            .map(|t| t.reg.function_id.clone())
            .collect();
        for f in &subscribers {
            self.enqueue(DURABLE_QUEUE, Some(f), data.clone(), parent, None, None)
                .await?;
        }
        Ok(subscribers.len())
    }

    // ---------------------------------------------------------------- triggers
}

/// A consumer whose queue stayed empty this long, with no trigger on it, stops (the next
/// message sent to the queue starts one again).
pub(super) const IDLE_CONSUMER: Duration = Duration::from_secs(300);

pub(super) async fn run_queue_consumer(engine: Weak<Engine>, queue: String, generation: u64) {
    let cfg = match engine.upgrade() {
        Some(e) => {
            if !e.wait_ready().await {
                return;
            }
            e.queues.config(&queue).await
        }
        None => return,
    };
    let mut cfg = cfg.unwrap_or_else(|| QueueConfig::standard(&queue));
    let permits = Arc::new(Semaphore::new(cfg.concurrency));
    let idle_after = engine
        .upgrade()
        .map_or(IDLE_CONSUMER, |e| e.config.idle_consumer);
    let mut idle_since = tokio::time::Instant::now();
    loop {
        // Settings may be re-declared while we run (concurrency is fixed at start).
        if let Some(e) = engine.upgrade()
            && let Some(fresh) = e.queues.config(&queue).await
        {
            cfg = fresh;
        }
        let Ok(first) = permits.clone().acquire_owned().await else {
            return;
        };
        let room = permits.available_permits() + 1;
        let Some(e) = engine.upgrade() else { return };
        let backend = e.queues.clone();
        drop(e);
        let lambda = engine.upgrade().and_then(|e| e.queue_lambda(&queue));
        let room = if lambda.is_some() { 10 } else { room };
        let batch = match backend.receive(&queue, room, Duration::from_secs(1)).await {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(queue = %queue, error = %err, "queue receive failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if !batch.is_empty() {
            idle_since = tokio::time::Instant::now();
        } else if idle_since.elapsed() >= idle_after {
            let Some(e) = engine.upgrade() else { return };
            if e.retire_consumer(&queue, generation).await {
                tracing::debug!(queue = %queue, "idle queue consumer stopped");
                return;
            }
            idle_since = tokio::time::Instant::now();
        }
        if let Some(f) = lambda {
            if batch.is_empty() {
                continue;
            }
            let Some(e) = engine.upgrade() else { return };
            let cfg = cfg.clone();
            tokio::spawn(async move {
                e.deliver_lambda_batch(&cfg, &*f, batch).await;
                drop(first);
            });
            continue;
        }
        // A FIFO backend may hand out several messages of one group in a batch (SQS does):
        // run each group's messages in order, one at a time, and hand back the rest of a
        // group after its first failure so nothing overtakes it.
        let mut lanes: Vec<(Option<String>, Vec<Delivery>)> = Vec::new();
        for d in batch {
            let group = d.message.group.clone();
            match lanes
                .iter_mut()
                .find(|(g, _)| group.is_some() && *g == group)
            {
                Some((_, lane)) => lane.push(d),
                None => lanes.push((group, vec![d])),
            }
        }
        let mut first = Some(first);
        for (_, lane) in lanes {
            let permit = match first.take() {
                Some(p) => p,
                None => match permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let Some(e) = engine.upgrade() else { return };
            let cfg = cfg.clone();
            tokio::spawn(async move {
                let mut lane = lane.into_iter();
                for d in lane.by_ref() {
                    if !e.deliver(&cfg, d).await {
                        break;
                    }
                }
                for rest in lane {
                    let _ = e.queues.release(&rest, Duration::ZERO).await;
                }
                drop(permit);
            });
        }
    }
}
