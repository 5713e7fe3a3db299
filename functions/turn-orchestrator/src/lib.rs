//! The durable turn state machine (SPEC §3 turn-orchestrator).
//!
//! A run is a record at `agent/session/<sid>/turn_state`; each state is a step function
//! `turn::<state> {session_id}` consumed from the `turn-steps` FIFO queue (grouped by session).
//! A step loads the record, does its work, and saves with the version it loaded (a conflict
//! or a state that moved on means the delivery was stale: skipped). The conversation lives in
//! the record, so appends commit with the transition; every executed call is saved before the
//! next one, so a redelivered step never runs a call twice, and the target gets
//! `function_call_id` to make its own effect idempotent.

pub mod hooks;
pub mod prompt;
pub mod types;

use engine_gateway::builtins::req_str;
use engine_gateway::state::DURABILITY_BAGGAGE;
use futures_util::FutureExt;
use harness_sdk::messages::{
    AgentMessage, AssistantMessageEvent, ContentBlock, ErrorKind, StopReason, args_hash,
};
use harness_sdk::{
    BusError, ChannelFrame, Ctx, EnqueueOptions, ErrorBody, RegisterFunction, Worker,
};
use hooks::Hooks;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use types::*;

pub const POLICY_TIMEOUT: Duration = Duration::from_secs(5);
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(300);
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);
pub const BEST_EFFORT_TIMEOUT: Duration = Duration::from_secs(5);
pub const COMPACTION_TIMEOUT: Duration = Duration::from_secs(300);
/// Tokens kept free when the model's window is large (SPEC: reserved 20 000); at most half of
/// a small window.
pub const RESERVED_TOKENS: u64 = 20_000;

/// Why a step could not finish: transient errors are re-thrown so the queue retries with
/// backoff (and dead-letters); anything else fails the run with events the UI can show.
enum StepError {
    Transient(ErrorBody),
    Fatal(String),
    Stale,
}

impl From<BusError> for StepError {
    fn from(e: BusError) -> Self {
        StepError::Transient(e.into())
    }
}

type StepResult<T> = Result<T, StepError>;

enum Next {
    To(TurnState),
    /// Stay (still waiting for approvals); the record was saved as it is.
    Stay,
}

fn now() -> u64 {
    harness_sdk::messages::now_ms()
}

/// The same context, its writes durable on commit (ends a step's deferral).
fn durably(ctx: &Ctx) -> Ctx {
    ctx.with_baggage(DURABILITY_BAGGAGE, "immediate")
}

async fn load(ctx: &Ctx, sid: &str) -> StepResult<Option<(Record, u64)>> {
    let mut v = ctx.state_get_versioned(SCOPE, &record_key(sid)).await?;
    if v.is_null() {
        return Ok(None);
    }
    let version = v["version"].as_u64().unwrap_or(0);
    let rec: Record = serde_json::from_value(v["value"].take())
        .map_err(|e| StepError::Fatal(format!("unreadable turn record: {e}")))?;
    Ok(Some((rec, version)))
}

/// Save at `version` → the new version; a conflict means another delivery moved on.
async fn save(ctx: &Ctx, rec: &mut Record, version: &mut u64) -> StepResult<()> {
    // A reader that sees the saved record finds its events stored.
    flush_events(ctx, rec).await;
    rec.updated_at_ms = now();
    let value = serde_json::to_value(&*rec).map_err(|e| StepError::Fatal(e.to_string()))?;
    match ctx
        .state_set_if(SCOPE, &record_key(&rec.session_id), value, *version)
        .await
    {
        Ok(out) => {
            *version = out["version"].as_u64().unwrap_or(*version + 1);
            Ok(())
        }
        Err(BusError::VersionConflict(_)) => Err(StepError::Stale),
        Err(e) => Err(e.into()),
    }
}

/// One UI event on `agent::events` (item `<sid>-<seq>`). Seq numbers come from the record, so
/// a redelivered step rewrites the same items instead of adding new ones. Held in the
/// record's outbox until the next flush.
fn emit(rec: &mut Record, event_type: &str, data: Value) {
    rec.event_seq += 1;
    emit_at(rec, rec.event_seq, event_type, data);
}

/// An event at a seq reserved earlier (saved with the record before the event is written).
fn emit_at(rec: &mut Record, seq: u64, event_type: &str, mut data: Value) {
    data["type"] = json!(event_type);
    let item = format!("{}-{:012}", rec.session_id, seq);
    let sid = rec.session_id.clone();
    rec.outbox.push((EVENTS.to_string(), sid, item, data));
}

/// A `turn_state_changed` event's data: the record's view (never the work list).
fn state_changed(rec: &Record, event_type: &str) -> Value {
    json!({"event_type": event_type, "new_value": rec.view()})
}

/// Write the outbox's events in one call. A failure is logged, as a lost push would be: the
/// events are the UI's view, the record and the session tree are the truth.
async fn flush_events(ctx: &Ctx, rec: &mut Record) {
    if rec.outbox.is_empty() {
        return;
    }
    let items = std::mem::take(&mut rec.outbox);
    let count = items.len();
    if let Err(e) = ctx.stream_set_many(items).await {
        tracing::warn!(error = %e, count, "events not stored");
    }
}

/// High-volume events are pushed, not stored.
async fn emit_transient(ctx: &Ctx, rec: &Record, event_type: &str, mut data: Value) {
    data["type"] = json!(event_type);
    let _ = ctx
        .stream_send(EVENTS, &rec.session_id, event_type, data)
        .await;
}

async fn enqueue_step(ctx: &Ctx, sid: &str, state: TurnState, dedup: String) -> StepResult<()> {
    ctx.enqueue_with(
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

/// The run's request, read once per run by this instance (it never changes during a run).
async fn run_request(ctx: &Ctx, rec: &Record) -> StepResult<Arc<RunRequest>> {
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
async fn run_prompt(ctx: &Ctx, rec: &Record) -> StepResult<Arc<Prompt>> {
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

async fn best_effort(ctx: &Ctx, function_id: &str, payload: Value) -> Option<Value> {
    ctx.trigger_timeout(function_id, payload, BEST_EFFORT_TIMEOUT)
        .await
        .ok()
}

// ------------------------------------------------------------------ history

/// What this orchestrator instance keeps between steps, by session, so a step does not re-read
/// what cannot have changed:
/// - the history it read or wrote last, with the leaf it ends at. A run appends only through
///   this worker, so while the record's leaf is the cached one, the cache is the tree's path
///   (an entry rewritten in place by `session-tree::update_part` is seen from the next run on);
/// - the run's request and prompt, which are fixed for a run (keyed by the run's key and start
///   time, so a new run on the session never sees the last one's).
#[derive(Default)]
pub struct InstanceCache {
    inner: std::sync::Mutex<std::collections::HashMap<String, (String, History)>>,
    runs: std::sync::Mutex<std::collections::HashMap<String, CachedRun>>,
    /// The instance's compaction reserve (its [`Settings`]).
    reserved_tokens: u64,
}

/// A conversation shared between the cache and the step using it (not copied per turn).
type History = Arc<Vec<AgentMessage>>;

#[derive(Clone, Default)]
struct CachedRun {
    run_key: String,
    started_at_ms: u64,
    request: Option<Arc<RunRequest>>,
    prompt: Option<Arc<Prompt>>,
}

const CACHE_SESSIONS: usize = 256;

impl InstanceCache {
    fn run(&self, sid: &str, rec: &Record) -> Option<CachedRun> {
        let runs = self.runs.lock().ok()?;
        runs.get(sid)
            .filter(|r| r.run_key == rec.run_key && r.started_at_ms == rec.started_at_ms)
            .cloned()
    }
    fn update_run(&self, sid: &str, rec: &Record, f: impl FnOnce(&mut CachedRun)) {
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
    fn get(&self, sid: &str, leaf: &str) -> Option<History> {
        let inner = self.inner.lock().ok()?;
        inner
            .get(sid)
            .filter(|(l, _)| l == leaf)
            .map(|(_, m)| m.clone())
    }
    fn put(&self, sid: &str, leaf: &str, messages: History) {
        if let Ok(mut inner) = self.inner.lock() {
            if inner.len() >= CACHE_SESSIONS && !inner.contains_key(sid) {
                inner.clear();
            }
            inner.insert(sid.to_string(), (leaf.to_string(), messages));
        }
    }
    /// The path grew from `old_leaf` to `new_leaf` by `appended`.
    fn extend(&self, sid: &str, old_leaf: Option<&str>, new_leaf: &str, appended: &[AgentMessage]) {
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
    static CACHE: std::sync::Arc<InstanceCache>;
}

/// The conversation as the model will see it: the cached path while the run's leaf is the
/// cached one, else from the session tree (compaction applied; this also moves the run onto
/// the tree's current leaf), or the record's own list without a session store.
async fn history(ctx: &Ctx, rec: &mut Record) -> StepResult<History> {
    if rec.tree
        && let Some(leaf) = &rec.tree_leaf
        && let Ok(Some(hit)) = CACHE.try_with(|c| c.get(&rec.session_id, leaf))
    {
        return Ok(hit);
    }
    history_fresh(ctx, rec).await
}

/// The history read from the session tree, whatever the cache holds.
async fn history_fresh(ctx: &Ctx, rec: &mut Record) -> StepResult<History> {
    if !rec.tree {
        return Ok(Arc::new(rec.messages.clone()));
    }
    let mut v = ctx
        .trigger(
            "session-tree::messages",
            json!({"session_id": rec.session_id}),
        )
        .await?;
    rec.tree_leaf = v["leaf_id"].as_str().map(str::to_owned);
    let messages: History = Arc::new(
        serde_json::from_value(v["messages"].take())
            .map_err(|e| StepError::Fatal(format!("unreadable session history: {e}")))?,
    );
    if let Some(leaf) = &rec.tree_leaf {
        let _ = CACHE.try_with(|c| c.put(&rec.session_id, leaf, messages.clone()));
    }
    Ok(messages)
}

/// For events that show the history (agent_end): never fails the step.
async fn history_for_event(ctx: &Ctx, rec: &Record) -> Vec<AgentMessage> {
    let mut copy = rec.clone();
    history(ctx, &mut copy)
        .await
        .map(|h| h.as_ref().clone())
        .unwrap_or_default()
}

/// Append messages to the history → the messages as stored. In the tree each gets the id
/// `<run_key>-t<turn>-<tag><i>`: a step that runs again appends nothing new and gets back
/// what the first run stored (so it decides on the same messages).
async fn append_history(
    ctx: &Ctx,
    rec: &mut Record,
    messages: Vec<AgentMessage>,
    tag: &str,
) -> StepResult<Vec<AgentMessage>> {
    if !rec.tree {
        rec.messages.extend(messages.iter().cloned());
        return Ok(messages);
    }
    if messages.is_empty() {
        return Ok(messages);
    }
    let entries: Vec<Value> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({"type": "message", "id": format!("{}-t{}-{tag}{i}", rec.run_key, rec.turn_count), "message": m})
        })
        .collect();
    let request = harness_sdk::fields([
        ("session_id", rec.session_id.as_str().into()),
        ("parent_id", json!(rec.tree_leaf)),
        ("entries", Value::Array(entries)),
    ]);
    let mut out = ctx.trigger("session-tree::append_batch", request).await?;
    let old_leaf = rec.tree_leaf.take();
    rec.tree_leaf = out["leaf_id"].as_str().map(str::to_owned);
    let stored = out["entries"]
        .as_array_mut()
        .map(|a| {
            a.iter_mut()
                .map(|e| serde_json::from_value(e["entry"]["message"].take()))
                .collect::<Result<Vec<AgentMessage>, _>>()
        })
        .unwrap_or_else(|| Ok(Vec::new()))
        .map_err(|e| {
            StepError::Fatal(format!(
                "the session store answered an unreadable entry: {e}"
            ))
        })?;
    if let Some(new_leaf) = &rec.tree_leaf {
        let _ =
            CACHE.try_with(|c| c.extend(&rec.session_id, old_leaf.as_deref(), new_leaf, &stored));
    }
    Ok(stored)
}

/// `Some(why)` when a budget of the run refuses another model call.
async fn budget_refusal(ctx: &Ctx, rec: &Record, req: &RunRequest) -> StepResult<Option<String>> {
    for id in &rec.budget_ids {
        match ctx
            .trigger_timeout(
                "budget::check",
                json!({"budget_id": id, "principal_id": req.agent_id}),
                BEST_EFFORT_TIMEOUT,
            )
            .await
        {
            Ok(v) if v["allowed"] == false => {
                return Ok(Some(format!(
                    "budget `{id}` refuses another model call ({}): spent ${:.6} of ${:.6}",
                    v["reason"].as_str().unwrap_or("not allowed"),
                    v["spent_usd"].as_f64().unwrap_or(0.0),
                    v["ceiling_usd"].as_f64().unwrap_or(0.0),
                )));
            }
            Ok(_) => {}
            // The budget worker left: optional workers are skipped.
            Err(BusError::FunctionNotFound(_)) => {
                tracing::warn!(budget = %id, "budget::check not available; not enforced");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

fn usable_tokens(window: u64) -> u64 {
    let reserved = CACHE
        .try_with(|c| c.reserved_tokens)
        .unwrap_or(RESERVED_TOKENS);
    window.saturating_sub(reserved.min(window / 2))
}

/// Pre-flight: over the model's usable window → compact now and reload the history.
async fn preflight_compaction(
    ctx: &Ctx,
    rec: &mut Record,
    req: &RunRequest,
    messages: History,
) -> StepResult<History> {
    let Some(window) = rec
        .model_meta
        .as_ref()
        .and_then(|m| m["context_window"].as_u64())
    else {
        return Ok(messages);
    };
    let prompt = run_prompt(ctx, rec).await?;
    let chars = serde_json::to_string(&(&prompt.system_prompt, &*messages, &prompt.tools))
        .map_or(0, |s| s.chars().count() as u64);
    if !rec.tree || chars / 4 <= usable_tokens(window) {
        return Ok(messages);
    }
    let out = ctx
        .trigger_timeout(
            "context-compaction::compact_now",
            json!({"session_id": rec.session_id, "provider": req.provider, "model": req.model, "emit_event": false}),
            COMPACTION_TIMEOUT,
        )
        .await;
    match out {
        Ok(v) if v["compacted"] == true => {
            emit(
                rec,
                "compaction_done",
                json!({"summary_text": v["summary_text"], "tokens_before": v["tokens_before"], "compaction_entry_id": v["compaction_entry_id"], "tail_start_id": v["tail_start_id"]}),
            );
            history_fresh(ctx, rec).await
        }
        Ok(_) => Ok(messages),
        Err(e) => {
            // The model call may still fit (the estimate is rough); if not, the provider
            // reports context_overflow and the run ends with it.
            tracing::warn!(session = %rec.session_id, error = %e, "pre-flight compaction failed");
            Ok(messages)
        }
    }
}

// ------------------------------------------------------------------ states

async fn provisioning(ctx: &Ctx, rec: &mut Record, req: &RunRequest) -> StepResult<Next> {
    // Default skills, best effort (the directory worker may not run).
    let skills: Vec<String> = match &req.system_default_skills {
        Some(ids) => ids.clone(),
        None => DEFAULT_SKILLS.iter().map(|s| s.to_string()).collect(),
    };
    for id in &skills {
        let _ = best_effort(ctx, "directory::skills::download", json!({ "id": id })).await;
    }
    let index = best_effort(ctx, "directory::skills::index", json!({})).await;
    let index_text = index
        .as_ref()
        .and_then(|v| v["body"].as_str().or(v["index"].as_str()))
        .map(str::to_owned);
    // Where the tools worker works (best effort: it may not run).
    let workdir = best_effort(ctx, "shell::sandbox", json!({}))
        .await
        .and_then(|v| v["workdir"].as_str().map(str::to_owned));
    let system_prompt = Some(match &req.system_prompt {
        Some(verbatim) => verbatim.clone(),
        None => prompt::system_prompt(
            req.mode.as_deref().unwrap_or("agent"),
            index_text.as_deref(),
            workdir.as_deref(),
        ),
    });
    rec.model_meta = best_effort(
        ctx,
        "models::get",
        json!({"provider": req.provider, "model_id": req.model}),
    )
    .await
    .filter(|v| !v.is_null());
    let catalogue = ctx.trigger("engine::functions::list", json!({})).await?;
    let run_prompt = Prompt {
        run_key: rec.run_key.clone(),
        system_prompt,
        tools: vec![prompt::agent_trigger_tool(&catalogue)],
    };
    ctx.state_set(
        SCOPE,
        &prompt_key(&rec.session_id),
        serde_json::to_value(&run_prompt).map_err(|e| StepError::Fatal(e.to_string()))?,
    )
    .await?;
    let run_prompt = Arc::new(run_prompt);
    let _ = CACHE.try_with(|c| {
        c.update_run(&rec.session_id, rec, |r| {
            r.prompt = Some(run_prompt.clone())
        })
    });
    // Budgets: the one named, and those governing this workspace/agent.
    let mut budgets: Vec<String> = req.budget_id.iter().cloned().collect();
    if (req.workspace_id.is_some() || req.agent_id.is_some())
        && let Some(v) = best_effort(
            ctx,
            "budget::list",
            json!({"workspace_id": req.workspace_id, "agent_id": req.agent_id}),
        )
        .await
    {
        for b in v["budgets"].as_array().into_iter().flatten() {
            if let Some(id) = b["budget_id"].as_str()
                && !budgets.iter().any(|x| x == id)
            {
                budgets.push(id.to_string());
            }
        }
    }
    rec.budget_ids = budgets;
    // Resume from the session's current leaf, then add this run's messages.
    if rec.tree {
        history_fresh(ctx, rec).await?;
        append_history(ctx, rec, req.messages.clone(), "u").await?;
    }
    Ok(Next::To(TurnState::AssistantStreaming))
}

/// Errors that mean the call never reached a handler that decided anything.
fn is_unreachable(e: &BusError) -> bool {
    matches!(
        e,
        BusError::FunctionNotFound(_) | BusError::InvocationStopped(_) | BusError::Disconnected(_)
    )
}

fn error_message(req: &RunRequest, kind: ErrorKind, message: String) -> AgentMessage {
    AgentMessage::Assistant {
        content: Vec::new(),
        stop_reason: StopReason::Error,
        error_message: Some(message),
        error_kind: Some(kind),
        usage: None,
        model: req.model.clone(),
        provider: req.provider.clone(),
        timestamp: now(),
    }
}

async fn assistant_streaming(ctx: &Ctx, rec: &mut Record, req: &RunRequest) -> StepResult<Next> {
    if let Some(why) = budget_refusal(ctx, rec, req).await? {
        let note = AgentMessage::Custom {
            custom_type: "budget_exceeded".into(),
            content: vec![ContentBlock::Text {
                text: format!("The run stops: {why}."),
            }],
            display: Some("budget exceeded".into()),
            details: json!({"budget_ids": rec.budget_ids}),
            timestamp: now(),
        };
        let stored = append_history(ctx, rec, vec![note], "b").await?;
        for m in stored {
            emit(rec, "message_complete", json!({"message": m}));
        }
        rec.error = Some(TurnError {
            kind: "budget_exceeded".into(),
            message: why,
        });
        return Ok(Next::To(TurnState::Stopped));
    }
    rec.turn_count += 1;
    rec.turn_end_emitted = false;
    let messages = history(ctx, rec).await?;
    let messages = preflight_compaction(ctx, rec, req, messages).await?;
    let prompt = run_prompt(ctx, rec).await?;
    // The UI sees what happened so far (compaction) before the model answers.
    flush_events(ctx, rec).await;
    let (writer, reader) = ctx.create_channel(Some(64)).await?;
    let mut reader = ctx.open_reader(&reader).await?;
    let mut call = {
        let ctx = ctx.clone();
        let payload = json!({
            "writer_ref": writer,
            "system_prompt": prompt.system_prompt,
            "model": req.model,
            "messages": &*messages,
            "tools": prompt.tools,
            "budget_ids": rec.budget_ids,
        });
        // Released before this step appends to the cached list (which then needs no copy).
        drop(messages);
        let fid = format!("provider::{}::stream", req.provider);
        tokio::spawn(async move { ctx.trigger_timeout(&fid, payload, PROVIDER_TIMEOUT).await })
    };
    let mut final_message: Option<AgentMessage> = None;
    let mut call_result: Option<Result<Value, BusError>> = None;
    let deadline = tokio::time::Instant::now() + PROVIDER_TIMEOUT + Duration::from_secs(5);
    let mut timed_out = false;
    loop {
        tokio::select! {
            frame = reader.next() => {
                let Some(frame) = frame else { break };
                // Frames already waiting are merged into one `message_update` (the latest
                // partial holds every earlier delta), so a fast stream costs one push per
                // batch instead of one per token.
                let mut update: Option<Value> = None;
                let mut closed = false;
                let mut next = Some(frame);
                while let Some(frame) = next.take() {
                    if let ChannelFrame::Text(text) = frame
                        && let Ok(ev) = serde_json::from_str::<AssistantMessageEvent>(&text)
                    {
                        match ev {
                            AssistantMessageEvent::Done { message } | AssistantMessageEvent::Error { error: message } => final_message = Some(message),
                            other => {
                                let mut llm_event = serde_json::to_value(&other).unwrap_or(Value::Null);
                                let partial = llm_event.as_object_mut().and_then(|o| o.remove("partial"));
                                if let Some(p) = partial {
                                    update = Some(json!({"message": p, "llm_event": llm_event}));
                                }
                            }
                        }
                    }
                    match reader.next().now_or_never() {
                        Some(Some(more)) => next = Some(more),
                        Some(None) => closed = true,
                        None => {}
                    }
                }
                if let Some(u) = update {
                    emit_transient(ctx, rec, "message_update", u).await;
                }
                if closed {
                    break;
                }
            }
            // A provider that fails before attaching the writer (not registered, refused the
            // request) must not leave us waiting for a stream that will never come.
            r = &mut call, if call_result.is_none() => {
                let r = r.map_err(|e| StepError::Fatal(e.to_string()))?;
                let failed = r.is_err();
                call_result = Some(r);
                if failed {
                    break;
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                break;
            }
        }
    }
    if call_result.is_none() && !timed_out {
        call_result = Some(call.await.map_err(|e| StepError::Fatal(e.to_string()))?);
    }
    // The bus could not reach the provider at all (not registered yet after a restart, its
    // worker gone, the call lost): nothing was decided, so the step is retried with the
    // queue's backoff, and dead-lettered with this reason if it never gets through. A
    // provider that answered (even with an error) decided the turn; that is recorded below.
    if final_message.is_none()
        && let Some(Err(e)) = &call_result
        && is_unreachable(e)
    {
        let why = format!("provider::{}::stream: {e}", req.provider);
        emit_transient(
            ctx,
            rec,
            "turn_step_retry",
            json!({"state": "assistant_streaming", "error": why}),
        )
        .await;
        return Err(StepError::Transient(ErrorBody::new(e.code(), why)));
    }
    let message = match (final_message, timed_out, call_result) {
        (Some(m), _, _) => m,
        (None, true, _) => error_message(
            req,
            ErrorKind::Transient,
            "the provider stream did not finish in time".into(),
        ),
        (None, _, Some(Err(e))) => error_message(
            req,
            ErrorKind::Transient,
            format!("provider::{}::stream: {e}", req.provider),
        ),
        (None, _, _) => error_message(
            req,
            ErrorKind::Transient,
            "the provider closed the stream without a final message".into(),
        ),
    };
    let message = with_usable_call_ids(message, rec.turn_count);
    // The stored message is the one decided on (a re-run step gets the first run's back).
    let message = append_history(ctx, rec, vec![message], "a")
        .await?
        .pop()
        .ok_or_else(|| StepError::Fatal("the assistant message was not stored".into()))?;
    emit(rec, "message_complete", json!({"message": message}));
    rec.last_assistant = Some(message.clone());
    let AgentMessage::Assistant {
        stop_reason,
        content,
        error_kind,
        error_message,
        ..
    } = &message
    else {
        return Err(StepError::Fatal(
            "the provider answered with a non-assistant message".into(),
        ));
    };
    match stop_reason {
        StopReason::Error | StopReason::Aborted => {
            rec.error = Some(TurnError {
                kind: error_kind
                    .map(|k| {
                        serde_json::to_value(k)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    })
                    .unwrap_or_else(|| "aborted".into()),
                message: error_message.clone().unwrap_or_default(),
            });
            emit_turn_end(rec, Vec::new());
            Ok(Next::To(TurnState::Stopped))
        }
        _ => {
            let calls: Vec<Call> = content
                .iter()
                .filter_map(|c| match c {
                    ContentBlock::FunctionCall {
                        id,
                        function_id,
                        arguments,
                    } if function_id == AGENT_TRIGGER => Some(Call {
                        function_call_id: id.clone(),
                        function_id: arguments["function"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        args: arguments
                            .get("payload")
                            .cloned()
                            .unwrap_or_else(|| json!({})),
                    }),
                    ContentBlock::FunctionCall {
                        id,
                        function_id,
                        arguments,
                    } => Some(Call {
                        function_call_id: id.clone(),
                        function_id: function_id.clone(),
                        args: arguments.clone(),
                    }),
                    _ => None,
                })
                .collect();
            if calls.is_empty() {
                emit_turn_end(rec, Vec::new());
                Ok(Next::To(TurnState::SteeringCheck))
            } else {
                rec.work = Some(Work {
                    prepared: calls,
                    executed: Default::default(),
                });
                rec.awaiting_approval = None;
                Ok(Next::To(TurnState::FunctionExecute))
            }
        }
    }
}

fn emit_turn_end(rec: &mut Record, results: Vec<AgentMessage>) {
    if rec.turn_end_emitted {
        return;
    }
    rec.turn_end_emitted = true;
    let data = json!({"message": rec.last_assistant, "function_results": results});
    emit(rec, "turn_end", data.clone());
    let item = format!("{}-{}", rec.session_id, rec.turn_count);
    let mut end = data;
    end["type"] = json!("turn_end");
    let sid = rec.session_id.clone();
    rec.outbox
        .push((TURN_END_STREAM.to_string(), sid, item, end));
}

/// Call the target with the routing envelope; a failing target is an error result.
/// `announce`: emit `function_execution_start` (an approved call announced it when parked).
async fn dispatch(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    call: &Call,
    announce: bool,
) -> Executed {
    dispatch_with(ctx, hooks, rec, call, announce, false).await
}

/// `network`: the policy's allow rule opened the network to this call's sandbox. The model
/// cannot ask for it: a `sandbox` field in its arguments is dropped.
async fn dispatch_with(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    call: &Call,
    announce: bool,
    network: bool,
) -> Executed {
    if announce {
        emit(
            rec,
            "function_execution_start",
            json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "args": redact(&call.args)}),
        );
    }
    if let Some(envelope) = hooks::before_call(ctx, hooks, &rec.session_id, call).await {
        return refused(rec, call, envelope);
    }
    let started = Instant::now();
    let mut payload = call.args.clone();
    if let Some(o) = payload.as_object_mut() {
        o.remove("sandbox");
        if network {
            o.insert("sandbox".into(), json!({"network": true}));
        }
        o.insert("session_id".into(), json!(rec.session_id));
        o.insert("function_call_id".into(), json!(call.function_call_id));
        o.insert("function_id".into(), json!(call.function_id));
    }
    // The call's start is shown before it runs, however long it takes.
    flush_events(ctx, rec).await;
    let (result, is_error) = match ctx
        .trigger_timeout(&call.function_id, payload, CALL_TIMEOUT)
        .await
    {
        Ok(v) => (v, false),
        Err(e) => (
            json!({"error": {"code": e.code(), "message": e.message()}}),
            true,
        ),
    };
    let (result, is_error) =
        hooks::after_call(ctx, hooks, &rec.session_id, call, result, is_error).await;
    let executed = Executed {
        call: call.clone(),
        result,
        is_error,
        duration_ms: started.elapsed().as_millis() as u64,
        terminate: false,
    };
    emit_execution_end(rec, &executed);
    executed
}

fn emit_execution_end(rec: &mut Record, e: &Executed) {
    emit(
        rec,
        "function_execution_end",
        json!({"function_call_id": e.call.function_call_id, "function_id": e.call.function_id, "result": e.result, "is_error": e.is_error, "duration_ms": e.duration_ms}),
    );
}

fn result_message(e: &Executed) -> AgentMessage {
    AgentMessage::FunctionResult {
        function_call_id: e.call.function_call_id.clone(),
        function_id: e.call.function_id.clone(),
        content: vec![ContentBlock::Text {
            text: e.result.to_string(),
        }],
        details: e.result.clone(),
        is_error: e.is_error,
        timestamp: now(),
    }
}

/// All calls of the batch are decided: append the results once, in call order.
async fn finalize_batch(ctx: &Ctx, rec: &mut Record) -> StepResult<Next> {
    let work = rec.work.clone().unwrap_or_default();
    let mut results = Vec::new();
    let mut terminate = false;
    for call in &work.prepared {
        if let Some(e) = work.executed.get(&call.function_call_id) {
            results.push(result_message(e));
            terminate |= e.terminate;
        }
    }
    let results = append_history(ctx, rec, results, "r").await?;
    rec.work = None;
    rec.function_results = results.clone();
    rec.awaiting_approval = None;
    emit_turn_end(rec, results);
    if terminate {
        rec.error = Some(TurnError {
            kind: "aborted".into(),
            message: "a call was aborted by the user".into(),
        });
        Ok(Next::To(TurnState::Stopped))
    } else {
        Ok(Next::To(TurnState::SteeringCheck))
    }
}

/// Functions the orchestrator never dispatches for the model, whatever the policy answers: a
/// swapped or buggy policy must not let the agent approve its own calls, rewrite the policy,
/// start runs, change credentials, write state behind the record's back or drive the engine.
const NEVER_FOR_THE_AGENT: &[&str] = &[
    "approval::*",
    "policy::*",
    "run::start",
    "auth::set_token",
    "auth::delete_token",
    "shell::cancel",
    "state::set",
    "state::update",
    "state::delete",
    "engine::*",
    "iii::*",
];

fn never_for_the_agent(function_id: &str) -> Option<&'static str> {
    NEVER_FOR_THE_AGENT
        .iter()
        .copied()
        .find(|p| match p.strip_suffix('*') {
            Some(prefix) => function_id.starts_with(prefix),
            None => function_id == *p,
        })
}

/// Call ids the orchestrator can key results and approvals by: a provider id that is empty,
/// too long, holds `/` or repeats another of the same message is replaced by
/// `call-<turn>-<index>`, in the stored message too, so the provider's round trip still pairs
/// each result with its call.
fn with_usable_call_ids(mut message: AgentMessage, turn: u32) -> AgentMessage {
    if let AgentMessage::Assistant { content, .. } = &mut message {
        let mut seen = std::collections::HashSet::new();
        for (index, block) in content.iter_mut().enumerate() {
            if let ContentBlock::FunctionCall { id, .. } = block {
                let usable = !id.is_empty() && id.len() <= 128 && !id.contains('/');
                if !usable || !seen.insert(id.clone()) {
                    let mut fresh = format!("call-{turn}-{index}");
                    while seen.contains(&fresh) {
                        fresh.push('_');
                    }
                    seen.insert(fresh.clone());
                    *id = fresh;
                }
            }
        }
    }
    message
}

async fn function_execute(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    version: &mut u64,
) -> StepResult<Next> {
    let prepared = rec
        .work
        .as_ref()
        .map(|w| w.prepared.clone())
        .unwrap_or_default();
    for call in prepared {
        let done = rec
            .work
            .as_ref()
            .is_some_and(|w| w.executed.contains_key(&call.function_call_id));
        let parked = rec.awaiting_approval.as_ref().is_some_and(|a| {
            a.iter()
                .any(|c| c.function_call_id == call.function_call_id)
        });
        if done || parked {
            continue;
        }
        if let Some(pattern) = never_for_the_agent(&call.function_id) {
            let env = denial(
                "permissions",
                &call.function_id,
                Some("harness.internal_only"),
                Some(&json!(pattern)),
                &call.args,
                "this function is for humans and the harness itself; the orchestrator never calls it for the model, whatever the policy says",
            );
            let executed = denied(rec, &call, env);
            if let Some(w) = rec.work.as_mut() {
                w.executed.insert(call.function_call_id.clone(), executed);
            }
            save(&durably(ctx), rec, version).await?;
            continue;
        }
        // The one choke point: the policy decides, and silence or slowness means deny.
        let decision = ctx
            .trigger_timeout(
                "policy::check_permissions",
                json!({"function_id": call.function_id, "args": call.args, "session_id": rec.session_id}),
                POLICY_TIMEOUT,
            )
            .await;
        let executed = match decision
            .as_ref()
            .map(|d| d["decision"].as_str().unwrap_or(""))
        {
            Ok("allow") => {
                let network = decision.as_ref().is_ok_and(|d| d["network"] == true);
                dispatch_with(ctx, hooks, rec, &call, true, network).await
            }
            Ok("needs_approval") => {
                // Parked (and saved) before it is announced, so an approver who reacts to the
                // event finds it pending.
                rec.awaiting_approval
                    .get_or_insert_with(Vec::new)
                    .push(call.clone());
                save(ctx, rec, version).await?;
                emit(
                    rec,
                    "function_execution_start",
                    json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "args": redact(&call.args), "awaiting_approval": true}),
                );
                continue;
            }
            Ok(_) => {
                let d = decision.as_ref().ok().cloned().unwrap_or(Value::Null);
                let env = denial(
                    "permissions",
                    &call.function_id,
                    d["rule_id"].as_str(),
                    d.get("matched_constraint"),
                    &call.args,
                    "the permissions policy denies this call",
                );
                denied(rec, &call, env)
            }
            Err(e) => {
                let env = denial(
                    "gate_unavailable",
                    &call.function_id,
                    None,
                    None,
                    &call.args,
                    &format!("the policy could not be asked ({e}); denied to be safe"),
                );
                denied(rec, &call, env)
            }
        };
        if let Some(w) = rec.work.as_mut() {
            w.executed.insert(call.function_call_id.clone(), executed);
        }
        // Saved durably after every call (with whatever the call itself wrote): a
        // redelivered step never runs it again.
        save(&durably(ctx), rec, version).await?;
    }
    if rec
        .awaiting_approval
        .as_ref()
        .is_some_and(|a| !a.is_empty())
    {
        return Ok(Next::To(TurnState::FunctionAwaitingApproval));
    }
    finalize_batch(ctx, rec).await
}

fn denied(rec: &mut Record, call: &Call, envelope: Value) -> Executed {
    emit(
        rec,
        "function_execution_start",
        json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "args": redact(&call.args)}),
    );
    refused(rec, call, envelope)
}

/// A call that was not run: its denial envelope is the result (announced already).
fn refused(rec: &mut Record, call: &Call, envelope: Value) -> Executed {
    let e = Executed {
        call: call.clone(),
        result: envelope,
        is_error: true,
        duration_ms: 0,
        terminate: false,
    };
    emit_execution_end(rec, &e);
    e
}

async fn function_awaiting_approval(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    version: &mut u64,
) -> StepResult<Next> {
    let parked = rec.awaiting_approval.clone().unwrap_or_default();
    for call in parked {
        let decision = ctx
            .state_get(
                APPROVALS,
                &format!("{}/{}", rec.session_id, call.function_call_id),
            )
            .await?;
        // A decision counts only for the call it was made for: same function, same
        // arguments. Anything else under this id (a leftover of an earlier call) is ignored
        // and the call stays parked until it is decided itself.
        let bound = decision["function_id"] == call.function_id.as_str()
            && decision["args_hash"] == args_hash(&call.args).as_str();
        if decision.is_null() || !bound {
            continue;
        }
        let reason = decision["reason"].as_str().unwrap_or("").to_string();
        // The decision record is deleted once applied: the event log keeps who decided what.
        emit(
            rec,
            "approval_applied",
            json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "decision": decision["decision"], "reason": reason, "decided_by": decision["decided_by"], "decided_at": decision["decided_at"]}),
        );
        let executed = match decision["decision"].as_str() {
            // Approved: dispatched without asking the policy again.
            Some("allow") => dispatch(ctx, hooks, rec, &call, false).await,
            Some("deny") => {
                let why = if reason.is_empty() {
                    "denied by the user".to_string()
                } else {
                    reason
                };
                let env = denial("user", &call.function_id, None, None, &call.args, &why);
                refused(rec, &call, env)
            }
            _ => {
                let e = Executed {
                    call: call.clone(),
                    result: json!({"status": "aborted", "terminate": true, "reason": if reason.is_empty() { "aborted by the user".to_string() } else { reason }}),
                    is_error: true,
                    duration_ms: 0,
                    terminate: true,
                };
                emit_execution_end(rec, &e);
                e
            }
        };
        if let Some(w) = rec.work.as_mut() {
            w.executed.insert(call.function_call_id.clone(), executed);
        }
        if let Some(a) = rec.awaiting_approval.as_mut() {
            a.retain(|c| c.function_call_id != call.function_call_id);
        }
        save(&durably(ctx), rec, version).await?;
        // Consumed: the decision goes once the call's outcome is saved. (Should this delete
        // be lost, the binding above still keeps it from applying to any other call.)
        let key = format!("{}/{}", rec.session_id, call.function_call_id);
        if let Err(e) = ctx.state_delete(APPROVALS, &key).await {
            tracing::warn!(%key, error = %e, "a consumed approval could not be deleted");
        }
    }
    if rec
        .awaiting_approval
        .as_ref()
        .is_some_and(|a| !a.is_empty())
    {
        return Ok(Next::Stay);
    }
    finalize_batch(ctx, rec).await
}

async fn steering_check(ctx: &Ctx, rec: &mut Record) -> StepResult<Next> {
    let results_pending = !rec.function_results.is_empty();
    rec.function_results.clear();
    if rec.max_turns.is_some_and(|m| rec.turn_count >= m) {
        if results_pending {
            let note = AgentMessage::Custom {
                custom_type: "max_turns".into(),
                content: vec![ContentBlock::Text {
                    text: format!(
                        "max_turns reached ({} turns); the run stops here.",
                        rec.turn_count
                    ),
                }],
                display: Some("max_turns reached".into()),
                details: json!({"max_turns": rec.max_turns}),
                timestamp: now(),
            };
            for m in append_history(ctx, rec, vec![note], "m").await? {
                emit(rec, "message_complete", json!({"message": m}));
            }
            rec.error = Some(TurnError {
                kind: "max_turns".into(),
                message: format!("max_turns ({}) reached", rec.turn_count),
            });
        }
        return Ok(Next::To(TurnState::Stopped));
    }
    // Steering first, then follow-ups (the inbox worker may not run). Peek, store, then
    // drain exactly what was stored: a crash in between leaves the items in the inbox, and
    // the retry's appends are no-ops (ids from each item's content and position).
    for name in ["steering", "followup"] {
        let Some(v) = best_effort(
            ctx,
            "session-inbox::peek",
            json!({"name": name, "session_id": rec.session_id}),
        )
        .await
        else {
            continue;
        };
        let raw: Vec<Value> = v["items"].as_array().cloned().unwrap_or_default();
        if raw.is_empty() {
            continue;
        }
        for (i, item) in raw.iter().enumerate() {
            let message = item
                .as_str()
                .map(harness_sdk::messages::user_text)
                .or_else(|| serde_json::from_value(item.clone()).ok())
                .unwrap_or_else(|| harness_sdk::messages::user_text(&item.to_string()));
            let tag = format!("{name}-{:016x}-", content_hash(i, item));
            append_history(ctx, rec, vec![message], &tag).await?;
        }
        ctx.trigger(
            "session-inbox::drain",
            json!({"name": name, "session_id": rec.session_id, "max": raw.len()}),
        )
        .await?;
        return Ok(Next::To(TurnState::AssistantStreaming));
    }
    if results_pending {
        return Ok(Next::To(TurnState::AssistantStreaming));
    }
    Ok(Next::To(TurnState::Stopped))
}

/// FNV-1a of an inbox item and its position: a stable, content-derived entry id part.
fn content_hash(position: usize, item: &Value) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in position
        .to_le_bytes()
        .iter()
        .chain(item.to_string().as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

// ------------------------------------------------------------------ the step driver

async fn step(
    ctx: &Ctx,
    hooks: &Hooks,
    expected: TurnState,
    data: &Value,
) -> Result<Value, ErrorBody> {
    // Everything this step writes (record, events, history, the next step) becomes durable
    // with the step's queue acknowledgement; only what must outlive a crash on its own (the
    // record after each executed call) is written durably at once.
    let ctx = &ctx.with_baggage(DURABILITY_BAGGAGE, "deferred");
    let sid = req_str(data, "session_id")?;
    let stale = json!({"ok": true, "skipped": true, "reason": "stale"});
    let (mut rec, mut version) = match load(ctx, &sid).await {
        Ok(Some(x)) => x,
        Ok(None) | Err(StepError::Stale) => return Ok(stale),
        Err(StepError::Transient(e)) => return Err(e),
        Err(StepError::Fatal(e)) => return Err(ErrorBody::new("invocation_error", e)),
    };
    if rec.state != expected {
        return Ok(stale);
    }
    let loaded_version = version;
    let outcome = async {
        let req = run_request(ctx, &rec).await?;
        match expected {
            TurnState::Provisioning => provisioning(ctx, &mut rec, &req).await,
            TurnState::AssistantStreaming => assistant_streaming(ctx, &mut rec, &req).await,
            TurnState::FunctionExecute => {
                function_execute(ctx, hooks, &mut rec, &mut version).await
            }
            TurnState::FunctionAwaitingApproval => {
                function_awaiting_approval(ctx, hooks, &mut rec, &mut version).await
            }
            TurnState::SteeringCheck => steering_check(ctx, &mut rec).await,
            TurnState::Stopped | TurnState::Failed => Ok(Next::Stay),
        }
    }
    .await;
    // steering_check runs in the step that leads to it, not as a queued step of its own: a
    // load, a save, a send and a receive fewer per model turn. The UI still sees the state
    // pass; its queued step remains for records saved in it.
    let outcome = match outcome {
        Ok(Next::To(TurnState::SteeringCheck)) => {
            rec.state = TurnState::SteeringCheck;
            let changed = state_changed(&rec, "state:updated");
            emit(&mut rec, "turn_state_changed", changed);
            steering_check(ctx, &mut rec).await
        }
        other => other,
    };
    match outcome {
        Ok(Next::Stay) => {
            flush_events(ctx, &mut rec).await;
            Ok(json!({"ok": true, "from_state": expected, "to_state": expected}))
        }
        Ok(Next::To(to)) => {
            rec.state = to;
            if to == TurnState::Stopped {
                // finish, inline.
                let messages = history_for_event(ctx, &rec).await;
                emit(&mut rec, "agent_end", json!({"messages": messages}));
            }
            // The state-change event goes out with the step's other events, in the write
            // just before the save: a delivery that loses the save to another delivery of
            // the same step wrote the same items (same loaded record, same seqs).
            let changed = state_changed(&rec, "state:updated");
            emit(&mut rec, "turn_state_changed", changed);
            // A run that ends or waits for a human is durable at once; other transitions
            // become durable with the step's acknowledgement (or the next executed call).
            let save_ctx = if to.terminal() || to == TurnState::FunctionAwaitingApproval {
                durably(ctx)
            } else {
                ctx.clone()
            };
            match save(&save_ctx, &mut rec, &mut version).await {
                Ok(()) => {}
                Err(StepError::Stale) => return Ok(stale),
                Err(StepError::Transient(e)) => return Err(e),
                Err(StepError::Fatal(e)) => return Err(ErrorBody::new("invocation_error", e)),
            }
            // Entering function_awaiting_approval also queues one check: a decision written
            // before this transition found no parked session to wake.
            let needs_step = !to.terminal();
            if needs_step
                && let Err(StepError::Transient(e)) =
                    enqueue_step(ctx, &sid, to, format!("{sid}-{to:?}-{loaded_version}")).await
            {
                return Err(e);
            }
            Ok(json!({"ok": true, "from_state": expected, "to_state": to}))
        }
        Err(StepError::Stale) => Ok(stale),
        Err(StepError::Transient(e)) => Err(e),
        Err(StepError::Fatal(message)) => {
            // Unexpected: fail the run with events the UI can show; the message is acknowledged.
            // What the step emitted before it failed is shown too.
            flush_events(ctx, &mut rec).await;
            let (mut rec, mut version) = match load(ctx, &sid).await {
                Ok(Some(x)) => x,
                _ => return Ok(json!({"ok": false, "error": message})),
            };
            rec.state = TurnState::Failed;
            rec.error = Some(TurnError {
                kind: "transition_error".into(),
                message: message.clone(),
            });
            let failed = AgentMessage::Assistant {
                content: Vec::new(),
                stop_reason: StopReason::Error,
                error_message: Some(message.clone()),
                error_kind: Some(ErrorKind::Permanent),
                usage: None,
                model: String::new(),
                provider: String::new(),
                timestamp: now(),
            };
            emit(&mut rec, "message_complete", json!({"message": failed}));
            let messages = history_for_event(ctx, &rec).await;
            emit(&mut rec, "agent_end", json!({"messages": messages}));
            let _ = save(ctx, &mut rec, &mut version).await;
            Ok(json!({"ok": false, "from_state": expected, "to_state": "failed", "error": message}))
        }
    }
}

// ------------------------------------------------------------------ public functions

async fn run_start(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    for f in ["session_id", "provider", "model"] {
        req_str(&data, f)?;
    }
    let req: RunRequest = serde_json::from_value(data.clone())
        .map_err(|e| ErrorBody::invalid(format!("invalid run::start request: {e}")))?;
    if req.session_id.is_empty() || req.session_id.contains('/') {
        return Err(ErrorBody::invalid(
            "`session_id` must be non-empty and contain no `/`",
        ));
    }
    if let Some(skills) = &req.system_default_skills {
        if skills.len() > MAX_DEFAULT_SKILLS {
            return Err(ErrorBody::invalid(format!(
                "`system_default_skills` holds {} ids; at most {MAX_DEFAULT_SKILLS}",
                skills.len()
            )));
        }
        if let Some(bad) = skills
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_SKILL_ID_LEN || s.chars().any(char::is_control))
        {
            let shown: String = bad.chars().take(40).collect();
            return Err(ErrorBody::invalid(format!(
                "`system_default_skills` entry `{shown}` must be 1 to {MAX_SKILL_ID_LEN} characters, without control characters"
            )));
        }
    }
    let sid = req.session_id.clone();
    let busy = json!({"session_id": sid, "started": false, "reason": "session_busy"});
    let existing = load(&ctx, &sid).await.map_err(|e| match e {
        StepError::Transient(e) => e,
        StepError::Fatal(m) => ErrorBody::new("invocation_error", m),
        StepError::Stale => ErrorBody::new("invocation_error", "stale"),
    })?;
    if existing.as_ref().is_some_and(|(r, _)| !r.state.terminal()) {
        return Ok(busy);
    }
    // The history lives in the session tree when the session worker runs (provisioning
    // resumes from its current leaf); otherwise in the record, carried over from a stopped run.
    let tree = match ctx
        .trigger_timeout(
            "session-tree::ensure",
            json!({"session_id": sid}),
            BEST_EFFORT_TIMEOUT,
        )
        .await
    {
        Ok(_) => true,
        Err(BusError::FunctionNotFound(_)) => false,
        Err(e) => return Err(e.into()),
    };
    let (mut messages, expected) = match existing {
        Some((r, v)) => (if tree { Vec::new() } else { r.messages }, v),
        None => (Vec::new(), 0),
    };
    if !tree {
        messages.extend(req.messages.iter().cloned());
    }
    let run_key = req
        .message_id
        .clone()
        .or_else(|| ctx.message_id().map(str::to_owned))
        .filter(|k| !k.is_empty() && !k.contains('/'))
        .unwrap_or_else(|| format!("run{}", engine_gateway::trace::random_hex(6)));
    ctx.state_set(SCOPE, &request_key(&sid), data).await?;
    let t = now();
    let mut rec = Record {
        session_id: sid.clone(),
        state: TurnState::Provisioning,
        turn_count: 0,
        max_turns: req.max_turns,
        function_results: Vec::new(),
        turn_end_emitted: false,
        started_at_ms: t,
        updated_at_ms: t,
        model_meta: None,
        error: None,
        last_assistant: None,
        work: None,
        awaiting_approval: None,
        messages,
        tree,
        tree_leaf: None,
        run_key,
        budget_ids: Vec::new(),
        // The first event's seq, reserved: it is written once the record is (a busy session
        // keeps its own events).
        event_seq: 1,
        outbox: Vec::new(),
    };
    let mut version = expected;
    match save(&ctx, &mut rec, &mut version).await {
        Ok(()) => {}
        Err(StepError::Stale) => return Ok(busy),
        Err(StepError::Transient(e)) => return Err(e),
        Err(StepError::Fatal(m)) => return Err(ErrorBody::new("invocation_error", m)),
    }
    let created = state_changed(&rec, "state:created");
    emit_at(&mut rec, 1, "turn_state_changed", created);
    flush_events(&ctx, &mut rec).await;
    enqueue_step(
        &ctx,
        &sid,
        TurnState::Provisioning,
        format!("{sid}-start-{version}"),
    )
    .await
    .map_err(|e| match e {
        StepError::Transient(e) => e,
        _ => ErrorBody::new("enqueue_error", "could not enqueue the first step"),
    })?;
    Ok(json!({"session_id": sid, "started": true}))
}

async fn run_abort(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = req_str(&data, "session_id")?;
    for _ in 0..5 {
        let Some((mut rec, mut version)) = load(&ctx, &sid)
            .await
            .map_err(|_| ErrorBody::new("storage_error", "cannot read the turn record"))?
        else {
            return Ok(json!({"session_id": sid, "aborted": false, "state": null}));
        };
        if rec.state.terminal() {
            return Ok(json!({"session_id": sid, "aborted": false, "state": rec.state}));
        }
        rec.state = TurnState::Stopped;
        rec.error = Some(TurnError {
            kind: "aborted".into(),
            message: "aborted by run::abort".into(),
        });
        rec.awaiting_approval = None;
        let messages = history_for_event(&ctx, &rec).await;
        emit(&mut rec, "agent_end", json!({"messages": messages}));
        match save(&ctx, &mut rec, &mut version).await {
            Ok(()) => {
                let changed = state_changed(&rec, "state:updated");
                emit(&mut rec, "turn_state_changed", changed);
                let _ = save(&ctx, &mut rec, &mut version).await;
                // A command the run started dies with it (best effort: a tools worker that
                // does not offer this lets the command run out its timeout).
                let killed = best_effort(&ctx, "shell::cancel", json!({"session_id": sid}))
                    .await
                    .and_then(|v| v["killed"].as_u64())
                    .unwrap_or(0);
                return Ok(
                    json!({"session_id": sid, "aborted": true, "state": "stopped", "commands_killed": killed}),
                );
            }
            Err(StepError::Stale) => continue,
            Err(StepError::Transient(e)) => return Err(e),
            Err(StepError::Fatal(m)) => return Err(ErrorBody::new("invocation_error", m)),
        }
    }
    Err(ErrorBody::new(
        "version_conflict",
        "the run kept changing; try again",
    ))
}

async fn get_state(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = req_str(&data, "session_id")?;
    match load(&ctx, &sid).await {
        Ok(Some((rec, _))) => Ok(rec.view()),
        Ok(None) => Ok(Value::Null),
        Err(StepError::Transient(e)) => Err(e),
        Err(_) => Err(ErrorBody::new(
            "storage_error",
            "cannot read the turn record",
        )),
    }
}

/// State trigger on `approvals`: wake the parked session with a queued step.
async fn on_approval(ctx: Ctx, event: Value) -> Result<Value, ErrorBody> {
    let key = event["key"].as_str().unwrap_or_default();
    let Some((sid, cid)) = key.split_once('/') else {
        return Ok(json!({"ignored": key}));
    };
    if event["event_type"] == "state:deleted" {
        return Ok(json!({"ignored": key}));
    }
    if let Ok(Some((rec, _))) = load(&ctx, sid).await
        && rec.state == TurnState::FunctionAwaitingApproval
    {
        enqueue_step(
            &ctx,
            sid,
            TurnState::FunctionAwaitingApproval,
            // Per decision, not per call id: a later call parked under the same id must
            // wake the session too (the queue drops a repeated deduplication id).
            format!(
                "{sid}-approval-{cid}-{}",
                event["new_value"]["decided_at"].as_u64().unwrap_or(0)
            ),
        )
        .await
        .map_err(|_| ErrorBody::new("enqueue_error", "could not wake the session"))?;
        return Ok(json!({"woke": sid}));
    }
    Ok(json!({"ignored": key}))
}

fn def(id: &str, description: &str) -> RegisterFunction {
    let mut d = RegisterFunction::new(id);
    d.description = Some(description.to_string());
    d
}

/// First retry delay of a failed step; each next one doubles (SPEC's exponential backoff).
pub const STEP_BACKOFF_MS: u64 = engine_gateway::queue::DEFAULT_BACKOFF_MS;

/// How long a step that keeps failing transiently is retried before it is dead-lettered:
/// `HARNESS_STEP_RETRY_SECS`, default 60 s.
pub fn step_retry_window() -> Duration {
    let default = Duration::from_secs(60);
    match std::env::var("HARNESS_STEP_RETRY_SECS") {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(secs) if secs > 0 => Duration::from_secs(secs),
            _ => {
                tracing::warn!(value = %v, "HARNESS_STEP_RETRY_SECS must be a positive number of seconds; using 60");
                default
            }
        },
    }
}

/// The fewest retries whose backoff delays (1 s, 2 s, 4 s…) add up to `window`.
pub fn step_retries(window: Duration) -> u32 {
    let mut total = 0u64;
    let mut n = 0u32;
    while total < window.as_millis() as u64 && n < 16 {
        total += STEP_BACKOFF_MS << n;
        n += 1;
    }
    n.max(1)
}

/// An orchestrator instance's settings (`harness.yaml`'s `hooks` and `compaction`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tokens kept free below the model's window before a pre-flight compaction.
    pub reserved_tokens: u64,
    pub before_call_timeout_ms: u64,
    pub after_call_timeout_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            reserved_tokens: RESERVED_TOKENS,
            before_call_timeout_ms: hooks::BEFORE_TIMEOUT_MS,
            after_call_timeout_ms: hooks::AFTER_TIMEOUT_MS,
        }
    }
}

pub fn worker() -> Worker {
    worker_with(Settings::default())
}

pub fn worker_with(settings: Settings) -> Worker {
    let hooks = Arc::new(Hooks::new(
        settings.before_call_timeout_ms,
        settings.after_call_timeout_ms,
    ));
    let cache = Arc::new(InstanceCache {
        reserved_tokens: settings.reserved_tokens,
        ..InstanceCache::default()
    });
    let mut w = Worker::new("turn-orchestrator");
    w.register_function(def("run::start", "Start (or resume) a run: {session_id, provider, model, messages?, mode?, max_turns?, system_prompt?, system_default_skills?}."), run_start);
    w.register_function(
        def("run::abort", "Stop a run now: {session_id}.").public(),
        run_abort,
    );
    w.register_function(
        def(
            "turn::get_state",
            "The TurnStateView of a session, or null.",
        )
        .public(),
        get_state,
    );
    for state in [
        TurnState::Provisioning,
        TurnState::AssistantStreaming,
        TurnState::FunctionExecute,
        TurnState::FunctionAwaitingApproval,
        TurnState::SteeringCheck,
    ] {
        w.register_function(
            def(&state.step_function(), "A turn step (queue consumer)."),
            {
                let hooks = hooks.clone();
                let cache = cache.clone();
                move |ctx, data: Value| {
                    let hooks = hooks.clone();
                    let cache = cache.clone();
                    CACHE.scope(cache, async move { step(&ctx, &hooks, state, &data).await })
                }
            },
        );
    }
    w.register_function(
        def(
            "turn::on_approval",
            "State trigger on approvals: wakes the parked session.",
        ),
        on_approval,
    );
    w.register_trigger(
        "queue",
        "turn::provisioning",
        json!({"queue": QUEUE, "type": "fifo", "message_group_field": "session_id", "max_retries": step_retries(step_retry_window()), "backoff_ms": STEP_BACKOFF_MS, "visibility_timeout_ms": 360000, "concurrency": 16}),
    );
    w.register_trigger("state", "turn::on_approval", json!({"scope": APPROVALS}));
    w
}

#[cfg(test)]
mod retry_window_tests {
    use super::*;

    #[test]
    fn the_retry_count_covers_the_window() {
        // 1 + 2 + 4 + 8 + 16 + 32 = 63 s ≥ 60 s.
        assert_eq!(step_retries(Duration::from_secs(60)), 6);
        assert_eq!(step_retries(Duration::from_secs(1)), 1);
        assert_eq!(step_retries(Duration::from_secs(0)), 1);
        assert_eq!(step_retries(Duration::from_secs(3)), 2);
        assert_eq!(step_retries(Duration::from_secs(u64::MAX / 2000)), 16);
    }
}
