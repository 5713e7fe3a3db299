//! The embedded durable backend: state, the change feed and queues in one redb file under the
//! data dir, with a write-ahead log beside it (`wal`). Every write is one log record, in
//! commit order, applied to redb's open write transaction once appended (redb commits in
//! batches); a durable write returns once its log record is on disk. A state write and its
//! change-feed record are one record, so a trigger is never lost for a committed write.
//! Queue scheduling state (in flight, visibility) is kept in memory: after a crash every
//! unacknowledged message is simply visible again.

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use bus::queue::{Delivery, QueueBackend, QueueConfig, QueueError, QueueMessage, QueueStats};
use bus::state::{
    ChangeFeed, ChangeKind, ChangeRecord, Entry, StateError, StateStore, UpdateOp, Versioned,
    WriteMeta, WriteOutcome, apply_ops, check_expected, is_reserved_scope, validate_address,
};

mod wal;
use crate::wal::{CHANGES, Op, QUEUE_CONFIGS, QUEUE_DEAD, QUEUE_MSGS, STATE, Wal, WalError};

mod mem_queue;
use mem_queue::{MemMsg, MemQueue};
mod queues;
mod state;

/// redb's page cache. The hot part of the file (turn records, session heads, queues) is
/// small; old history and events are read from the OS page cache when asked for.
pub const CACHE_BYTES: usize = 4 << 20;

fn storage<E: std::fmt::Display>(e: E) -> StateError {
    StateError::Storage(e.to_string())
}
fn qstorage<E: std::fmt::Display>(e: E) -> QueueError {
    QueueError::Storage(e.to_string())
}

fn state_key(scope: &str, key: &str) -> String {
    format!("{scope}\0{key}")
}

fn encode(version: u64, value: &Value) -> Vec<u8> {
    let mut out = version.to_be_bytes().to_vec();
    // Value serialization cannot fail.
    out.extend(serde_json::to_vec(value).unwrap_or_default());
    out
}

/// A stored record's version and its value's JSON (the layout `encode` writes).
fn split_stored(bytes: &[u8]) -> Result<(u64, &[u8]), StateError> {
    match bytes.split_first_chunk::<8>() {
        Some((version, json)) => Ok((u64::from_be_bytes(*version), json)),
        None => Err(StateError::Storage("corrupt state record".into())),
    }
}

fn decode(bytes: &[u8]) -> Result<Versioned, StateError> {
    let (version, json) = split_stored(bytes)?;
    let value = serde_json::from_slice(json).map_err(storage)?;
    Ok(Versioned { value, version })
}

/// A stored record's value as the JSON it is, checked but not decoded into a tree.
fn raw_value(bytes: &[u8]) -> Result<&RawValue, StateError> {
    serde_json::from_slice(split_stored(bytes)?.1).map_err(storage)
}

pub struct EmbeddedBackend {
    db: Arc<Database>,
    wal: Arc<Wal>,
    /// Allocated inside the (serialized) write transaction, so seq order is commit order.
    change_seq: Arc<AtomicU64>,
    /// The last change record handed out by `next_batch`. The records themselves stay in the
    /// `changes` table until acknowledged and are read from it in batches: held in memory, a
    /// burst of writes before the dispatcher drains them (the start-up grace records every
    /// write) kept each one's old and new values as JSON trees, without a bound.
    handed_out: Mutex<u64>,
    change_notify: Notify,
    queue_seq: Arc<AtomicU64>,
    queues: Mutex<HashMap<String, MemQueue>>,
}

impl EmbeddedBackend {
    /// Open (or create) `<data_dir>/engine.redb` and load every pending queue message.
    pub fn open(data_dir: &Path) -> anyhow::Result<Arc<Self>> {
        Self::open_with_cache(data_dir, CACHE_BYTES)
    }

    /// [`EmbeddedBackend::open`] with redb's page cache capped at `cache_bytes`.
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(data_dir)?;
        // redb's default cache (1 GiB) would keep the whole file in this process as it grows;
        // the OS page cache holds what does not fit.
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(data_dir.join("engine.redb"))?;
        let txn = db.begin_write()?;
        {
            txn.open_table(STATE)?;
            txn.open_table(CHANGES)?;
            txn.open_table(QUEUE_CONFIGS)?;
            txn.open_table(QUEUE_MSGS)?;
            txn.open_table(QUEUE_DEAD)?;
        }
        txn.commit()?;
        // Whatever the log holds beyond redb's durable state is applied before anything is
        // loaded from it. Opening the log also fsyncs the data dir, which makes the creation
        // of engine.redb and engine.wal durable.
        let wal = Wal::open(&db, &data_dir.join("engine.wal"))?;

        let mut queues: HashMap<String, MemQueue> = HashMap::new();
        let mut max_queue_seq = 0u64;
        let mut max_change_seq = 0u64;
        {
            let read = db.begin_read()?;
            for row in read.open_table(QUEUE_CONFIGS)?.iter()? {
                let (name, cfg) = row?;
                let cfg: QueueConfig = serde_json::from_slice(cfg.value())?;
                queues.insert(name.value().to_string(), MemQueue::new(cfg));
            }
            let now = Instant::now();
            for row in read.open_table(QUEUE_MSGS)?.iter()? {
                let (k, v) = row?;
                let (queue, seq) = k.value();
                max_queue_seq = max_queue_seq.max(seq);
                let message: QueueMessage = serde_json::from_slice(v.value())?;
                queues
                    .entry(queue.to_string())
                    .or_insert_with(|| MemQueue::new(QueueConfig::standard(queue)))
                    .insert(
                        seq,
                        MemMsg {
                            message,
                            visible_at: now,
                            in_flight: false,
                        },
                        now,
                    );
            }
            for row in read.open_table(QUEUE_DEAD)?.iter()? {
                let (k, _) = row?;
                max_queue_seq = max_queue_seq.max(k.value().1);
            }
            if let Some((seq, _)) = read.open_table(CHANGES)?.last()? {
                max_change_seq = seq.value();
            }
        }
        Ok(Arc::new(Self {
            db: Arc::new(db),
            wal: Arc::new(wal),
            change_seq: Arc::new(AtomicU64::new(max_change_seq)),
            handed_out: Mutex::new(0),
            change_notify: Notify::new(),
            queue_seq: Arc::new(AtomicU64::new(max_queue_seq)),
            queues: Mutex::new(queues),
        }))
    }

    /// Run one write transaction and log it; unless `deferred`, return once its log record is
    /// on disk. All of it runs in place: redb commits to memory, the log append is one
    /// write(2), and the fdatasync (about 0.1 ms) cost less than a hand-off to the blocking
    /// pool and back. Concurrent durable writers share it: those that come while one syncs
    /// wait for the next sync without holding a thread ([`Wal::wait_synced`]).
    async fn commit<T, E, F>(&self, deferred: bool, f: F) -> Result<T, E>
    where
        E: From<WalError>,
        F: FnOnce(&WriteTransaction, &mut Vec<Op>) -> Result<T, E>,
    {
        let (out, lsn) = self.wal.write_async(&self.db, f).await?;
        if !deferred {
            self.wal.wait_synced(lsn).await?;
        }
        Ok(out)
    }

    async fn blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Database) -> Result<T, E> + Send + 'static,
        String: Into<E>,
    {
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || f(&db)).await {
            Ok(r) => r,
            Err(e) => Err(format!("storage task failed: {e}").into()),
        }
    }

    /// One conditional write of a state record plus its change record, in one transaction.
    /// `compute` maps the current record to the new value (`None` deletes).
    async fn write<F>(
        &self,
        scope: &str,
        key: &str,
        expected_version: Option<u64>,
        meta: &WriteMeta,
        compute: F,
    ) -> Result<WriteOutcome, StateError>
    where
        F: FnOnce(Option<&Current>) -> Result<Option<Value>, StateError> + Send + 'static,
    {
        validate_address(scope, key)?;
        let seqs = &self.change_seq;
        let written = self
            .commit(meta.deferred(), |txn, log| {
                write_in(
                    &txn.open_table(STATE).map_err(storage)?,
                    log,
                    seqs,
                    scope,
                    key,
                    expected_version,
                    meta,
                    true,
                    compute,
                )
            })
            .await?;
        if written.recorded {
            self.change_notify.notify_one();
        }
        Ok(written.outcome)
    }

    /// Several conditional writes in one redb transaction: all commit or none does.
    pub(crate) async fn write_all(
        &self,
        writes: Vec<bus::state::TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<u64>>, StateError> {
        let written = self.write_all_keeping(writes, meta).await?;
        Ok(written.into_iter().map(|(version, _)| version).collect())
    }

    /// [`Self::write_all`] → each write's version and its value, which the write kept.
    pub(crate) async fn write_all_keeping(
        &self,
        writes: Vec<bus::state::TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<(Option<u64>, Value)>, StateError> {
        bus::state::check_transaction(&writes)?;
        let batch = writes.into_iter().map(|w| {
            (
                w.scope,
                w.key,
                w.expected_version,
                w.value,
                w.expected_value,
            )
        });
        let written = self.write_batch(batch, meta).await?;
        Ok(written
            .into_iter()
            .map(|w| {
                let value = w.outcome.new_value.unwrap_or(Value::Null);
                (Some(w.outcome.version), value)
            })
            .collect())
    }

    /// Unconditional writes in one transaction (one commit and one log record for a batch of
    /// stream items, instead of one each); whether each record existed before.
    pub(crate) async fn set_many_in_one(
        &self,
        items: Vec<(String, String, Value)>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<bool>>, StateError> {
        for (scope, key, _) in &items {
            validate_address(scope, key)?;
        }
        // A write reads the store as it was before the batch: a key written twice in one
        // batch would get the same version twice, so such a batch is written one by one.
        let mut seen = HashSet::with_capacity(items.len());
        if !items.iter().all(|(s, k, _)| seen.insert((s, k))) {
            let mut existed = Vec::with_capacity(items.len());
            for (scope, key, value) in items {
                let written = self
                    .write(&scope, &key, None, meta, move |_| Ok(Some(value)))
                    .await?;
                existed.push(Some(written.old_value.is_some()));
            }
            return Ok(existed);
        }
        let batch = items
            .into_iter()
            .map(|(scope, key, value)| (scope, key, None, value, None));
        let written = self.write_batch(batch, meta).await?;
        Ok(written.iter().map(|w| Some(w.existed)).collect())
    }

    /// Writes of (scope, key, expected version, value, expected value), each with its change
    /// record, as one log record: all are written or none is. Keys are distinct (each write
    /// reads the store as it was before the batch).
    async fn write_batch(
        &self,
        batch: impl Iterator<Item = (String, String, Option<u64>, Value, Option<Value>)>,
        meta: &WriteMeta,
    ) -> Result<Vec<Written>, StateError> {
        let seqs = &self.change_seq;
        let written = self
            .commit(meta.deferred(), |txn, log| {
                // Opened once for the batch (it is closed again before the log is applied).
                let state = txn.open_table(STATE).map_err(storage)?;
                batch
                    .map(|(scope, key, expected_version, value, expected_value)| {
                        let (s, k) = (&scope, &key);
                        write_in(
                            &state,
                            log,
                            seqs,
                            &scope,
                            &key,
                            expected_version,
                            meta,
                            false,
                            move |current| {
                                if let (Some(expected), Some(current)) = (&expected_value, current)
                                {
                                    bus::state::check_expected_value(
                                        s,
                                        k,
                                        expected,
                                        &current.value()?,
                                        current.version,
                                    )?;
                                }
                                Ok(Some(value))
                            },
                        )
                    })
                    .collect::<Result<Vec<_>, StateError>>()
            })
            .await?;
        if written.iter().any(|w| w.recorded) {
            self.change_notify.notify_one();
        }
        Ok(written)
    }
}

/// A change record as `changes` stores it, written from borrowed parts (the same JSON as
/// [`ChangeRecord`]'s, which reads it back; `position` is a DynamoDB Streams field).
#[derive(serde::Serialize)]
struct StoredChange<'a> {
    seq: u64,
    kind: ChangeKind,
    scope: &'a str,
    key: &'a str,
    old_value: Option<&'a RawValue>,
    new_value: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    baggage: Option<&'a str>,
}

/// A record as `state` holds it: its version, then its value's JSON, decoded only when
/// someone needs the value (an update's base, a single write's answer). A transaction's
/// writes and its change records do not: they carry the bytes as they are.
pub(crate) struct Current {
    version: u64,
    bytes: Vec<u8>,
}

impl Current {
    fn new(bytes: Vec<u8>) -> Result<Self, StateError> {
        let (version, _) = split_stored(&bytes)?;
        Ok(Self { version, bytes })
    }

    pub(crate) fn value(&self) -> Result<Value, StateError> {
        decode(&self.bytes).map(|v| v.value)
    }

    fn raw(&self) -> Result<&RawValue, StateError> {
        raw_value(&self.bytes)
    }
}

/// One record's write, read from `txn` and written as effects in `log` (applied once logged),
/// with its change record (none for the engine's own scopes or an unwatched write): checked
/// against `expected_version`, then `compute` maps the current record to the new value
/// (`None` deletes). The answer's `old_value` is decoded only when `want_old`.
#[allow(clippy::too_many_arguments)]
fn write_in<F>(
    state: &impl ReadableTable<&'static str, &'static [u8]>,
    log: &mut Vec<Op>,
    seqs: &AtomicU64,
    scope: &str,
    key: &str,
    expected_version: Option<u64>,
    meta: &WriteMeta,
    want_old: bool,
    compute: F,
) -> Result<Written, StateError>
where
    F: FnOnce(Option<&Current>) -> Result<Option<Value>, StateError>,
{
    let k = state_key(scope, key);
    let current = match state.get(k.as_str()).map_err(storage)? {
        Some(g) => Some(Current::new(g.value().to_vec())?),
        None => None,
    };
    let current_version = current.as_ref().map(|c| c.version);
    check_expected(scope, key, expected_version, current_version)?;
    let new_value = compute(current.as_ref())?;
    let kind = match (&current, &new_value) {
        (None, Some(_)) => Some(ChangeKind::Created),
        (Some(_), Some(_)) => Some(ChangeKind::Updated),
        (Some(_), None) => Some(ChangeKind::Deleted),
        (None, None) => None,
    };
    let recorded = kind.filter(|_| !is_reserved_scope(scope) && !meta.unwatched);
    // Computed once: a first version is a clock reading.
    let next_version = bus::state::next_version(current_version);
    let new_bytes = new_value.as_ref().map(|v| encode(next_version, v));
    if let Some(kind) = recorded {
        let seq = seqs.fetch_add(1, Ordering::SeqCst) + 1;
        let record = StoredChange {
            seq,
            kind,
            scope,
            key,
            old_value: current.as_ref().map(Current::raw).transpose()?,
            new_value: new_bytes.as_deref().map(raw_value).transpose()?,
            traceparent: meta.traceparent.as_deref(),
            baggage: meta.baggage.as_deref(),
        };
        let bytes = serde_json::to_vec(&record).map_err(storage)?;
        log.push(Op::ChangePut(seq, bytes));
    }
    let version = match new_bytes {
        Some(bytes) => {
            log.push(Op::StatePut(k, bytes));
            next_version
        }
        None => {
            if current.is_some() {
                log.push(Op::StateDel(k));
            }
            current_version.unwrap_or(0)
        }
    };
    let old_value = match (&current, want_old) {
        (Some(c), true) => Some(c.value()?),
        _ => None,
    };
    Ok(Written {
        outcome: WriteOutcome {
            old_value,
            new_value,
            version,
        },
        recorded: recorded.is_some(),
        existed: current.is_some(),
    })
}

/// What [`write_in`] did.
struct Written {
    outcome: WriteOutcome,
    /// A change record was written.
    recorded: bool,
    /// The record existed before the write.
    existed: bool,
}

impl From<WalError> for StateError {
    fn from(e: WalError) -> Self {
        StateError::Storage(e.to_string())
    }
}

impl From<WalError> for QueueError {
    fn from(e: WalError) -> Self {
        QueueError::Storage(e.to_string())
    }
}
