//! The session worker: a branching session store (`session-tree::*`) and per-session inboxes
//! (`session-inbox::*`), SPEC §3 session.
//!
//! Layout: `session-index/<sid>` holds the session's meta (with the `seq` counter that orders
//! entries), `session-entries/<sid>/<entry_id>` one entry each. An append creates its entry
//! only if absent, so an append retried with the same (deterministic) id returns the entry
//! already stored instead of adding a second one. The current leaf is derived from the
//! entries themselves (newest entry that is nobody's parent), never from a pointer that a
//! crash could leave dangling.

mod store;
pub mod tree;
pub mod types;

use store::*;
pub use store::{Parent, append_chain, load_entries, load_meta};

/// Forget what this process remembers of `session_id`'s index, as a freshly started instance
/// of the worker would (tests of the paths such an instance takes).
#[doc(hidden)]
pub fn forget_remembered(session_id: &str) {
    store::memo::forget(session_id);
}

use bus::builtins::req_str;
use harness_sdk::contracts::{inbox, session_tree};
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, Worker, Write, def, fields};
use serde_json::{Value, json};
use tree::TreeError;
use types::*;

fn storage(e: BusError) -> ErrorBody {
    ErrorBody::new("storage", format!("session storage failed: {e}"))
}

fn not_found(sid: &str) -> ErrorBody {
    ErrorBody::new("not_found", format!("session `{sid}` does not exist"))
}

/// Another's session answers exactly as one that does not exist.
async fn visible(ctx: &Ctx, sid: &str) -> Result<(), ErrorBody> {
    match harness_sdk::owners::may_see(ctx, sid).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(not_found(sid)),
        Err(e) => Err(storage(e)),
    }
}

fn entry_not_found(sid: &str, eid: &str) -> ErrorBody {
    ErrorBody::new(
        "entry_not_found",
        format!("session `{sid}` has no entry `{eid}`"),
    )
}

fn tree_error(sid: &str, e: TreeError) -> ErrorBody {
    match e {
        TreeError::EntryNotFound(id) => entry_not_found(sid, &id),
        TreeError::Broken(why) => ErrorBody::new("storage", format!("session `{sid}`: {why}")),
    }
}

/// Session and entry ids are key parts: non-empty, no `/`.
fn valid_id(field: &str, v: &str) -> Result<(), ErrorBody> {
    if v.is_empty() || v.contains('/') || v.chars().any(char::is_control) {
        return Err(ErrorBody::invalid(format!(
            "`{field}` must be non-empty, without `/` or control characters"
        )));
    }
    Ok(())
}

fn sid_of(data: &Value, field: &str) -> Result<String, ErrorBody> {
    let sid = req_str(data, field)?;
    valid_id(field, &sid)?;
    Ok(sid)
}

fn new_id() -> String {
    bus_telemetry::trace::random_hex(8)
}

fn now() -> u64 {
    harness_sdk::messages::now_ms()
}

async fn create(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = match data.get("session_id") {
        None | Some(Value::Null) => new_id(),
        Some(_) => sid_of(&data, "session_id")?,
    };
    let (meta, created) = create_meta(&ctx, new_meta(&sid, &data)).await?;
    if !created {
        return Err(ErrorBody::new(
            "already_exists",
            format!("session `{sid}` already exists (session-tree::ensure accepts that)"),
        ));
    }
    Ok(json!({"session_id": sid, "created": true, "session": meta}))
}

/// → `{session_id, created, session}`, and the session's index as `index` (`{value, version}`,
/// when at most 4 KB of JSON): the caller's first append may hand it back as `index_seen`,
/// so a run's start appends without reading the index.
async fn ensure(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    let (meta, created, index) = match store::load_meta_versioned(&ctx, &sid).await? {
        Some((meta, index)) => (meta, false, Some(index)),
        None => store::create_meta_versioned(&ctx, new_meta(&sid, &data)).await?,
    };
    let mut answer = json!({"session_id": sid, "created": created, "session": meta});
    if let Some(index) = index.filter(store::IndexSeen::fits_an_answer) {
        answer["index"] = index.to_json();
    }
    Ok(answer)
}

async fn append(ctx: Ctx, mut data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    let entry = data.get_mut("entry").map(Value::take);
    let input = match entry {
        Some(e) => entry_input(e)?,
        None if data.get("message").is_some() => {
            entry_input(json!({"message": data["message"], "id": data.get("id")}))?
        }
        None => return Err(ErrorBody::invalid("missing `entry` (or `message`)")),
    };
    let stored = append_chain(&ctx, &sid, Parent::from_request(&data)?, vec![input]).await?;
    Ok(stored_json(&stored[0]))
}

async fn append_batch(ctx: Ctx, mut data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    let inputs = match data["entries"].take() {
        Value::Array(entries) => entries
            .into_iter()
            .map(entry_input)
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(ErrorBody::invalid("`entries` must be an array")),
    };
    let peek = match data.get("peek_inboxes") {
        None | Some(Value::Null) => None,
        Some(names) => Some(peek_names(names)?),
    };
    let with_messages = bus::builtins::opt_bool(&data, "with_messages")?.unwrap_or(false);
    let seen = store::IndexSeen::from_request(&data)?;
    let mut parent = Parent::from_request(&data)?;
    // Entries that attach at the current leaf: the context there is read first, and its leaf
    // is where they go (one read, which also finds the leaf).
    let mut before = None;
    if with_messages {
        // The context is read beside the visibility check (nothing is answered from it, or
        // written, unless the caller may see the session).
        let (seen_by_caller, read) = tokio::join!(visible(&ctx, &sid), async {
            match parent {
                Parent::Leaf => Some(context_of(&ctx, &sid, None).await),
                _ => None,
            }
        });
        seen_by_caller?;
        if let Some(read) = read {
            let (leaf, path, context) = read?;
            parent = leaf.clone().map_or(Parent::Root, Parent::Id);
            before = Some((leaf, path.len(), context));
        }
    }
    // The peek reads beside the append, not after it: it reads the inboxes, which the
    // append does not write, and a message that lands a moment after the read is seen at
    // the next check, as it would be a moment after a later read.
    let peeked = async {
        match &peek {
            Some(names) => Some(peek_first(&ctx, &sid, names).await),
            None => None,
        }
    };
    let (stored, peeked) = tokio::join!(
        store::append_chain_seen(&ctx, &sid, parent, inputs, seen.as_ref()),
        peeked
    );
    let (stored, index) = stored?;
    let mut answer = fields([
        (
            "entry_ids",
            stored.iter().map(|s| Value::from(s.0.id.clone())).collect(),
        ),
        ("leaf_id", json!(stored.last().map(|s| s.0.id.clone()))),
        ("entries", stored.iter().map(stored_json).collect()),
    ]);
    if with_messages {
        answer["messages"] = context_after(&ctx, &sid, before, &stored).await?;
    }
    if let Some(index) = index.filter(store::IndexSeen::fits_an_answer) {
        answer["index"] = index.to_json();
    }
    // An inbox that could not be read leaves `inbox` out (the entries are stored), and the
    // caller peeks on its own.
    match peeked {
        Some(Ok(inbox)) => answer["inbox"] = inbox,
        Some(Err(e)) => {
            tracing::warn!(session = %sid, error = %e.message, "inboxes not peeked beside an append")
        }
        None => {}
    }
    Ok(answer)
}

/// A model context read at a leaf: the leaf, the path's length, each message with its entry.
type ContextAt = (
    Option<String>,
    usize,
    Vec<(String, harness_sdk::messages::AgentMessage)>,
);

/// `append_batch`'s `messages`: the model context at the new leaf, as `session-tree::messages`
/// answers it. The context read before the append, with the stored entries' messages after
/// it; read again when there was none, when an entry changes more than its own message (a
/// compaction), or when an entry was there already (a retried append: the context read
/// before may hold it).
async fn context_after(
    ctx: &Ctx,
    sid: &str,
    before: Option<ContextAt>,
    stored: &[(Entry, bool)],
) -> Result<Value, ErrorBody> {
    let extends = stored
        .iter()
        .all(|(e, created)| *created && !matches!(e.body, EntryBody::Compaction { .. }));
    let (leaf, path_length, context) = match before {
        Some((leaf, path_length, mut context)) if extends => {
            context.extend(
                stored
                    .iter()
                    .filter_map(|(e, _)| tree::entry_message(e).map(|m| (e.id.clone(), m))),
            );
            let leaf = stored.last().map(|(e, _)| e.id.clone()).or(leaf);
            (leaf, path_length + stored.len(), context)
        }
        _ => {
            let leaf = stored.last().map(|(e, _)| e.id.as_str());
            let (leaf, path, context) = context_of(ctx, sid, leaf).await?;
            (leaf, path.len(), context)
        }
    };
    let (entry_ids, messages) = context.into_iter().unzip();
    Ok(json!(session_tree::MessagesAnswer {
        session_id: sid.to_string(),
        leaf_id: leaf,
        path_length: path_length as u64,
        entry_ids,
        messages,
    }))
}

/// The path to `leaf_id` (default: the current leaf) and its model context.
pub async fn context_of(
    ctx: &Ctx,
    sid: &str,
    leaf_id: Option<&str>,
) -> Result<
    (
        Option<String>,
        Vec<Entry>,
        Vec<(String, harness_sdk::messages::AgentMessage)>,
    ),
    ErrorBody,
> {
    // Both at once: the entries read is thrown away when the session is not there.
    let (meta, entries) = tokio::join!(require_meta(ctx, sid), load_entries(ctx, sid));
    meta?;
    let entries = entries?;
    let leaf = match leaf_id {
        Some(id) => Some(id.to_string()),
        None => tree::leaf(&entries).map(|e| e.id.clone()),
    };
    let Some(leaf) = leaf else {
        return Ok((None, Vec::new(), Vec::new()));
    };
    let path = tree::path(&entries, &leaf).map_err(|e| tree_error(sid, e))?;
    let context = tree::context(&path);
    let path: Vec<Entry> = path.into_iter().cloned().collect();
    Ok((Some(leaf), path, context))
}

async fn messages(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    visible(&ctx, &sid).await?;
    let leaf = data["leaf_id"].as_str();
    let (leaf, path, context) = context_of(&ctx, &sid, leaf).await?;
    let (entry_ids, messages) = context.into_iter().unzip();
    Ok(json!(session_tree::MessagesAnswer {
        session_id: sid,
        leaf_id: leaf,
        path_length: path.len() as u64,
        entry_ids,
        messages,
    }))
}

/// Write a copy of `entries` (already ordered, parents before children) as a new session.
async fn write_copy(
    ctx: &Ctx,
    new_sid: &str,
    copied_from: Value,
    entries: Vec<Entry>,
) -> Result<(), ErrorBody> {
    let t = now();
    let (_, created) = create_meta(
        ctx,
        SessionMeta {
            session_id: new_sid.to_string(),
            created_at_ms: t,
            updated_at_ms: t,
            seq: 0,
            title: None,
            copied_from: Some(copied_from),
            metadata: Value::Null,
            last_entry: None,
        },
    )
    .await?;
    if !created {
        return Err(ErrorBody::new(
            "already_exists",
            format!("session `{new_sid}` already exists"),
        ));
    }
    let (first, _) = alloc_seq(ctx, new_sid, entries.len().max(1) as u64).await?;
    for (i, mut e) in entries.into_iter().enumerate() {
        e.seq = first + i as u64;
        let value = serde_json::to_value(&e).map_err(|e| ErrorBody::invalid(e.to_string()))?;
        ctx.state_set(ENTRIES, &entry_key(new_sid, &e.id), value)
            .await
            .map_err(storage)?;
    }
    Ok(())
}

/// A fork or a clone is owned by whoever made it: the new id is claimed first, and another's
/// id is refused as one that exists.
async fn claim_copy(ctx: &Ctx, new_sid: &str) -> Result<(), ErrorBody> {
    match harness_sdk::owners::claim(ctx, new_sid).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(ErrorBody::new(
            "already_exists",
            format!("session `{new_sid}` already exists"),
        )),
        Err(e) => Err(storage(e)),
    }
}

async fn fork(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let source = sid_of(&data, "source_session_id")?;
    let from = req_str(&data, "from_entry_id")?;
    let new_sid = match data.get("new_session_id") {
        None | Some(Value::Null) => new_id(),
        Some(_) => sid_of(&data, "new_session_id")?,
    };
    visible(&ctx, &source).await?;
    require_meta(&ctx, &source).await?;
    claim_copy(&ctx, &new_sid).await?;
    let entries = load_entries(&ctx, &source).await?;
    let path = tree::path(&entries, &from).map_err(|e| tree_error(&source, e))?;
    let mut copy: Vec<Entry> = Vec::new();
    let mut summarized = 0;
    let kept = if path.len() > FORK_COPY_LIMIT {
        let (head, tail) = path.split_at(path.len() - FORK_COPY_LIMIT);
        summarized = head.len();
        let summary = Entry {
            id: format!("fork-summary-{}", head[head.len() - 1].id),
            parent_id: None,
            timestamp: now(),
            seq: 0,
            body: EntryBody::BranchSummary {
                summary: tree::digest(head),
                entries_summarized: head.len(),
                from_session_id: Some(source.clone()),
            },
        };
        copy.push(summary);
        tail
    } else {
        &path[..]
    };
    for (i, e) in kept.iter().enumerate() {
        let mut e = (*e).clone();
        if i == 0 {
            e.parent_id = copy.first().map(|s| s.id.clone());
        }
        copy.push(e);
    }
    let copied = copy.len();
    write_copy(
        &ctx,
        &new_sid,
        json!({"session_id": source, "entry_id": from, "mode": "fork"}),
        copy,
    )
    .await?;
    // The fork's agent starts from a copy of its parent's working directory (best effort:
    // the tools worker may not run); its writes never change the parent's files.
    let _ = ctx
        .trigger_timeout(
            "shell::provision",
            json!({"session_id": new_sid, "from_session_id": source}),
            std::time::Duration::from_secs(60),
        )
        .await;
    Ok(json!({"session_id": new_sid, "leaf_id": from, "copied": copied, "summarized": summarized}))
}

async fn clone(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let source = sid_of(&data, "source_session_id")?;
    let new_sid = match data.get("new_session_id") {
        None | Some(Value::Null) => new_id(),
        Some(_) => sid_of(&data, "new_session_id")?,
    };
    visible(&ctx, &source).await?;
    require_meta(&ctx, &source).await?;
    claim_copy(&ctx, &new_sid).await?;
    let entries = load_entries(&ctx, &source).await?;
    let leaf = tree::leaf(&entries).map(|e| e.id.clone());
    let copied = entries.len();
    write_copy(
        &ctx,
        &new_sid,
        json!({"session_id": source, "mode": "clone"}),
        entries,
    )
    .await?;
    Ok(json!({"session_id": new_sid, "leaf_id": leaf, "copied": copied}))
}

async fn compact(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    let summary = req_str(&data, "summary")?;
    let tail_start_id = data["tail_start_id"].as_str().map(str::to_owned);
    let input = EntryInput {
        id: data["id"].as_str().map(str::to_owned),
        timestamp: None,
        body: EntryBody::Compaction {
            summary,
            tail_start_id,
            tokens_before: data["tokens_before"].as_u64().unwrap_or(0),
            details: data.get("details").cloned().unwrap_or(Value::Null),
        },
    };
    let stored = append_chain(&ctx, &sid, Parent::from_request(&data)?, vec![input]).await?;
    Ok(stored_json(&stored[0]))
}

async fn compactions(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    visible(&ctx, &sid).await?;
    require_meta(&ctx, &sid).await?;
    let list: Vec<Entry> = load_entries(&ctx, &sid)
        .await?
        .into_iter()
        .filter(|e| matches!(e.body, EntryBody::Compaction { .. }))
        .collect();
    Ok(json!({"session_id": sid, "compactions": list}))
}

async fn tree_fn(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    visible(&ctx, &sid).await?;
    let meta = require_meta(&ctx, &sid).await?;
    let entries = load_entries(&ctx, &sid).await?;
    let leaf = tree::leaf(&entries).map(|e| e.id.clone());
    let nodes: Vec<Value> = entries
        .iter()
        .map(|e| {
            let children: Vec<&str> = entries
                .iter()
                .filter(|c| c.parent_id.as_deref() == Some(e.id.as_str()))
                .map(|c| c.id.as_str())
                .collect();
            let label = match tree::entry_message(e) {
                Some(m) => {
                    let t = tree::message_text(&m);
                    format!("{}: {}", tree::role(&m), t.chars().take(80).collect::<String>())
                }
                None => e.body.kind().to_string(),
            };
            json!({"id": e.id, "parent_id": e.parent_id, "type": e.body.kind(), "timestamp": e.timestamp, "seq": e.seq, "children": children, "label": label})
        })
        .collect();
    Ok(json!({"session_id": sid, "session": meta, "leaf_id": leaf, "entries": nodes}))
}

/// The most sessions one page of `session-tree::list` holds.
pub const LIST_PAGE_MAX: u64 = 500;

async fn list(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let number = |field: &str| match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ErrorBody::invalid(format!("`{field}` must be a non-negative integer"))),
    };
    let (limit, offset) = (number("limit")?, number("offset")?.unwrap_or(0));
    if limit.is_some_and(|l| l == 0 || l > LIST_PAGE_MAX) {
        return Err(ErrorBody::invalid(format!(
            "`limit` must be from 1 to {LIST_PAGE_MAX}"
        )));
    }
    let v = ctx.state_list(INDEX, None).await.map_err(storage)?;
    let mut sessions: Vec<Value> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["value"].clone())
        .collect();
    // Only what the caller may see, and the total counts only that.
    let mine = harness_sdk::owners::visible(
        &ctx,
        sessions.iter().filter_map(|s| s["session_id"].as_str()),
    )
    .await
    .map_err(storage)?;
    sessions.retain(|s| s["session_id"].as_str().is_some_and(|id| mine.contains(id)));
    sessions.sort_by_key(|s| std::cmp::Reverse(s["updated_at_ms"].as_u64().unwrap_or(0)));
    let total = sessions.len() as u64;
    let Some(limit) = limit else {
        return Ok(json!({"sessions": sessions, "total": total}));
    };
    let page: Vec<Value> = sessions
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(limit as usize)
        .collect();
    let end = offset.saturating_add(page.len() as u64);
    let mut answer = json!({"sessions": page, "total": total});
    if end < total {
        answer["next_offset"] = json!(end);
    }
    Ok(answer)
}

async fn export_html(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    visible(&ctx, &sid).await?;
    let (leaf, path, _) = context_of(&ctx, &sid, data["leaf_id"].as_str()).await?;
    let refs: Vec<&Entry> = path.iter().collect();
    Ok(json!({"session_id": sid, "leaf_id": leaf, "html": tree::export_html(&sid, &refs)}))
}

async fn update_part(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = sid_of(&data, "session_id")?;
    let eid = req_str(&data, "entry_id")?;
    valid_id("entry_id", &eid)?;
    let index = data["part_index"]
        .as_u64()
        .ok_or_else(|| ErrorBody::invalid("`part_index` must be a non-negative integer"))?
        as usize;
    let part: harness_sdk::messages::ContentBlock =
        serde_json::from_value(data.get("part").cloned().unwrap_or(Value::Null))
            .map_err(|e| ErrorBody::invalid(format!("invalid `part`: {e}")))?;
    require_meta(&ctx, &sid).await?;
    let outcome = ctx
        .state_transact(ENTRIES, &entry_key(&sid, &eid), |current| {
            let Some(current) = current else {
                return Ok((Write::Keep, Err(entry_not_found(&sid, &eid))));
            };
            let mut entry: Entry = match serde_json::from_value(current) {
                Ok(e) => e,
                Err(e) => return Ok((Write::Keep, Err(ErrorBody::new("storage", e.to_string())))),
            };
            let blocks = match &mut entry.body {
                EntryBody::Message { message } => match message {
                    harness_sdk::messages::AgentMessage::User { content, .. }
                    | harness_sdk::messages::AgentMessage::Assistant { content, .. }
                    | harness_sdk::messages::AgentMessage::FunctionResult { content, .. }
                    | harness_sdk::messages::AgentMessage::Custom { content, .. } => content,
                },
                EntryBody::CustomMessage { content, .. } => content,
                _ => {
                    return Ok((
                        Write::Keep,
                        Err(ErrorBody::invalid(format!(
                            "entry `{eid}` has no content parts"
                        ))),
                    ));
                }
            };
            let Some(slot) = blocks.get_mut(index) else {
                return Ok((
                    Write::Keep,
                    Err(ErrorBody::invalid(format!(
                        "`part_index` {index} is out of range (the entry has {} parts)",
                        blocks.len()
                    ))),
                ));
            };
            *slot = part.clone();
            let value = serde_json::to_value(&entry).unwrap_or(Value::Null);
            Ok((Write::Put(value), Ok(entry)))
        })
        .await
        .map_err(storage)??;
    Ok(json!({"ok": true, "entry": outcome}))
}

// ------------------------------------------------------------------ session-inbox::*

fn inbox_key(data: &Value) -> Result<String, ErrorBody> {
    let sid = sid_of(data, "session_id")?;
    let name = req_str(data, "name")?;
    valid_id("name", &name)?;
    Ok(format!("{sid}/{name}"))
}

async fn inbox_push(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let key = inbox_key(&data)?;
    // Pushing into an id claims it; another's session is refused as one that is not there,
    // so nobody can plant messages in a session someone else will use.
    let sid = sid_of(&data, "session_id")?;
    match harness_sdk::owners::claim(&ctx, &sid).await {
        Ok(true) => {}
        Ok(false) => return Err(not_found(&sid)),
        Err(e) => return Err(storage(e)),
    }
    let item = data
        .get("item")
        .filter(|v| !v.is_null())
        .cloned()
        .ok_or_else(|| ErrorBody::invalid("missing `item`"))?;
    let out = ctx
        .state_update(
            INBOX,
            &key,
            json!([{"type": "append", "path": "items", "value": item}]),
        )
        .await
        .map_err(storage)?;
    let depth = out["new_value"]["items"].as_array().map_or(0, Vec::len);
    Ok(json!({"ok": true, "depth": depth}))
}

async fn inbox_peek(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let key = inbox_key(&data)?;
    if let Some(names) = data.get("names").filter(|v| !v.is_null()) {
        return peek_first(&ctx, &sid_of(&data, "session_id")?, &peek_names(names)?).await;
    }
    let v = ctx.state_get(INBOX, &key).await.map_err(storage)?;
    Ok(json!({"items": v["items"].as_array().cloned().unwrap_or_default()}))
}

/// A peek's inbox names (`names`, or an append's `peek_inboxes`), checked.
fn peek_names(names: &Value) -> Result<Vec<String>, ErrorBody> {
    let names: Vec<String> = serde_json::from_value(names.clone())
        .map_err(|_| ErrorBody::invalid("`names` must be a list of inbox names"))?;
    if names.is_empty() || names.len() > inbox::PEEK_MAX_NAMES {
        return Err(ErrorBody::invalid(format!(
            "`names` must name 1 to {} inboxes",
            inbox::PEEK_MAX_NAMES
        )));
    }
    for name in &names {
        valid_id("names[]", name)?;
    }
    Ok(names)
}

/// The first of `names` that holds items, found with one read of the session's inboxes →
/// `{items, name}` (`name` null when all are empty).
async fn peek_first(ctx: &Ctx, sid: &str, names: &[String]) -> Result<Value, ErrorBody> {
    // A session has a few inboxes: one page holds them.
    let first =
        harness_sdk::session_layout::read_first_inbox(ctx, sid, names.iter().map(String::as_str))
            .await
            .map_err(storage)?;
    Ok(match first {
        Some((name, items)) => json!({"items": items, "name": name}),
        None => json!({"items": [], "name": null}),
    })
}

/// Take the items (the first `max`, default all) atomically: a push racing the drain lands
/// either in this drain or the next.
async fn inbox_drain(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let key = inbox_key(&data)?;
    let max = match data.get("max") {
        None | Some(Value::Null) => usize::MAX,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| ErrorBody::invalid("`max` must be a non-negative integer"))?
            as usize,
    };
    let items = ctx
        .state_transact(INBOX, &key, |current| {
            let mut items = current
                .as_ref()
                .and_then(|v| v["items"].as_array().cloned())
                .unwrap_or_default();
            if current.is_none() || max == 0 {
                return Ok((Write::Keep, Vec::new()));
            }
            if items.len() <= max {
                return Ok((Write::Delete, items));
            }
            let rest = items.split_off(max);
            Ok((Write::Put(json!({"items": rest})), items))
        })
        .await
        .map_err(storage)?;
    Ok(json!({"items": items}))
}

// ------------------------------------------------------------------ the worker

pub fn worker() -> Worker {
    let errors: &[(&str, &str)] = &[
        ("not_found", "the session does not exist"),
        (
            "entry_not_found",
            "an entry id (parent_id, from_entry_id, leaf_id) does not exist in the session",
        ),
        ("storage", "the state store failed; safe to retry"),
        (
            "invalid_message",
            "a field is missing or malformed; the message names it",
        ),
    ];
    let mut w = Worker::new("session");
    w.register_function(
        def("session-tree::create", "Create a session.")
            .not_for_the_agent()
            .contract::<CreateRequest, SessionAnswer>()
            .errors(&[
                (
                    "already_exists",
                    "a session with that id exists (use ensure)",
                ),
                ("storage", "state store failure"),
            ]),
        create,
    );
    w.register_function(
        def(
            "session-tree::ensure",
            "Create the session unless it exists.",
        )
        .not_for_the_agent()
        .contract::<SessionRef, SessionAnswer>()
        .errors(errors),
        ensure,
    );
    w.register_function(
        def("session-tree::append", "Append one entry. parent_id absent: the current leaf; null: a new root; an older entry: starts a branch.")
        .not_for_the_agent()
            .contract::<AppendRequest, StoredEntry>()
            .errors(errors),
        append,
    );
    w.register_function(
        def(
            "session-tree::append_batch",
            "Append entries as a chain (each the parent of the next).",
        )
        .not_for_the_agent()
        .contract::<AppendBatchRequest, AppendBatchAnswer>()
        .errors(errors),
        append_batch,
    );
    w.register_function(
        def("session-tree::messages", "The model context of a branch: leaf → root walk, compaction applied (summary + kept tail).")
            .contract::<session_tree::MessagesRequest, session_tree::MessagesAnswer>()
            .errors(errors)
        .public(),
        messages,
    );
    w.register_function(
        def("session-tree::fork", "A new session holding the path root → from_entry_id (over 50 entries: older ones become one branch_summary root). The source is untouched.")
        .not_for_the_agent()
            .contract::<ForkRequest, ForkAnswer>()
            .errors(errors)
            // A new session from a copy: nothing of the source changes.
            .public(),
        fork,
    );
    w.register_function(
        def(
            "session-tree::clone",
            "A new session with every branch of the source.",
        )
        .not_for_the_agent()
        .contract::<CloneRequest, ForkAnswer>()
        .errors(errors),
        clone,
    );
    w.register_function(
        def(
            "session-tree::compact",
            "Append a compaction entry: the context becomes summary + the tail from tail_start_id.",
        )
        .not_for_the_agent()
        .contract::<CompactRequest, StoredEntry>()
        .errors(errors),
        compact,
    );
    w.register_function(
        def(
            "session-tree::compactions",
            "Every compaction entry of a session.",
        )
        .contract::<SessionRef, CompactionsAnswer>()
        .errors(errors)
        .public(),
        compactions,
    );
    w.register_function(
        def(
            "session-tree::tree",
            "Every entry with its children and a short label; the current leaf.",
        )
        .contract::<SessionRef, TreeAnswer>()
        .errors(errors)
        .public(),
        tree_fn,
    );
    w.register_function(
        def(
            "session-tree::list",
            "Every session, most recently updated first; or one page (`limit` ≤ 500, `offset`) with `total` and `next_offset`.",
        )
        .contract::<ListRequest, ListAnswer>()
        .errors(&[("storage", "state store failure")])
        .public(),
        list,
    );
    w.register_function(
        def(
            "session-tree::export_html",
            "A readable HTML page of one branch.",
        )
        .contract::<ExportRequest, ExportAnswer>()
        .errors(errors)
        .public(),
        export_html,
    );
    w.register_function(
        def(
            "session-tree::update_part",
            "Replace one content block of a message entry (e.g. prune a large tool output).",
        )
        .not_for_the_agent()
        .contract::<UpdatePartRequest, UpdatePartAnswer>()
        .errors(errors),
        update_part,
    );
    let inbox_errors: &[(&str, &str)] = &[
        ("storage", "state store failure"),
        ("invalid_message", "bad name/session_id/item"),
    ];
    w.register_function(
        def("session-inbox::push", "Queue an item (a string or an AgentMessage) in a session's inbox (`steering` is taken before the next model call, `followup` when the run would stop).")
        .not_for_the_agent()
            .contract::<inbox::PushRequest, inbox::PushAnswer>()
            .errors(inbox_errors)
            // A chat front end steers the turn it shows (the console's message box).
            .public(),
        inbox_push,
    );
    w.register_function(
        def("session-inbox::peek", "The queued items, left in place.")
            .contract::<inbox::PeekRequest, inbox::ItemsAnswer>()
            .errors(inbox_errors),
        inbox_peek,
    );
    w.register_function(
        def(
            "session-inbox::drain",
            "Take the queued items (the first `max`, default all) atomically.",
        )
        .not_for_the_agent()
        .contract::<inbox::DrainRequest, inbox::ItemsAnswer>()
        .errors(inbox_errors),
        inbox_drain,
    );
    w
}
