//! Running one call for the model (hooks around it, the sandbox's network grant, its result
//! announced) and closing a batch whose calls are all decided.

use crate::prelude::*;

/// Call the target with the routing envelope; a failing target is an error result.
/// `announce`: emit `function_execution_start` (an approved call announced it when parked).
pub(crate) async fn dispatch(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    version: &mut u64,
    call: &Call,
    announce: bool,
) -> StepResult<Executed> {
    let decision = announce.then(|| json!({"decision": "allow"}));
    dispatch_with(ctx, hooks, rec, version, call, decision, Grant::default()).await
}

/// What the policy's allow says of a call besides allowing it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Grant {
    /// The allow rule opens the network to the call's sandbox.
    pub network: bool,
    /// What it allows only reads (`read_only`: a rule's word, or a built-in read).
    pub read_only: bool,
}

/// `grant.network`: the policy's allow rule opened the network to this call's sandbox. The
/// model cannot ask for it: a `sandbox` field in its arguments is dropped. `announce`: emit
/// `function_execution_start` with this policy decision (`{decision, rule_id?}`), for the UI.
/// The record is saved (at `version`) just before the call runs: a delivery that another
/// has overtaken stops here (stale) instead of running the call, and a step that runs again
/// after a crash finds the call announced. A read (`grant.read_only`, without hooks or the
/// network) is not: running it twice changes nothing, so it runs at once, and its start is
/// saved with its end, or after [`crate::READ_START_SHOWN_AFTER`] while it still runs (a
/// slow read is shown running as any call is). A delivery that another overtook then finds
/// out at that save, as it would at the save after the call.
pub(crate) async fn dispatch_with(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    version: &mut u64,
    call: &Call,
    announce: Option<Value>,
    grant: Grant,
) -> StepResult<Executed> {
    let network = grant.network;
    if let Some(decision) = announce {
        emit(
            rec,
            "function_execution_start",
            json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "args": redact(&call.args), "decision": decision}),
        );
    }
    // Neither the call nor its hooks run before the result of the call before it is durable
    // (the sync that a chained turn left running beside its model call).
    let hooked = hooks.present(ctx, BEFORE_CALL_TOPIC).await;
    if hooked {
        settle_before_a_call(rec, version).await?;
        if let Some(envelope) = hooks::before_call(ctx, hooks, &rec.session_id, call).await {
            return Ok(refused(rec, call, envelope));
        }
    }
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
    // The call's start is shown before it runs, however long it takes: its event goes with
    // the record's save (the batch, the first time), one write. That save is no call: it
    // goes into the log behind the writes being synced, while they are (with no hook, the
    // wait for the sync starts after it, off the path of one session's turn).
    //
    // A read runs beside the save (and the sync) that the turn before left running: it
    // changes nothing, so running it in a delivery that turns out stale, or again after a
    // crash, costs only its time. Its result waits for that save, so nothing of a stale
    // delivery is stored after it.
    let read = grant.read_only && !grant.network && !hooked;
    if !read {
        save(ctx, rec, version, false).await?;
        settle_before_a_call(rec, version).await?;
    }
    let started = Instant::now();
    let mut span = tool_span(ctx, call);
    let answered = {
        let running = span
            .ctx()
            .trigger_timeout(&call.function_id, payload, CALL_TIMEOUT);
        tokio::pin!(running);
        if read {
            tokio::select! {
                answered = &mut running => answered,
                () = tokio::time::sleep(crate::history::settings().read_start_shown_after) => {
                    save(ctx, rec, version, false).await?;
                    running.await
                }
            }
        } else {
            running.await
        }
    };
    if read {
        settle_before_a_call(rec, version).await?;
    }
    let (result, is_error) = match answered {
        Ok(v) => (v, false),
        Err(e) => (
            json!({"error": {"code": e.code(), "message": e.message()}}),
            true,
        ),
    };
    if bus_telemetry::telemetry::gen_ai::capture_content() {
        span.set(
            bus_telemetry::telemetry::gen_ai::TOOL_CALL_RESULT,
            redact(&result),
        );
    }
    span.finish(is_error.then(|| result["error"]["code"].as_str().unwrap_or("error")));
    if let Some(m) = bus_telemetry::metrics::get() {
        m.tool_call(
            &call.function_id,
            if is_error { "error" } else { "ok" },
            started.elapsed(),
        );
    }
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
    Ok(executed)
}

/// An `execute_tool {function}` span (GenAI semantic conventions) around one tool call; the
/// tool's own span nests under it.
fn tool_span(ctx: &Ctx, call: &Call) -> harness_sdk::span::ChildSpan {
    use bus_telemetry::telemetry::gen_ai;
    let mut span = ctx.child_span(
        &format!("execute_tool {}", call.function_id),
        "turn-orchestrator",
    );
    span.set(gen_ai::OPERATION_NAME, "execute_tool");
    span.set(gen_ai::TOOL_NAME, &call.function_id);
    span.set(gen_ai::TOOL_CALL_ID, &call.function_call_id);
    span.set(gen_ai::TOOL_TYPE, "function");
    // An MCP tool names its server too.
    if let Some((server, _)) = call
        .function_id
        .strip_prefix("mcp::")
        .and_then(|rest| rest.split_once("::"))
    {
        span.set("mcp.server.name", server);
    }
    if gen_ai::capture_content() {
        span.set(gen_ai::TOOL_CALL_ARGUMENTS, redact(&call.args));
    }
    span
}

pub(crate) fn emit_execution_end(rec: &mut Record, e: &Executed) {
    rec.totals.tool_calls += 1;
    emit(
        rec,
        "function_execution_end",
        harness_sdk::fields([
            ("function_call_id", e.call.function_call_id.as_str().into()),
            ("function_id", e.call.function_id.as_str().into()),
            ("result", e.result.clone()),
            ("is_error", e.is_error.into()),
            ("duration_ms", e.duration_ms.into()),
        ]),
    );
}

/// The most image bytes (base64) one result passes to the model as images.
const MAX_RESULT_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// The result as the model sees it: its JSON as text, and the images it carries as image
/// blocks (MCP's `{type: "image", data, mimeType}` in a `content` list) when the model can see
/// images (`vision`: the catalogue's word; unknown models get them). Each image's data is
/// replaced in the text by a note, so it is not sent twice.
pub(crate) fn result_message(e: &Executed, vision: bool) -> AgentMessage {
    let mut shown = e.result.clone();
    let mut images = Vec::new();
    let mut budget = MAX_RESULT_IMAGE_BYTES;
    if !e.is_error
        && let Some(blocks) = shown.get_mut("content").and_then(Value::as_array_mut)
    {
        for b in blocks.iter_mut() {
            if b["type"] != "image" {
                continue;
            }
            let (Some(data), Some(mime)) = (b["data"].as_str(), b["mimeType"].as_str()) else {
                continue;
            };
            let plausible = mime.starts_with("image/") && mime.len() < 100;
            let note = if vision && plausible && data.len() <= budget {
                budget -= data.len();
                images.push(ContentBlock::Image {
                    mime: mime.to_string(),
                    data: data.to_string(),
                });
                format!("[image {} attached below]", images.len())
            } else if !vision {
                format!(
                    "[an image ({mime}, {} bytes of base64) the model cannot see]",
                    data.len()
                )
            } else {
                format!(
                    "[an image ({}, {} bytes of base64) left out]",
                    cut(mime, 100),
                    data.len()
                )
            };
            *b = json!({"type": "text", "text": note});
        }
    }
    let mut content = vec![ContentBlock::Text {
        text: shown.to_string(),
    }];
    content.extend(images);
    AgentMessage::FunctionResult {
        function_call_id: e.call.function_call_id.clone(),
        function_id: e.call.function_id.clone(),
        content,
        details: e.result.clone(),
        is_error: e.is_error,
        timestamp: now(),
    }
}

fn cut(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether the run's model takes images: the catalogue says so, or does not know the model.
fn vision(rec: &Record) -> bool {
    rec.model_meta
        .as_ref()
        .and_then(|m| m["supports_vision"].as_bool())
        .unwrap_or(true)
}

/// How old a peek beside the calls (started with the turn's model call) may be for the
/// steering check after them: a message that lands later is seen at the next check, one
/// turn later. A turn whose model takes longer peeks again at the check.
pub(crate) const EARLY_PEEK_FRESH: Duration = Duration::from_millis(500);

impl BesideTheCalls {
    /// Started with a turn's model call (so they have the call, the policy and the calls to
    /// run beside), where the session tree holds the history (the results may be carried).
    pub(crate) fn start(ctx: &Ctx, rec: &Record) -> Option<Self> {
        use harness_sdk::session_layout::{INDEX, LAYOUT, carries_after};
        if !rec.tree {
            return None;
        }
        let here = bus_telemetry::tracing_bridge::CallPosition::current();
        let layout = layout_named(rec);
        let (c, sid) = (ctx.clone(), rec.session_id.clone());
        let peek = tokio::spawn(here.run(async move { peek_inboxes(&c, &sid, layout).await }));
        // No save in flight brings the index.
        let behind = layout
            && rec
                .tree_index
                .as_ref()
                .is_some_and(|seen| !carries_after(seen, rec.tree_leaf.as_deref()))
            && matches!(rec.carried, Carried::None);
        let index = behind.then(|| {
            let (c, sid) = (ctx.clone(), rec.session_id.clone());
            let here = bus_telemetry::tracing_bridge::CallPosition::current();
            tokio::spawn(here.run(async move {
                let mut v = c.state_get_versioned(INDEX, &sid).await.ok()?;
                Some(session_tree::IndexSeen {
                    version: v["version"].as_u64().filter(|v| *v > 0)?,
                    value: v.get_mut("value").map(Value::take)?,
                    layout: Some(LAYOUT.into()),
                })
            }))
        });
        Some(Self {
            started: Instant::now(),
            peek,
            index,
        })
    }

    /// The inboxes as peeked, if fresh; the record's index brought up to date, if read.
    pub(crate) async fn take(mut self, rec: &mut Record) -> Option<PeekedInbox> {
        if let Some(index) = self.index.as_mut()
            && let Ok(Some(fresh)) = index.await
        {
            rec.tree_index = Some(fresh);
        }
        if self.started.elapsed() > EARLY_PEEK_FRESH {
            return None;
        }
        (&mut self.peek).await.ok()
    }
}

/// All calls of the batch are decided: append the results once, in call order (carried in
/// the record's next save where the session's index allows). `beside`: the reads started
/// beside the calls.
pub(crate) async fn finalize_batch(
    ctx: &Ctx,
    rec: &mut Record,
    beside: Option<BesideTheCalls>,
) -> StepResult<Outcome> {
    let work = rec.work.clone().unwrap_or_default();
    let mut results = Vec::new();
    let mut terminate = false;
    for call in &work.prepared {
        if let Some(e) = work.executed.get(&call.function_call_id) {
            results.push(result_message(e, vision(rec)));
            terminate |= e.terminate;
        }
    }
    // The steering check follows in this step: the peek beside the calls is for it (else
    // the append peeks the inboxes).
    let peeked = match beside {
        Some(beside) => beside.take(rec).await,
        None => None,
    };
    let results = append_history_carried(ctx, rec, results, "r", peeked).await?;
    Ok(Outcome::BatchDone {
        results,
        terminated: terminate,
    })
}

/// Functions the orchestrator never dispatches for the model, whatever the policy answers and
/// whoever registers them: the engine's own (no worker declares them: writing state behind the
/// record's back, writing streams, driving the engine), and the SPEC's human-only contracts,
/// so a replacement written to the seeds without our metadata (an approval gate, a policy)
/// cannot let the agent approve its own calls or read keys. Every other such function is
/// declared by the worker that registers it, with `metadata.agent: false`
/// ([`not_for_the_agent`]).
pub(crate) const ENGINE_NEVER_FOR_THE_AGENT: &[&str] = &[
    "approval::resolve",
    "policy::*",
    "run::start",
    "harness::trigger",
    "auth::get_token",
    "auth::set_token",
    "auth::delete_token",
    "state::set",
    "state::update",
    "state::delete",
    "state::transact",
    "state::sync",
    "stream::set",
    "stream::set_many",
    "stream::delete",
    "stream::send",
    "engine::*",
    "iii::*",
];

fn engine_never_for_the_agent(function_id: &str) -> Option<&'static str> {
    ENGINE_NEVER_FOR_THE_AGENT
        .iter()
        .copied()
        .find(|p| match p.strip_suffix('*') {
            Some(prefix) => function_id.starts_with(prefix),
            None => function_id == *p,
        })
}

/// How long a read of which functions are not for the agent is trusted before the engine's
/// `catalogue_version` is asked again (and, where the engine gives none, the catalogue).
const NOT_FOR_THE_AGENT_TTL: Duration = Duration::from_secs(1);

/// Why the orchestrator refuses `function_id` for the model whatever the policy says: the
/// engine's own pattern it matches, or the worker's declaration. `None`: the policy decides.
/// A swapped or buggy policy must not let the agent approve its own calls, read provider
/// keys, start runs, exempt itself from its budget or drive the engine.
pub(crate) async fn not_for_the_agent(ctx: &Ctx, function_id: &str) -> StepResult<Option<String>> {
    if let Some(p) = engine_never_for_the_agent(function_id) {
        return Ok(Some(p.to_string()));
    }
    let cached = crate::history::CACHE
        .try_with(|c| {
            c.not_for_the_agent.lock().ok().and_then(|n| {
                n.as_ref().map(|n| {
                    (
                        n.version.clone(),
                        n.read_at.elapsed() < NOT_FOR_THE_AGENT_TTL,
                        n.ids.contains(function_id),
                    )
                })
            })
        })
        .ok()
        .flatten();
    let declared = |hit: bool| hit.then(|| "metadata.agent: false".to_string());
    if let Some((_, true, hit)) = cached {
        return Ok(declared(hit));
    }
    let version = ctx.catalogue_version().await;
    if let (Some((Some(was), _, hit)), Some(now)) = (&cached, &version)
        && was == now
    {
        let _ = crate::history::CACHE.try_with(|c| {
            if let Ok(mut n) = c.not_for_the_agent.lock()
                && let Some(n) = n.as_mut()
            {
                n.read_at = std::time::Instant::now();
            }
        });
        return Ok(declared(*hit));
    }
    let ids: std::collections::HashSet<String> = ctx
        .functions(false)
        .await?
        .iter()
        .filter(|f| bus::access::is_not_for_the_agent(f.get("metadata")))
        .filter_map(|f| f["function_id"].as_str().map(str::to_owned))
        .collect();
    let hit = ids.contains(function_id);
    let _ = crate::history::CACHE.try_with(|c| {
        if let Ok(mut n) = c.not_for_the_agent.lock() {
            *n = Some(crate::history::NotForTheAgent {
                version,
                read_at: std::time::Instant::now(),
                ids,
            });
        }
    });
    Ok(declared(hit))
}

pub(crate) fn denied(rec: &mut Record, call: &Call, envelope: Value) -> Executed {
    let decision = json!({"decision": "deny", "denied_by": envelope["denied_by"], "rule_id": envelope["rule_id"]});
    emit(
        rec,
        "function_execution_start",
        json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "args": redact(&call.args), "decision": decision}),
    );
    refused(rec, call, envelope)
}

/// A call that was not run: its denial envelope is the result (announced already).
pub(crate) fn refused(rec: &mut Record, call: &Call, envelope: Value) -> Executed {
    if let Some(m) = bus_telemetry::metrics::get() {
        m.tool_call(&call.function_id, "denied", Duration::ZERO);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Call, Executed};

    fn executed(result: Value) -> Executed {
        Executed {
            call: Call {
                function_call_id: "c1".into(),
                function_id: "mcp::s::shot".into(),
                args: json!({}),
            },
            result,
            is_error: false,
            duration_ms: 1,
            terminate: false,
        }
    }

    #[test]
    fn a_results_images_go_to_a_vision_model_as_images_and_to_others_as_a_note() {
        let e = executed(json!({"content": [
            {"type": "text", "text": "a picture"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "image", "data": "PHN2Zz4=", "mimeType": "text/html"}
        ]}));
        let AgentMessage::FunctionResult { content, .. } = result_message(&e, true) else {
            panic!()
        };
        assert_eq!(
            content.len(),
            2,
            "the text, and the one plausible image: {content:?}"
        );
        let ContentBlock::Text { text } = &content[0] else {
            panic!()
        };
        assert!(
            text.contains("[image 1 attached below]") && !text.contains("iVBORw0KGgo="),
            "{text}"
        );
        assert!(
            text.contains("left out"),
            "a non-image mime type is not passed on: {text}"
        );
        assert!(matches!(&content[1], ContentBlock::Image { mime, .. } if mime == "image/png"));
        let AgentMessage::FunctionResult { content, .. } = result_message(&e, false) else {
            panic!()
        };
        assert_eq!(content.len(), 1);
        let ContentBlock::Text { text } = &content[0] else {
            panic!()
        };
        assert!(text.contains("the model cannot see"), "{text}");
    }
}
