//! `function_awaiting_approval`: apply the decisions made for the parked calls (bound to
//! the call's function and arguments), once each.

use crate::prelude::*;

pub(crate) async fn function_awaiting_approval(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    version: &mut u64,
) -> StepResult<Outcome> {
    let parked = rec.awaiting_approval.clone().unwrap_or_default();
    for call in parked {
        let stored = ctx
            .state_get(
                APPROVALS,
                &format!("{}/{}", rec.session_id, call.function_call_id),
            )
            .await?;
        if stored.is_null() {
            continue;
        }
        // A decision counts only for the call it was made for. Call ids are unique within the
        // session (a model's repeated id is replaced), so the key names one call; a record
        // that also names the function and the arguments' hash (ours does; the seeds' `{decision,
        // reason}` does not) must name this call's. A record that is not a decision is ignored
        // and the call stays parked until it is decided.
        let Ok(decision) =
            contracts::parse::<approval::DecisionRecord>("an approval record", stored)
        else {
            continue;
        };
        let other_function = decision
            .function_id
            .as_ref()
            .is_some_and(|f| *f != call.function_id);
        let other_args = decision
            .args_hash
            .as_ref()
            .is_some_and(|h| *h != args_hash(&call.args));
        if other_function || other_args {
            continue;
        }
        let reason = decision.reason.clone();
        // The decision record is deleted once applied: the event log keeps who decided what.
        emit(
            rec,
            "approval_applied",
            json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "decision": decision.decision, "reason": reason, "decided_by": decision.decided_by, "decided_at": decision.decided_at}),
        );
        let executed = match decision.decision {
            // Approved: dispatched without asking the policy again.
            approval::Verdict::Allow => dispatch(ctx, hooks, rec, version, &call, false).await?,
            // Denied or aborted: this call is refused with the reason; the batch goes on (the
            // seeds' meaning of both; `run::abort` is how a run is stopped).
            verdict @ (approval::Verdict::Deny | approval::Verdict::Aborted) => {
                let why = match (reason.is_empty(), verdict) {
                    (false, _) => reason,
                    (true, approval::Verdict::Aborted) => "aborted by the user".to_string(),
                    (true, _) => "denied by the user".to_string(),
                };
                let env = denial("user", &call.function_id, None, None, &call.args, &why);
                refused(rec, &call, env)
            }
        };
        if let Some(w) = rec.work.as_mut() {
            w.executed.insert(call.function_call_id.clone(), executed);
        }
        if let Some(a) = rec.awaiting_approval.as_mut() {
            a.retain(|c| c.function_call_id != call.function_call_id);
        }
        save(ctx, rec, version, true).await?;
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
        return Ok(Outcome::Undecided);
    }
    finalize_batch(ctx, rec, None).await
}
