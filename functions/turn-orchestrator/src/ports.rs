//! What the step driver needs from outside, as small traits: the record store, the step
//! queue, the event stream and calls. [`Ctx`] (the bus) is the adapter the worker uses;
//! [`Memory`] is the one the driver's tests use, without a bus. The error a step can end in
//! ([`StepError`]) is in `types`, with the record that holds a save's outcome.

use crate::prelude::*;
use async_trait::async_trait;
use bus::state::{
    SET_MANY_MAX, TRANSACT_MAX_BYTES, TRANSACT_MAX_WRITES, TxWrite, json_len, json_len_bound,
};
use std::collections::HashMap;
use std::sync::Mutex;

pub use crate::types::{StepError, StepResult};

/// One stored UI event: (stream, group, item id, data).
pub type EventItem = (String, String, String, Value);

/// Turn records, versioned: a save names the version it loaded.
#[async_trait]
pub trait RecordStore: Send + Sync {
    async fn load(&self, sid: &str) -> StepResult<Option<(Record, u64)>>;
    /// Save the record and the UI events held with it, together: both or neither (a
    /// delivery that loses the save to another wrote nothing; the winner wrote the same
    /// items). → the new version; `Stale` when another delivery saved first. `durable`: on
    /// disk at once, not with the step's acknowledgement.
    async fn save(
        &self,
        rec: &Record,
        version: u64,
        durable: bool,
        events: Vec<EventItem>,
    ) -> StepResult<u64>;
    /// Start making every save so far durable, in a task of its own (`state::sync`), so the
    /// step goes on meanwhile. `None`: nothing to wait for.
    fn start_sync(&self) -> Option<crate::types::SyncHandle> {
        None
    }
    /// [`Self::save`] (not durable at once) in a task of its own, then (`sync`) every save
    /// so far made durable, so the step goes on meanwhile → the new version; it takes the
    /// events. `None`: this store saves only in line (the events are left).
    fn save_in_background(
        &self,
        _rec: &Record,
        _version: u64,
        _events: &mut Vec<EventItem>,
        _sync: bool,
    ) -> Option<crate::types::SaveHandle> {
        None
    }
}

/// The `turn-steps` FIFO queue (grouped by session, deduplicated by id).
#[async_trait]
pub trait StepQueue: Send + Sync {
    async fn enqueue(&self, sid: &str, state: TurnState, dedup: String) -> StepResult<()>;
}

/// `agent::events`: stored items, and pushes that are not stored (token deltas).
#[async_trait]
pub trait EventStream: Send + Sync {
    async fn store(&self, items: Vec<EventItem>) -> Result<(), String>;
    async fn push(&self, sid: &str, event_type: &str, data: Value);
    /// [`Self::push`] of an event that supersedes the one before it of its type (a partial
    /// message). A bus that posts from one ordered queue answers once it is queued, so a
    /// step waits for its place in that order, not for the post.
    async fn push_latest(&self, sid: &str, event_type: &str, data: Value) {
        self.push(sid, event_type, data).await
    }
}

/// Calls to other functions.
#[async_trait]
pub trait Calls: Send + Sync {
    async fn call(
        &self,
        function_id: &str,
        payload: Value,
        timeout: Duration,
    ) -> Result<Value, BusError>;
}

/// Everything the driver uses.
pub trait Ports: RecordStore + StepQueue + EventStream + Calls {}
impl<T: RecordStore + StepQueue + EventStream + Calls> Ports for T {}

// ------------------------------------------------------------------ the bus

#[async_trait]
impl RecordStore for Ctx {
    async fn load(&self, sid: &str) -> StepResult<Option<(Record, u64)>> {
        let mut v = self.state_get_versioned(SCOPE, &record_key(sid)).await?;
        if v.is_null() {
            return Ok(None);
        }
        let version = v["version"].as_u64().unwrap_or(0);
        let rec: Record = serde_json::from_value(v["value"].take())
            .map_err(|e| StepError::Fatal(format!("unreadable turn record: {e}")))?;
        Ok(Some((rec, version)))
    }

    async fn save(
        &self,
        rec: &Record,
        version: u64,
        durable: bool,
        mut events: Vec<EventItem>,
    ) -> StepResult<u64> {
        let value = serde_json::to_value(rec).map_err(|e| StepError::Fatal(e.to_string()))?;
        let ctx = if durable { durably(self) } else { self.clone() };
        let key = record_key(&rec.session_id);
        let carried = rec.carried.planned();
        let tree = carried.map_or(0, |c| c.writes.len());
        let fits = one_write(&value, &events, tree);
        if !fits {
            // Too many or too large for one transaction: the events first (a reader that
            // sees the saved record finds them), then the record.
            flush_in_chunks(&ctx, std::mem::take(&mut events)).await;
        }
        let saved = match carried {
            None if !fits => ctx
                .state_set_if(SCOPE, &key, value, version)
                .await
                .map(|out| out["version"].as_u64().unwrap_or(version + 1)),
            // One write: the record and its events (one TransactWriteItems on DynamoDB).
            None => ctx
                .state_commit(
                    vec![TxWrite::new(SCOPE, &key, value, Some(version))],
                    events,
                )
                .await
                .map(|out| out["versions"][0].as_u64().unwrap_or(version + 1)),
            // The batch's results with them, in the same write.
            Some(c) => {
                let mut writes = vec![TxWrite::new(SCOPE, &key, value.clone(), Some(version))];
                writes.extend(c.writes.iter().cloned());
                match ctx.state_commit(writes, events.clone()).await {
                    Ok(out) => {
                        c.wrote(&out["versions"]);
                        Ok(out["versions"][0].as_u64().unwrap_or(version + 1))
                    }
                    Err(BusError::VersionConflict(why)) => {
                        // The record moved (another delivery: stale), or only the tree did
                        // (another writer appended): the session worker appends then.
                        let stored = self.state_get_versioned(SCOPE, &key).await?;
                        if stored["version"].as_u64() != Some(version) {
                            return Err(StepError::Stale);
                        }
                        tracing::info!(session = %rec.session_id, why = %why, "the tree moved: the session worker appends the batch");
                        c.land_through_the_worker(self).await?;
                        ctx.state_commit(
                            vec![TxWrite::new(SCOPE, &key, value, Some(version))],
                            events,
                        )
                        .await
                        .map(|out| out["versions"][0].as_u64().unwrap_or(version + 1))
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match saved {
            Ok(v) => Ok(v),
            Err(BusError::VersionConflict(_)) => Err(StepError::Stale),
            Err(e) => Err(e.into()),
        }
    }

    fn start_sync(&self) -> Option<crate::types::SyncHandle> {
        let ctx = self.clone();
        Some(tokio::spawn(async move {
            ctx.state_sync().await.map(drop).map_err(|e| e.to_string())
        }))
    }

    fn save_in_background(
        &self,
        rec: &Record,
        version: u64,
        events: &mut Vec<EventItem>,
        sync: bool,
    ) -> Option<crate::types::SaveHandle> {
        let (rec, events) = (rec.clone(), std::mem::take(events));
        let ctx = self.clone();
        // At this call's position, so the save's spans are in the step's trace.
        let here = bus_telemetry::tracing_bridge::CallPosition::current();
        Some(tokio::spawn(here.run(async move {
            let saved = RecordStore::save(&ctx, &rec, version, false, events).await?;
            if sync {
                ctx.state_sync().await.map_err(StepError::not_durable)?;
            }
            Ok(saved)
        })))
    }
}

/// The most JSON one event may hold to be written in the record's transaction. DynamoDB
/// refuses an item over 400 KB, and with it the whole transaction: a larger event (a large
/// tool result) is written on its own, best effort, so it never blocks the record's save.
const EVENT_IN_TRANSACTION_MAX: usize = 256 * 1024;

/// Whether the record and its events go in one `state::transact`: there are events, they fit
/// one transaction with the record and `other_writes` (count, and half its bytes; a carried
/// append holds at most a quarter), and none is too large to be an item of it.
fn one_write(record: &Value, events: &[EventItem], other_writes: usize) -> bool {
    if events.is_empty() || events.len() + other_writes >= TRANSACT_MAX_WRITES {
        return false;
    }
    // Most saves are far under the limits: their bound says so without writing the JSON.
    let mut bound = json_len_bound(record);
    let mut each_small = true;
    for e in events {
        let n = json_len_bound(&e.3);
        each_small &= n <= EVENT_IN_TRANSACTION_MAX;
        bound += n;
    }
    if each_small && bound < TRANSACT_MAX_BYTES / 2 {
        return true;
    }
    let mut bytes = json_len(record);
    for e in events {
        let n = json_len(&e.3);
        if n > EVENT_IN_TRANSACTION_MAX {
            return false;
        }
        bytes += n;
    }
    bytes < TRANSACT_MAX_BYTES / 2
}

/// Events in writes of at most `SET_MANY_MAX` items; a failure is logged (the events are the
/// UI's view, the record and the session tree are the truth).
async fn flush_in_chunks(ctx: &Ctx, mut events: Vec<EventItem>) {
    while !events.is_empty() {
        let rest = events.split_off(events.len().min(SET_MANY_MAX));
        let count = events.len();
        if let Err(e) = ctx.stream_set_many(events).await {
            tracing::warn!(error = %e, count, "events not stored");
        }
        events = rest;
    }
}

#[async_trait]
impl StepQueue for Ctx {
    async fn enqueue(&self, sid: &str, state: TurnState, dedup: String) -> StepResult<()> {
        self.enqueue_with(
            QUEUE,
            &state.step_function(),
            json!({"session_id": sid}),
            EnqueueOptions {
                message_group_id: Some(sid.to_string()),
                deduplication_id: Some(dedup),
            },
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl EventStream for Ctx {
    async fn store(&self, items: Vec<EventItem>) -> Result<(), String> {
        flush_in_chunks(self, items).await;
        Ok(())
    }
    async fn push(&self, sid: &str, event_type: &str, data: Value) {
        let _ = self.stream_send(EVENTS, sid, event_type, data).await;
    }
    async fn push_latest(&self, sid: &str, event_type: &str, data: Value) {
        let _ = self.stream_send_latest(EVENTS, sid, event_type, data).await;
    }
}

#[async_trait]
impl Calls for Ctx {
    async fn call(
        &self,
        function_id: &str,
        payload: Value,
        timeout: Duration,
    ) -> Result<Value, BusError> {
        self.trigger_timeout(function_id, payload, timeout).await
    }
}

// ------------------------------------------------------------------ in memory

/// All four ports in memory: records with versions, the queued steps, the stored events,
/// and calls that answer from a table (anything else: `function_not_found`).
#[derive(Default)]
pub struct Memory {
    pub records: std::sync::Arc<Mutex<HashMap<String, (Record, u64)>>>,
    /// Saves made durable at once, in order (session, state).
    pub durable_saves: Mutex<Vec<(String, TurnState)>>,
    pub queued: Mutex<Vec<(String, TurnState, String)>>,
    pub events: Mutex<Vec<EventItem>>,
    pub answers: Mutex<HashMap<String, Value>>,
    /// Syncs started ([`RecordStore::start_sync`]) and finished: each takes 20 ms, as a
    /// disk's would take a while.
    pub syncs_started: Mutex<usize>,
    pub synced: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Every sync fails (a failing disk).
    pub sync_fails: std::sync::atomic::AtomicBool,
    /// Saves in a task of its own, as the bus does ([`RecordStore::save_in_background`]):
    /// each is written after 20 ms.
    pub saves_in_background: std::sync::atomic::AtomicBool,
    /// The next save in the background fails with this, writing nothing.
    pub background_save_fails: Mutex<Option<StepError>>,
}

impl Memory {
    /// A save at `version`, or `Stale` when the record is at another.
    fn save_now(
        records: &Mutex<HashMap<String, (Record, u64)>>,
        rec: &Record,
        version: u64,
    ) -> StepResult<u64> {
        let mut records = lock(records);
        let current = records.get(&rec.session_id).map_or(0, |(_, v)| *v);
        if current != version {
            return Err(StepError::Stale);
        }
        records.insert(rec.session_id.clone(), (rec.clone(), version + 1));
        Ok(version + 1)
    }
}

#[async_trait]
impl RecordStore for Memory {
    async fn load(&self, sid: &str) -> StepResult<Option<(Record, u64)>> {
        Ok(lock(&self.records).get(sid).cloned())
    }
    async fn save(
        &self,
        rec: &Record,
        version: u64,
        durable: bool,
        events: Vec<EventItem>,
    ) -> StepResult<u64> {
        let saved = Self::save_now(&self.records, rec, version)?;
        store_events(&mut lock(&self.events), events);
        if durable {
            lock(&self.durable_saves).push((rec.session_id.clone(), rec.state));
        }
        Ok(saved)
    }

    fn save_in_background(
        &self,
        rec: &Record,
        version: u64,
        events: &mut Vec<EventItem>,
        _sync: bool,
    ) -> Option<crate::types::SaveHandle> {
        if !self
            .saves_in_background
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let (rec, events) = (rec.clone(), std::mem::take(events));
        // The events go in at once (the tests read the record's); the record after a while.
        store_events(&mut lock(&self.events), events);
        let fails = lock(&self.background_save_fails).take();
        let records = self.records.clone();
        Some(tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            match fails {
                Some(e) => Err(e),
                None => Self::save_now(&records, &rec, version),
            }
        }))
    }

    fn start_sync(&self) -> Option<crate::types::SyncHandle> {
        *lock(&self.syncs_started) += 1;
        let synced = self.synced.clone();
        let fails = self.sync_fails.load(std::sync::atomic::Ordering::SeqCst);
        Some(tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            if fails {
                return Err("fdatasync: Input/output error".into());
            }
            synced.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }))
    }
}

#[async_trait]
impl StepQueue for Memory {
    async fn enqueue(&self, sid: &str, state: TurnState, dedup: String) -> StepResult<()> {
        let mut q = lock(&self.queued);
        if !q.iter().any(|(_, _, d)| *d == dedup) {
            q.push((sid.to_string(), state, dedup));
        }
        Ok(())
    }
}

#[async_trait]
impl EventStream for Memory {
    async fn store(&self, items: Vec<EventItem>) -> Result<(), String> {
        store_events(&mut lock(&self.events), items);
        Ok(())
    }
    async fn push(&self, _sid: &str, _event_type: &str, _data: Value) {}
}

#[async_trait]
impl Calls for Memory {
    async fn call(&self, function_id: &str, _: Value, _: Duration) -> Result<Value, BusError> {
        lock(&self.answers)
            .get(function_id)
            .cloned()
            .ok_or_else(|| BusError::FunctionNotFound(function_id.to_string()))
    }
}

fn store_events(events: &mut Vec<EventItem>, items: Vec<EventItem>) {
    for item in items {
        // Same item id: rewritten, as the stream store does.
        match events.iter_mut().find(|e| e.2 == item.2) {
            Some(e) => *e = item,
            None => events.push(item),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(bytes: usize) -> EventItem {
        (
            EVENTS.into(),
            "s1".into(),
            "s1-1".into(),
            json!({"result": "x".repeat(bytes)}),
        )
    }

    #[test]
    fn events_go_with_the_record_unless_too_many_or_too_large() {
        let rec = json!({"state": "function_execute"});
        assert!(one_write(&rec, &[event(10), event(10)], 0));
        assert!(
            !one_write(&rec, &[event(10), event(10)], TRANSACT_MAX_WRITES - 2),
            "no room beside a carried append"
        );
        assert!(!one_write(&rec, &[], 0), "nothing to write with it");
        let many: Vec<EventItem> = (0..TRANSACT_MAX_WRITES).map(|_| event(1)).collect();
        assert!(!one_write(&rec, &many, 0), "no room for the record");
        assert!(
            !one_write(&rec, &[event(10), event(EVENT_IN_TRANSACTION_MAX)], 0),
            "an event DynamoDB could refuse must not take the record's save with it"
        );
        let big: Vec<EventItem> = (0..8).map(|_| event(250 * 1024)).collect();
        assert!(!one_write(&rec, &big, 0), "over half a transaction's bytes");
    }
}
