//! The approval gate. `approval::resolve {session_id, function_call_id, decision:
//! allow|deny|aborted, reason?}` writes `approvals/<sid>/<cid>` (the first
//! decision wins) only for a call that is parked; the turn's state trigger on `approvals`
//! wakes the session. `approval::list_pending {session_id?}` lists parked calls.
//!
//! A decision is bound to the parked call: it records the call's function id and the hash of
//! its arguments, and the orchestrator applies it only to a call with exactly those, then
//! deletes it (consumed once). A leftover decision of another call under the same id is
//! replaced, never reused.

use harness_sdk::contracts::{
    self,
    approval::{
        DecisionRecord, ListPendingAnswer, ListPendingRequest, ResolveAnswer, ResolveRequest,
    },
};
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, RegisterFunction, Worker};
use serde_json::{Value, json};

fn invalid(why: &str) -> Value {
    json!({"ok": false, "error": "invalid_payload", "message": why})
}

fn id_ok(v: Option<&str>) -> Option<&str> {
    v.filter(|s| !s.is_empty() && !s.contains('/'))
}

fn parked(record: &Value) -> Vec<Value> {
    record["awaiting_approval"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub async fn resolve(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let req: ResolveRequest = match contracts::parse("approval::resolve", data) {
        Ok(r) => r,
        Err(e) => return Ok(invalid(&e)),
    };
    let Some(sid) = id_ok(Some(&req.session_id)) else {
        return Ok(invalid(
            "`session_id` must be a non-empty string without `/`",
        ));
    };
    let Some(cid) = id_ok(Some(&req.function_call_id)) else {
        return Ok(invalid(
            "`function_call_id` must be a non-empty string without `/`",
        ));
    };
    // Another's session: as if nothing were parked there.
    if !harness_sdk::owners::may_see(&ctx, sid).await? {
        return Ok(json!({"ok": false, "error": "not_pending"}));
    }
    let record = ctx
        .state_get("agent", &format!("session/{sid}/turn_state"))
        .await?;
    // Parked means in the record's list while the run is live (the record is saved with the
    // call parked a moment before its state becomes function_awaiting_approval).
    let live = !matches!(
        record["state"].as_str(),
        None | Some("stopped") | Some("failed")
    );
    let calls = parked(&record);
    let Some(call) = calls
        .iter()
        .find(|c| c["function_call_id"] == cid)
        .filter(|_| live)
    else {
        return Ok(json!({"ok": false, "error": "not_pending"}));
    };
    let function_id = call["function_id"].as_str().unwrap_or_default();
    let hash = harness_sdk::messages::args_hash(&call["args"]);
    let value = DecisionRecord {
        decision: req.decision,
        reason: req.reason.unwrap_or_default(),
        // Who decided is who called (the engine writes a client's identity; the Slack
        // worker names the verified Slack user), never a field the caller sends.
        decided_by: harness_sdk::owners::caller(&ctx)
            .map(|a| a.name)
            .unwrap_or_else(|| "harness".into()),
        decided_at: bus_telemetry::trace::now_ms(),
        function_id: Some(function_id.to_string()),
        args_hash: Some(hash.clone()),
    };
    let value = serde_json::to_value(&value)
        .map_err(|e| ErrorBody::new("serialization_error", e.to_string()))?;
    let key = format!("{sid}/{cid}");
    // A record may already be there: this call's decision (someone decided first), or one
    // left by an earlier call under the same id that was never consumed (a crash between
    // running it and deleting its decision). Only the first means "not pending".
    let mut expected = 0;
    let existing = ctx.state_get_versioned("approvals", &key).await;
    if let Ok(existing) = &existing
        && !existing.is_null()
    {
        let bound = &existing["value"];
        if bound["function_id"] == function_id && bound["args_hash"] == hash.as_str() {
            return Ok(json!({"ok": false, "error": "not_pending"}));
        }
        expected = existing["version"].as_u64().unwrap_or(0);
    }
    match ctx.state_set_if("approvals", &key, value, expected).await {
        Ok(_) => Ok(json!({"ok": true})),
        // Someone decided first.
        Err(BusError::VersionConflict(_)) => Ok(json!({"ok": false, "error": "not_pending"})),
        Err(e) => Ok(json!({"ok": false, "error": "resume_failed", "message": e.to_string()})),
    }
}

pub async fn list_pending(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let only = data["session_id"].as_str().map(str::to_owned);
    let prefix = match &only {
        Some(s) => format!("session/{s}/"),
        None => "session/".to_string(),
    };
    let items = ctx.state_list("agent", Some(&prefix)).await?;
    let records = items["items"].as_array().cloned().unwrap_or_default();
    let sids: Vec<String> = records
        .iter()
        .filter_map(|i| i["value"]["session_id"].as_str().map(str::to_owned))
        .collect();
    let visible = harness_sdk::owners::visible(&ctx, sids.iter().map(String::as_str)).await?;
    let mut pending = Vec::new();
    for item in records {
        if !item["value"]["session_id"]
            .as_str()
            .is_some_and(|s| visible.contains(s))
        {
            continue;
        }
        if !item["key"]
            .as_str()
            .is_some_and(|k| k.ends_with("/turn_state"))
            || item["value"]["state"] != "function_awaiting_approval"
        {
            continue;
        }
        let sid = item["value"]["session_id"].clone();
        for c in parked(&item["value"]) {
            pending.push(json!({"session_id": sid, "function_call_id": c["function_call_id"], "function_id": c["function_id"], "args": c["args"]}));
        }
    }
    Ok(json!({"pending": pending}))
}

pub fn worker() -> Worker {
    let mut w = Worker::new("approval-gate");
    let mut d = RegisterFunction::new("approval::resolve")
        .not_for_the_agent()
        .public()
        .contract::<ResolveRequest, ResolveAnswer>();
    d.description = Some("Decide a parked call: {session_id, function_call_id, decision: allow|deny|aborted, reason?} → {ok} | {ok:false, error: invalid_payload|not_pending|resume_failed}.".into());
    w.register_function(d, resolve);
    let mut d = RegisterFunction::new("approval::list_pending")
        .not_for_the_agent()
        .public()
        .contract::<ListPendingRequest, ListPendingAnswer>();
    d.description = Some("Parked calls, optionally of one session.".into());
    w.register_function(d, list_pending);
    w
}
