//! `assistant_streaming`: the budget check, the pre-flight compaction, one model call over a
//! channel (token deltas pushed as they come) and the answer stored in the history.

use crate::prelude::*;

/// `Some(why)` when a budget of the run refuses another model call.
pub(crate) async fn budget_refusal(
    ctx: &Ctx,
    rec: &Record,
    req: &RunRequest,
) -> StepResult<Option<String>> {
    for id in &rec.budget_ids {
        match ctx
            .trigger_timeout(
                budget::CHECK,
                json!(budget::CheckRequest {
                    budget_id: id.clone(),
                    estimated_cost_usd: None,
                    principal_id: req.agent_id.clone(),
                }),
                BEST_EFFORT_TIMEOUT,
            )
            .await
        {
            Ok(v) => {
                // An answer that is not a check enforces nothing, as a missing worker does.
                let answer = match contracts::parse::<budget::CheckAnswer>(budget::CHECK, v) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(budget = %id, error = %e, "budget::check answered no check; not enforced");
                        continue;
                    }
                };
                if !answer.allowed {
                    return Ok(Some(format!(
                        "budget `{id}` refuses another model call ({}): spent ${:.6} of ${:.6}",
                        answer.reason.as_deref().unwrap_or("not allowed"),
                        answer.spent_usd,
                        answer.ceiling_usd,
                    )));
                }
            }
            // The budget worker left: optional workers are skipped.
            Err(BusError::FunctionNotFound(_)) => {
                tracing::warn!(budget = %id, "budget::check not available; not enforced");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

pub(crate) fn usable_tokens(window: u64) -> u64 {
    let reserved = crate::history::settings().reserved_tokens;
    window.saturating_sub(reserved.min(window / 2))
}

/// Pre-flight: over the model's usable window → compact now and reload the history.
pub(crate) async fn preflight_compaction(
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
    let chars = json_chars(&(&prompt.system_prompt, &*messages, &prompt.tools));
    if !rec.tree || chars / 4 <= usable_tokens(window) {
        return Ok(messages);
    }
    let out = ctx
        .trigger_timeout(
            compaction::COMPACT_NOW,
            json!(compaction::CompactRequest {
                session_id: rec.session_id.clone(),
                provider: Some(req.provider.clone()),
                model: Some(req.model.clone()),
                force: false,
                emit_event: Some(false),
            }),
            COMPACTION_TIMEOUT,
        )
        .await;
    let out = out.and_then(|v| {
        contracts::parse::<compaction::CompactAnswer>(compaction::COMPACT_NOW, v).map_err(|e| {
            BusError::Other {
                code: "invalid_answer".into(),
                message: e,
            }
        })
    });
    match out {
        Ok(v) if v.compacted => {
            emit(
                rec,
                "compaction_done",
                json!({"summary_text": v.summary_text, "tokens_before": v.tokens_before, "compaction_entry_id": v.compaction_entry_id, "tail_start_id": v.tail_start_id}),
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

/// The characters of `value` as JSON, counted as it is written rather than from a string of
/// it (the history can be long, and this runs before every model call).
fn json_chars(value: &impl serde::Serialize) -> u64 {
    struct CharCount(u64);
    impl std::io::Write for CharCount {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            // Every byte but a UTF-8 continuation byte starts a character.
            self.0 += bytes.iter().filter(|b| (**b & 0xC0) != 0x80).count() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = CharCount(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

/// A `chat {model}` span (GenAI semantic conventions) around one model call.
fn chat_span(
    ctx: &Ctx,
    rec: &Record,
    req: &RunRequest,
    messages: &History,
) -> harness_sdk::span::ChildSpan {
    use bus_telemetry::telemetry::gen_ai;
    let mut span = ctx.child_span(&format!("chat {}", req.model), "turn-orchestrator");
    span.set(gen_ai::OPERATION_NAME, "chat");
    span.set(gen_ai::PROVIDER_NAME, provider_name(&req.provider));
    span.set(gen_ai::REQUEST_MODEL, &req.model);
    span.set(gen_ai::CONVERSATION_ID, &rec.session_id);
    if gen_ai::capture_content() {
        let redacted: Vec<Value> = messages
            .iter()
            .map(|m| redact(&serde_json::to_value(m).unwrap_or(Value::Null)))
            .collect();
        span.set(gen_ai::INPUT_MESSAGES, Value::Array(redacted));
    }
    span
}

/// The model's answer on its span: model, usage, finish reason (and content, when captured).
fn finish_chat_span(span: &mut harness_sdk::span::ChildSpan, message: &AgentMessage) {
    use bus_telemetry::telemetry::gen_ai;
    let AgentMessage::Assistant {
        model,
        usage,
        stop_reason,
        ..
    } = message
    else {
        return;
    };
    span.set(gen_ai::RESPONSE_MODEL, model);
    if let Some(u) = usage {
        span.set(
            gen_ai::USAGE_INPUT_TOKENS,
            u.input + u.cache_read + u.cache_write,
        );
        span.set(gen_ai::USAGE_OUTPUT_TOKENS, u.output);
        span.set(gen_ai::USAGE_CACHE_READ_INPUT_TOKENS, u.cache_read);
        span.set(gen_ai::USAGE_CACHE_CREATION_INPUT_TOKENS, u.cache_write);
    }
    let reason = serde_json::to_value(stop_reason).unwrap_or(Value::Null);
    span.set(
        gen_ai::RESPONSE_FINISH_REASONS,
        json!([reason.as_str().unwrap_or("")]),
    );
    if gen_ai::capture_content() {
        span.set(
            gen_ai::OUTPUT_MESSAGES,
            redact(&serde_json::to_value(message).unwrap_or(Value::Null)),
        );
    }
}

/// The GenAI conventions' provider names for ours (`kimi` is Moonshot AI's).
fn provider_name(provider: &str) -> &str {
    match provider {
        "kimi" => "moonshot_ai",
        other => other,
    }
}

/// The latest frames with a partial message kept per batch, newest first read.
const MAX_FALLBACK_FRAMES: usize = 8;

/// What a provider frame is, read from its `type` alone.
#[derive(Debug, PartialEq)]
enum FrameKind {
    /// `done` or `error`: the final message.
    Final,
    /// An event that carries the partial message.
    Partial,
    /// `usage`, `stop`, or a type this version does not know.
    Other,
}

/// The frame's kind without building its message (`None`: not a JSON object with a `type`).
/// Providers write the tag first (events are internally tagged), so it is read off the front
/// without reading the rest; any other frame is parsed. A frame malformed after its tag is
/// passed over where it is read whole (the final message, the latest partial), as before.
fn frame_kind(text: &str) -> Option<FrameKind> {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    let kind = match leading_type(text) {
        Some(kind) => std::borrow::Cow::Borrowed(kind),
        None => serde_json::from_str::<Typed>(text).ok()?.kind,
    };
    Some(match kind.as_ref() {
        "done" | "error" => FrameKind::Final,
        "usage" | "stop" => FrameKind::Other,
        "start" | "text_start" | "text_delta" | "text_end" | "thinking_start"
        | "thinking_delta" | "thinking_end" | "functioncall_start" | "functioncall_delta"
        | "functioncall_end" => FrameKind::Partial,
        _ => FrameKind::Other,
    })
}

/// The type of a frame that starts `{"type":"<type>"` with nothing escaped in it.
fn leading_type(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(r#"{"type":""#)?;
    let kind = &rest[..rest.find('"')?];
    (!kind.contains('\\')).then_some(kind)
}

/// The `message_update` of a batch: the latest frame that reads as an event with a partial
/// message (a malformed one is passed over, as before, for the one before it).
fn latest_update(partials: &[String]) -> Option<Value> {
    partials.iter().rev().find_map(|text| {
        let event = serde_json::from_str::<AssistantMessageEvent>(text).ok()?;
        let mut llm_event = serde_json::to_value(&event).ok()?;
        let partial = llm_event.as_object_mut()?.remove("partial")?;
        Some(harness_sdk::fields([
            ("message", partial),
            ("llm_event", llm_event),
        ]))
    })
}

/// Errors that mean the call never reached a handler that decided anything.
pub(crate) fn is_unreachable(e: &BusError) -> bool {
    matches!(
        e,
        BusError::FunctionNotFound(_) | BusError::InvocationStopped(_) | BusError::Disconnected(_)
    )
}

pub(crate) fn error_message(req: &RunRequest, kind: ErrorKind, message: String) -> AgentMessage {
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

pub(crate) async fn assistant_streaming(
    ctx: &Ctx,
    rec: &mut Record,
    req: &RunRequest,
) -> StepResult<Outcome> {
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
        return Ok(Outcome::BudgetRefused { reason: why });
    }
    rec.turn_count += 1;
    rec.turn_end_emitted = false;
    let messages = history(ctx, rec).await?;
    let messages = preflight_compaction(ctx, rec, req, messages).await?;
    let prompt = run_prompt(ctx, rec).await?;
    // What the batch's end will need, beside the model call and the calls.
    if let Some(reads) = BesideTheCalls::start(ctx, rec) {
        rec.beside_the_calls.start(reads);
    }
    // The UI sees what happened so far (compaction) before the model answers.
    flush_events(ctx, rec).await;
    // What the catalogue says of the run's model (unknown for a fallback: today's request).
    let meta = rec.model_meta.clone();
    let mut message = call_model(ctx, rec, req, messages.clone(), &prompt, meta.as_ref()).await?;
    // The fallback chain: the same step asks the next model at once.
    let mut asked = (req.provider.clone(), req.model.clone());
    for next in &req.fallback {
        let Some(reason) = falls_back(&message) else {
            break;
        };
        emit(
            rec,
            "model_fallback",
            json!({"from": {"provider": asked.0, "model": asked.1}, "to": {"provider": next.provider, "model": next.model}, "reason": reason}),
        );
        let attempt = RunRequest {
            provider: next.provider.clone(),
            model: next.model.clone(),
            ..req.clone()
        };
        message = call_model(ctx, rec, &attempt, messages.clone(), &prompt, None).await?;
        asked = (next.provider.clone(), next.model.clone());
    }
    let message = with_usable_call_ids(message, rec.turn_count, &messages);
    drop(messages);
    let (message, outcome) = match outcome_of(&message) {
        // An answer whose calls will run is appended with the batch's results, in one write
        // (`append_history`): the record holds it until then, and a batch that parks appends
        // it first.
        Ok(Outcome::Answered { calls }) if rec.tree && !calls.is_empty() => {
            rec.assistant_pending = true;
            (message, Ok(Outcome::Answered { calls }))
        }
        _ => {
            // The stored message is the one decided on (a re-run step gets the first run's
            // back).
            // An answer without calls goes to the steering check in this step (see
            // `append_history_then_peek`).
            let stored = append_history_then_peek(ctx, rec, vec![message], "a")
                .await?
                .pop()
                .ok_or_else(|| StepError::Fatal("the assistant message was not stored".into()))?;
            let outcome = outcome_of(&stored);
            (stored, outcome)
        }
    };
    emit(rec, "message_complete", json!({"message": message}));
    if let AgentMessage::Assistant { usage: Some(u), .. } = &message {
        rec.totals.add_usage(u);
    }
    rec.last_assistant = Some(message);
    outcome
}

/// One model call over a channel (token deltas pushed as they come) → the model's answer, an
/// error answer included. Its own `chat` span and metrics, for the provider and model asked.
async fn call_model(
    ctx: &Ctx,
    rec: &mut Record,
    req: &RunRequest,
    messages: History,
    prompt: &Prompt,
    meta: Option<&Value>,
) -> StepResult<AgentMessage> {
    // A fallback's call: the first call's last pushes go out before this one's.
    rec.pending_push.settle().await;
    let caps = Capabilities::of(meta);
    let messages = match caps.vision {
        Some(false) => without_images(messages),
        _ => messages,
    };
    let (writer, reader) = ctx.create_channel(Some(64)).await?;
    let mut reader = ctx.open_reader(&reader).await?;
    // The model call as the GenAI conventions describe it; the provider's spans nest under it.
    let mut span = chat_span(ctx, rec, req, &messages);
    let called_at = std::time::Instant::now();
    let mut first_frame: Option<Duration> = None;
    let mut call = {
        let ctx = span.ctx().clone();
        let no_tools = caps.tools == Some(false);
        let system_prompt = match (&prompt.system_prompt, no_tools) {
            (Some(p), true) => Some(format!("{p}\n\n{NO_TOOLS_NOTE}")),
            (p, _) => p.clone(),
        };
        let tools = if no_tools { &[][..] } else { &prompt.tools[..] };
        let mut payload = json!({
            "writer_ref": writer,
            "system_prompt": system_prompt,
            "model": req.model,
            "tools": tools,
            "budget_ids": rec.budget_ids,
        });
        if let Some(max) = caps.max_output_tokens {
            payload["max_tokens"] = json!(max);
        }
        // Told off by the run, or what the catalogue knows; unknown: the provider's default.
        let cache = match req.prompt_cache {
            Some(false) => Some(false),
            _ => caps.cache,
        };
        if let Some(c) = cache {
            payload["prompt_cache"] = json!(c);
        }
        // The history goes beside the payload: a provider in this process reads the shared
        // list as it is, any other gets it as the payload's `messages`. It is released when
        // the call ends, before this step appends to the cached list (which then needs no
        // copy).
        let messages = contracts::provider::messages_attachment(messages);
        let fid = format!("provider::{}::stream", req.provider);
        tokio::spawn(async move {
            ctx.trigger_attached(&fid, payload, messages, PROVIDER_TIMEOUT)
                .await
        })
    };
    let mut final_message: Option<AgentMessage> = None;
    let mut call_result: Option<Result<Value, BusError>> = None;
    // One `message_update` in flight at a time: the partials that come while it is pushed
    // merge into the next (the latest supersedes the others), so a fast stream costs a push
    // or two instead of one per batch, and the stream is read on while one goes out.
    let mut pushing: Option<futures_util::future::BoxFuture<'static, ()>> = None;
    let mut next_update: Option<Value> = None;
    // The updates go after the events of the save left running beside this call.
    let push_update = {
        let (ctx, sid, saved) = (
            ctx.clone(),
            rec.session_id.clone(),
            rec.pending_save.clone(),
        );
        move |update: Value| {
            let (ctx, sid, saved) = (ctx.clone(), sid.clone(), saved.clone());
            async move {
                saved.done().await;
                push_latest(&ctx, &sid, "message_update", update).await
            }
            .boxed()
        }
    };
    let deadline = tokio::time::Instant::now() + PROVIDER_TIMEOUT + Duration::from_secs(5);
    let mut timed_out = false;
    loop {
        tokio::select! {
            frame = reader.next() => {
                let Some(frame) = frame else { break };
                first_frame.get_or_insert_with(|| called_at.elapsed());
                // Frames already waiting are merged into one `message_update` (the latest
                // partial holds every earlier delta), so a fast stream costs one push per
                // batch instead of one per token.
                // Only the final message and the batch's latest partial are read whole: the
                // others are superseded, so their type is all that is looked at.
                let mut partials: Vec<String> = Vec::new();
                let mut closed = false;
                let mut next = Some(frame);
                while let Some(frame) = next.take() {
                    if let ChannelFrame::Text(text) = frame {
                        match frame_kind(&text) {
                            Some(FrameKind::Final) => {
                                if let Ok(AssistantMessageEvent::Done { message } | AssistantMessageEvent::Error { error: message }) =
                                    serde_json::from_str::<AssistantMessageEvent>(&text)
                                {
                                    final_message = Some(message);
                                }
                            }
                            Some(FrameKind::Partial) => {
                                // A few to fall back on, not the whole of a long burst.
                                if partials.len() == MAX_FALLBACK_FRAMES {
                                    partials.remove(0);
                                }
                                partials.push(text);
                            }
                            Some(FrameKind::Other) | None => {}
                        }
                    }
                    match reader.next().now_or_never() {
                        Some(Some(more)) => next = Some(more),
                        Some(None) => closed = true,
                        None => {}
                    }
                }
                if let Some(u) = latest_update(&partials) {
                    if pushing.is_none() {
                        pushing = Some(push_update(u));
                    } else {
                        next_update = Some(u);
                    }
                }
                if closed {
                    break;
                }
            }
            () = async { pushing.as_mut().expect("guarded").await }, if pushing.is_some() => {
                pushing = next_update.take().map(&push_update);
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
    // The updates still going out (in order: the one in flight, then the latest) go on
    // while the step does; whatever writes or pushes the session's events next waits for
    // them ([`PendingPush`]), so they still go before anything this step records. (A
    // Lambda's bus answers an update once it is queued behind its pushes, so there the
    // wait is for its place in that queue, not for the post.)
    let last = next_update.map(push_update);
    if pushing.is_some() || last.is_some() {
        // At this call's position, so a Lambda's posts are traced in the step's trace.
        let here = bus_telemetry::tracing_bridge::CallPosition::current();
        rec.pending_push.start(tokio::spawn(here.run(async move {
            for p in [pushing, last].into_iter().flatten() {
                p.await;
            }
        })));
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
    finish_chat_span(&mut span, &message);
    let failed = match &message {
        AgentMessage::Assistant {
            stop_reason: StopReason::Error,
            error_kind,
            ..
        } => Some(
            error_kind
                .as_ref()
                .and_then(|k| serde_json::to_value(k).ok())
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "error".into()),
        ),
        _ => None,
    };
    if let (Some(m), AgentMessage::Assistant { usage, .. }) =
        (bus_telemetry::metrics::get(), &message)
    {
        let u = usage.clone().unwrap_or_default();
        m.model_call(
            provider_name(&req.provider),
            &req.model,
            u.input + u.cache_read + u.cache_write,
            u.output,
            u.cost_usd,
            called_at.elapsed(),
            first_frame,
            failed.as_deref(),
        );
    }
    span.finish(failed.as_deref());
    Ok(message)
}

/// What the model's catalogue entry says it can do; `None`: not known, today's request.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Capabilities {
    pub tools: Option<bool>,
    pub vision: Option<bool>,
    pub max_output_tokens: Option<u64>,
    pub cache: Option<bool>,
}

impl Capabilities {
    pub(crate) fn of(meta: Option<&Value>) -> Self {
        let Some(m) = meta.filter(|m| m.is_object()) else {
            return Self::default();
        };
        Self {
            tools: m["supports_tools"].as_bool(),
            vision: m["supports_vision"].as_bool(),
            max_output_tokens: m["max_output_tokens"].as_u64().filter(|n| *n > 0),
            cache: m["supports_cache"].as_bool(),
        }
    }
}

/// What a model without tool use is told (it gets no tools).
pub(crate) const NO_TOOLS_NOTE: &str = "This model cannot call functions here: no tool is offered, so answer in text, and say so when the task needs an action.";

/// The history with every image replaced by a note (a model that cannot see them); the shared
/// list itself when it holds none.
pub(crate) fn without_images(messages: History) -> History {
    let has = |c: &[ContentBlock]| c.iter().any(|b| matches!(b, ContentBlock::Image { .. }));
    if !messages.iter().any(|m| match m {
        AgentMessage::User { content, .. } | AgentMessage::FunctionResult { content, .. } => {
            has(content)
        }
        _ => false,
    }) {
        return messages;
    }
    let strip = |content: &[ContentBlock]| -> Vec<ContentBlock> {
        content
            .iter()
            .map(|b| match b {
                ContentBlock::Image { mime, data } => ContentBlock::Text {
                    text: format!(
                        "[an image ({mime}, {} bytes of base64) the model cannot see]",
                        data.len()
                    ),
                },
                other => other.clone(),
            })
            .collect()
    };
    let copied = messages
        .iter()
        .map(|m| match m {
            AgentMessage::User { content, timestamp } => AgentMessage::User {
                content: strip(content),
                timestamp: *timestamp,
            },
            AgentMessage::FunctionResult {
                function_call_id,
                function_id,
                content,
                details,
                is_error,
                timestamp,
            } => AgentMessage::FunctionResult {
                function_call_id: function_call_id.clone(),
                function_id: function_id.clone(),
                content: strip(content),
                details: details.clone(),
                is_error: *is_error,
                timestamp: *timestamp,
            },
            other => other.clone(),
        })
        .collect();
    std::sync::Arc::new(copied)
}

/// Whether a failed answer may go to the next model: it failed before its first token, with
/// an error another provider may not have (rate limits, overload, unavailability, timeouts);
/// never a refused request (bad input, credentials, the context window).
fn falls_back(message: &AgentMessage) -> Option<String> {
    let AgentMessage::Assistant {
        stop_reason: StopReason::Error,
        error_kind,
        error_message,
        content,
        ..
    } = message
    else {
        return None;
    };
    let retryable = matches!(
        error_kind,
        Some(ErrorKind::RateLimited) | Some(ErrorKind::Transient)
    );
    (retryable && content.is_empty()).then(|| error_message.clone().unwrap_or_default())
}

/// What the model's answer decides: failed (an error or abort), or answered with these calls
/// (maybe none).
fn outcome_of(message: &AgentMessage) -> StepResult<Outcome> {
    let AgentMessage::Assistant {
        stop_reason,
        content,
        error_kind,
        error_message,
        ..
    } = message
    else {
        return Err(StepError::Fatal(
            "the provider answered with a non-assistant message".into(),
        ));
    };
    match stop_reason {
        StopReason::Error | StopReason::Aborted => Ok(Outcome::ModelFailed {
            kind: error_kind
                .map(|k| {
                    serde_json::to_value(k)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                })
                .unwrap_or_else(|| "aborted".into()),
            message: error_message.clone().unwrap_or_default(),
        }),
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
            Ok(Outcome::Answered { calls })
        }
    }
}

/// Every call id of the answer made usable and unique within the session: an id that is
/// empty, over 128 bytes, holds a `/` (approval keys are `<sid>/<cid>`), repeats one of the
/// same answer or one already in the session's history (models reuse ids such as `call_1`
/// across turns) is replaced by `call-<turn>-<index>` (made unique). Otherwise the model's own
/// id is kept, so the provider's round trip sees it unchanged. A decision recorded for an
/// earlier call can then never apply to a later one.
pub(crate) fn with_usable_call_ids(
    mut message: AgentMessage,
    turn: u32,
    history: &[AgentMessage],
) -> AgentMessage {
    let AgentMessage::Assistant { content, .. } = &mut message else {
        return message;
    };
    if !content
        .iter()
        .any(|b| matches!(b, ContentBlock::FunctionCall { .. }))
    {
        return message;
    }
    let mut seen: std::collections::HashSet<String> = history
        .iter()
        .flat_map(|m| match m {
            AgentMessage::Assistant { content, .. } => content.as_slice(),
            _ => &[],
        })
        .filter_map(|b| match b {
            ContentBlock::FunctionCall { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
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
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An assistant message holding `text`.
    fn answer(text: &str) -> AgentMessage {
        AgentMessage::Assistant {
            content: vec![ContentBlock::Text { text: text.into() }],
            stop_reason: StopReason::End,
            error_message: None,
            error_kind: None,
            usage: None,
            model: "m".into(),
            provider: "p".into(),
            timestamp: 1,
        }
    }

    fn calls(ids: &[&str]) -> AgentMessage {
        let mut m = answer("");
        if let AgentMessage::Assistant { content, .. } = &mut m {
            *content = ids
                .iter()
                .map(|id| ContentBlock::FunctionCall {
                    id: id.to_string(),
                    function_id: "agent_trigger".into(),
                    arguments: json!({}),
                })
                .collect();
        }
        m
    }

    fn ids(m: &AgentMessage) -> Vec<String> {
        match m {
            AgentMessage::Assistant { content, .. } => content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::FunctionCall { id, .. } => Some(id.clone()),
                    _ => None,
                })
                .collect(),
            _ => vec![],
        }
    }

    #[test]
    fn call_ids_are_unique_within_the_session_and_the_models_kept_when_new() {
        // An earlier turn used call_w and (replaced) call-2-0.
        let history = vec![calls(&["call_w", "call-2-0"])];
        let out = with_usable_call_ids(
            calls(&[
                "call_w",
                "toolu_new",
                "toolu_new",
                "",
                "a/b",
                &"x".repeat(129),
            ]),
            2,
            &history,
        );
        assert_eq!(
            ids(&out),
            [
                "call-2-0_",
                "toolu_new",
                "call-2-2",
                "call-2-3",
                "call-2-4",
                "call-2-5"
            ]
        );
        // Nothing to do without calls, and a new id is the model's own.
        assert_eq!(
            ids(&with_usable_call_ids(calls(&["c9"]), 3, &history)),
            ["c9"]
        );
    }

    #[test]
    fn a_batch_of_frames_yields_its_latest_partial_and_skips_the_malformed() {
        let partial = |text: &str| serde_json::to_value(answer(text)).unwrap();
        let frame = |v: Value| v.to_string();
        let start = frame(json!({"type": "start", "partial": partial("")}));
        let delta = frame(json!({"type": "text_delta", "delta": "hi", "partial": partial("hi")}));
        let usage = frame(json!({"type": "usage", "usage": {"input": 1, "output": 1}}));
        let done = frame(json!({"type": "done", "message": partial("hi")}));
        assert_eq!(frame_kind(&start), Some(FrameKind::Partial));
        assert_eq!(frame_kind(&usage), Some(FrameKind::Other));
        assert_eq!(frame_kind(&done), Some(FrameKind::Final));
        assert_eq!(
            frame_kind(r#"{"type": "from_the_future"}"#),
            Some(FrameKind::Other)
        );
        for hostile in ["", "[]", "{}", r#"{"type": 7}"#, "{\"type\": \"start\""] {
            assert_eq!(frame_kind(hostile), None, "{hostile}");
        }
        let u = latest_update(&[start.clone(), delta.clone()]).unwrap();
        assert_eq!(u["message"]["content"][0]["text"], "hi");
        assert_eq!(u["llm_event"]["type"], "text_delta");
        assert!(u["llm_event"].get("partial").is_none());
        // A malformed latest frame (a partial that is not a message) gives way to the one before.
        let broken = frame(json!({"type": "text_delta", "delta": "x", "partial": 3}));
        let u = latest_update(&[start.clone(), delta, broken.clone()]).unwrap();
        assert_eq!(u["llm_event"]["delta"], "hi");
        assert!(latest_update(&[broken]).is_none());
    }

    /// Frames as providers write them (the tag first) are typed from their front; a frame
    /// broken after its tag is typed too, and then passed over where it is read whole.
    #[test]
    fn a_frame_is_typed_from_its_leading_tag_as_providers_write_it() {
        let partial = answer("hi");
        let written = |ev: AssistantMessageEvent| serde_json::to_string(&ev).unwrap();
        let delta = written(AssistantMessageEvent::TextDelta {
            delta: "hi".into(),
            partial: partial.clone(),
        });
        let done = written(AssistantMessageEvent::Done { message: partial });
        for (frame, kind) in [(&delta, FrameKind::Partial), (&done, FrameKind::Final)] {
            assert!(leading_type(frame).is_some(), "{frame}");
            assert_eq!(frame_kind(frame), Some(kind), "{frame}");
        }
        assert_eq!(leading_type(r#"{"type":"stop","x":1}"#), Some("stop"));
        // An escaped tag, or a tag not first, is read by the parser.
        assert_eq!(leading_type(r#"{"type":"st\"art"}"#), None);
        assert_eq!(frame_kind(r#"{"type":"st\"art"}"#), Some(FrameKind::Other));
        assert_eq!(leading_type(r#"{"delta":"x","type":"text_delta"}"#), None);
        assert_eq!(
            frame_kind(r#"{"delta":"x","type":"text_delta"}"#),
            Some(FrameKind::Partial)
        );
        // Unterminated tags and broken frames.
        for hostile in [r#"{"type":""#, r#"{"type":"start"#, r#"{"type":"#] {
            assert_eq!(frame_kind(hostile), None, "{hostile}");
        }
        let truncated = &delta[..delta.len() / 2];
        assert_eq!(frame_kind(truncated), Some(FrameKind::Partial));
        assert!(latest_update(&[truncated.to_string()]).is_none());
        let truncated_done = &done[..done.len() / 2];
        assert_eq!(frame_kind(truncated_done), Some(FrameKind::Final));
        assert!(serde_json::from_str::<AssistantMessageEvent>(truncated_done).is_err());
    }

    #[test]
    fn json_chars_counts_what_the_string_would_hold() {
        let value = json!({"text": "héllo → 世界 🦀", "escaped": "a\"b\\c\n", "n": [1, 2.5, null]});
        let string = serde_json::to_string(&value).unwrap();
        assert_eq!(json_chars(&value), string.chars().count() as u64);
        assert_ne!(
            json_chars(&value),
            string.len() as u64,
            "multi-byte characters count once"
        );
    }
}
