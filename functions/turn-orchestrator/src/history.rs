//! What a step reads besides the record: the run's request and prompt, and the conversation
//! (the session tree, or the record's own list), cached per orchestrator instance.

use crate::prelude::*;

/// The run's request, read once per run by this instance (it never changes during a run).
pub(crate) async fn run_request(ctx: &Ctx, rec: &Record) -> StepResult<Arc<RunRequest>> {
    let sid = &rec.session_id;
    if let Ok(Some(hit)) = CACHE.try_with(|c| c.run(sid, rec).and_then(|r| r.request)) {
        return Ok(hit);
    }
    let v = ctx.state_get(SCOPE, &request_key(sid)).await?;
    let req: Arc<RunRequest> = Arc::new(
        serde_json::from_value(v)
            .map_err(|e| StepError::Fatal(format!("unreadable run request: {e}")))?,
    );
    let _ = CACHE.try_with(|c| c.update_run(sid, rec, |r| r.request = Some(req.clone())));
    Ok(req)
}

/// The run's prompt (written at provisioning), read once per run by this instance.
pub(crate) async fn run_prompt(ctx: &Ctx, rec: &Record) -> StepResult<Arc<Prompt>> {
    let sid = &rec.session_id;
    if let Ok(Some(hit)) = CACHE.try_with(|c| c.run(sid, rec).and_then(|r| r.prompt)) {
        return Ok(hit);
    }
    let v = ctx.state_get(SCOPE, &prompt_key(sid)).await?;
    let prompt: Prompt = serde_json::from_value(v)
        .map_err(|e| StepError::Fatal(format!("unreadable run prompt: {e}")))?;
    if prompt.run_key != rec.run_key {
        return Err(StepError::Fatal(format!(
            "the stored prompt belongs to run `{}`, not `{}`",
            prompt.run_key, rec.run_key
        )));
    }
    let prompt = Arc::new(prompt);
    let _ = CACHE.try_with(|c| c.update_run(sid, rec, |r| r.prompt = Some(prompt.clone())));
    Ok(prompt)
}

pub(crate) async fn best_effort(ctx: &Ctx, function_id: &str, payload: Value) -> Option<Value> {
    ctx.trigger_timeout(function_id, payload, BEST_EFFORT_TIMEOUT)
        .await
        .ok()
}

/// What this orchestrator instance keeps between steps, by session, so a step does not re-read
/// what cannot have changed (and, for every run, the tool listing the catalogue while the
/// engine's catalogue version is the same):
/// - the history it read or wrote last, with the leaf it ends at. A run appends only through
///   this worker, so while the record's leaf is the cached one, the cache is the tree's path
///   (an entry rewritten in place by `session-tree::update_part` is seen from the next run on);
/// - the run's request and prompt, which are fixed for a run (keyed by the run's key and start
///   time, so a new run on the session never sees the last one's).
#[derive(Default)]
pub struct InstanceCache {
    inner: std::sync::Mutex<std::collections::HashMap<String, (String, History)>>,
    runs: std::sync::Mutex<std::collections::HashMap<String, CachedRun>>,
    /// The `agent_trigger` tool with the catalogue it lists, by the engine's
    /// `catalogue_version` it was built from.
    pub(crate) tool: std::sync::Mutex<Option<(String, harness_sdk::messages::ToolSpec)>>,
    /// Which functions are registered `metadata.agent: false`, by catalogue version.
    pub(crate) not_for_the_agent: std::sync::Mutex<Option<NotForTheAgent>>,
    /// The instance's settings (compaction reserve, read start, chain budget).
    pub(crate) settings: crate::Settings,
}

/// A conversation shared between the cache and the step using it (not copied per turn).
pub(crate) type History = Arc<Vec<AgentMessage>>;

#[derive(Clone, Default)]
pub(crate) struct CachedRun {
    run_key: String,
    started_at_ms: u64,
    request: Option<Arc<RunRequest>>,
    pub(crate) prompt: Option<Arc<Prompt>>,
}

pub(crate) const CACHE_SESSIONS: usize = 256;

impl InstanceCache {
    pub fn new(settings: crate::Settings) -> Self {
        Self {
            settings,
            ..Self::default()
        }
    }

    pub(crate) fn run(&self, sid: &str, rec: &Record) -> Option<CachedRun> {
        let runs = self.runs.lock().ok()?;
        runs.get(sid)
            .filter(|r| r.run_key == rec.run_key && r.started_at_ms == rec.started_at_ms)
            .cloned()
    }
    pub(crate) fn update_run(&self, sid: &str, rec: &Record, f: impl FnOnce(&mut CachedRun)) {
        if let Ok(mut runs) = self.runs.lock() {
            if runs.len() >= CACHE_SESSIONS && !runs.contains_key(sid) {
                runs.clear();
            }
            let entry = runs.entry(sid.to_string()).or_default();
            if entry.run_key != rec.run_key || entry.started_at_ms != rec.started_at_ms {
                *entry = CachedRun {
                    run_key: rec.run_key.clone(),
                    started_at_ms: rec.started_at_ms,
                    ..Default::default()
                };
            }
            f(entry);
        }
    }
    /// Drop the session's cached history (a save that would have stored its last append
    /// failed).
    pub(crate) fn forget_history(&self, sid: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.remove(sid);
        }
    }
    /// Drop what is held for a session whose run ended: a stopped session keeps nothing here
    /// (its next run provisions again), so idle sessions cost no memory in this instance.
    pub(crate) fn forget(&self, sid: &str) {
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(sid);
        }
        if let Ok(mut inner) = self.inner.lock() {
            inner.remove(sid);
        }
    }
    pub(crate) fn get(&self, sid: &str, leaf: &str) -> Option<History> {
        let inner = self.inner.lock().ok()?;
        inner
            .get(sid)
            .filter(|(l, _)| l == leaf)
            .map(|(_, m)| m.clone())
    }
    pub(crate) fn put(&self, sid: &str, leaf: &str, messages: History) {
        if let Ok(mut inner) = self.inner.lock() {
            if inner.len() >= CACHE_SESSIONS && !inner.contains_key(sid) {
                inner.clear();
            }
            inner.insert(sid.to_string(), (leaf.to_string(), messages));
        }
    }
    /// The cached path brought up to `leaf` by the record's recent appends, when they
    /// continue it without a gap (another instance appended them).
    pub(crate) fn catch_up(
        &self,
        sid: &str,
        leaf: &str,
        recent: &[crate::types::RecentAppend],
    ) -> Option<History> {
        let mut inner = self.inner.lock().ok()?;
        let (cached_leaf, messages) = inner.get(sid)?;
        let start = recent
            .iter()
            .position(|b| b.from.as_deref() == Some(cached_leaf.as_str()))?;
        let mut at = cached_leaf.as_str();
        let mut grown: Vec<AgentMessage> = messages.as_ref().clone();
        for b in &recent[start..] {
            if b.from.as_deref() != Some(at) {
                return None;
            }
            grown.extend(b.messages.iter().cloned());
            at = b.to.as_str();
            if at == leaf {
                let grown: History = Arc::new(grown);
                inner.insert(sid.to_string(), (leaf.to_string(), grown.clone()));
                return Some(grown);
            }
        }
        None
    }
    /// The path grew from `old_leaf` to `new_leaf` by `appended`.
    pub(crate) fn extend(
        &self,
        sid: &str,
        old_leaf: Option<&str>,
        new_leaf: &str,
        appended: &[AgentMessage],
    ) {
        if let Ok(mut inner) = self.inner.lock() {
            match inner.get_mut(sid) {
                Some((leaf, messages)) if Some(leaf.as_str()) == old_leaf => {
                    // Copies only if a step still holds the old list.
                    Arc::make_mut(messages).extend(appended.iter().cloned());
                    *leaf = new_leaf.to_string();
                }
                _ => {
                    inner.remove(sid);
                }
            }
        }
    }
}

tokio::task_local! {
    /// The running step's instance cache (set by the step driver).
    pub(crate) static CACHE: std::sync::Arc<InstanceCache>;
}

/// The running step's cached history of `sid`, forgotten ([`InstanceCache::forget_history`]).
pub(crate) fn forget_history(sid: &str) {
    let _ = CACHE.try_with(|c| c.forget_history(sid));
}

/// The running step's instance settings (the defaults outside a step).
pub(crate) fn settings() -> crate::Settings {
    CACHE.try_with(|c| c.settings).unwrap_or_default()
}

/// The conversation as the model will see it: the cached path while the run's leaf is the
/// cached one, else from the session tree (compaction applied; this also moves the run onto
/// the tree's current leaf), or the record's own list without a session store.
pub(crate) async fn history(ctx: &Ctx, rec: &mut Record) -> StepResult<History> {
    if rec.tree
        && let Some(hit) = cached(rec)
    {
        return Ok(hit);
    }
    history_fresh(ctx, rec).await
}

/// The instance's cached path at the record's leaf, or brought up to it by the record's
/// recent appends.
fn cached(rec: &Record) -> Option<History> {
    let leaf = rec.tree_leaf.as_deref()?;
    CACHE
        .try_with(|c| {
            c.get(&rec.session_id, leaf)
                .or_else(|| c.catch_up(&rec.session_id, leaf, &rec.recent_appends))
        })
        .ok()
        .flatten()
}

/// The history read from the session tree, whatever the cache holds.
pub(crate) async fn history_fresh(ctx: &Ctx, rec: &mut Record) -> StepResult<History> {
    if !rec.tree {
        return Ok(Arc::new(rec.messages.clone()));
    }
    land_carried(ctx, rec).await?;
    let (leaf, messages) = read_history(ctx, &rec.session_id).await?;
    rec.tree_leaf = leaf;
    Ok(messages)
}

/// The session's history at its current leaf, read and cached at that leaf.
async fn read_history(ctx: &Ctx, sid: &str) -> StepResult<(Option<String>, History)> {
    let v = ctx
        .trigger(
            session_tree::MESSAGES,
            json!(session_tree::MessagesRequest {
                session_id: sid.to_string(),
                leaf_id: None,
            }),
        )
        .await?;
    let answer: session_tree::MessagesAnswer = contracts::parse(session_tree::MESSAGES, v)
        .map_err(|e| StepError::Fatal(format!("unreadable session history: {e}")))?;
    let messages: History = Arc::new(answer.messages);
    if let Some(leaf) = &answer.leaf_id {
        let _ = CACHE.try_with(|c| c.put(sid, leaf, messages.clone()));
    }
    Ok((answer.leaf_id, messages))
}

/// The run's request, with what a turn's step reads before its model call (the prompt, the
/// history) read beside it where this instance has none of it cached: a step that lands on
/// another instance than the run's last one (with a real model, every turn is a queue hop)
/// makes one round trip of these reads instead of three in a row. The history read goes to
/// the cache, where the step's own read finds it at the record's leaf.
pub(crate) async fn warm_turn(ctx: &Ctx, rec: &Record) -> StepResult<Arc<RunRequest>> {
    let history = async {
        if rec.tree && cached(rec).is_none() {
            read_history(ctx, &rec.session_id).await?;
        }
        Ok(())
    };
    let (req, _, ()) = tokio::try_join!(run_request(ctx, rec), run_prompt(ctx, rec), history)?;
    Ok(req)
}

/// For events that show the history (agent_end): never fails the step.
pub(crate) async fn history_for_event<C: Calls + ?Sized>(
    calls: &C,
    rec: &Record,
) -> Vec<AgentMessage> {
    if !rec.tree {
        return rec.messages.clone();
    }
    if let Some(hit) = cached(rec) {
        return hit.as_ref().clone();
    }
    match calls
        .call(
            session_tree::MESSAGES,
            json!(session_tree::MessagesRequest {
                session_id: rec.session_id.clone(),
                leaf_id: None,
            }),
            HISTORY_READ_TIMEOUT,
        )
        .await
    {
        Ok(v) => contracts::parse::<session_tree::MessagesAnswer>(session_tree::MESSAGES, v)
            .map(|a| a.messages)
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// How long an event waits for the history it shows.
const HISTORY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Append messages to the history → the messages as stored. In the tree each gets the id
/// `<run_key>-t<turn>-<tag><i>`: a step that runs again appends nothing new and gets back
/// what the first run stored (so it decides on the same messages). A model answer held back
/// (`assistant_pending`) goes first, as `<run_key>-t<turn>-a0`, the id it would have had
/// on its own.
pub(crate) async fn append_history(
    ctx: &Ctx,
    rec: &mut Record,
    messages: Vec<AgentMessage>,
    tag: &str,
) -> StepResult<Vec<AgentMessage>> {
    append(ctx, rec, messages, tag, Then::Nothing).await
}

/// A run's first append: its messages at the session's current leaf, with the history they
/// continue answered by the same call (`with_messages`). A read before it would be a second
/// session call right behind this one, which finds the session's Lambda not yet free again
/// (it is busy until it asks for its next event) and starts another instance, whose
/// remembered appends the run's later appends then miss every other time. A session worker
/// that does not know the field answers without the history, which is then read.
pub(crate) async fn append_history_continuing(
    ctx: &Ctx,
    rec: &mut Record,
    messages: Vec<AgentMessage>,
    tag: &str,
) -> StepResult<()> {
    if !rec.tree {
        rec.messages.extend(messages);
        return Ok(());
    }
    append(ctx, rec, messages, tag, Then::ReadHistory).await?;
    Ok(())
}

/// What an append does besides storing.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    Nothing,
    /// Peek the inboxes (`rec.peeked_inbox`).
    Peek,
    /// Attach at the session's current leaf and bring back the history there.
    ReadHistory,
}

/// [`append_history`] for the append that ends a step before its steering check: the same
/// call peeks the inboxes once the messages are stored (`rec.peeked_inbox`), which saves the
/// check a call of its own. A session worker that does not peek leaves the check to do it.
pub(crate) async fn append_history_then_peek(
    ctx: &Ctx,
    rec: &mut Record,
    messages: Vec<AgentMessage>,
    tag: &str,
) -> StepResult<Vec<AgentMessage>> {
    append(ctx, rec, messages, tag, Then::Peek).await
}

/// [`append_history_then_peek`] for a batch's results, carried in the record's next save
/// ([`crate::carried`]) where the session's index allows it: the history and the cache move
/// on now, the session tree with the record. `peeked`: the inboxes as a peek beside the
/// batch's calls found them (`None`: the append peeks, or the steering check does).
pub(crate) async fn append_history_carried(
    ctx: &Ctx,
    rec: &mut Record,
    messages: Vec<AgentMessage>,
    tag: &str,
    peeked: Option<PeekedInbox>,
) -> StepResult<Vec<AgentMessage>> {
    if !rec.tree {
        return append(ctx, rec, messages, tag, Then::Nothing).await;
    }
    land_carried(ctx, rec).await?;
    let then = match peeked {
        Some(peeked) => {
            rec.peeked_inbox = Some(peeked);
            Then::Nothing
        }
        None => Then::Peek,
    };
    let (sent, held_back) = to_send(rec, messages, tag);
    let Some(planned) = plan_carried(rec, &sent) else {
        return append_sent(ctx, rec, sent, held_back, then).await;
    };
    let leaf = planned.fallback.entries.last().and_then(|e| e.id.clone());
    // The save that carries it leaves the next index (`record::after_a_save`); until then,
    // and in the record it saves, the index before it stands (a step that loads that record
    // reads the index again, `states::calls::BesideTheCalls`).
    rec.carried = Carried::Planned(Box::new(planned));
    let stored = sent.into_iter().map(|(_, m)| m).collect();
    Ok(appended(rec, leaf, stored, held_back))
}

/// The carried append of `sent` after the run's leaf, on the index the session worker
/// answered with its layout; `None`: the session worker appends.
fn plan_carried(rec: &Record, sent: &[(String, AgentMessage)]) -> Option<CarriedAppend> {
    use harness_sdk::session_layout::{
        Base, CARRIED_MAX_BYTES, CARRIED_MAX_ENTRIES, carries_after, entries_fit_one_item_each,
        plan_append,
    };
    let parent = rec.tree_leaf.as_deref()?;
    let seen = rec.tree_index.as_ref()?;
    // (Called with the tree in use and nothing carried: `land_carried` ran.)
    if sent.is_empty() || sent.len() > CARRIED_MAX_ENTRIES || !carries_after(seen, Some(parent)) {
        return None;
    }
    let entries = entry_inputs(sent);
    let base = Base {
        index: &seen.value,
        version: seen.version,
        check_value: true,
    };
    let plan = plan_append(
        &rec.session_id,
        Some(parent),
        &entries,
        base,
        CARRIED_MAX_BYTES,
        String::new,
        now(),
    )
    .filter(entries_fit_one_item_each)?;
    Some(CarriedAppend {
        writes: plan.writes,
        index: plan.index,
        fallback: session_tree::AppendBatchRequest {
            session_id: rec.session_id.clone(),
            entries,
            parent_id: Some(json!(parent)),
            peek_inboxes: None,
            with_messages: false,
            index_seen: None,
        },
        landed: Default::default(),
    })
}

/// Before the tree is appended to or read through the session worker: the append planned
/// into the record's save is in it. A planned one the session worker appends now; one in a
/// save left running is waited for (its outcome stays for the step's next settle, and its
/// error ends this step too).
pub(crate) async fn land_carried(ctx: &Ctx, rec: &mut Record) -> StepResult<()> {
    match std::mem::take(&mut rec.carried) {
        Carried::None => Ok(()),
        Carried::Planned(c) => {
            c.land_through_the_worker(ctx).await?;
            rec.tree_index = c.landed.get().cloned();
            Ok(())
        }
        Carried::Saving(landed) => {
            if let Some(Err(e)) = rec.pending_save.outcome().await {
                // Still the save's: its settle forgets the history it would have stored.
                rec.carried = Carried::Saving(landed);
                return Err(e);
            }
            if let Some(index) = landed.get() {
                rec.tree_index = Some(index.clone());
            }
            Ok(())
        }
    }
}

/// The messages with their entry ids, the model answer held back first → and whether it was.
fn to_send(
    rec: &Record,
    messages: Vec<AgentMessage>,
    tag: &str,
) -> (Vec<(String, AgentMessage)>, bool) {
    let pending = rec
        .assistant_pending
        .then(|| rec.last_assistant.clone())
        .flatten();
    let id = |tag: &str, i: usize| format!("{}-t{}-{tag}{i}", rec.run_key, rec.turn_count);
    let held_back = pending.is_some();
    let sent = pending
        .map(|m| (id("a", 0), m))
        .into_iter()
        .chain(
            messages
                .into_iter()
                .enumerate()
                .map(|(i, m)| (id(tag, i), m)),
        )
        .collect();
    (sent, held_back)
}

fn entry_inputs(sent: &[(String, AgentMessage)]) -> Vec<session_tree::EntryInput> {
    sent.iter()
        .map(|(id, message)| session_tree::EntryInput {
            id: Some(id.clone()),
            timestamp: None,
            body: session_tree::EntryBody::Message {
                message: message.clone(),
            },
        })
        .collect()
}

async fn append(
    ctx: &Ctx,
    rec: &mut Record,
    messages: Vec<AgentMessage>,
    tag: &str,
    then: Then,
) -> StepResult<Vec<AgentMessage>> {
    if !rec.tree {
        rec.messages.extend(messages.iter().cloned());
        return Ok(messages);
    }
    land_carried(ctx, rec).await?;
    let (sent, held_back) = to_send(rec, messages, tag);
    append_sent(ctx, rec, sent, held_back, then).await
}

async fn append_sent(
    ctx: &Ctx,
    rec: &mut Record,
    sent: Vec<(String, AgentMessage)>,
    held_back: bool,
    then: Then,
) -> StepResult<Vec<AgentMessage>> {
    let (peek, continuing) = (then == Then::Peek, then == Then::ReadHistory);
    if sent.is_empty() {
        return Ok(Vec::new());
    }
    let request = session_tree::AppendBatchRequest {
        session_id: rec.session_id.clone(),
        entries: entry_inputs(&sent),
        // The run's leaf; none yet: a new root (continuing: the session's current leaf).
        parent_id: (!continuing).then(|| json!(rec.tree_leaf)),
        peek_inboxes: peek.then(|| INBOXES.iter().map(|n| n.to_string()).collect()),
        with_messages: continuing,
        // Continuing, it is the index `session-tree::ensure` answered at the run's start.
        index_seen: rec.tree_index.take(),
    };
    let mut out = ctx
        .trigger(session_tree::APPEND_BATCH, json!(request))
        .await?;
    if peek {
        rec.peeked_inbox = out
            .get_mut("inbox")
            .map(Value::take)
            .and_then(|v| contracts::parse::<inbox::ItemsAnswer>(inbox::PEEK, v).ok())
            .and_then(first_of);
    }
    // The index this append wrote, for the next one (none: the next one's session reads it).
    rec.tree_index = out
        .get_mut("index")
        .map(Value::take)
        .and_then(|v| serde_json::from_value(v).ok());
    let context = match out.get_mut("messages").map(Value::take) {
        Some(v) if continuing && !v.is_null() => Some(
            contracts::parse::<session_tree::MessagesAnswer>(session_tree::APPEND_BATCH, v)
                .map_err(|e| StepError::Fatal(format!("unreadable session history: {e}")))?,
        ),
        _ => None,
    };
    let (leaf_id, stored) = read_appended(out, sent)?;
    if !continuing {
        return Ok(appended(rec, leaf_id, stored, held_back));
    }
    // Where the entries attached is not known here: the history at the new leaf is
    // cached whole, and the record's note of this append names no start.
    rec.tree_leaf = leaf_id;
    match (context, rec.tree_leaf.clone()) {
        (Some(context), Some(leaf)) => {
            let history: History = Arc::new(context.messages);
            let _ = CACHE.try_with(|c| c.put(&rec.session_id, &leaf, history));
            RecentAppend::keep(
                &mut rec.recent_appends,
                RecentAppend {
                    from: None,
                    to: leaf,
                    messages: stored.clone(),
                },
            );
        }
        (Some(_), None) => {}
        (None, _) => {
            history_fresh(ctx, rec).await?;
        }
    }
    Ok(finish_held_back(rec, stored, held_back))
}

/// The run's path grew from its leaf by `stored`, to `leaf_id`: the cache and the record's
/// recent appends follow → the messages after the held-back answer.
fn appended(
    rec: &mut Record,
    leaf_id: Option<String>,
    stored: Vec<AgentMessage>,
    held_back: bool,
) -> Vec<AgentMessage> {
    let old_leaf = rec.tree_leaf.take();
    rec.tree_leaf = leaf_id;
    if let Some(new_leaf) = &rec.tree_leaf {
        let _ =
            CACHE.try_with(|c| c.extend(&rec.session_id, old_leaf.as_deref(), new_leaf, &stored));
        RecentAppend::keep(
            &mut rec.recent_appends,
            RecentAppend {
                from: old_leaf,
                to: new_leaf.clone(),
                messages: stored.clone(),
            },
        );
    }
    finish_held_back(rec, stored, held_back)
}

/// The held-back answer as stored (a batch that ran again gets the first run's message
/// back) → the messages after it.
fn finish_held_back(
    rec: &mut Record,
    stored: Vec<AgentMessage>,
    held_back: bool,
) -> Vec<AgentMessage> {
    let mut stored = stored.into_iter();
    if held_back {
        rec.assistant_pending = false;
        if let Some(m) = stored.next() {
            rec.last_assistant = Some(m);
        }
    }
    stored.collect()
}

/// `session-tree::append_batch`'s answer → the leaf and the messages as stored. An entry the
/// call created holds the message sent (so it is not read back: a tagged, flattened entry
/// was the dearest read of a turn); one that already existed (a step that runs again) is
/// read, and must be a message.
fn read_appended(
    mut out: Value,
    sent: Vec<(String, AgentMessage)>,
) -> StepResult<(Option<String>, Vec<AgentMessage>)> {
    let unreadable = |why: String| {
        StepError::Fatal(format!(
            "the session store answered an unreadable entry: {}: {why}",
            session_tree::APPEND_BATCH
        ))
    };
    // Taken with `get_mut`: indexing a value that is not an object to take from it panics.
    let take = |v: &mut Value, field: &str| v.get_mut(field).map(Value::take);
    let leaf_id = match take(&mut out, "leaf_id").unwrap_or(Value::Null) {
        Value::Null => None,
        Value::String(leaf) => Some(leaf),
        other => return Err(unreadable(format!("`leaf_id` is {other}"))),
    };
    let Some(Value::Array(entries)) = take(&mut out, "entries") else {
        return Err(unreadable("no `entries` list".into()));
    };
    if entries.len() != sent.len() {
        return Err(unreadable(format!(
            "{} entries for {} appended",
            entries.len(),
            sent.len()
        )));
    }
    let mut stored = Vec::with_capacity(sent.len());
    for (mut answered, (id, message)) in entries.into_iter().zip(sent) {
        if answered["created"] == true && answered["entry_id"] == id.as_str() {
            stored.push(message);
            continue;
        }
        let entry = take(&mut answered, "entry").unwrap_or(Value::Null);
        let entry: session_tree::Entry =
            serde_json::from_value(entry).map_err(|e| unreadable(e.to_string()))?;
        match entry.body {
            session_tree::EntryBody::Message { message } => stored.push(message),
            other => {
                return Err(StepError::Fatal(format!(
                    "the session store answered a `{}` entry for a message",
                    other.kind()
                )));
            }
        }
    }
    Ok((leaf_id, stored))
}

/// Append the model answer held back for its batch's results now (a batch that parks, a run
/// that is aborted): nothing else to append with it.
pub(crate) async fn append_pending_answer(ctx: &Ctx, rec: &mut Record) -> StepResult<()> {
    append_history(ctx, rec, Vec::new(), "r").await.map(drop)
}

/// The functions registered with `metadata.agent: false`, as of one catalogue version
/// (read by `states::calls`, kept with the rest of the turn's cache).
pub(crate) struct NotForTheAgent {
    pub(crate) version: Option<String>,
    pub(crate) read_at: std::time::Instant,
    pub(crate) ids: std::collections::HashSet<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_sdk::messages::user_text;

    fn entry(id: &str, created: bool, body: Value) -> Value {
        let mut entry = json!({"id": id, "parent_id": null, "timestamp": 1, "seq": 1});
        for (k, v) in body.as_object().unwrap() {
            entry[k] = v.clone();
        }
        json!({"entry_id": id, "created": created, "entry": entry})
    }

    fn answer(leaf: &str, entries: Vec<Value>) -> Value {
        json!({"entry_ids": [], "leaf_id": leaf, "entries": entries})
    }

    fn sent() -> Vec<(String, AgentMessage)> {
        vec![
            ("r-t1-a0".into(), user_text("sent first")),
            ("r-t1-r0".into(), user_text("sent second")),
        ]
    }

    #[test]
    fn created_entries_are_the_messages_sent_and_existing_ones_are_read_back() {
        let first_run = user_text("stored by the first run");
        let out = answer(
            "r-t1-r0",
            vec![
                entry(
                    "r-t1-a0",
                    true,
                    json!({"type": "message", "message": {"role": "user", "content": "ignored", "timestamp": 0}}),
                ),
                entry(
                    "r-t1-r0",
                    false,
                    json!({"type": "message", "message": first_run}),
                ),
            ],
        );
        // One list: each `sent()` stamps its messages with the clock.
        let sent = sent();
        let sent_first = sent[0].1.clone();
        let (leaf, stored) = read_appended(out, sent).unwrap();
        assert_eq!(leaf.as_deref(), Some("r-t1-r0"));
        assert_eq!(stored, vec![sent_first, first_run]);
    }

    #[test]
    fn an_answer_that_does_not_fit_the_append_fails_the_step_with_what_is_wrong() {
        let ok = |id| {
            entry(
                id,
                true,
                json!({"type": "message", "message": user_text("x")}),
            )
        };
        let cases = [
            (json!("not an object"), "no `entries` list"),
            (json!({"entries": "no list"}), "no `entries` list"),
            (answer("l", vec![ok("r-t1-a0")]), "1 entries for 2 appended"),
            (
                json!({"leaf_id": 7, "entries": [ok("r-t1-a0"), ok("r-t1-r0")]}),
                "`leaf_id` is 7",
            ),
            (
                answer(
                    "l",
                    vec![
                        ok("r-t1-a0"),
                        entry("r-t1-r0", false, json!({"type": "message", "message": 5})),
                    ],
                ),
                "unreadable entry",
            ),
            (
                answer(
                    "l",
                    vec![
                        ok("r-t1-a0"),
                        json!({"entry_id": "other", "created": true, "entry": []}),
                    ],
                ),
                "unreadable entry",
            ),
            (
                answer(
                    "l",
                    vec![
                        ok("r-t1-a0"),
                        entry(
                            "r-t1-r0",
                            false,
                            json!({"type": "branch_summary", "summary": "s"}),
                        ),
                    ],
                ),
                "a `branch_summary` entry for a message",
            ),
        ];
        for (out, names) in cases {
            match read_appended(out.clone(), sent()) {
                Err(StepError::Fatal(why)) => assert!(why.contains(names), "{out}: {why}"),
                other => panic!("{out}: {other:?}"),
            }
        }
    }

    /// A user message stamped with a fixed time: messages made apart compare equal.
    fn said(text: &str) -> AgentMessage {
        match user_text(text) {
            AgentMessage::User { content, .. } => AgentMessage::User {
                content,
                timestamp: 1,
            },
            other => other,
        }
    }

    fn batch(from: Option<&str>, to: &str, text: &str) -> RecentAppend {
        RecentAppend {
            from: from.map(str::to_owned),
            to: to.into(),
            messages: vec![said(text)],
        }
    }

    #[test]
    fn another_instances_appends_bring_a_stale_cache_up_to_the_leaf() {
        let cache = InstanceCache::default();
        cache.put("s", "l1", Arc::new(vec![said("m1")]));
        let recent = vec![
            batch(None, "l0", "m0"),
            batch(Some("l0"), "l1", "m1"),
            batch(Some("l1"), "l2", "m2"),
            batch(Some("l2"), "l3", "m3"),
        ];
        let grown = cache.catch_up("s", "l3", &recent).unwrap();
        assert_eq!(*grown, vec![said("m1"), said("m2"), said("m3")]);
        assert_eq!(cache.get("s", "l3").unwrap(), grown, "kept at the new leaf");
        // A gap, a leaf the appends do not reach, or a cache older than every append kept:
        // nothing is made up (the history is read instead).
        cache.put("s", "l1", Arc::new(vec![said("m1")]));
        let gap = vec![batch(Some("l1"), "l2", "m2"), batch(Some("lx"), "l3", "m3")];
        assert!(cache.catch_up("s", "l3", &gap).is_none());
        assert!(cache.catch_up("s", "l9", &recent).is_none());
        cache.put("s", "old", Arc::new(vec![]));
        assert!(cache.catch_up("s", "l3", &recent).is_none());
        assert!(cache.catch_up("other", "l3", &recent).is_none());
    }

    #[test]
    fn the_record_keeps_a_bounded_tail_of_appends() {
        let mut recent = Vec::new();
        for i in 0..6 {
            RecentAppend::keep(
                &mut recent,
                batch(Some(&format!("l{i}")), &format!("l{}", i + 1), "m"),
            );
        }
        assert_eq!(recent.len(), RecentAppend::MAX_BATCHES);
        assert_eq!(recent[0].from.as_deref(), Some("l2"), "the oldest dropped");
        let big = "x".repeat(RecentAppend::MAX_BYTES / 3);
        RecentAppend::keep(&mut recent, batch(Some("l6"), "l7", &big));
        RecentAppend::keep(&mut recent, batch(Some("l7"), "l8", &big));
        RecentAppend::keep(&mut recent, batch(Some("l8"), "l9", &big));
        let bytes: usize = recent
            .iter()
            .map(|b| serde_json::to_vec(b).unwrap().len())
            .sum();
        assert!(bytes <= RecentAppend::MAX_BYTES, "{bytes}");
        assert_eq!(recent.last().unwrap().to, "l9");
        // One append larger than the bound: none kept (a later one cannot chain past it).
        RecentAppend::keep(
            &mut recent,
            batch(Some("l9"), "l10", &"y".repeat(RecentAppend::MAX_BYTES)),
        );
        assert!(recent.is_empty());
    }
}
