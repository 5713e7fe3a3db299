//! The public functions: `run::start`, `run::abort`, `turn::get_state`, and the approvals
//! trigger that wakes a parked session.

use crate::prelude::*;

pub(crate) async fn run_start(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    for f in ["session_id", "provider", "model"] {
        req_str(&data, f)?;
    }
    let req: RunRequest =
        contracts::parse("invalid run::start request", data.clone()).map_err(ErrorBody::invalid)?;
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
    if let Some(mode) = req.mode.as_deref()
        && !MODES.contains(&mode)
    {
        let shown: String = mode.chars().take(40).collect();
        return Err(ErrorBody::invalid(format!(
            "`mode` `{shown}` is not a mode; the modes are {}",
            MODES.join(", ")
        )));
    }
    if req.fallback.len() > MAX_FALLBACK {
        return Err(ErrorBody::invalid(format!(
            "`fallback` holds {} models; at most {MAX_FALLBACK}",
            req.fallback.len()
        )));
    }
    for (i, f) in req.fallback.iter().enumerate() {
        if !is_provider_name(&f.provider) {
            return Err(ErrorBody::invalid(format!(
                "`fallback[{i}].provider` must be 1-64 characters of [a-z0-9_-]"
            )));
        }
        if f.model.is_empty() || f.model.len() > 256 || f.model.chars().any(char::is_control) {
            return Err(ErrorBody::invalid(format!(
                "`fallback[{i}].model` must be 1 to 256 characters, without control characters"
            )));
        }
    }
    let sid = req.session_id.clone();
    // The first to start a session under an id owns it; another's id is refused as one that
    // is not there (never "busy": that would say it exists).
    if !harness_sdk::owners::claim(&ctx, &sid).await? {
        return Ok(json!(RunStartAnswer {
            session_id: sid,
            started: false,
            reason: Some("not_found".into()),
        }));
    }
    let busy = json!(RunStartAnswer {
        session_id: sid.clone(),
        started: false,
        reason: Some("session_busy".into()),
    });
    // The record and the session's tree at once (making sure of the tree is idempotent, so
    // it may run for a session that turns out busy).
    let (existing, ensured) = tokio::join!(
        RecordStore::load(&ctx, &sid),
        ctx.trigger_timeout(
            "session-tree::ensure",
            json!({"session_id": sid}),
            BEST_EFFORT_TIMEOUT,
        )
    );
    let existing = existing.map_err(|e| match e {
        StepError::Transient(e) => e,
        StepError::Fatal(m) => ErrorBody::new("invocation_error", m),
        StepError::Stale => ErrorBody::new("invocation_error", "stale"),
    })?;
    if existing.as_ref().is_some_and(|(r, _)| !r.state.terminal()) {
        return Ok(busy);
    }
    // The history lives in the session tree when the session worker runs (provisioning
    // resumes from its current leaf); otherwise in the record, carried over from a stopped run.
    let (tree, tree_index) = match ensured {
        // The session's index as it is now: the run's first append hands it back, so the
        // session worker appends without reading it (a worker that answers none reads it).
        Ok(mut answer) => (
            true,
            answer
                .get_mut("index")
                .map(Value::take)
                .and_then(|v| serde_json::from_value(v).ok()),
        ),
        Err(BusError::FunctionNotFound(_)) => (false, None),
        Err(e) => return Err(e.into()),
    };
    // A new run on a stopped session keeps counting: its events come after the last run's
    // (item ids are `<sid>-<seq>`, which a client resuming a stream relies on), and its totals add up.
    let (event_seq, totals) = existing
        .as_ref()
        .map(|(r, _)| (r.event_seq + 1, r.totals.clone()))
        .unwrap_or((1, Default::default()));
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
        .unwrap_or_else(|| format!("run{}", bus_telemetry::trace::random_hex(6)));
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
        assistant_pending: false,
        recent_appends: Vec::new(),
        tree_index,
        peeked_inbox: None,
        // The first event's seq, reserved: it is written once the record is (a busy session
        // keeps its own events).
        event_seq,
        totals,
        outbox: Vec::new(),
        unsaved_call: None,
        pending_sync: Default::default(),
        pending_push: Default::default(),
        pending_save: Default::default(),
        carried: Default::default(),
        beside_the_calls: Default::default(),
    };
    let mut version = expected;
    match save(&ctx, &mut rec, &mut version, false).await {
        Ok(()) => {}
        Err(StepError::Stale) => return Ok(busy),
        Err(StepError::Transient(e)) => return Err(e),
        Err(StepError::Fatal(m)) => return Err(ErrorBody::new("invocation_error", m)),
    }
    let created = state_changed(&rec, "state:created");
    emit_at(&mut rec, 1, "turn_state_changed", created);
    flush_events(&ctx, &mut rec).await;
    StepQueue::enqueue(
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
    Ok(json!(RunStartAnswer {
        session_id: sid,
        started: true,
        reason: None,
    }))
}

pub(crate) async fn run_abort(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = req_str(&data, "session_id")?;
    let answer = |aborted, state, commands_killed| {
        json!(RunAbortAnswer {
            session_id: sid.clone(),
            aborted,
            state,
            commands_killed,
        })
    };
    // Another's session answers as one that does not exist.
    if !harness_sdk::owners::may_see(&ctx, &sid).await? {
        return Ok(answer(false, None, None));
    }
    for _ in 0..5 {
        let Some((mut rec, mut version)) = RecordStore::load(&ctx, &sid)
            .await
            .map_err(|_| ErrorBody::new("storage_error", "cannot read the turn record"))?
        else {
            return Ok(answer(false, None, None));
        };
        if rec.state.terminal() {
            return Ok(answer(false, Some(rec.state), None));
        }
        rec.state = TurnState::Stopped;
        rec.error = Some(TurnError {
            kind: "aborted".into(),
            message: "aborted by run::abort".into(),
        });
        rec.awaiting_approval = None;
        // A model answer held back for its batch's results goes into the history now (best
        // effort: the abort must not wait on the session store).
        let _ = append_pending_answer(&ctx, &mut rec).await;
        let messages = history_for_event(&ctx, &rec).await;
        emit(&mut rec, "agent_end", json!({"messages": messages}));
        match save(&ctx, &mut rec, &mut version, false).await {
            Ok(()) => {
                let changed = state_changed(&rec, "state:updated");
                emit(&mut rec, "turn_state_changed", changed);
                let _ = save(&ctx, &mut rec, &mut version, false).await;
                // A command the run started dies with it (best effort: a tools worker that
                // does not offer this lets the command run out its timeout).
                let killed = best_effort(&ctx, "shell::cancel", json!({"session_id": sid}))
                    .await
                    .and_then(|v| v["killed"].as_u64())
                    .unwrap_or(0);
                // So does an MCP call in flight, cancelled on its server.
                let _ = best_effort(&ctx, "mcp::cancel", json!({"session_id": sid})).await;
                // And its sandbox goes with the run.
                let _ = best_effort(&ctx, "shell::release", json!({"session_id": sid})).await;
                return Ok(answer(true, Some(TurnState::Stopped), Some(killed)));
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

pub(crate) async fn get_state(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let sid = req_str(&data, "session_id")?;
    // Another's session answers as one that does not exist.
    if !harness_sdk::owners::may_see(&ctx, &sid).await? {
        return Ok(Value::Null);
    }
    match RecordStore::load(&ctx, &sid).await {
        Ok(Some((rec, _))) => {
            let mut view = rec.view();
            let owner = harness_sdk::owners::owner(&ctx, &sid).await?;
            if let Some(v) = view.as_object_mut()
                && !owner.is_null()
            {
                v.insert("owner".into(), owner);
            }
            Ok(view)
        }
        Ok(None) => Ok(Value::Null),
        Err(StepError::Transient(e)) => Err(e),
        Err(_) => Err(ErrorBody::new(
            "storage_error",
            "cannot read the turn record",
        )),
    }
}

/// State trigger on `approvals`: wake the parked session with a queued step.
pub(crate) async fn on_approval(ctx: Ctx, event: Value) -> Result<Value, ErrorBody> {
    let key = event["key"].as_str().unwrap_or_default();
    let Some((sid, cid)) = key.split_once('/') else {
        return Ok(json!({"ignored": key}));
    };
    if event["event_type"] == "state:deleted" {
        return Ok(json!({"ignored": key}));
    }
    if let Ok(Some((rec, _))) = RecordStore::load(&ctx, sid).await
        && rec.state == TurnState::FunctionAwaitingApproval
    {
        StepQueue::enqueue(
            &ctx,
            sid,
            TurnState::FunctionAwaitingApproval,
            // Per record written, not per call id: a second, different record under the same
            // key (a correction after one that did not apply) must wake the session too, and
            // the seeds' `{decision, reason}` has no time to tell two apart (the queue drops a
            // repeated deduplication id). The same record twice wakes it once.
            format!(
                "{sid}-approval-{cid}-{}",
                harness_sdk::messages::args_hash(&event["new_value"])
            ),
        )
        .await
        .map_err(|_| ErrorBody::new("enqueue_error", "could not wake the session"))?;
        return Ok(json!({"woke": sid}));
    }
    Ok(json!({"ignored": key}))
}
