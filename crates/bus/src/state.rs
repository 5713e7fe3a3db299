//! The state port: (scope, key) → JSON with a version number, conditional writes, atomic
//! update ops, and a change feed that drives state triggers.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::{ErrorBody, codes};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "version_conflict on {scope}/{key}: expected version {expected}, found {}",
        found.map(|v| v.to_string()).unwrap_or_else(|| "no record".into())
    )]
    VersionConflict {
        scope: String,
        key: String,
        expected: u64,
        found: Option<u64>,
    },
    /// The record is at the version expected but does not hold the value expected
    /// ([`TxWrite::expected_value`]): the caller's view of it was not what was stored.
    #[error(
        "version_conflict on {scope}/{key}: it is at version {version} but does not hold the value expected"
    )]
    ValueConflict {
        scope: String,
        key: String,
        version: u64,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("storage error: {0}")]
    Storage(String),
}

impl From<StateError> for ErrorBody {
    fn from(e: StateError) -> Self {
        let code = match &e {
            StateError::VersionConflict { .. } | StateError::ValueConflict { .. } => {
                codes::VERSION_CONFLICT
            }
            StateError::Invalid(_) => codes::INVALID_MESSAGE,
            StateError::Storage(_) => codes::STORAGE_ERROR,
        };
        ErrorBody::new(code, e.to_string())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versioned {
    pub value: Value,
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteOutcome {
    pub old_value: Option<Value>,
    pub new_value: Option<Value>,
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    pub value: Value,
    pub version: u64,
}

/// One atomic `state::update` operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum UpdateOp {
    Set {
        #[serde(default)]
        path: String,
        value: Value,
    },
    Append {
        #[serde(default)]
        path: String,
        value: Value,
    },
    Increment {
        #[serde(default)]
        path: String,
        by: f64,
    },
    Remove {
        #[serde(default)]
        path: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    #[serde(rename = "state:created")]
    Created,
    #[serde(rename = "state:updated")]
    Updated,
    #[serde(rename = "state:deleted")]
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Created => "state:created",
            ChangeKind::Updated => "state:updated",
            ChangeKind::Deleted => "state:deleted",
        }
    }
}

/// One committed write, as the change feed reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// Commit order within one backend (embedded); 0 where the feed orders by `position`.
    #[serde(default)]
    pub seq: u64,
    /// The feed's own position of the record (DynamoDB Streams: `shard_id` + sequence number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
    pub kind: ChangeKind,
    pub scope: String,
    pub key: String,
    pub old_value: Option<Value>,
    pub new_value: Option<Value>,
    /// The writer's trace position, so the trigger continues the writer's trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
}

impl ChangeRecord {
    /// An update of `scope`/`key` from `old` to `new`, at no place in a feed and with no
    /// trace: what a filter or a trigger is checked against before any write happens.
    pub fn updated(scope: &str, key: &str, old: Value, new: Value) -> ChangeRecord {
        ChangeRecord {
            seq: 1,
            position: None,
            kind: ChangeKind::Updated,
            scope: scope.to_string(),
            key: key.to_string(),
            old_value: Some(old),
            new_value: Some(new),
            traceparent: None,
            baggage: None,
        }
    }

    /// What acknowledging this record needs (its place in the feed: `seq`, `position`), without
    /// its values or trace context. Dispatched records wait for their handlers and then up to
    /// `ACK_INTERVAL` for their acknowledgement; kept whole, their old and new values (a turn
    /// record each, as JSON trees) were about half of the heap of a busy harness.
    pub fn acknowledgement(&self) -> ChangeRecord {
        ChangeRecord {
            seq: self.seq,
            position: self.position.clone(),
            kind: self.kind,
            scope: String::new(),
            key: String::new(),
            old_value: None,
            new_value: None,
            traceparent: None,
            baggage: None,
        }
    }
}

/// Who wrote: carried into the change record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteMeta {
    pub traceparent: Option<String>,
    pub baggage: Option<String>,
    /// No state trigger watches the written scope (and the start-up grace, in which
    /// reconnecting workers re-register theirs, is over): a backend with its own change feed
    /// may skip the change record, which its dispatcher would drop anyway. Feeds it does not
    /// control (DynamoDB Streams) ignore it.
    pub unwatched: bool,
}

/// Baggage key a caller sets to `deferred` when its writes need not be durable on their own:
/// the embedded backend commits them without an fsync, and they become durable with the next
/// durable commit (at the latest the queue acknowledgement of the step that made them, so a
/// crash loses only the writes of a step that will run again). Backends whose every write is
/// durable (DynamoDB, SQS) ignore it.
pub const DURABILITY_BAGGAGE: &str = "iii.durability";

/// Does this baggage header ask for deferred durability?
pub fn baggage_defers(baggage: Option<&str>) -> bool {
    baggage.is_some_and(|b| {
        b.split(',').any(|kv| {
            kv.split_once('=').is_some_and(|(k, v)| {
                k.trim() == DURABILITY_BAGGAGE
                    && v.split(';').next().is_some_and(|v| v.trim() == "deferred")
            })
        })
    })
}

impl WriteMeta {
    pub fn deferred(&self) -> bool {
        baggage_defers(self.baggage.as_deref())
    }
}

/// Stream items are stored in scope `$stream:<stream name>`.
pub const STREAM_SCOPE_PREFIX: &str = "$stream:";

/// The item attribute (a DynamoDB string set) naming the value's [`filled_fields`]: a stored
/// value is JSON text, which an event-source filter cannot look into, so this is what a
/// filter on the table's stream tests (e.g. a turn record with calls awaiting approval).
pub const FILLED_FIELDS_ATTRIBUTE: &str = "filled";

/// The top-level fields of an object value that hold something: not null, false, an empty
/// string, array or object. Sorted; none for any other value. Bounded by the value itself.
pub fn filled_fields(value: &Value) -> Vec<&str> {
    let Value::Object(fields) = value else {
        return Vec::new();
    };
    let mut filled: Vec<&str> = fields
        .iter()
        .filter(|(_, v)| match v {
            Value::Null | Value::Bool(false) => false,
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        })
        .map(|(k, _)| k.as_str())
        .collect();
    filled.sort_unstable();
    filled
}

/// Scopes starting with `$` are the engine's own (stream items, registries): they never fire
/// state triggers.
pub fn is_reserved_scope(scope: &str) -> bool {
    scope.starts_with('$')
}

pub fn validate_address(scope: &str, key: &str) -> Result<(), StateError> {
    if scope.is_empty() {
        return Err(StateError::Invalid("`scope` must not be empty".into()));
    }
    if key.is_empty() {
        return Err(StateError::Invalid("`key` must not be empty".into()));
    }
    if scope.contains('\0') || key.contains('\0') {
        return Err(StateError::Invalid(
            "`scope` and `key` must not contain NUL".into(),
        ));
    }
    Ok(())
}

#[async_trait]
pub trait StateStore: Send + Sync {
    /// Return once every write committed before this call is durable, deferred ones too
    /// (`iii.durability=deferred`). A store whose writes are durable when they return
    /// (DynamoDB) has nothing to wait for.
    async fn sync(&self) -> Result<(), StateError> {
        Ok(())
    }
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError>;
    /// `expected_version`: `Some(0)` means "only if absent", `Some(n)` "only if at version n".
    async fn set(
        &self,
        scope: &str,
        key: &str,
        value: Value,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError>;
    /// Apply every op to the current value (or `{}`) in one atomic write.
    async fn update(
        &self,
        scope: &str,
        key: &str,
        ops: Vec<UpdateOp>,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError>;
    async fn delete(
        &self,
        scope: &str,
        key: &str,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError>;
    /// One page of a scope's records in key order: at most `limit`, keys after `after` (the
    /// last key of the previous page). The flag says whether more records follow.
    async fn list_page(
        &self,
        scope: &str,
        prefix: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool), StateError>;

    /// Unconditional writes of several records, in order, in as few round trips as the
    /// backend allows (DynamoDB: one `TransactWriteItems` per 100 items or 4 MB). For each
    /// record: whether it existed before, or `None` where the backend cannot tell without
    /// another read. Not atomic as a whole: a failure may leave a prefix written.
    async fn set_many(
        &self,
        items: Vec<(String, String, Value)>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<bool>>, StateError> {
        let mut existed = Vec::with_capacity(items.len());
        for (scope, key, value) in items {
            let out = self.set(&scope, &key, value, None, meta).await?;
            existed.push(Some(out.old_value.is_some()));
        }
        Ok(existed)
    }

    /// Several writes that commit together or not at all (DynamoDB: one
    /// `TransactWriteItems`), each conditional as [`StateStore::set`] is; a version conflict
    /// on any of them writes nothing and names that one. Checked by [`check_transaction`].
    /// → each write's new version, where the backend knows it without another read
    /// (DynamoDB does not for an unconditional write: `None`).
    async fn transact(
        &self,
        writes: Vec<TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<u64>>, StateError>;

    /// [`StateStore::transact`], handing each write's value back with its version, for a
    /// caller that needs them after the commit (`state::transact` pushes its stream items to
    /// subscribers): a store that keeps them through its write spares that caller a copy of
    /// each made beforehand. By default they are copied before the write.
    async fn transact_keeping(
        &self,
        writes: Vec<TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<(Option<u64>, Value)>, StateError> {
        let values: Vec<Value> = writes.iter().map(|w| w.value.clone()).collect();
        let versions = self.transact(writes, meta).await?;
        Ok(versions.into_iter().zip(values).collect())
    }

    /// Every record of a scope (page by page). For internal readers whose lists are bounded
    /// by retention; clients page through `state::list` themselves.
    async fn list(&self, scope: &str, prefix: Option<&str>) -> Result<Vec<Entry>, StateError> {
        let mut out: Vec<Entry> = Vec::new();
        loop {
            let after = out.last().map(|e| e.key.clone());
            let (page, more) = self
                .list_page(scope, prefix, after.as_deref(), LIST_PAGE_MAX)
                .await?;
            out.extend(page);
            if !more {
                return Ok(out);
            }
        }
    }
}

/// The most items one `stream::set_many` call writes.
pub const SET_MANY_MAX: usize = 100;

/// One write of a [`StateStore::transact`]: `value` at (`scope`, `key`) if the record is at
/// `expected_version` (`Some(0)`: absent; `None`: whatever it holds) and, where
/// `expected_value` is given, holds exactly that value: a compare-and-set on the content, for
/// a writer that was told the record's value by someone it does not trust (a caller's copy of
/// what an earlier answer said) and must not write on it unless it is what is stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TxWrite {
    pub scope: String,
    pub key: String,
    pub value: Value,
    pub expected_version: Option<u64>,
    /// Only with an `expected_version` of an existing record (not `None` or `Some(0)`).
    pub expected_value: Option<Value>,
}

impl TxWrite {
    /// `value` at (`scope`, `key`) if the record is at `expected_version`.
    pub fn new(scope: &str, key: &str, value: Value, expected_version: Option<u64>) -> Self {
        Self {
            scope: scope.to_string(),
            key: key.to_string(),
            value,
            expected_version,
            expected_value: None,
        }
    }
}

/// Whether a record at (`scope`, `key`) holding `stored` at the expected version holds the
/// `expected_value` a write asks for → the conflict that names it.
pub fn check_expected_value(
    scope: &str,
    key: &str,
    expected: &Value,
    stored: &Value,
    version: u64,
) -> Result<(), StateError> {
    if expected == stored {
        return Ok(());
    }
    Err(StateError::ValueConflict {
        scope: scope.to_string(),
        key: key.to_string(),
        version,
    })
}

/// The most writes one transaction holds (DynamoDB's `TransactWriteItems` limit).
pub const TRANSACT_MAX_WRITES: usize = 100;
/// The most JSON one transaction holds, keys included (DynamoDB's 4 MB, with room for the
/// attribute names and versions each item repeats).
pub const TRANSACT_MAX_BYTES: usize = 3_500_000;

/// What every backend refuses before it writes anything: no writes, too many or too large,
/// an address twice (DynamoDB refuses two operations on one item), a bad address or value.
pub fn check_transaction(writes: &[TxWrite]) -> Result<(), StateError> {
    if writes.is_empty() {
        return Err(StateError::Invalid(
            "a transaction needs at least one write".into(),
        ));
    }
    if writes.len() > TRANSACT_MAX_WRITES {
        return Err(StateError::Invalid(format!(
            "a transaction holds {} writes; at most {TRANSACT_MAX_WRITES}",
            writes.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(writes.len());
    let mut bound = 0usize;
    for (i, w) in writes.iter().enumerate() {
        validate_address(&w.scope, &w.key)
            .map_err(|e| StateError::Invalid(format!("write {i}: {e}")))?;
        if !seen.insert((w.scope.as_str(), w.key.as_str())) {
            return Err(StateError::Invalid(format!(
                "write {i}: {}/{} is written twice in one transaction",
                w.scope, w.key
            )));
        }
        check_value_depth_of(&w.value, || format!("write {i}'s `value`"))?;
        bound += w.scope.len() + w.key.len() + json_len_bound(&w.value);
        if let Some(expected) = &w.expected_value {
            if matches!(w.expected_version, None | Some(0)) {
                return Err(StateError::Invalid(format!(
                    "write {i}: `expected_value` needs the `expected_version` of an existing record"
                )));
            }
            check_value_depth_of(expected, || format!("write {i}'s `expected_value`"))?;
            bound += json_len_bound(expected);
        }
    }
    if bound <= TRANSACT_MAX_BYTES {
        return Ok(());
    }
    // Maybe over: counted exactly.
    let mut bytes = 0usize;
    for (i, w) in writes.iter().enumerate() {
        bytes += w.scope.len() + w.key.len() + json_len(&w.value);
        bytes += w.expected_value.as_ref().map_or(0, json_len);
        if bytes > TRANSACT_MAX_BYTES {
            return Err(StateError::Invalid(format!(
                "a transaction holds more than {TRANSACT_MAX_BYTES} bytes of JSON (at write {i})"
            )));
        }
    }
    Ok(())
}

/// At least the length of `v`'s JSON text, from the lengths of its strings and the count of
/// its nodes (a string counted as if every byte were escaped), without writing it: a check
/// that a value fits under a limit needs [`json_len`] only when this is over it.
pub fn json_len_bound(v: &Value) -> usize {
    fn string(s: &str) -> usize {
        2 + 6 * s.len()
    }
    match v {
        Value::Null | Value::Bool(_) => 5,
        // The longest a number is written: `-1.7976931348623157e308`, 23 bytes.
        Value::Number(_) => 24,
        Value::String(s) => string(s),
        Value::Array(items) => 2 + items.iter().map(|i| json_len_bound(i) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| string(k) + 2 + json_len_bound(v))
                .sum::<usize>()
        }
    }
}

/// The length of `v`'s JSON text, counted without building it.
pub fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The most records one `state::list` page holds (also its default `limit`).
pub const LIST_PAGE_MAX: usize = 1000;

/// The change feed behind state triggers: at-least-once, in commit order. Records handed out
/// are not handed out again by this process; records not yet acknowledged when the process
/// dies are handed out again after a restart.
#[async_trait]
pub trait ChangeFeed: Send + Sync {
    /// Wait up to `wait` for committed changes not yet handed out.
    async fn next_batch(
        &self,
        max: usize,
        wait: std::time::Duration,
    ) -> Result<Vec<ChangeRecord>, StateError>;
    /// These records (handed out by `next_batch`, in order) have been dispatched: durably
    /// record that, so a restart resumes after them.
    async fn ack(&self, records: &[ChangeRecord]) -> Result<(), StateError>;
}

/// The version a write gives a record now at `current` (None = absent).
///
/// A record created (or created again after a delete) starts at the wall clock in
/// microseconds, not at 1: a reader holding the version of a deleted incarnation must never
/// find it again on a new one, or its conditional write would pass on data it never saw
/// (the ABA problem that once let a stale inbox drain drop one item and return another
/// twice). Updates add 1, and no record takes a write per microsecond for its whole life,
/// so a new incarnation never meets a version an older one had. The value stays below
/// 2^53, so JSON clients read it exactly.
pub fn next_version(current: Option<u64>) -> u64 {
    match current {
        Some(v) => v + 1,
        None => first_version(),
    }
}

fn first_version() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
        .max(1)
}

pub fn check_expected(
    scope: &str,
    key: &str,
    expected: Option<u64>,
    current: Option<u64>,
) -> Result<(), StateError> {
    match expected {
        None => Ok(()),
        Some(0) if current.is_none() => Ok(()),
        Some(n) if current == Some(n) && n > 0 => Ok(()),
        Some(n) => Err(StateError::VersionConflict {
            scope: scope.into(),
            key: key.into(),
            expected: n,
            found: current,
        }),
    }
}

/// Most segments in a `state::update` path.
pub const MAX_PATH_SEGMENTS: usize = 64;
/// Deepest JSON value a write may store (objects and arrays nested in each other).
pub const MAX_VALUE_DEPTH: usize = 64;

/// Whether `v` nests deeper than `max`, found without recursion: a hostile value must not
/// exhaust the stack of the check meant to refuse it.
pub fn deeper_than(v: &Value, max: usize) -> bool {
    // Only containers are stacked (a leaf adds no depth), and without a boxed iterator per
    // node: this walk runs over every value written.
    fn nested(v: &Value) -> bool {
        matches!(v, Value::Array(_) | Value::Object(_))
    }
    if !nested(v) {
        return false;
    }
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, depth)) = stack.pop() {
        if depth + 1 > max {
            return true;
        }
        match v {
            Value::Array(items) => {
                stack.extend(items.iter().filter(|c| nested(c)).map(|c| (c, depth + 1)));
            }
            Value::Object(map) => {
                stack.extend(map.values().filter(|c| nested(c)).map(|c| (c, depth + 1)));
            }
            _ => {}
        }
    }
    false
}

/// Refuse a value to be written that nests deeper than [`MAX_VALUE_DEPTH`].
pub fn check_value_depth(what: &str, v: &Value) -> Result<(), StateError> {
    check_value_depth_of(v, || what.to_string())
}

/// [`check_value_depth`], naming the value only when it is refused (a transaction checks
/// every write's value, and a name formatted for each was a cost of every save).
pub fn check_value_depth_of(v: &Value, what: impl FnOnce() -> String) -> Result<(), StateError> {
    if deeper_than(v, MAX_VALUE_DEPTH) {
        return Err(StateError::Invalid(format!(
            "{} nests deeper than {MAX_VALUE_DEPTH} levels (the limit for stored values)",
            what()
        )));
    }
    Ok(())
}

pub fn check_path(path: &str) -> Result<(), StateError> {
    let sep = if path.starts_with('/') { '/' } else { '.' };
    let segments = path.chars().filter(|c| *c == sep).count() + 1;
    if segments > MAX_PATH_SEGMENTS {
        let shown: String = path.chars().take(40).collect();
        return Err(StateError::Invalid(format!(
            "path `{shown}…` has {segments} segments (at most {MAX_PATH_SEGMENTS})"
        )));
    }
    Ok(())
}

/// Apply update ops to a value (pure; the store makes it atomic). Paths are at most
/// [`MAX_PATH_SEGMENTS`] long and the result at most [`MAX_VALUE_DEPTH`] deep.
pub fn apply_ops(mut current: Value, ops: &[UpdateOp]) -> Result<Value, StateError> {
    for op in ops {
        let path = match op {
            UpdateOp::Set { path, .. }
            | UpdateOp::Append { path, .. }
            | UpdateOp::Increment { path, .. }
            | UpdateOp::Remove { path } => path,
        };
        check_path(path)?;
    }
    for op in ops {
        match op {
            UpdateOp::Set { path, value } => {
                *slot(&mut current, path, true)?.ok_or_else(|| missing(path))? = value.clone();
            }
            UpdateOp::Append { path, value } => {
                let target = slot(&mut current, path, true)?.ok_or_else(|| missing(path))?;
                match target {
                    Value::Null => *target = Value::Array(vec![value.clone()]),
                    Value::Array(items) => items.push(value.clone()),
                    Value::String(s) => match value {
                        Value::String(more) => s.push_str(more),
                        other => {
                            return Err(StateError::Invalid(format!(
                                "append at `{path}`: cannot append {} to a string",
                                crate::protocol::kind_of(other)
                            )));
                        }
                    },
                    other => {
                        return Err(StateError::Invalid(format!(
                            "append at `{path}`: target is {}, not an array or string",
                            crate::protocol::kind_of(other)
                        )));
                    }
                }
            }
            UpdateOp::Increment { path, by } => {
                let target = slot(&mut current, path, true)?.ok_or_else(|| missing(path))?;
                let base = match target {
                    Value::Null => 0.0,
                    Value::Number(n) => n.as_f64().unwrap_or(0.0),
                    other => {
                        return Err(StateError::Invalid(format!(
                            "increment at `{path}`: target is {}, not a number",
                            crate::protocol::kind_of(other)
                        )));
                    }
                };
                let sum = base + by;
                *target = if sum.fract() == 0.0 && sum.abs() < 9.0e15 {
                    Value::from(sum as i64)
                } else {
                    serde_json::Number::from_f64(sum)
                        .map(Value::Number)
                        .ok_or_else(|| {
                            StateError::Invalid(format!(
                                "increment at `{path}`: result is not finite"
                            ))
                        })?
                };
            }
            UpdateOp::Remove { path } => remove_at(&mut current, path)?,
        }
    }
    check_value_depth("the updated value", &current)?;
    Ok(current)
}

fn missing(path: &str) -> StateError {
    StateError::Invalid(format!("path `{path}` does not exist"))
}

/// The value a path (dotted, or a JSON pointer) names in `v`, if there is one. Array
/// elements are named by their index.
pub fn value_at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    split_path(path).iter().try_fold(v, |v, seg| match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => a.get(seg.parse::<usize>().ok()?),
        _ => None,
    })
}

fn split_path(path: &str) -> Vec<String> {
    if path.is_empty() {
        return Vec::new();
    }
    if let Some(pointer) = path.strip_prefix('/') {
        pointer
            .split('/')
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .collect()
    } else {
        path.split('.').map(str::to_owned).collect()
    }
}

/// The slot a path names, creating intermediate objects when `create`.
fn slot<'a>(
    root: &'a mut Value,
    path: &str,
    create: bool,
) -> Result<Option<&'a mut Value>, StateError> {
    let mut cur = root;
    for part in split_path(path) {
        if cur.is_null() && create {
            *cur = Value::Object(Map::new());
        }
        cur = match cur {
            Value::Object(map) => {
                if !map.contains_key(&part) && !create {
                    return Ok(None);
                }
                map.entry(part).or_insert(Value::Null)
            }
            Value::Array(items) => {
                let idx: usize = part.parse().map_err(|_| {
                    StateError::Invalid(format!("path `{path}`: `{part}` is not an array index"))
                })?;
                match items.get_mut(idx) {
                    Some(v) => v,
                    None => {
                        return Err(StateError::Invalid(format!(
                            "path `{path}`: index {idx} is out of bounds"
                        )));
                    }
                }
            }
            other => {
                return Err(StateError::Invalid(format!(
                    "path `{path}`: cannot descend into {}",
                    crate::protocol::kind_of(other)
                )));
            }
        };
    }
    Ok(Some(cur))
}

fn remove_at(root: &mut Value, path: &str) -> Result<(), StateError> {
    let mut parts = split_path(path);
    let Some(last) = parts.pop() else {
        *root = Value::Null;
        return Ok(());
    };
    let parent_path = parts.join(".");
    let parent = if parts.is_empty() {
        Some(root)
    } else if path.starts_with('/') {
        slot(root, &format!("/{}", parts.join("/")), false)?
    } else {
        slot(root, &parent_path, false)?
    };
    match parent {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
    Ok(())
}

/// A backend's failure described in words is a storage error.
impl From<String> for StateError {
    fn from(s: String) -> Self {
        StateError::Storage(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_json_length_bound_is_never_under_the_length() {
        let samples = [
            json!(null),
            json!(true),
            json!(-1.7976931348623157e308),
            json!(u64::MAX),
            json!("plain"),
            json!("\u{1}\u{2}\"\\\n\t"),
            json!("héllo → 世界 🦀"),
            json!([]),
            json!({}),
            json!([1, [2, [3, {"a": null}]], "x"]),
            json!({"k\u{0}ey": {"nested": [true, false, 0.5]}, "": ""}),
        ];
        for v in samples {
            assert!(json_len_bound(&v) >= json_len(&v), "{v}");
        }
        // A big value is bounded within a small factor, so the exact count is rarely needed.
        let text = json!({"message": {"content": [{"type": "text", "text": "a".repeat(10_000)}]}});
        assert!(json_len_bound(&text) < 7 * json_len(&text));
    }

    fn ops(v: Value) -> Vec<UpdateOp> {
        serde_json::from_value(v).expect("ops")
    }

    #[test]
    fn ops_apply_in_order() {
        let out = apply_ops(
            json!({"a": {"n": 1}, "list": [1]}),
            &ops(json!([
                {"type":"increment","path":"a.n","by":2},
                {"type":"append","path":"list","value":2},
                {"type":"append","path":"new","value":"x"},
                {"type":"set","path":"/b/c","value":true},
                {"type":"remove","path":"a"},
                {"type":"increment","path":"f","by":0.5},
            ])),
        )
        .expect("apply");
        assert_eq!(
            out,
            json!({"list":[1,2],"new":["x"],"b":{"c":true},"f":0.5})
        );
    }

    #[test]
    fn depth_is_measured_without_recursion_and_paths_are_bounded() {
        let nest = |d: usize| (0..d).fold(json!(1), |v, _| json!({"k": [v]}));
        assert!(!deeper_than(&json!(1), 0));
        assert!(deeper_than(&json!([1]), 0));
        assert!(!deeper_than(&nest(32), 64));
        assert!(deeper_than(&nest(33), 64));
        // A container counts a level, even empty; a leaf does not.
        assert!(deeper_than(&json!({}), 0));
        assert!(deeper_than(&json!([[], 1]), 1));
        assert!(!deeper_than(&json!([[], 1]), 2));
        assert!(!deeper_than(&json!({"a": 1, "b": "x"}), 1));
        assert!(deeper_than(&json!({"a": 1, "b": {"c": [2]}}), 2));
        assert!(!deeper_than(&json!({"a": 1, "b": {"c": [2]}}), 3));
        // Far deeper than any stack would survive recursively.
        let mut deep = json!(1);
        for _ in 0..200_000 {
            deep = Value::Array(vec![deep]);
        }
        assert!(deeper_than(&deep, MAX_VALUE_DEPTH));
        // Dropping it recursively would overflow the stack too: take it apart iteratively.
        while let Value::Array(mut items) = deep {
            deep = items.pop().unwrap_or(Value::Null);
        }
        let ops = vec![UpdateOp::Set {
            path: vec!["a"; 65].join("."),
            value: json!(1),
        }];
        let err = apply_ops(Value::Null, &ops).unwrap_err().to_string();
        assert!(err.contains("65 segments"), "{err}");
    }

    #[test]
    fn ops_reject_type_mismatch_with_path() {
        let err = apply_ops(
            json!({"s": 1}),
            &ops(json!([{"type":"append","path":"s","value":1}])),
        )
        .unwrap_err();
        assert!(err.to_string().contains("`s`"), "{err}");
        let err = apply_ops(
            json!({"s": "x"}),
            &ops(json!([{"type":"increment","path":"s","by":1}])),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not a number"), "{err}");
    }

    #[test]
    fn expected_version_rules() {
        assert!(check_expected("s", "k", Some(0), None).is_ok());
        assert!(check_expected("s", "k", Some(0), Some(1)).is_err());
        assert!(check_expected("s", "k", Some(2), Some(2)).is_ok());
        assert!(check_expected("s", "k", Some(2), Some(3)).is_err());
        assert!(check_expected("s", "k", Some(1), None).is_err());
        assert!(check_expected("s", "k", None, Some(9)).is_ok());
    }
}
