//! context-compaction (SPEC §3): when a session's context outgrows the model's usable window,
//! summarize its head with the session's own model and append a `compaction` entry; the tree
//! then serves summary + kept tail as the context.
//!
//! `compact_now` compacts only when over the threshold (the orchestrator's pre-flight check
//! and the `agent::turn_end` wake use it); `compact_session` compacts regardless (a user's
//! "compact now"); `prune_tool_outputs` shortens large old tool results in place. A lease at
//! `compaction-lease/<sid>` (TTL 300 s) keeps one compactor per session.

pub mod plan;

use bus::builtins::req_str;
use futures_util::future::BoxFuture;
use harness_sdk::messages::{AgentMessage, ContentBlock, StopReason, user_text};
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, Worker, Write, def};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub const LEASE_SCOPE: &str = "compaction-lease";
pub const LEASE_MS: u64 = 300_000;
pub const DEFAULT_WINDOW: u64 = 128_000;
const SUMMARY_TIMEOUT: Duration = Duration::from_secs(240);
/// Tool results longer than this, outside the kept turns, are pruned.
pub const PRUNE_OVER_CHARS: usize = 2_000;

/// A compactor's thresholds (`harness.yaml`'s `compaction`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tokens kept free below the model's window (at most half of it).
    pub reserved_tokens: u64,
    /// Model turns always kept verbatim (at least one).
    pub keep_turns: usize,
    /// Older tool results longer than this are pruned (unless a request says otherwise).
    pub prune_over_chars: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            reserved_tokens: plan::RESERVED,
            keep_turns: plan::KEEP_TURNS,
            prune_over_chars: PRUNE_OVER_CHARS,
        }
    }
}

/// The session's model context and the entry each message came from.
async fn session_messages(
    ctx: &Ctx,
    sid: &str,
) -> Result<(Vec<AgentMessage>, Vec<String>), ErrorBody> {
    use harness_sdk::contracts::session_tree::{MESSAGES, MessagesAnswer, MessagesRequest};
    let v = ctx
        .trigger(
            MESSAGES,
            json!(MessagesRequest {
                session_id: sid.to_string(),
                leaf_id: None,
            }),
        )
        .await?;
    let answer: MessagesAnswer = harness_sdk::contracts::parse(MESSAGES, v)
        .map_err(|e| ErrorBody::new("storage", format!("unreadable session messages: {e}")))?;
    Ok((answer.messages, answer.entry_ids))
}

fn now() -> u64 {
    harness_sdk::messages::now_ms()
}

fn storage(e: BusError) -> ErrorBody {
    ErrorBody::new("storage", e.to_string())
}

/// Take the session's lease → false when another live compactor holds it.
async fn acquire(ctx: &Ctx, sid: &str, owner: &str) -> Result<bool, ErrorBody> {
    let t = now();
    ctx.state_transact(LEASE_SCOPE, sid, |current| {
        let held = current
            .as_ref()
            .is_some_and(|l| l["until_ms"].as_u64().unwrap_or(0) > t && l["owner"] != owner);
        if held {
            return Ok((Write::Keep, false));
        }
        Ok((
            Write::Put(json!({"owner": owner, "until_ms": t + LEASE_MS})),
            true,
        ))
    })
    .await
    .map_err(storage)
}

async fn release(ctx: &Ctx, sid: &str, owner: &str) {
    let _ = ctx
        .state_transact(LEASE_SCOPE, sid, |current| {
            let mine = current.as_ref().is_some_and(|l| l["owner"] == owner);
            Ok((if mine { Write::Delete } else { Write::Keep }, ()))
        })
        .await;
}

/// The session's provider and model: given, or those of its run request.
async fn model_of(ctx: &Ctx, sid: &str, data: &Value) -> Result<(String, String), ErrorBody> {
    if let (Some(p), Some(m)) = (data["provider"].as_str(), data["model"].as_str()) {
        return Ok((p.to_string(), m.to_string()));
    }
    let req = ctx
        .state_get("agent", &format!("session/{sid}/run_request"))
        .await
        .map_err(storage)?;
    match (req["provider"].as_str(), req["model"].as_str()) {
        (Some(p), Some(m)) => Ok((p.to_string(), m.to_string())),
        _ => Err(ErrorBody::invalid(
            "no `provider`/`model` given and the session has no run to take them from",
        )),
    }
}

async fn context_window(ctx: &Ctx, provider: &str, model: &str) -> u64 {
    ctx.trigger(
        "models::get",
        json!({"provider": provider, "model_id": model}),
    )
    .await
    .ok()
    .and_then(|m| m["context_window"].as_u64())
    .unwrap_or(DEFAULT_WINDOW)
}

fn text(m: &AgentMessage) -> String {
    match m {
        AgentMessage::Assistant { content, .. } => content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

async fn compact(s: &Settings, ctx: &Ctx, data: &Value, force: bool) -> Result<Value, ErrorBody> {
    let sid = req_str(data, "session_id")?;
    let owner = format!("compactor-{}", bus_telemetry::trace::random_hex(4));
    if !acquire(ctx, &sid, &owner).await? {
        return Ok(json!({"status": "busy", "session_id": sid}));
    }
    let out = compact_locked(s, ctx, &sid, data, force).await;
    release(ctx, &sid, &owner).await;
    out
}

async fn compact_locked(
    s: &Settings,
    ctx: &Ctx,
    sid: &str,
    data: &Value,
    force: bool,
) -> Result<Value, ErrorBody> {
    let (provider, model) = model_of(ctx, sid, data).await?;
    let window = context_window(ctx, &provider, &model).await;
    let usable = plan::usable_with(window, s.reserved_tokens);
    let (messages, entry_ids) = session_messages(ctx, sid).await?;
    let tokens_before = plan::estimate(&messages);
    if !force && tokens_before <= usable {
        return Ok(
            json!({"status": "ok", "compacted": false, "session_id": sid, "tokens": tokens_before, "usable": usable}),
        );
    }
    let Some(tail) = plan::select_tail(&messages, usable, s.keep_turns) else {
        return Ok(
            json!({"status": "empty", "session_id": sid, "tokens": tokens_before, "usable": usable}),
        );
    };
    let previous = messages
        .first()
        .filter(|m| plan::is_summary(m))
        .map(|m| match m {
            AgentMessage::Custom { content, .. } => content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text { text } => Some(text.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        });
    let head_begin = usize::from(previous.is_some());
    let head = &messages[head_begin..tail];
    let request = json!({
        "model": model,
        "system_prompt": plan::system_prompt(),
        "messages": [user_text(&plan::user_prompt(previous.as_deref(), head))],
        "tools": [],
    });
    let answer = ctx
        .trigger_timeout(
            &format!("provider::{provider}::complete"),
            request,
            SUMMARY_TIMEOUT,
        )
        .await?;
    let answer: AgentMessage = serde_json::from_value(answer).map_err(|e| {
        ErrorBody::new(
            "summarize_failed",
            format!("the summarizer answered with no message: {e}"),
        )
    })?;
    if let AgentMessage::Assistant {
        stop_reason: StopReason::Error,
        error_kind,
        error_message,
        ..
    } = &answer
    {
        let overflow = matches!(
            error_kind,
            Some(harness_sdk::messages::ErrorKind::ContextOverflow)
        );
        if overflow {
            return Ok(
                json!({"status": "overflow", "session_id": sid, "tokens": tokens_before, "error": error_message}),
            );
        }
        return Err(ErrorBody::new(
            "summarize_failed",
            format!(
                "the summary call failed: {}",
                error_message.clone().unwrap_or_default()
            ),
        ));
    }
    let summary = text(&answer);
    if summary.trim().is_empty() {
        return Err(ErrorBody::new(
            "summarize_failed",
            "the model returned an empty summary",
        ));
    }
    let tail_start_id = entry_ids.get(tail).cloned();
    let tokens_after = plan::estimate(&summary) + plan::estimate(&messages[tail..]);
    let stored = ctx
        .trigger("session-tree::compact", json!({"session_id": sid, "summary": summary, "tail_start_id": tail_start_id, "tokens_before": tokens_before, "details": {"provider": provider, "model": model, "tokens_after": tokens_after, "summarized_messages": head.len()}}))
        .await?;
    let entry_id = stored["entry_id"].clone();
    let status = if tokens_after > usable {
        "overflow"
    } else {
        "ok"
    };
    let event = json!({"summary_text": summary, "tokens_before": tokens_before, "compaction_entry_id": entry_id, "tail_start_id": tail_start_id});
    if data["emit_event"] != false {
        let mut item = event.clone();
        item["type"] = json!("compaction_done");
        let item_id = format!("{sid}-compaction-{}", entry_id.as_str().unwrap_or("?"));
        if let Err(e) = ctx.stream_set("agent::events", sid, &item_id, item).await {
            tracing::warn!(error = %e, "compaction_done not stored");
        }
    }
    Ok(
        json!({"status": status, "compacted": true, "session_id": sid, "tokens_before": tokens_before, "tokens_after": tokens_after, "usable": usable, "compaction_entry_id": entry_id, "tail_start_id": tail_start_id, "summary_text": summary}),
    )
}

async fn compact_now(s: Arc<Settings>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    compact(&s, &ctx, &data, data["force"] == true).await
}

async fn compact_session(s: Arc<Settings>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    compact(&s, &ctx, &data, true).await
}

async fn prune_tool_outputs(s: Arc<Settings>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = req_str(&data, "session_id")?;
    let over = data["max_chars"]
        .as_u64()
        .map_or(s.prune_over_chars, |n| n as usize);
    let (messages, entry_ids) = session_messages(&ctx, &sid).await?;
    // The last turns stay whole.
    let protected_from = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, AgentMessage::Assistant { .. }))
        .map(|(i, _)| i)
        .rev()
        .nth(s.keep_turns.max(1) - 1)
        .unwrap_or(0);
    let mut pruned = 0;
    let mut saved = 0u64;
    for (i, m) in messages.iter().enumerate().take(protected_from) {
        let AgentMessage::FunctionResult {
            content,
            function_id,
            ..
        } = m
        else {
            continue;
        };
        for (part, b) in content.iter().enumerate() {
            let ContentBlock::Text { text } = b else {
                continue;
            };
            let n = text.chars().count();
            if n <= over {
                continue;
            }
            let stub = format!(
                "[output of {function_id} pruned: {n} characters; it began: {}…]",
                text.chars().take(200).collect::<String>()
            );
            ctx.trigger("session-tree::update_part", json!({"session_id": sid, "entry_id": entry_ids.get(i), "part_index": part, "part": {"type": "text", "text": stub}})).await?;
            pruned += 1;
            saved += (n.saturating_sub(stub.chars().count()) / 4) as u64;
        }
    }
    Ok(
        json!({"status": if pruned == 0 { "empty" } else { "ok" }, "session_id": sid, "pruned": pruned, "tokens_saved": saved}),
    )
}

/// Stream trigger on `agent::turn_end`: compact a session that is over its window once its
/// run is idle. While the run is live, the orchestrator's pre-flight check compacts before
/// its next model call (a compaction appended under a running turn would branch off it).
async fn on_turn_end(s: Arc<Settings>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let Some(sid) = data["group_id"].as_str().map(str::to_owned) else {
        return Ok(json!({"ignored": "no session"}));
    };
    // A turn that ends with function results goes back to the model: the run is live.
    if data["event"]["data"]["function_results"]
        .as_array()
        .is_some_and(|r| !r.is_empty())
    {
        return Ok(
            json!({"skipped": "run live; the pre-flight check compacts", "session_id": sid}),
        );
    }
    // The model's own count of the turn's context, when it gave one: under the window, the
    // history need not be loaded to know there is nothing to compact. A count that is wrong
    // (or forged) only defers a compaction to the orchestrator's pre-flight check.
    let message = &data["event"]["data"]["message"];
    if let (Some(tokens), Some(provider), Some(model)) = (
        plan::reported_context_tokens(&message["usage"]),
        message["provider"].as_str(),
        message["model"].as_str(),
    ) {
        let usable = plan::usable_with(
            context_window(&ctx, provider, model).await,
            s.reserved_tokens,
        );
        if tokens <= usable {
            return Ok(
                json!({"status": "ok", "compacted": false, "session_id": sid, "tokens": tokens, "usable": usable, "counted_by": "model"}),
            );
        }
    }
    let state = ctx
        .trigger("turn::get_state", json!({"session_id": sid}))
        .await
        .unwrap_or(Value::Null);
    if !matches!(
        state["state"].as_str(),
        None | Some("stopped") | Some("failed")
    ) {
        return Ok(
            json!({"skipped": "run live; the pre-flight check compacts", "session_id": sid}),
        );
    }
    compact(&s, &ctx, &json!({"session_id": sid}), false).await
}

pub fn worker() -> Worker {
    worker_with(Settings::default())
}

type Handler = fn(Arc<Settings>, Ctx, Value) -> BoxFuture<'static, Result<Value, ErrorBody>>;

/// Binds a handler to this worker's settings.
fn with(
    s: &Arc<Settings>,
    f: Handler,
) -> impl Fn(Ctx, Value) -> BoxFuture<'static, Result<Value, ErrorBody>> + Send + Sync + 'static {
    let s = s.clone();
    move |ctx, data| f(s.clone(), ctx, data)
}

pub fn worker_with(settings: Settings) -> Worker {
    let s = Arc::new(settings);
    let errs: &[(&str, &str)] = &[
        (
            "summarize_failed",
            "the session's model could not produce a summary",
        ),
        ("not_found", "no such session"),
        ("storage", "state store failure"),
    ];
    let mut w = Worker::new("context-compaction");
    w.register_function(
        def("context-compaction::compact_now", "Compact the session if its context is over the model's usable window (window − reserved_tokens, 20 000 unless configured).")
        .not_for_the_agent()
            .contract::<harness_sdk::contracts::compaction::CompactRequest, harness_sdk::contracts::compaction::CompactAnswer>()
            .errors(errs),
        with(&s, |s, c, d| Box::pin(compact_now(s, c, d))),
    );
    w.register_function(
        def(
            "context-compaction::compact_session",
            "Compact the session now, whatever its size.",
        )
        .not_for_the_agent()
        .contract::<harness_sdk::contracts::compaction::CompactRequest, harness_sdk::contracts::compaction::CompactAnswer>()
        .errors(errs),
        with(&s, |s, c, d| Box::pin(compact_session(s, c, d))),
    );
    w.register_function(
        def(
            "context-compaction::prune_tool_outputs",
            "Shorten large tool results outside the kept turns (two unless configured), in place.",
        )
        .not_for_the_agent()
        .contract::<harness_sdk::contracts::compaction::PruneRequest, harness_sdk::contracts::compaction::PruneAnswer>()
        .errors(errs),
        with(&s, |s, c, d| Box::pin(prune_tool_outputs(s, c, d))),
    );
    w.register_function(
        def(
            "context-compaction::on_turn_end",
            "Stream trigger on agent::turn_end (one wake per turn).",
        )
        .not_for_the_agent(),
        with(&s, |s, c, d| Box::pin(on_turn_end(s, c, d))),
    );
    w.register_trigger(
        "stream",
        "context-compaction::on_turn_end",
        json!({"stream_name": "agent::turn_end"}),
    );
    w
}
