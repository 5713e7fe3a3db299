//! The session tree in state: session heads, entries, sequence numbers (allocated with a
//! memo of the last head this worker wrote), and chains of appends.

use super::*;

pub async fn load_meta(ctx: &Ctx, sid: &str) -> Result<Option<SessionMeta>, ErrorBody> {
    let v = ctx.state_get(INDEX, sid).await.map_err(storage)?;
    if v.is_null() {
        return Ok(None);
    }
    meta_of(sid, v).map(Some)
}

/// [`load_meta`] with the index as stored (value and version), for a caller's `index_seen`.
pub(crate) async fn load_meta_versioned(
    ctx: &Ctx,
    sid: &str,
) -> Result<Option<(SessionMeta, IndexSeen)>, ErrorBody> {
    let mut v = ctx.state_get_versioned(INDEX, sid).await.map_err(storage)?;
    let (Some(version), value) = (v["version"].as_u64(), v["value"].take()) else {
        return Ok(None);
    };
    if value.is_null() {
        return Ok(None);
    }
    let meta = meta_of(sid, value.clone())?;
    Ok(Some((meta, IndexSeen { value, version })))
}

/// A session's index as stored, read as its metadata.
fn meta_of(sid: &str, value: Value) -> Result<SessionMeta, ErrorBody> {
    serde_json::from_value(value)
        .map_err(|e| ErrorBody::new("storage", format!("unreadable meta of `{sid}`: {e}")))
}

pub(crate) async fn require_meta(ctx: &Ctx, sid: &str) -> Result<SessionMeta, ErrorBody> {
    load_meta(ctx, sid).await?.ok_or_else(|| not_found(sid))
}

pub async fn load_entries(ctx: &Ctx, sid: &str) -> Result<Vec<Entry>, ErrorBody> {
    let v = ctx
        .state_list(ENTRIES, Some(&format!("{sid}/")))
        .await
        .map_err(storage)?;
    let mut out = Vec::new();
    for item in v["items"].as_array().into_iter().flatten() {
        match serde_json::from_value::<Entry>(item["value"].clone()) {
            Ok(e) => out.push(e),
            Err(e) => {
                tracing::warn!(key = %item["key"], error = %e, "unreadable session entry skipped")
            }
        }
    }
    out.sort_by_key(|e| e.seq);
    Ok(out)
}

pub(crate) async fn load_entry(
    ctx: &Ctx,
    sid: &str,
    eid: &str,
) -> Result<Option<Entry>, ErrorBody> {
    let v = ctx
        .state_get(ENTRIES, &entry_key(sid, eid))
        .await
        .map_err(storage)?;
    if v.is_null() {
        return Ok(None);
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| ErrorBody::new("storage", format!("unreadable entry `{eid}`: {e}")))
}

/// A fresh session's meta, with the request's `title` and `metadata`.
pub(crate) fn new_meta(sid: &str, data: &Value) -> SessionMeta {
    let t = now();
    SessionMeta {
        session_id: sid.to_string(),
        created_at_ms: t,
        updated_at_ms: t,
        seq: 0,
        title: data["title"].as_str().map(str::to_owned),
        copied_from: None,
        metadata: data.get("metadata").cloned().unwrap_or(Value::Null),
        last_entry: None,
    }
}

/// Create the session's meta if absent → (meta, created).
pub(crate) async fn create_meta(
    ctx: &Ctx,
    meta: SessionMeta,
) -> Result<(SessionMeta, bool), ErrorBody> {
    let (meta, created, _) = create_meta_versioned(ctx, meta).await?;
    Ok((meta, created))
}

/// [`create_meta`] → also the index as written, when this call wrote it (remembered too, so
/// this process's first append on the new session reads nothing).
pub(crate) async fn create_meta_versioned(
    ctx: &Ctx,
    meta: SessionMeta,
) -> Result<(SessionMeta, bool, Option<IndexSeen>), ErrorBody> {
    let value = serde_json::to_value(&meta).map_err(|e| ErrorBody::invalid(e.to_string()))?;
    match ctx
        .state_set_if(INDEX, &meta.session_id, value.clone(), 0)
        .await
    {
        Ok(out) => {
            let index = out["version"].as_u64().map(|version| {
                memo::wrote_index(&meta.session_id, value.clone(), version);
                IndexSeen { value, version }
            });
            Ok((meta, true, index))
        }
        Err(BusError::VersionConflict(_)) => {
            let existing = load_meta_versioned(ctx, &meta.session_id).await?;
            let (existing, index) = existing.ok_or_else(|| not_found(&meta.session_id))?;
            Ok((existing, false, Some(index)))
        }
        Err(e) => Err(storage(e)),
    }
}

/// Reserve `n` entry seq numbers → the first one, and the index version written.
pub(crate) async fn alloc_seq(
    ctx: &Ctx,
    sid: &str,
    n: u64,
) -> Result<(u64, Option<u64>), ErrorBody> {
    let out = ctx
        .state_update(
            INDEX,
            sid,
            json!([{"type": "increment", "path": "seq", "by": n}, {"type": "set", "path": "updated_at_ms", "value": now()}]),
        )
        .await
        .map_err(storage)?;
    let last = out["new_value"]["seq"].as_f64().unwrap_or(0.0) as u64;
    let version = out["version"].as_u64();
    if let Some(version) = version {
        memo::wrote_index(sid, out["new_value"].clone(), version);
    }
    Ok((last + 1 - n, version))
}

/// What this process last wrote to a session's index, and the entry it appended after.
///
/// An append whose parent is that entry (the orchestrator's next append, nearly always) writes
/// the index conditionally on the remembered version, without reading it first and without
/// reading the parent. The condition holding proves nobody wrote the index since (versions
/// never repeat), so the remembered entry was written to this same store and still exists
/// (entries are never deleted). Two reads fewer per append; any other writer of the index
/// makes the condition fail, and the append takes the checked path.
pub(crate) mod memo {
    use serde_json::Value;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Sessions remembered; the map is emptied when it is full (a miss only costs the reads).
    const SESSIONS: usize = 1024;

    #[derive(Clone)]
    pub struct Memo {
        pub index: Value,
        pub version: u64,
        pub last_entry: Option<String>,
    }

    static MEMOS: Mutex<Option<HashMap<String, Memo>>> = Mutex::new(None);

    fn with<T>(f: impl FnOnce(&mut HashMap<String, Memo>) -> T) -> T {
        let mut g = MEMOS.lock().unwrap_or_else(|p| p.into_inner());
        f(g.get_or_insert_with(HashMap::new))
    }

    pub fn get(sid: &str) -> Option<Memo> {
        with(|m| m.get(sid).cloned())
    }

    pub fn forget(sid: &str) {
        with(|m| m.remove(sid));
    }

    pub fn wrote_index(sid: &str, index: Value, version: u64) {
        with(|m| {
            if m.len() >= SESSIONS && !m.contains_key(sid) {
                m.clear();
            }
            m.insert(
                sid.to_string(),
                Memo {
                    index,
                    version,
                    last_entry: None,
                },
            );
        })
    }

    /// `entry` is stored, after the index write at `version`.
    pub fn appended(sid: &str, version: u64, entry: &str) {
        with(|m| {
            if let Some(memo) = m.get_mut(sid).filter(|memo| memo.version == version) {
                memo.last_entry = Some(entry.to_string());
            }
        })
    }
}

/// A session's index as an append's answer gave it (`index`), which the caller hands back
/// with its next append (`index_seen`): the index's value and version.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSeen {
    pub value: Value,
    pub version: u64,
}

/// The most JSON of an index an append answers (`index`): a session whose metadata is larger
/// answers none, and its appends read the index where this process does not remember it.
pub const INDEX_ANSWER_MAX_BYTES: usize = 4096;

impl IndexSeen {
    /// The request's `index_seen` (`{value, version}`), absent or null: none. Anything else is
    /// refused by name: it is a caller's claim, checked by the append's transaction.
    pub fn from_request(data: &Value) -> Result<Option<IndexSeen>, ErrorBody> {
        let seen = match data.get("index_seen") {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        let (value, version) = match (
            seen.get("value"),
            seen.get("version").and_then(Value::as_u64),
        ) {
            (Some(value @ Value::Object(_)), Some(version)) if version > 0 => (value, version),
            _ => {
                return Err(ErrorBody::invalid(
                    "`index_seen` must be `{value: <the index as answered>, version: <a positive integer>}`",
                ));
            }
        };
        // No index this worker answers is larger or nests deeper: such a claim is refused
        // here rather than failing the append's transaction.
        bus::state::check_value_depth("`index_seen.value`", value)
            .map_err(|e| ErrorBody::invalid(e.to_string()))?;
        if bus::state::json_len_bound(value) > INDEX_ANSWER_MAX_BYTES
            && bus::state::json_len(value) > INDEX_ANSWER_MAX_BYTES
        {
            return Err(ErrorBody::invalid(format!(
                "`index_seen.value` holds more than {INDEX_ANSWER_MAX_BYTES} bytes of JSON: no index is answered that large"
            )));
        }
        Ok(Some(IndexSeen {
            value: value.clone(),
            version,
        }))
    }

    /// As answered: with the layout, so a caller may carry its next append
    /// (`harness_sdk::session_layout`).
    pub fn to_json(&self) -> Value {
        json!({"value": self.value, "version": self.version, "layout": harness_sdk::session_layout::LAYOUT})
    }

    /// Small enough to answer ([`INDEX_ANSWER_MAX_BYTES`]).
    pub fn fits_an_answer(&self) -> bool {
        bus::state::json_len_bound(&self.value) <= INDEX_ANSWER_MAX_BYTES
            || bus::state::json_len(&self.value) <= INDEX_ANSWER_MAX_BYTES
    }
}

/// Where an append's index comes from: this process's memo (it wrote that index), or a
/// caller's word, which the transaction then also requires the stored index to hold.
struct Base {
    index: Value,
    version: u64,
    trusted: bool,
}

/// The fast path of an append after `parent` (`None`: a new root): the index (seq numbers
/// reserved, `last_entry` set) and the new entries in one transaction, conditional on the
/// index's version and on each entry being absent. The index is what this process's memo
/// says it wrote, when the memo's last entry is `parent` (a new root: any); else the
/// caller's `index_seen`, when its `last_entry` is `parent` (likewise; the transaction then also requires the stored index to hold exactly that value:
/// a caller's copy cannot write what the store does not hold); else it is read. The version
/// holding proves nobody wrote the index since; `last_entry` is written only in the
/// transaction that creates that entry, so the parent exists (entries are never deleted).
/// `None` when no base applies, the chain is too large for one transaction, or a condition
/// failed (another writer, a stale or altered `index_seen`, or a retried append whose entries
/// exist): the checked path then decides.
async fn fast_append(
    ctx: &Ctx,
    sid: &str,
    parent: Option<&str>,
    inputs: &[EntryInput],
    seen: Option<&IndexSeen>,
) -> Result<Option<(Vec<(Entry, bool)>, IndexSeen)>, ErrorBody> {
    if inputs.len() >= bus::state::TRANSACT_MAX_WRITES {
        return Ok(None);
    }
    let read = || async {
        Ok::<_, ErrorBody>(memo_read(ctx, sid, parent).await?.map(|m| Base {
            index: m.index,
            version: m.version,
            trusted: true,
        }))
    };
    // A new root needs no parent: any index this process wrote, or the caller was
    // answered, will do (its version still proves nobody allocated since).
    let attaches = |last_entry: Option<&str>| parent.is_none() || last_entry == parent;
    let remembered = memo::get(sid).filter(|m| attaches(m.last_entry.as_deref()));
    let told = seen.filter(|s| attaches(s.value["last_entry"].as_str()));
    let base = match (remembered, told) {
        // A caller's index newer than this process's memo: another writer (a caller that
        // carried its append in its own transaction) wrote after this process did.
        (Some(m), Some(s)) if s.version > m.version => Base {
            index: s.value.clone(),
            version: s.version,
            trusted: false,
        },
        (Some(m), _) => Base {
            index: m.index,
            version: m.version,
            trusted: true,
        },
        (None, Some(s)) => Base {
            index: s.value.clone(),
            version: s.version,
            trusted: false,
        },
        (None, None) => match read().await? {
            Some(base) => base,
            None => return Ok(None),
        },
    };
    let from_caller = !base.trusted;
    match append_on(ctx, sid, parent, inputs, base).await? {
        Some(done) => Ok(Some(done)),
        // The caller's index was not the stored one (another writer since, or altered): as
        // if it had not been given.
        None if from_caller => match read().await? {
            Some(base) => append_on(ctx, sid, parent, inputs, base).await,
            None => Ok(None),
        },
        None => Ok(None),
    }
}

/// One transaction of [`fast_append`] on `base` → `None` when a condition failed.
async fn append_on(
    ctx: &Ctx,
    sid: &str,
    parent: Option<&str>,
    inputs: &[EntryInput],
    base: Base,
) -> Result<Option<(Vec<(Entry, bool)>, IndexSeen)>, ErrorBody> {
    use harness_sdk::session_layout::plan_append;
    let on = harness_sdk::session_layout::Base {
        index: &base.index,
        version: base.version,
        check_value: !base.trusted,
    };
    // Half a transaction of entries at most (the checked path takes larger chains).
    let Some(plan) = plan_append(
        sid,
        parent,
        inputs,
        on,
        bus::state::TRANSACT_MAX_BYTES / 2,
        new_id,
        now(),
    ) else {
        return Ok(None);
    };
    let (writes, index) = (plan.writes, plan.index);
    let entries: Vec<(Entry, bool)> = plan.entries.into_iter().map(|e| (e, true)).collect();
    match ctx.state_commit(writes, Vec::new()).await {
        Ok(out) => {
            let version = out["versions"][0].as_u64().unwrap_or(base.version + 1);
            memo::wrote_index(sid, index.clone(), version);
            if let Some((last, _)) = entries.last() {
                memo::appended(sid, version, &last.id);
            }
            Ok(Some((
                entries,
                IndexSeen {
                    value: index,
                    version,
                },
            )))
        }
        Err(BusError::VersionConflict(_)) => {
            memo::forget(sid);
            Ok(None)
        }
        Err(e) => Err(storage(e)),
    }
}

/// What the memo would hold, read: the index with its version and the parent (none for a
/// new root), at once (one round trip). Another instance of this worker wrote the session
/// last (a Lambda's second warm instance), so this one remembers nothing; the parent read
/// proves it exists, and the index written at the version read proves nobody allocated
/// since. `None` (the checked path decides, and names what is missing) when either is
/// absent.
async fn memo_read(
    ctx: &Ctx,
    sid: &str,
    parent: Option<&str>,
) -> Result<Option<memo::Memo>, ErrorBody> {
    let parent_read = async {
        match parent {
            Some(p) => load_entry(ctx, sid, p).await.map(|e| e.is_some()),
            None => Ok(true),
        }
    };
    let (index, parent_exists) = tokio::join!(ctx.state_get_versioned(INDEX, sid), parent_read);
    let index = index.map_err(storage)?;
    let (Some(version), true) = (index["version"].as_u64(), parent_exists?) else {
        return Ok(None);
    };
    Ok(Some(memo::Memo {
        index: index["value"].clone(),
        version,
        last_entry: parent.map(str::to_string),
    }))
}

/// Where an append attaches.
pub enum Parent {
    /// The session's current leaf (`parent_id` absent).
    Leaf,
    /// A new root (`parent_id: null`).
    Root,
    Id(String),
}

impl Parent {
    pub(crate) fn from_request(data: &Value) -> Result<Parent, ErrorBody> {
        match data.get("parent_id") {
            None => Ok(Parent::Leaf),
            Some(Value::Null) => Ok(Parent::Root),
            Some(Value::String(s)) => Ok(Parent::Id(s.clone())),
            Some(_) => Err(ErrorBody::invalid("`parent_id` must be a string or null")),
        }
    }
}

/// Append entries as a chain (each the parent of the next) → each stored entry and whether
/// this call created it.
pub async fn append_chain(
    ctx: &Ctx,
    sid: &str,
    parent: Parent,
    inputs: Vec<EntryInput>,
) -> Result<Vec<(Entry, bool)>, ErrorBody> {
    Ok(append_chain_seen(ctx, sid, parent, inputs, None).await?.0)
}

/// [`append_chain`] with the index the caller was last answered (`index_seen`) → also the
/// index this append wrote, where it wrote it in one transaction with the entries (the
/// caller hands it back with its next append).
pub async fn append_chain_seen(
    ctx: &Ctx,
    sid: &str,
    parent: Parent,
    inputs: Vec<EntryInput>,
    seen: Option<&IndexSeen>,
) -> Result<(Vec<(Entry, bool)>, Option<IndexSeen>), ErrorBody> {
    for input in &inputs {
        if let Some(id) = &input.id {
            valid_id("id", id)?;
        }
    }
    let fast_parent = match &parent {
        Parent::Id(p) => Some(Some(p.as_str())),
        Parent::Root => Some(None),
        Parent::Leaf => None,
    };
    if let Some(fast_parent) = fast_parent
        && !inputs.is_empty()
        && let Some((stored, index)) = fast_append(ctx, sid, fast_parent, &inputs, seen).await?
    {
        return Ok((stored, Some(index)));
    }
    let (first_seq, mut parent, index_version) =
        match checked_alloc(ctx, sid, parent, inputs.len()).await? {
            Some(reserved) => reserved,
            None => return Ok((Vec::new(), None)),
        };
    let mut out = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.into_iter().enumerate() {
        let entry = Entry {
            id: input.id.unwrap_or_else(new_id),
            parent_id: parent.clone(),
            timestamp: input.timestamp.unwrap_or_else(now),
            seq: first_seq + i as u64,
            body: input.body,
        };
        let value = serde_json::to_value(&entry).map_err(|e| ErrorBody::invalid(e.to_string()))?;
        let stored = match ctx
            .state_set_if(ENTRIES, &entry_key(sid, &entry.id), value, 0)
            .await
        {
            Ok(_) => (entry, true),
            // Already appended (a retried step): the stored entry is the truth.
            Err(BusError::VersionConflict(_)) => (
                load_entry(ctx, sid, &entry.id)
                    .await?
                    .ok_or_else(|| entry_not_found(sid, &entry.id))?,
                false,
            ),
            Err(e) => return Err(storage(e)),
        };
        parent = Some(stored.0.id.clone());
        out.push(stored);
    }
    if let (Some(version), Some(last)) = (index_version, out.last()) {
        memo::appended(sid, version, &last.0.id);
    }
    Ok((out, None))
}

/// The checked path of an append: the session and the parent exist → (the first of `n` seq
/// numbers reserved, the parent, the index version written), or None when there is nothing
/// to append.
pub(crate) async fn checked_alloc(
    ctx: &Ctx,
    sid: &str,
    parent: Parent,
    n: usize,
) -> Result<Option<(u64, Option<String>, Option<u64>)>, ErrorBody> {
    // The session and the parent are checked at once (two reads, one round trip of latency).
    // A parent named by id that exists proves the session does too (entries are written
    // only into sessions that exist, and sessions are never deleted): one read, not two.
    let named_parent = matches!(parent, Parent::Id(_));
    let parent_check = async {
        match parent {
            Parent::Root => Ok(None),
            Parent::Id(p) => {
                if load_entry(ctx, sid, &p).await?.is_none() {
                    return Err(entry_not_found(sid, &p));
                }
                Ok(Some(p))
            }
            Parent::Leaf => Ok(tree::leaf(&load_entries(ctx, sid).await?).map(|e| e.id.clone())),
        }
    };
    let session_check = async {
        if named_parent {
            Ok(())
        } else {
            require_meta(ctx, sid).await.map(|_| ())
        }
    };
    let (meta, parent) = tokio::join!(session_check, parent_check);
    meta?;
    let parent = parent?;
    if n == 0 {
        return Ok(None);
    }
    let (first_seq, version) = alloc_seq(ctx, sid, n as u64).await?;
    Ok(Some((first_seq, parent, version)))
}

pub(crate) fn entry_input(mut v: Value) -> Result<EntryInput, ErrorBody> {
    // Shorthand: a bare AgentMessage under `message`.
    if v.get("type").is_none() && v.get("message").is_some() {
        v["type"] = json!("message");
    }
    if let Some(input) = message_entry(&mut v) {
        return input;
    }
    serde_json::from_value(v).map_err(|e| ErrorBody::invalid(format!("invalid entry: {e}")))
}

/// A message entry (nearly every append) read field by field: serde reads a flattened,
/// tagged body by copying the whole entry into a buffer twice over before the message's own
/// read. `None` (nothing taken from `v`) when it is not plainly one: the general read then
/// decides, and names what is wrong.
fn message_entry(v: &mut Value) -> Option<Result<EntryInput, ErrorBody>> {
    let obj = v.as_object_mut()?;
    if obj.get("type")?.as_str()? != "message" || !obj.get("message")?.is_object() {
        return None;
    }
    let id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return None,
    };
    let timestamp = match obj.get("timestamp") {
        None | Some(Value::Null) => None,
        Some(t) => Some(t.as_u64()?),
    };
    let message = obj.remove("message")?;
    Some(
        serde_json::from_value::<harness_sdk::messages::AgentMessage>(message)
            .map(|message| EntryInput {
                id,
                timestamp,
                body: EntryBody::Message { message },
            })
            .map_err(|e| ErrorBody::invalid(format!("invalid entry: message: {e}"))),
    )
}

pub(crate) fn stored_json(stored: &(Entry, bool)) -> Value {
    json!({"entry_id": stored.0.id, "created": stored.1, "entry": stored.0})
}

// ------------------------------------------------------------------ session-tree::*

#[cfg(test)]
mod tests {
    use super::*;

    /// The general read of an entry, as before the message fast path.
    fn general(v: Value) -> Result<EntryInput, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn a_message_entry_reads_as_the_general_read_does() {
        let message =
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 5});
        for v in [
            json!({"type": "message", "message": message}),
            json!({"type": "message", "message": message, "id": "e1", "timestamp": 7}),
            json!({"type": "message", "message": message, "id": null, "timestamp": null, "extra": [1]}),
        ] {
            let fast = entry_input(v.clone()).expect("reads");
            let slow = general(v).expect("reads");
            assert_eq!(
                (fast.id, fast.timestamp, fast.body),
                (slow.id, slow.timestamp, slow.body)
            );
        }
        // The shorthand (no `type`) is a message too.
        let short = entry_input(json!({"message": message, "id": "e2"})).expect("reads");
        assert_eq!(short.id.as_deref(), Some("e2"));
        assert_eq!(short.body.kind(), "message");
    }

    #[test]
    fn a_message_entry_of_the_wrong_shape_is_refused_with_what_is_wrong() {
        let message =
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 5});
        for (v, names) in [
            (
                json!({"type": "message", "message": {"role": "nobody"}}),
                "message",
            ),
            (
                json!({"type": "message", "message": message, "id": 3}),
                "invalid type",
            ),
            (
                json!({"type": "message", "message": message, "timestamp": -1}),
                "invalid value",
            ),
            (
                json!({"type": "message", "message": "text"}),
                "invalid type",
            ),
            (json!({"type": "message"}), "message"),
        ] {
            let err = entry_input(v.clone()).expect_err(&v.to_string());
            assert!(err.message.starts_with("invalid entry"), "{}", err.message);
            assert!(err.message.contains(names), "{v}: {}", err.message);
        }
    }
}
