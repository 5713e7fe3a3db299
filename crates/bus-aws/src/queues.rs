//! `QueueBackend` on SQS. FIFO queues get `MessageGroupId` from the message's group and a
//! deterministic `MessageDeduplicationId` (the caller's, else the message id); every queue has
//! a dead-letter queue of the same kind wired by a redrive policy
//! (`maxReceiveCount` = `max_retries` + 1). Attempts come from `ApproximateReceiveCount`.
//! Queue settings live in the registry table so every process sees the same ones.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue as DdbValue;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{AwsClients, AwsNames, err_code, err_text};
use bus::queue::{
    Delivery, QueueBackend, QueueConfig, QueueError, QueueKind, QueueMessage, QueueStats,
    validate_queue_name,
};

#[derive(Clone)]
struct Urls {
    main: String,
    dlq: String,
}

pub struct SqsQueues {
    clients: AwsClients,
    names: AwsNames,
    urls: Mutex<HashMap<String, Urls>>,
    configs: Mutex<HashMap<String, QueueConfig>>,
}

fn qerr(e: impl std::fmt::Display) -> QueueError {
    QueueError::Storage(e.to_string())
}

/// SQS delay/visibility are whole seconds; round up so a backoff is never shortened to 0.
fn secs(d: Duration) -> i32 {
    (d.as_millis().div_ceil(1000)).min(43_200) as i32
}

/// SQS FIFO group ids allow 128 printable ASCII characters; anything else is hashed.
fn group_id(g: &str) -> String {
    if !g.is_empty() && g.len() <= 128 && g.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        g.to_string()
    } else {
        format!("g-{:08x}-{}", super::fnv(g), g.len())
    }
}

impl SqsQueues {
    pub fn new(clients: AwsClients, names: AwsNames) -> Self {
        Self {
            clients,
            names,
            urls: Mutex::new(HashMap::new()),
            configs: Mutex::new(HashMap::new()),
        }
    }

    /// The URL of an SQS queue by its SQS name (not a bus queue name).
    async fn url_of_name(&self, name: &str) -> Result<String, QueueError> {
        self.clients
            .sqs
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .map_err(|e| qerr(err_text(&e)))?
            .queue_url()
            .map(str::to_owned)
            .ok_or_else(|| qerr(format!("GetQueueUrl returned no URL for {name}")))
    }

    async fn change_visibility(
        &self,
        url: &str,
        receipt_handle: &str,
        delay: Duration,
    ) -> Result<(), QueueError> {
        self.clients
            .sqs
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(secs(delay))
            .send()
            .await
            .map_err(|e| qerr(err_text(&e)))?;
        Ok(())
    }

    /// Make a message an event-source mapping delivered (its `eventSourceARN` names the
    /// queue: `arn:aws:sqs:<region>:<account>:<name>`) visible again after `delay`.
    pub async fn release_delivered(
        &self,
        event_source_arn: &str,
        receipt_handle: &str,
        delay: Duration,
    ) -> Result<(), QueueError> {
        let name = event_source_arn
            .rsplit(':')
            .next()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| QueueError::Invalid(format!("not a queue ARN: `{event_source_arn}`")))?;
        let url = self.url_of_name(name).await?;
        self.change_visibility(&url, receipt_handle, delay).await
    }

    async fn create_queue(
        &self,
        name: &str,
        attrs: HashMap<QueueAttributeName, String>,
    ) -> Result<String, QueueError> {
        let created = self
            .clients
            .sqs
            .create_queue()
            .queue_name(name)
            .set_attributes(Some(attrs.clone()))
            .send()
            .await;
        match created {
            Ok(out) => out
                .queue_url()
                .map(str::to_owned)
                .ok_or_else(|| qerr("CreateQueue returned no URL")),
            Err(e)
                if err_code(&e).as_deref() == Some("QueueAlreadyExists")
                    || err_code(&e).as_deref() == Some("QueueNameExists") =>
            {
                // Exists with other settings: adopt it and apply ours.
                let url = self.url_of_name(name).await?;
                let mut settable = attrs;
                settable.remove(&QueueAttributeName::FifoQueue);
                self.clients
                    .sqs
                    .set_queue_attributes()
                    .queue_url(&url)
                    .set_attributes(Some(settable))
                    .send()
                    .await
                    .map_err(|e| qerr(err_text(&e)))?;
                Ok(url)
            }
            Err(e) => Err(qerr(format!("create queue {name}: {}", err_text(&e)))),
        }
    }

    /// Look up the queue and its dead-letter queue by name → whether both exist (their URLs
    /// are then remembered).
    async fn find_existing(&self, cfg: &QueueConfig) -> Result<bool, QueueError> {
        let fifo = cfg.kind == QueueKind::Fifo;
        let mut found = Vec::new();
        for dlq in [false, true] {
            match self
                .clients
                .sqs
                .get_queue_url()
                .queue_name(self.names.queue_name(&cfg.name, fifo, dlq))
                .send()
                .await
            {
                Ok(out) => match out.queue_url {
                    Some(u) => found.push(u),
                    None => return Ok(false),
                },
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_queue_does_not_exist()) =>
                {
                    return Ok(false);
                }
                Err(e) => return Err(qerr(err_text(&e))),
            }
        }
        let dlq = found.pop().unwrap_or_default();
        let main = found.pop().unwrap_or_default();
        self.urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cfg.name.clone(), Urls { main, dlq });
        Ok(true)
    }

    async fn urls(&self, queue: &str) -> Result<Urls, QueueError> {
        if let Some(u) = self
            .urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
        {
            return Ok(u.clone());
        }
        let cfg = match self.config(queue).await {
            Some(c) => c,
            None => {
                let c = QueueConfig::standard(queue);
                self.declare(&c).await?;
                c
            }
        };
        // A queue that exists is used as it is configured (as deployed, the template owns its
        // attributes, and a worker's role may only send to it); only a missing one is created.
        if !self.find_existing(&cfg).await? {
            self.declare(&cfg).await?;
        }
        self.urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
            .cloned()
            .ok_or_else(|| qerr(format!("queue `{queue}` could not be created")))
    }

    async fn save_config(&self, cfg: &QueueConfig) -> Result<(), QueueError> {
        let body = serde_json::to_string(cfg).map_err(qerr)?;
        self.clients
            .dynamodb
            .put_item()
            .table_name(self.names.registry_table())
            .item("kind", DdbValue::S("queue".into()))
            .item("id", DdbValue::S(cfg.name.clone()))
            .item("config", DdbValue::S(body))
            .send()
            .await
            .map_err(|e| qerr(err_text(&e)))?;
        Ok(())
    }

    fn delivery(&self, queue: &str, m: &aws_sdk_sqs::types::Message) -> Result<Delivery, String> {
        let body = m.body().unwrap_or_default();
        let receipt = m.receipt_handle().unwrap_or_default().to_string();
        let attempt = m
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|c| c.parse().ok())
            .unwrap_or(1);
        let mut message: QueueMessage =
            serde_json::from_str(body).map_err(|e| format!("unreadable message body: {e}"))?;
        message.queue = queue.to_string();
        Ok(Delivery {
            message,
            receipt,
            attempt,
        })
    }

    async fn send_raw(
        &self,
        url: &str,
        fifo: bool,
        body: String,
        group: Option<&str>,
        dedup: &str,
    ) -> Result<(), QueueError> {
        let mut req = self
            .clients
            .sqs
            .send_message()
            .queue_url(url)
            .message_body(body);
        if fifo {
            req = req
                .message_group_id(group_id(group.unwrap_or("default")))
                .message_deduplication_id(group_id(dedup));
        }
        req.send().await.map_err(|e| qerr(err_text(&e)))?;
        Ok(())
    }

    fn is_fifo(&self, queue: &str) -> bool {
        self.configs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
            .is_some_and(|c| c.kind == QueueKind::Fifo)
    }
}

#[async_trait]
impl QueueBackend for SqsQueues {
    async fn declare(&self, cfg: &QueueConfig) -> Result<(), QueueError> {
        validate_queue_name(&cfg.name)?;
        let fifo = cfg.kind == QueueKind::Fifo;
        let mut dlq_attrs = HashMap::new();
        if fifo {
            dlq_attrs.insert(QueueAttributeName::FifoQueue, "true".to_string());
        }
        dlq_attrs.insert(
            QueueAttributeName::MessageRetentionPeriod,
            "1209600".to_string(),
        );
        let dlq_name = self.names.queue_name(&cfg.name, fifo, true);
        let dlq = self.create_queue(&dlq_name, dlq_attrs).await?;
        let dlq_arn = self
            .clients
            .sqs
            .get_queue_attributes()
            .queue_url(&dlq)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| qerr(err_text(&e)))?
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| qerr("dead-letter queue has no ARN"))?;
        let mut attrs = HashMap::new();
        if fifo {
            attrs.insert(QueueAttributeName::FifoQueue, "true".to_string());
        }
        attrs.insert(
            QueueAttributeName::VisibilityTimeout,
            secs(Duration::from_millis(cfg.visibility_timeout_ms))
                .max(1)
                .to_string(),
        );
        attrs.insert(
            QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": cfg.max_retries + 1})
                .to_string(),
        );
        let main = self
            .create_queue(&self.names.queue_name(&cfg.name, fifo, false), attrs)
            .await?;
        self.save_config(cfg).await?;
        self.urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cfg.name.clone(), Urls { main, dlq });
        self.configs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cfg.name.clone(), cfg.clone());
        Ok(())
    }

    async fn config(&self, queue: &str) -> Option<QueueConfig> {
        if let Some(c) = self
            .configs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
        {
            return Some(c.clone());
        }
        let out = self
            .clients
            .dynamodb
            .get_item()
            .table_name(self.names.registry_table())
            .key("kind", DdbValue::S("queue".into()))
            .key("id", DdbValue::S(queue.to_string()))
            .consistent_read(true)
            .send()
            .await
            .ok()?;
        let cfg: QueueConfig = match out.item()?.get("config")? {
            DdbValue::S(s) => serde_json::from_str(s).ok()?,
            _ => return None,
        };
        self.configs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(queue.to_string(), cfg.clone());
        Some(cfg)
    }

    async fn send(&self, msg: QueueMessage) -> Result<String, QueueError> {
        let urls = self.urls(&msg.queue).await?;
        let fifo = self.is_fifo(&msg.queue);
        let dedup = msg
            .deduplication_id
            .clone()
            .unwrap_or_else(|| msg.id.clone());
        let body = serde_json::to_string(&msg).map_err(qerr)?;
        self.send_raw(&urls.main, fifo, body, msg.group.as_deref(), &dedup)
            .await?;
        Ok(msg.id)
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let urls = self.urls(queue).await?;
        let receive = |n: usize, wait_secs: i32| {
            self.clients
                .sqs
                .receive_message()
                .queue_url(&urls.main)
                .max_number_of_messages(n.clamp(1, 10) as i32)
                .wait_time_seconds(wait_secs)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
        };
        let wait_secs = (wait.as_secs() as i32).clamp(0, 20);
        let mut messages = Vec::new();
        // FIFO: one message per receive. A batch may hold several messages of one group, and
        // every one handed back unprocessed would count as a receive toward the dead-letter
        // limit; SQS locks a group while its message is in flight, so the caller's next
        // receive (at once, while it has room) gets another group. No extra receives are
        // made on speculation: they cost one call each and came back empty almost always
        // (they were nine per step).
        let n = if self.is_fifo(queue) { 1 } else { max };
        let out = receive(n, wait_secs)
            .await
            .map_err(|e| qerr(err_text(&e)))?;
        messages.extend(out.messages().iter().cloned());
        let mut deliveries = Vec::new();
        for m in &messages {
            match self.delivery(queue, m) {
                Ok(d) => deliveries.push(d),
                Err(why) => {
                    // A body we cannot read can never succeed: straight to the DLQ.
                    tracing::warn!(queue, why, "poison message moved to the dead-letter queue");
                    let fifo = self.is_fifo(queue);
                    let id = m.message_id().unwrap_or("unknown").to_string();
                    self.send_raw(
                        &urls.dlq,
                        fifo,
                        m.body().unwrap_or_default().to_string(),
                        Some("poison"),
                        &id,
                    )
                    .await?;
                    if let Some(r) = m.receipt_handle() {
                        let _ = self
                            .clients
                            .sqs
                            .delete_message()
                            .queue_url(&urls.main)
                            .receipt_handle(r)
                            .send()
                            .await;
                    }
                }
            }
        }
        Ok(deliveries)
    }

    async fn ack(&self, d: &Delivery) -> Result<(), QueueError> {
        let urls = self.urls(&d.message.queue).await?;
        self.clients
            .sqs
            .delete_message()
            .queue_url(&urls.main)
            .receipt_handle(&d.receipt)
            .send()
            .await
            .map_err(|e| qerr(err_text(&e)))?;
        Ok(())
    }

    async fn fail(
        &self,
        d: &Delivery,
        error: &str,
        delay: Duration,
        dead_letter: bool,
    ) -> Result<(), QueueError> {
        let urls = self.urls(&d.message.queue).await?;
        if dead_letter {
            let mut m = d.message.clone();
            m.attempts = d.attempt;
            m.last_error = Some(error.chars().take(2000).collect());
            let fifo = self.is_fifo(&m.queue);
            let dedup = format!("{}-dead-{}", m.id, d.attempt);
            self.send_raw(
                &urls.dlq,
                fifo,
                serde_json::to_string(&m).map_err(qerr)?,
                m.group.as_deref(),
                &dedup,
            )
            .await?;
            return self.ack(d).await;
        }
        self.clients
            .sqs
            .change_message_visibility()
            .queue_url(&urls.main)
            .receipt_handle(&d.receipt)
            .visibility_timeout(secs(delay))
            .send()
            .await
            .map_err(|e| qerr(err_text(&e)))?;
        Ok(())
    }

    async fn release(&self, d: &Delivery, delay: Duration) -> Result<(), QueueError> {
        let urls = self.urls(&d.message.queue).await?;
        self.change_visibility(&urls.main, &d.receipt, delay).await
    }

    fn needs_heartbeat(&self) -> bool {
        true
    }

    fn exact_stats(&self) -> bool {
        false
    }

    async fn extend(&self, d: &Delivery, by: Duration) -> Result<(), QueueError> {
        self.release(d, by).await
    }

    async fn redrive(&self, queue: &str) -> Result<usize, QueueError> {
        let urls = self.urls(queue).await?;
        let fifo = self.is_fifo(queue);
        let mut moved = 0;
        loop {
            let out = self
                .clients
                .sqs
                .receive_message()
                .queue_url(&urls.dlq)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .visibility_timeout(30)
                .send()
                .await
                .map_err(|e| qerr(err_text(&e)))?;
            if out.messages().is_empty() {
                return Ok(moved);
            }
            for m in out.messages() {
                let body = m.body().unwrap_or_default();
                let (body, group, id) = match serde_json::from_str::<QueueMessage>(body) {
                    Ok(mut qm) => {
                        qm.attempts = 0;
                        let g = qm.group.clone();
                        (serde_json::to_string(&qm).map_err(qerr)?, g, qm.id)
                    }
                    Err(_) => (
                        body.to_string(),
                        None,
                        m.message_id().unwrap_or("x").to_string(),
                    ),
                };
                // A fresh dedup id: the original is still inside SQS's 5-minute window.
                let dedup = format!("{id}-redrive-{}", bus_telemetry::trace::now_ms());
                self.send_raw(&urls.main, fifo, body, group.as_deref(), &dedup)
                    .await?;
                if let Some(r) = m.receipt_handle() {
                    self.clients
                        .sqs
                        .delete_message()
                        .queue_url(&urls.dlq)
                        .receipt_handle(r)
                        .send()
                        .await
                        .map_err(|e| qerr(err_text(&e)))?;
                }
                moved += 1;
            }
        }
    }

    async fn dead_letters(&self, queue: &str) -> Result<Vec<QueueMessage>, QueueError> {
        let urls = self.urls(queue).await?;
        let mut seen = HashMap::new();
        // Peek: receive with visibility 0 a few times and collect distinct messages.
        for _ in 0..5 {
            let out = self
                .clients
                .sqs
                .receive_message()
                .queue_url(&urls.dlq)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .wait_time_seconds(0)
                .send()
                .await
                .map_err(|e| qerr(err_text(&e)))?;
            if out.messages().is_empty() {
                break;
            }
            for m in out.messages() {
                if let Ok(qm) = serde_json::from_str::<QueueMessage>(m.body().unwrap_or_default()) {
                    seen.insert(m.message_id().unwrap_or_default().to_string(), qm);
                }
            }
        }
        Ok(seen.into_values().collect())
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let urls = self.urls(queue).await?;
        let count = |url: String| async move {
            let out = self
                .clients
                .sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .send()
                .await
                .map_err(|e| qerr(err_text(&e)))?;
            let get = |k: QueueAttributeName| {
                out.attributes()
                    .and_then(|a| a.get(&k))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0)
            };
            Ok::<_, QueueError>((
                get(QueueAttributeName::ApproximateNumberOfMessages),
                get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            ))
        };
        let (pending, in_flight) = count(urls.main).await?;
        let (dead_visible, dead_hidden) = count(urls.dlq).await?;
        Ok(QueueStats {
            pending,
            in_flight,
            dead: dead_visible + dead_hidden,
        })
    }

    async fn queues(&self) -> Vec<QueueConfig> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let mut req = self
                .clients
                .dynamodb
                .query()
                .table_name(self.names.registry_table())
                .key_condition_expression("#k = :k")
                .expression_attribute_names("#k", "kind")
                .expression_attribute_values(":k", DdbValue::S("queue".into()));
            if let Some(s) = start.take() {
                req = req.set_exclusive_start_key(Some(s));
            }
            let Ok(page) = req.send().await else { break };
            for item in page.items() {
                if let Some(DdbValue::S(c)) = item.get("config")
                    && let Ok(cfg) = serde_json::from_str::<QueueConfig>(c)
                {
                    out.push(cfg);
                }
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}
