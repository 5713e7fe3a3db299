//! Lambda event-source mappings, run locally for the deployed shape (AWS runs them itself;
//! neither emulator does without Docker): a queue → a function (the turn-step FIFO queue →
//! the turn orchestrator) and the state table's change feed → a function (its stream → the
//! stream router). Written against the queue and change-feed ports, so the same code runs on
//! SQS + DynamoDB Streams (LocalStack) and on the embedded backend.
//!
//! As AWS does them:
//! - **Queue**: batches of up to `batch_size`; the answer's `batchItemFailures` names the
//!   messages that failed (the rest are deleted); an invocation that fails as a whole leaves
//!   the whole batch to come back. On SQS a failed message comes back by itself (visibility
//!   timeout, shortened by the handler; the redrive policy dead-letters it); on a backend
//!   without visibility timeouts it is failed with the queue's backoff and dead-lettered after
//!   its retries.
//! - **Stream**: batches in order; a partial failure is retried from the first failed record
//!   on; an invocation that fails as a whole is split in two (`BisectBatchOnFunctionError`)
//!   until the failing record is alone; a record still failing after `max_retries` is skipped
//!   (logged) so the stream moves on. Each record is acknowledged once handled.
//! - **Filters** (`FilterCriteria`, [`crate::filter`]): a record no filter passes never reaches
//!   the function; a filtered stream record is checkpointed past, a filtered queue message
//!   deleted, as AWS does. A batch the filters drop entirely is checkpointed with the next
//!   batch that reaches the function, or after [`CHECKPOINT_EVERY`] (the checkpoint is this
//!   emulator's own write, which AWS's mapping does not make in the account): a restart in
//!   between reads those records again and drops them again. A queue record's `body` is
//!   matched as JSON when it is a JSON object.

use crate::apigw_ws::RouteTarget;
use crate::filter::FilterCriteria;
use bus::events::{batch_item_failures, dynamodb_event, sequence_number, sqs_event};
use bus::queue::{QueueBackend, QueueConfig};
use bus::state::{ChangeFeed, ChangeRecord};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct QueueMapping {
    pub queue: String,
    pub batch_size: usize,
    /// How long one receive waits for messages.
    pub wait: Duration,
    /// Batches in flight at once. AWS scales a FIFO queue's mapping with its active message
    /// groups, up to the function's concurrency; SQS itself keeps a group with a message in
    /// flight from every other receive, so a session's steps still run one at a time.
    pub pollers: usize,
    /// The mapping's `FilterCriteria` (none: every message).
    pub filter: FilterCriteria,
}

/// Deliver one batch from the queue → how many messages it held.
pub async fn deliver_queue_batch(
    queues: &dyn QueueBackend,
    target: &dyn RouteTarget,
    m: &QueueMapping,
) -> Result<usize, String> {
    let batch = queues
        .receive(&m.queue, m.batch_size.clamp(1, 10), m.wait)
        .await
        .map_err(|e| format!("receive from {}: {e}", m.queue))?;
    if batch.is_empty() {
        return Ok(0);
    }
    let cfg = queues
        .config(&m.queue)
        .await
        .unwrap_or_else(|| QueueConfig::standard(&m.queue));
    let received = batch.len();
    let keep = passing(
        &m.filter,
        received,
        || sqs_event(&batch, &m.queue),
        queue_record_as_filtered,
    );
    let (batch, dropped): (Vec<_>, Vec<_>) = batch.into_iter().zip(keep).partition(|(_, k)| *k);
    for (d, _) in dropped {
        queues
            .ack(&d)
            .await
            .map_err(|e| format!("delete filtered from {}: {e}", m.queue))?;
    }
    let batch: Vec<_> = batch.into_iter().map(|(d, _)| d).collect();
    if batch.is_empty() {
        return Ok(received);
    }
    let failed: Vec<String> = match target.invoke(&sqs_event(&batch, &m.queue)).await {
        Ok(answer) => batch_item_failures(&answer),
        Err(e) => {
            tracing::warn!(queue = %m.queue, error = %e, "the function failed; the whole batch comes back");
            batch.iter().map(|d| d.message.id.clone()).collect()
        }
    };
    for d in &batch {
        if !failed.contains(&d.message.id) {
            queues
                .ack(d)
                .await
                .map_err(|e| format!("delete from {}: {e}", m.queue))?;
        } else if !queues.needs_heartbeat() {
            let last = d.attempt > cfg.max_retries;
            queues
                .fail(
                    d,
                    "reported as failed by the function",
                    cfg.backoff(d.attempt),
                    last,
                )
                .await
                .map_err(|e| format!("fail in {}: {e}", m.queue))?;
        }
    }
    Ok(received)
}

/// Whether each of `n` items passes the mapping's filters, judged on its record in `event`
/// (as `view` shows it to them); with no filters every one does, and no event is built.
fn passing(
    filter: &FilterCriteria,
    n: usize,
    event: impl FnOnce() -> Value,
    view: for<'v> fn(&'v Value) -> Cow<'v, Value>,
) -> Vec<bool> {
    if filter.is_empty() {
        return vec![true; n];
    }
    let event = event();
    let records = event["Records"].as_array().into_iter().flatten();
    records.map(|r| filter.passes(&view(r))).collect()
}

/// A queue record as a filter sees it: a `body` that is a JSON object is matched by its
/// fields (AWS's rule for SQS filters); any other body stays a string.
fn queue_record_as_filtered(record: &Value) -> Cow<'_, Value> {
    let parsed = record["body"]
        .as_str()
        .and_then(|b| serde_json::from_str::<Value>(b).ok())
        .filter(Value::is_object);
    match parsed {
        Some(body) => {
            let mut r = record.clone();
            r["body"] = body;
            Cow::Owned(r)
        }
        None => Cow::Borrowed(record),
    }
}

/// Run the queue mapping's pollers until the task is dropped (errors are logged and retried).
pub async fn run_queue_mapping(
    queues: Arc<dyn QueueBackend>,
    target: Arc<dyn RouteTarget>,
    m: QueueMapping,
) {
    let poller = |queues: Arc<dyn QueueBackend>, target: Arc<dyn RouteTarget>, m: QueueMapping| async move {
        loop {
            if let Err(e) = deliver_queue_batch(queues.as_ref(), target.as_ref(), &m).await {
                tracing::warn!(queue = %m.queue, error = %e, "queue mapping");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let pollers = (0..m.pollers.max(1)).map(|_| poller(queues.clone(), target.clone(), m.clone()));
    futures_util::future::join_all(pollers).await;
}

#[derive(Debug, Clone)]
pub struct StreamMapping {
    /// The table the stream belongs to (for the event's source ARN).
    pub table: String,
    pub batch_size: usize,
    pub wait: Duration,
    /// `MaximumBatchingWindowInSeconds`: once a record is there, AWS gathers more for up to
    /// this long (or until the batch is full) before it invokes; zero invokes at once.
    pub batching_window: Duration,
    /// Retries of a failing record before it is skipped.
    pub max_retries: u32,
    /// First pause between retries (doubling, at most 5 s).
    pub retry_pause: Duration,
    /// The mapping's `FilterCriteria` (none: every record).
    pub filter: FilterCriteria,
}

/// How long a stream mapping leaves the records its filters dropped without a checkpoint.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// Most dropped records whose checkpoint waits (past it, the checkpoint is written).
const DEFERRED_MAX: usize = 1024;

/// What a running stream mapping has handed out but not checkpointed: records its filters
/// dropped (positions only), since `since`.
#[derive(Debug, Default)]
pub struct Unacked {
    records: Vec<ChangeRecord>,
    since: Option<tokio::time::Instant>,
}

/// Deliver what the feed has (one batch, fully handled, checkpointed) → how many records.
pub async fn deliver_stream_batch(
    feed: &dyn ChangeFeed,
    target: &dyn RouteTarget,
    m: &StreamMapping,
) -> Result<usize, String> {
    deliver_stream_batch_deferring(feed, target, m, &mut Unacked::default(), Duration::ZERO).await
}

/// [`deliver_stream_batch`], leaving a batch the filters dropped entirely in `unacked` until
/// a batch reaches the function or `every` has passed.
pub async fn deliver_stream_batch_deferring(
    feed: &dyn ChangeFeed,
    target: &dyn RouteTarget,
    m: &StreamMapping,
    unacked: &mut Unacked,
    every: Duration,
) -> Result<usize, String> {
    let max = m.batch_size.max(1);
    let mut records = feed
        .next_batch(max, m.wait)
        .await
        .map_err(|e| format!("stream of {}: {e}", m.table))?;
    if records.is_empty() {
        if unacked.since.is_some_and(|t| t.elapsed() >= every) {
            ack(feed, m, unacked, &[]).await?;
        }
        return Ok(0);
    }
    let window_ends = tokio::time::Instant::now() + m.batching_window;
    while records.len() < max {
        let left = window_ends.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let more = feed
            .next_batch(max - records.len(), left)
            .await
            .map_err(|e| format!("stream of {}: {e}", m.table))?;
        records.extend(more);
    }
    let keep = passing(
        &m.filter,
        records.len(),
        || dynamodb_event(&records, &m.table),
        |r| Cow::Borrowed(r),
    );
    if keep.iter().all(|k| !*k) {
        // Nothing for the function: its checkpoint can wait (positions only are kept).
        unacked.records.extend(records.iter().map(|r| ChangeRecord {
            old_value: None,
            new_value: None,
            ..r.clone()
        }));
        let since = *unacked.since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= every || unacked.records.len() >= DEFERRED_MAX {
            ack(feed, m, unacked, &[]).await?;
        }
        return Ok(records.len());
    }
    if keep.iter().all(|k| *k) {
        deliver_records(target, m, &records).await;
    } else {
        let passed: Vec<ChangeRecord> = records
            .iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|(r, _)| r.clone())
            .collect();
        deliver_records(target, m, &passed).await;
    }
    // Filtered records are checkpointed past with the delivered ones.
    ack(feed, m, unacked, &records).await?;
    Ok(records.len())
}

/// Checkpoint past what waited in `unacked` and `records` (in that order), in one ack.
async fn ack(
    feed: &dyn ChangeFeed,
    m: &StreamMapping,
    unacked: &mut Unacked,
    records: &[ChangeRecord],
) -> Result<(), String> {
    let done = if unacked.records.is_empty() {
        feed.ack(records).await
    } else {
        let mut all = std::mem::take(&mut unacked.records);
        all.extend_from_slice(records);
        feed.ack(&all).await
    };
    unacked.since = None;
    done.map_err(|e| format!("checkpoint of {}: {e}", m.table))
}

/// Deliver `records` in order until each succeeded or was skipped after its retries.
async fn deliver_records(target: &dyn RouteTarget, m: &StreamMapping, records: &[ChangeRecord]) {
    // Work list of slices still to deliver, in order; a failing whole invocation splits its
    // slice in two.
    let mut pending: Vec<(&[ChangeRecord], u32)> = vec![(records, 0)];
    while let Some((slice, tries)) = pending.pop() {
        if slice.is_empty() {
            continue;
        }
        let pause = m
            .retry_pause
            .saturating_mul(1 << tries.min(8))
            .min(Duration::from_secs(5));
        match target.invoke(&dynamodb_event(slice, &m.table)).await {
            Ok(answer) => {
                let failed = batch_item_failures(&answer);
                let Some(first) = failed.first() else {
                    continue;
                };
                // Retried from the first failed record on.
                let at = slice
                    .iter()
                    .position(|r| &sequence_number(r) == first)
                    .unwrap_or(0);
                let rest = &slice[at..];
                if tries >= m.max_retries {
                    tracing::error!(table = %m.table, sequence = %first, "a stream record kept failing; skipped");
                    pending.push((&rest[1..], 0));
                } else {
                    tokio::time::sleep(pause).await;
                    pending.push((rest, tries + 1));
                }
            }
            Err(e) if slice.len() > 1 => {
                tracing::warn!(table = %m.table, error = %e, records = slice.len(), "the function failed; the batch is bisected");
                let (a, b) = slice.split_at(slice.len() / 2);
                // `a` first: pushed last.
                pending.push((b, tries));
                pending.push((a, tries));
            }
            Err(e) => {
                if tries >= m.max_retries {
                    tracing::error!(table = %m.table, error = %e, sequence = %sequence_number(&slice[0]), "a stream record kept failing; skipped");
                } else {
                    tokio::time::sleep(pause).await;
                    pending.push((slice, tries + 1));
                }
            }
        }
    }
}

/// Run the stream mapping until the task is dropped.
pub async fn run_stream_mapping(
    feed: Arc<dyn ChangeFeed>,
    target: Arc<dyn RouteTarget>,
    m: StreamMapping,
) {
    let mut unacked = Unacked::default();
    loop {
        let delivered = deliver_stream_batch_deferring(
            feed.as_ref(),
            target.as_ref(),
            &m,
            &mut unacked,
            CHECKPOINT_EVERY,
        )
        .await;
        if let Err(e) = delivered {
            tracing::warn!(table = %m.table, error = %e, "stream mapping");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
