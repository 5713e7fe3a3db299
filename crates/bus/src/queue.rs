//! The queue port: named FIFO and standard queues with message groups, visibility, retries
//! with backoff and a dead-letter queue. The engine's consumer loop (in `engine`) is the same
//! for every backend; a backend only stores and hands out messages.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

use crate::protocol::{ErrorBody, codes};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("{0}")]
    Invalid(String),
    #[error("queue storage error: {0}")]
    Storage(String),
}

impl From<QueueError> for ErrorBody {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Invalid(m) => ErrorBody::new(codes::INVALID_MESSAGE, m),
            QueueError::Storage(m) => ErrorBody::new(codes::ENQUEUE_ERROR, m),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    Fifo,
    #[default]
    Standard,
}

/// How a named queue behaves (SPEC §1 "queue" trigger config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueConfig {
    pub name: String,
    #[serde(rename = "type", default)]
    pub kind: QueueKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_group_field: Option<String>,
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
    #[serde(default = "default_visibility_ms")]
    pub visibility_timeout_ms: u64,
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
}

fn default_max_retries() -> u32 {
    3
}
/// SPEC's default first retry delay of a queue (it doubles with each attempt).
pub const DEFAULT_BACKOFF_MS: u64 = 1000;

fn default_backoff_ms() -> u64 {
    DEFAULT_BACKOFF_MS
}
fn default_visibility_ms() -> u64 {
    30_000
}
fn default_concurrency() -> usize {
    10
}

impl QueueConfig {
    pub fn standard(name: &str) -> Self {
        Self {
            name: name.to_string(),
            kind: QueueKind::Standard,
            message_group_field: None,
            max_retries: default_max_retries(),
            backoff_ms: default_backoff_ms(),
            visibility_timeout_ms: default_visibility_ms(),
            concurrency: default_concurrency(),
        }
    }

    pub fn fifo(name: &str, group_field: &str) -> Self {
        Self {
            kind: QueueKind::Fifo,
            message_group_field: Some(group_field.to_string()),
            ..Self::standard(name)
        }
    }

    /// Read a config object as sent in a `queue` trigger or `engine::queue::declare`.
    /// Accepts `queue` or `name`, and `visibility_timeout` in seconds as an alias.
    pub fn from_json(v: &Value) -> Result<Self, QueueError> {
        let obj = v
            .as_object()
            .ok_or_else(|| QueueError::Invalid("queue config must be an object".into()))?;
        let name = obj
            .get("queue")
            .or_else(|| obj.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| QueueError::Invalid("queue config is missing field `queue`".into()))?;
        validate_queue_name(name)?;
        let mut norm = obj.clone();
        norm.insert("name".into(), Value::String(name.into()));
        if let Some(secs) = obj.get("visibility_timeout").and_then(Value::as_f64) {
            norm.insert(
                "visibility_timeout_ms".into(),
                Value::from((secs * 1000.0) as u64),
            );
        }
        let cfg: QueueConfig = serde_json::from_value(Value::Object(norm))
            .map_err(|e| QueueError::Invalid(format!("invalid queue config: {e}")))?;
        if cfg.concurrency == 0 {
            return Err(QueueError::Invalid(
                "`concurrency` must be at least 1".into(),
            ));
        }
        Ok(cfg)
    }

    /// The group a message belongs to: the explicit id, else the configured field of `data`,
    /// else (FIFO) the queue itself, so ordering is never silently lost.
    pub fn group_of(&self, explicit: Option<&str>, data: &Value) -> Option<String> {
        if self.kind == QueueKind::Standard {
            return None;
        }
        if let Some(g) = explicit {
            return Some(g.to_string());
        }
        let field = self
            .message_group_field
            .as_deref()
            .and_then(|f| data.get(f))
            .and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            });
        Some(field.unwrap_or_else(|| self.name.clone()))
    }

    /// Exponential backoff after the n-th failed attempt (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(16);
        Duration::from_millis(
            self.backoff_ms
                .saturating_mul(1u64 << exp)
                .min(15 * 60 * 1000),
        )
    }
}

pub fn validate_queue_name(name: &str) -> Result<(), QueueError> {
    if name.is_empty() || name.len() > 80 || name.contains('\0') {
        return Err(QueueError::Invalid(
            "queue name must be 1-80 characters without NUL".into(),
        ));
    }
    Ok(())
}

/// A message as stored: the invocation to make when it is delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueMessage {
    pub id: String,
    pub queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The function to invoke; absent → the queue trigger's function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_id: Option<String>,
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deduplication_id: Option<String>,
    /// Failed attempts so far.
    #[serde(default)]
    pub attempts: u32,
    pub enqueued_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The field a queue consumer's payload (when an object) gains with each delivery:
/// `{attempt, last}` (1-based; `last`: a failure now dead-letters the message).
pub const DELIVERY_FIELD: &str = "iii_delivery";

/// A message handed to a consumer; `receipt` identifies it to ack/fail/release.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message: QueueMessage,
    pub receipt: String,
    /// 1-based attempt number of this delivery.
    pub attempt: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub pending: usize,
    pub in_flight: usize,
    pub dead: usize,
}

#[async_trait]
pub trait QueueBackend: Send + Sync {
    async fn declare(&self, cfg: &QueueConfig) -> Result<(), QueueError>;
    async fn config(&self, queue: &str) -> Option<QueueConfig>;
    /// Store a message durably; returns its id (the receipt handed to the producer).
    async fn send(&self, msg: QueueMessage) -> Result<String, QueueError>;
    /// Messages ready for delivery now (FIFO: at most one in flight per group), waiting up to
    /// `wait` when there are none.
    async fn receive(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError>;
    async fn ack(&self, d: &Delivery) -> Result<(), QueueError>;
    /// A failed attempt: visible again after `delay`, or moved to the dead-letter queue.
    async fn fail(
        &self,
        d: &Delivery,
        error: &str,
        delay: Duration,
        dead_letter: bool,
    ) -> Result<(), QueueError>;
    /// Handed back without an attempt (e.g. no consumer registered yet).
    async fn release(&self, d: &Delivery, delay: Duration) -> Result<(), QueueError>;
    /// Whether in-flight messages reappear on their own after the visibility timeout (SQS),
    /// so a long handler needs `extend` calls to keep its message hidden.
    fn needs_heartbeat(&self) -> bool {
        false
    }
    /// Whether `stats` is exact at once. An idle consumer stops only when it can tell its
    /// queue is empty; SQS counts are approximate (they lag), so its consumers keep running.
    fn exact_stats(&self) -> bool {
        true
    }
    async fn extend(&self, _d: &Delivery, _by: Duration) -> Result<(), QueueError> {
        Ok(())
    }
    /// Move every dead-lettered message of `queue` back to it; returns how many.
    async fn redrive(&self, queue: &str) -> Result<usize, QueueError>;
    async fn dead_letters(&self, queue: &str) -> Result<Vec<QueueMessage>, QueueError>;
    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError>;
    async fn queues(&self) -> Vec<QueueConfig>;
}

/// A backend's failure described in words is a storage error.
impl From<String> for QueueError {
    fn from(s: String) -> Self {
        QueueError::Storage(s)
    }
}
