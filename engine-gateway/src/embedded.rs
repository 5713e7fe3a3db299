//! The embedded durable backend: state, the change feed and queues in one redb file under the
//! data dir, with a write-ahead log beside it (`wal`). Every write is one committed
//! transaction, logged in commit order; a durable write returns once its log record is on disk.
//! A state write and its change-feed record commit together, so a trigger is never lost for a
//! committed write. Queue scheduling state (in flight, visibility) is kept in memory: after a
//! crash every unacknowledged message is simply visible again.

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use crate::queue::{
    Delivery, QueueBackend, QueueConfig, QueueError, QueueKind, QueueMessage, QueueStats,
};
use crate::state::{
    ChangeFeed, ChangeKind, ChangeRecord, Entry, StateError, StateStore, UpdateOp, Versioned,
    WriteMeta, WriteOutcome, apply_ops, check_expected, is_reserved_scope, validate_address,
};

use crate::wal::{CHANGES, Op, QUEUE_CONFIGS, QUEUE_DEAD, QUEUE_MSGS, STATE, Wal, WalError};

/// redb's page cache. The hot part of the file (turn records, session heads, queues) is
/// small; old history and events are read from the OS page cache when asked for.
const CACHE_BYTES: usize = 32 << 20;

/// How long a deduplication id suppresses a second enqueue (as SQS FIFO).
const DEDUP_WINDOW: Duration = Duration::from_secs(300);

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

fn decode(bytes: &[u8]) -> Result<Versioned, StateError> {
    if bytes.len() < 8 {
        return Err(StateError::Storage("corrupt state record".into()));
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&bytes[..8]);
    let value = serde_json::from_slice(&bytes[8..]).map_err(storage)?;
    Ok(Versioned {
        value,
        version: u64::from_be_bytes(v),
    })
}

struct MemMsg {
    message: QueueMessage,
    visible_at: Instant,
    in_flight: bool,
}

struct MemQueue {
    cfg: QueueConfig,
    msgs: BTreeMap<u64, MemMsg>,
    dedup: HashMap<String, (String, Instant)>,
    /// The deduplication ids in the order they were recorded, so expiring them is amortized
    /// O(1) per send instead of a scan of every id of the last five minutes.
    dedup_order: std::collections::VecDeque<(Instant, String)>,
    notify: Arc<Notify>,
}

impl MemQueue {
    fn expire_dedup(&mut self, now: Instant) {
        while let Some((at, _)) = self.dedup_order.front() {
            if now.duration_since(*at) < DEDUP_WINDOW {
                break;
            }
            if let Some((at, id)) = self.dedup_order.pop_front()
                && self
                    .dedup
                    .get(&id)
                    .is_some_and(|(_, recorded)| *recorded == at)
            {
                self.dedup.remove(&id);
            }
        }
    }

    fn new(cfg: QueueConfig) -> Self {
        Self {
            cfg,
            msgs: BTreeMap::new(),
            dedup: HashMap::new(),
            dedup_order: Default::default(),
            notify: Arc::new(Notify::new()),
        }
    }
}

pub struct EmbeddedBackend {
    db: Arc<Database>,
    wal: Arc<Wal>,
    /// Allocated inside the (serialized) write transaction, so seq order is commit order.
    change_seq: Arc<AtomicU64>,
    /// Committed, not yet handed out changes, in seq order (the on-disk table is the truth
    /// until acked; this is loaded from it at open).
    feed: Mutex<BTreeMap<u64, ChangeRecord>>,
    change_notify: Notify,
    queue_seq: Arc<AtomicU64>,
    queues: Mutex<HashMap<String, MemQueue>>,
}

impl EmbeddedBackend {
    /// Open (or create) `<data_dir>/engine.redb` and load every pending queue message.
    pub fn open(data_dir: &Path) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(data_dir)?;
        // redb's default cache (1 GiB) would keep the whole file in this process as it grows;
        // the OS page cache holds what does not fit.
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
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
        let mut feed = BTreeMap::new();
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
                    .msgs
                    .insert(
                        seq,
                        MemMsg {
                            message,
                            visible_at: now,
                            in_flight: false,
                        },
                    );
            }
            for row in read.open_table(QUEUE_DEAD)?.iter()? {
                let (k, _) = row?;
                max_queue_seq = max_queue_seq.max(k.value().1);
            }
            for row in read.open_table(CHANGES)?.iter()? {
                let (seq, rec) = row?;
                let rec: ChangeRecord = serde_json::from_slice(rec.value())?;
                max_change_seq = max_change_seq.max(seq.value());
                feed.insert(seq.value(), rec);
            }
        }
        Ok(Arc::new(Self {
            db: Arc::new(db),
            wal: Arc::new(wal),
            change_seq: Arc::new(AtomicU64::new(max_change_seq)),
            feed: Mutex::new(feed),
            change_notify: Notify::new(),
            queue_seq: Arc::new(AtomicU64::new(max_queue_seq)),
            queues: Mutex::new(queues),
        }))
    }

    /// Run one write transaction and log it; unless `deferred`, return once its log record is
    /// on disk. All of it runs in place: redb commits to memory, the log append is one
    /// write(2), and the fdatasync (about 0.1 ms, shared by concurrent durable writers) cost
    /// less than a hand-off to the blocking pool and back.
    async fn commit<T, E, F>(&self, deferred: bool, f: F) -> Result<T, E>
    where
        E: From<WalError>,
        F: FnOnce(&WriteTransaction, &mut Vec<Op>) -> Result<T, E>,
    {
        let (out, lsn) = self.wal.write(&self.db, f)?;
        if !deferred {
            self.wal.sync_to(lsn)?;
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
        F: FnOnce(Option<&Versioned>) -> Result<Option<Value>, StateError> + Send + 'static,
    {
        validate_address(scope, key)?;
        let seqs = &self.change_seq;
        let (outcome, change) = self
            .commit(
                meta.deferred(),
                |txn, log| -> Result<(WriteOutcome, Option<ChangeRecord>), StateError> {
                    let outcome;
                    let mut change = None;
                    {
                        let mut table = txn.open_table(STATE).map_err(storage)?;
                        let k = state_key(scope, key);
                        let current = match table.get(k.as_str()).map_err(storage)? {
                            Some(g) => Some(decode(g.value())?),
                            None => None,
                        };
                        let current_version = current.as_ref().map(|c| c.version);
                        check_expected(scope, key, expected_version, current_version)?;
                        let new_value = compute(current.as_ref())?;
                        let old_value = current.map(|c| c.value);
                        let kind = match (&old_value, &new_value) {
                            (None, Some(_)) => Some(ChangeKind::Created),
                            (Some(_), Some(_)) => Some(ChangeKind::Updated),
                            (Some(_), None) => Some(ChangeKind::Deleted),
                            (None, None) => None,
                        };
                        let version = match &new_value {
                            Some(v) => {
                                let version = crate::state::next_version(current_version);
                                let bytes = encode(version, v);
                                table
                                    .insert(k.as_str(), bytes.as_slice())
                                    .map_err(storage)?;
                                log.push(Op::StatePut(k, bytes));
                                version
                            }
                            None => {
                                if table.remove(k.as_str()).map_err(storage)?.is_some() {
                                    log.push(Op::StateDel(k));
                                }
                                current_version.unwrap_or(0)
                            }
                        };
                        if let (Some(kind), false, false) =
                            (kind, is_reserved_scope(scope), meta.unwatched)
                        {
                            let seq = seqs.fetch_add(1, Ordering::SeqCst) + 1;
                            let record = ChangeRecord {
                                seq,
                                position: None,
                                kind,
                                scope: scope.to_string(),
                                key: key.to_string(),
                                old_value: old_value.clone(),
                                new_value: new_value.clone(),
                                traceparent: meta.traceparent.clone(),
                                baggage: meta.baggage.clone(),
                            };
                            let bytes = serde_json::to_vec(&record).map_err(storage)?;
                            txn.open_table(CHANGES)
                                .map_err(storage)?
                                .insert(seq, bytes.as_slice())
                                .map_err(storage)?;
                            log.push(Op::ChangePut(seq, bytes));
                            change = Some(record);
                        }
                        outcome = WriteOutcome {
                            old_value,
                            new_value,
                            version,
                        };
                    }
                    Ok((outcome, change))
                },
            )
            .await?;
        if let Some(record) = change {
            // Only after the commit: a trigger never fires for a write that did not happen.
            self.feed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(record.seq, record);
            self.change_notify.notify_one();
        }
        Ok(outcome)
    }
}

impl From<String> for StateError {
    fn from(s: String) -> Self {
        StateError::Storage(s)
    }
}

impl From<String> for QueueError {
    fn from(s: String) -> Self {
        QueueError::Storage(s)
    }
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

#[async_trait]
impl StateStore for EmbeddedBackend {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError> {
        validate_address(scope, key)?;
        let k = state_key(scope, key);
        // A point read is a few microseconds from redb's cache: done in place, not handed to
        // the blocking pool (that hand-off cost more than the read).
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(STATE).map_err(storage)?;
        match table.get(k.as_str()).map_err(storage)? {
            Some(g) => Ok(Some(decode(g.value())?)),
            None => Ok(None),
        }
    }

    async fn set(
        &self,
        scope: &str,
        key: &str,
        value: Value,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        self.write(scope, key, expected_version, meta, move |_| Ok(Some(value)))
            .await
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        ops: Vec<UpdateOp>,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        self.write(scope, key, expected_version, meta, move |current| {
            let base = current
                .map(|c| c.value.clone())
                .unwrap_or_else(|| Value::Object(Default::default()));
            apply_ops(base, &ops).map(Some)
        })
        .await
    }

    async fn delete(
        &self,
        scope: &str,
        key: &str,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        self.write(scope, key, expected_version, meta, |_| Ok(None))
            .await
    }

    async fn list_page(
        &self,
        scope: &str,
        prefix: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool), StateError> {
        if scope.is_empty() {
            return Err(StateError::Invalid("`scope` must not be empty".into()));
        }
        let start = state_key(scope, prefix.unwrap_or(""));
        let after = after.map(|a| state_key(scope, a));
        let scope_len = scope.len() + 1;
        self.blocking(move |db| {
            use std::ops::Bound;
            let read = db.begin_read().map_err(storage)?;
            let table = read.open_table(STATE).map_err(storage)?;
            let from = match after.as_deref() {
                Some(a) if a >= start.as_str() => Bound::Excluded(a),
                _ => Bound::Included(start.as_str()),
            };
            let mut out = Vec::new();
            for row in table
                .range::<&str>((from, Bound::Unbounded))
                .map_err(storage)?
            {
                let (k, v) = row.map_err(storage)?;
                let k = k.value();
                if !k.starts_with(start.as_str()) {
                    break;
                }
                if out.len() == limit {
                    return Ok((out, true));
                }
                let rec = decode(v.value())?;
                out.push(Entry {
                    key: k[scope_len..].to_string(),
                    value: rec.value,
                    version: rec.version,
                });
            }
            Ok((out, false))
        })
        .await
    }
}

#[async_trait]
impl ChangeFeed for EmbeddedBackend {
    async fn next_batch(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<ChangeRecord>, StateError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.change_notify.notified();
            let batch: Vec<ChangeRecord> = {
                let mut feed = self.feed.lock().unwrap_or_else(|p| p.into_inner());
                let mut out = Vec::new();
                while out.len() < max {
                    match feed.pop_first() {
                        Some((_, r)) => out.push(r),
                        None => break,
                    }
                }
                out
            };
            if !batch.is_empty() {
                return Ok(batch);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn ack(&self, records: &[ChangeRecord]) -> Result<(), StateError> {
        let Some(seq) = records.iter().map(|r| r.seq).max() else {
            return Ok(());
        };
        // Not waited for on disk: a lost acknowledgement fires the trigger again after a
        // machine crash (at least once), and a killed process loses no log record.
        self.commit(true, |txn, log| {
            let mut table = txn.open_table(CHANGES).map_err(storage)?;
            table.retain_in(..=seq, |_, _| false).map_err(storage)?;
            log.push(Op::ChangesRetainAfter(seq));
            Ok::<_, StateError>(())
        })
        .await
    }
}

impl EmbeddedBackend {
    fn with_queue<T>(&self, queue: &str, f: impl FnOnce(&mut MemQueue) -> T) -> T {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let q = queues
            .entry(queue.to_string())
            .or_insert_with(|| MemQueue::new(QueueConfig::standard(queue)));
        f(q)
    }

    fn seq_of(d: &Delivery) -> Result<u64, QueueError> {
        d.receipt
            .parse()
            .map_err(|_| QueueError::Invalid(format!("unknown receipt `{}`", d.receipt)))
    }
}

#[async_trait]
impl QueueBackend for EmbeddedBackend {
    async fn declare(&self, cfg: &QueueConfig) -> Result<(), QueueError> {
        let bytes = serde_json::to_vec(cfg).map_err(qstorage)?;
        let name = cfg.name.clone();
        self.commit(false, |txn, log| {
            txn.open_table(QUEUE_CONFIGS)
                .map_err(qstorage)?
                .insert(name.as_str(), bytes.as_slice())
                .map_err(qstorage)?;
            log.push(Op::QueueConfigPut(name, bytes));
            Ok::<_, QueueError>(())
        })
        .await?;
        self.with_queue(&cfg.name, |q| {
            q.cfg = cfg.clone();
            q.notify.notify_one();
        });
        Ok(())
    }

    async fn config(&self, queue: &str) -> Option<QueueConfig> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.get(queue).map(|q| q.cfg.clone())
    }

    async fn send(&self, msg: QueueMessage) -> Result<String, QueueError> {
        if let Some(dedup) = &msg.deduplication_id {
            let now = Instant::now();
            let seen = self.with_queue(&msg.queue, |q| {
                q.expire_dedup(now);
                q.dedup.get(dedup).map(|(id, _)| id.clone())
            });
            if let Some(id) = seen {
                return Ok(id);
            }
        }
        let bytes = serde_json::to_vec(&msg).map_err(qstorage)?;
        let queue = msg.queue.clone();
        let seqs = self.queue_seq.clone();
        let deferred = crate::state::baggage_defers(msg.baggage.as_deref());
        let seq = self
            .commit(deferred, |txn, log| {
                let seq = seqs.fetch_add(1, Ordering::SeqCst) + 1;
                txn.open_table(QUEUE_MSGS)
                    .map_err(qstorage)?
                    .insert((queue.as_str(), seq), bytes.as_slice())
                    .map_err(qstorage)?;
                log.push(Op::MsgPut(queue, seq, bytes));
                Ok::<_, QueueError>(seq)
            })
            .await?;
        let id = msg.id.clone();
        self.with_queue(&msg.queue.clone(), |q| {
            if let Some(dedup) = &msg.deduplication_id {
                let now = Instant::now();
                q.dedup.insert(dedup.clone(), (id.clone(), now));
                q.dedup_order.push_back((now, dedup.clone()));
            }
            q.msgs.insert(
                seq,
                MemMsg {
                    message: msg,
                    visible_at: Instant::now(),
                    in_flight: false,
                },
            );
            q.notify.notify_one();
        });
        Ok(id)
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let now = Instant::now();
            let (batch, next_visible, notify) = self.with_queue(queue, |q| {
                let fifo = q.cfg.kind == QueueKind::Fifo;
                let mut blocked: HashSet<&str> = HashSet::new();
                if fifo {
                    for m in q.msgs.values() {
                        if let (true, Some(g)) = (m.in_flight, m.message.group.as_deref()) {
                            blocked.insert(g);
                        }
                    }
                }
                let mut picked = Vec::new();
                let mut next_visible: Option<Instant> = None;
                for (seq, m) in q.msgs.iter() {
                    if picked.len() >= max {
                        break;
                    }
                    let group = m.message.group.as_deref().filter(|_| fifo);
                    if let Some(g) = group
                        && blocked.contains(g)
                    {
                        continue;
                    }
                    if m.in_flight {
                        continue;
                    }
                    if m.visible_at > now {
                        next_visible =
                            Some(next_visible.map_or(m.visible_at, |n| n.min(m.visible_at)));
                        if let Some(g) = group {
                            // The group's head is waiting out its backoff: the group waits too.
                            blocked.insert(g);
                        }
                        continue;
                    }
                    if let Some(g) = group {
                        blocked.insert(g);
                    }
                    picked.push(*seq);
                }
                let mut batch = Vec::with_capacity(picked.len());
                for seq in picked {
                    if let Some(m) = q.msgs.get_mut(&seq) {
                        m.in_flight = true;
                        batch.push(Delivery {
                            message: m.message.clone(),
                            receipt: seq.to_string(),
                            attempt: m.message.attempts + 1,
                        });
                    }
                }
                (batch, next_visible, q.notify.clone())
            });
            if !batch.is_empty() {
                return Ok(batch);
            }
            let mut wake = deadline;
            if let Some(nv) = next_visible {
                let nv = tokio::time::Instant::from_std(nv);
                if nv < wake {
                    wake = nv;
                }
            }
            if tokio::time::timeout_at(wake, notify.notified())
                .await
                .is_err()
                && tokio::time::Instant::now() >= deadline
            {
                return Ok(Vec::new());
            }
        }
    }

    async fn ack(&self, d: &Delivery) -> Result<(), QueueError> {
        let seq = Self::seq_of(d)?;
        let queue = d.message.queue.clone();
        // A message sent with deferred durability is acknowledged the same way: losing the
        // acknowledgement in a crash redelivers a step whose writes were lost with it.
        let deferred = crate::state::baggage_defers(d.message.baggage.as_deref());
        // The handler is done: free its FIFO group for the next message now, while the
        // acknowledgement commits. If that commit is lost, a restart delivers the message once
        // more, as a crash between handler and acknowledgement always could (at least once).
        self.with_queue(&d.message.queue, |q| {
            q.msgs.remove(&seq);
            q.notify.notify_one();
        });
        self.commit(deferred, |txn, log| {
            txn.open_table(QUEUE_MSGS)
                .map_err(qstorage)?
                .remove((queue.as_str(), seq))
                .map_err(qstorage)?;
            log.push(Op::MsgDel(queue, seq));
            Ok::<_, QueueError>(())
        })
        .await
    }

    async fn fail(
        &self,
        d: &Delivery,
        error: &str,
        delay: Duration,
        dead_letter: bool,
    ) -> Result<(), QueueError> {
        let seq = Self::seq_of(d)?;
        let mut message = d.message.clone();
        message.attempts = d.attempt;
        message.last_error = Some(error.chars().take(2000).collect());
        let bytes = serde_json::to_vec(&message).map_err(qstorage)?;
        let queue = message.queue.clone();
        self.commit(false, |txn, log| {
            let mut msgs = txn.open_table(QUEUE_MSGS).map_err(qstorage)?;
            if dead_letter {
                msgs.remove((queue.as_str(), seq)).map_err(qstorage)?;
                txn.open_table(QUEUE_DEAD)
                    .map_err(qstorage)?
                    .insert((queue.as_str(), seq), bytes.as_slice())
                    .map_err(qstorage)?;
                log.push(Op::MsgDel(queue.clone(), seq));
                log.push(Op::DeadPut(queue, seq, bytes));
            } else {
                msgs.insert((queue.as_str(), seq), bytes.as_slice())
                    .map_err(qstorage)?;
                log.push(Op::MsgPut(queue, seq, bytes));
            }
            Ok::<_, QueueError>(())
        })
        .await?;
        self.with_queue(&d.message.queue, |q| {
            if dead_letter {
                q.msgs.remove(&seq);
            } else if let Some(m) = q.msgs.get_mut(&seq) {
                m.message = message;
                m.in_flight = false;
                m.visible_at = Instant::now() + delay;
            }
            q.notify.notify_one();
        });
        Ok(())
    }

    async fn release(&self, d: &Delivery, delay: Duration) -> Result<(), QueueError> {
        let seq = Self::seq_of(d)?;
        self.with_queue(&d.message.queue, |q| {
            if let Some(m) = q.msgs.get_mut(&seq) {
                m.in_flight = false;
                m.visible_at = Instant::now() + delay;
            }
            q.notify.notify_one();
        });
        Ok(())
    }

    async fn redrive(&self, queue: &str) -> Result<usize, QueueError> {
        let name = queue.to_string();
        let seqs = self.queue_seq.clone();
        let moved = self
            .commit(false, |txn, log| {
                let mut out = Vec::new();
                {
                    let mut dead = txn.open_table(QUEUE_DEAD).map_err(qstorage)?;
                    let mut msgs = txn.open_table(QUEUE_MSGS).map_err(qstorage)?;
                    let mut revived = Vec::new();
                    for row in dead
                        .range((name.as_str(), 0)..=(name.as_str(), u64::MAX))
                        .map_err(qstorage)?
                    {
                        let (k, v) = row.map_err(qstorage)?;
                        let mut m: QueueMessage =
                            serde_json::from_slice(v.value()).map_err(qstorage)?;
                        m.attempts = 0;
                        revived.push((k.value().1, m));
                    }
                    for (old_seq, m) in revived {
                        dead.remove((name.as_str(), old_seq)).map_err(qstorage)?;
                        let seq = seqs.fetch_add(1, Ordering::SeqCst) + 1;
                        let bytes = serde_json::to_vec(&m).map_err(qstorage)?;
                        msgs.insert((name.as_str(), seq), bytes.as_slice())
                            .map_err(qstorage)?;
                        log.push(Op::DeadDel(name.clone(), old_seq));
                        log.push(Op::MsgPut(name.clone(), seq, bytes));
                        out.push((seq, m));
                    }
                }
                Ok::<_, QueueError>(out)
            })
            .await?;
        let count = moved.len();
        self.with_queue(queue, |q| {
            let now = Instant::now();
            for (seq, message) in moved {
                q.msgs.insert(
                    seq,
                    MemMsg {
                        message,
                        visible_at: now,
                        in_flight: false,
                    },
                );
            }
            q.notify.notify_one();
        });
        Ok(count)
    }

    async fn dead_letters(&self, queue: &str) -> Result<Vec<QueueMessage>, QueueError> {
        let name = queue.to_string();
        self.blocking(move |db| {
            let read = db.begin_read().map_err(qstorage)?;
            let dead = read.open_table(QUEUE_DEAD).map_err(qstorage)?;
            let mut out = Vec::new();
            for row in dead
                .range((name.as_str(), 0)..=(name.as_str(), u64::MAX))
                .map_err(qstorage)?
            {
                let (_, v) = row.map_err(qstorage)?;
                out.push(serde_json::from_slice(v.value()).map_err(qstorage)?);
            }
            Ok(out)
        })
        .await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let dead = self.dead_letters(queue).await?.len();
        Ok(self.with_queue(queue, |q| QueueStats {
            pending: q.msgs.values().filter(|m| !m.in_flight).count(),
            in_flight: q.msgs.values().filter(|m| m.in_flight).count(),
            dead,
        }))
    }

    async fn queues(&self) -> Vec<QueueConfig> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<QueueConfig> = queues.values().map(|q| q.cfg.clone()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}
