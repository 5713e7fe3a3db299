//! `function_execute`: every prepared call through the policy: run, parked for approval, or
//! denied; saved durably after each, so a redelivered step never runs one twice.

use crate::prelude::*;

pub(crate) async fn function_execute(
    ctx: &Ctx,
    hooks: &Hooks,
    rec: &mut Record,
    version: &mut u64,
    req: &RunRequest,
) -> StepResult<Outcome> {
    let mode = Mode::of(req.mode.as_deref());
    let prepared = rec
        .work
        .as_ref()
        .map(|w| w.prepared.clone())
        .unwrap_or_default();
    let last = prepared.len().saturating_sub(1);
    // Started with the turn's model call; a step that starts here (a redelivery, an
    // approval's) reads now.
    let beside = rec
        .beside_the_calls
        .take()
        .or_else(|| BesideTheCalls::start(ctx, rec));
    for (index, call) in prepared.into_iter().enumerate() {
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
        if let Some(pattern) = not_for_the_agent(ctx, &call.function_id).await? {
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
            save(ctx, rec, version, true).await?;
            continue;
        }
        // The one choke point: the policy decides, and silence or slowness means deny.
        let request = policy::CheckRequest {
            function_id: call.function_id.clone(),
            args: call.args.clone(),
            session_id: Some(rec.session_id.clone()),
        };
        let asked = ctx
            .trigger_timeout(policy::CHECK, json!(request), POLICY_TIMEOUT)
            .await;
        let executed = match asked
            .map(|v| contracts::parse::<policy::CheckAnswer>(policy::CHECK, v))
            .map(|a| a.map(|a| mode.applied_to(a)))
        {
            // Plan mode: only what the policy allows as a read runs; nothing parks.
            Ok(Ok(ModeAnswer::PlanRefuses)) => {
                let env = denial(
                    "permissions",
                    &call.function_id,
                    Some("mode-plan"),
                    None,
                    &call.args,
                    "the run is in plan mode: it investigates and plans, it does not act, and the permissions policy does not mark this function read-only",
                );
                denied(rec, &call, env)
            }
            Ok(Ok(ModeAnswer::Policy(answer))) => match answer.decision {
                policy::Decision::Allow => {
                    let decision = json!({"decision": "allow", "rule_id": answer.rule_id, "rule_name": answer.rule_name});
                    dispatch_with(
                        ctx,
                        hooks,
                        rec,
                        version,
                        &call,
                        Some(decision),
                        Grant {
                            network: answer.network,
                            read_only: answer.read_only,
                        },
                    )
                    .await?
                }
                policy::Decision::NeedsApproval => {
                    // Nobody can have decided a call not yet announced: a record already under
                    // its key was written for no parked call (a replay, a stray write) and
                    // must not decide this one.
                    let key = format!("{}/{}", rec.session_id, call.function_call_id);
                    ctx.state_delete(APPROVALS, &key).await?;
                    // Parked (and saved) before it is announced, so an approver who reacts
                    // to the event finds it pending.
                    rec.awaiting_approval
                        .get_or_insert_with(Vec::new)
                        .push(call.clone());
                    save(ctx, rec, version, false).await?;
                    // The history shows the call while it waits (maybe for hours). Appended
                    // after the save that holds the answer: a crash between the two leaves
                    // the answer to be appended later, never a history entry for an answer
                    // the record does not have (a redelivery would ask the model again).
                    append_pending_answer(ctx, rec).await?;
                    emit(
                        rec,
                        "function_execution_start",
                        json!({"function_call_id": call.function_call_id, "function_id": call.function_id, "args": redact(&call.args), "awaiting_approval": true, "decision": {"decision": "needs_approval"}}),
                    );
                    continue;
                }
                policy::Decision::Deny => {
                    let mut env = denial(
                        "permissions",
                        &call.function_id,
                        answer.rule_id.as_deref(),
                        answer.matched_constraint.as_ref(),
                        &call.args,
                        "the permissions policy denies this call",
                    );
                    if let Some(name) = &answer.rule_name {
                        env["rule_name"] = json!(name);
                    }
                    denied(rec, &call, env)
                }
            },
            // An answer that is not a decision decides nothing: denied.
            Ok(Err(unreadable)) => {
                let env = denial(
                    "permissions",
                    &call.function_id,
                    None,
                    None,
                    &call.args,
                    &format!(
                        "the permissions policy answered something that is not a decision ({unreadable}); denied to be safe"
                    ),
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
        // redelivered step never runs it again. The batch's last call is held by the step's
        // next save instead (after the history append, made durable for it): one write fewer
        // per batch; a step that fails before that save saves this record (the driver).
        if index == last {
            rec.unsaved_call = Some(Box::new(rec.clone()));
        } else {
            save(ctx, rec, version, true).await?;
        }
    }
    if rec
        .awaiting_approval
        .as_ref()
        .is_some_and(|a| !a.is_empty())
    {
        return Ok(Outcome::Parked);
    }
    finalize_batch(ctx, rec, beside).await
}

/// The run's mode (`run::start`'s `mode`), as it changes what the policy answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Agent,
    /// Only calls the policy allows as reads run; the rest are denied, none parks.
    Plan,
    /// Every call the policy allows waits for a person's approval.
    Ask,
}

pub(crate) enum ModeAnswer {
    Policy(policy::CheckAnswer),
    PlanRefuses,
}

impl Mode {
    /// Validated by `run::start`; anything else reads as `agent`.
    pub(crate) fn of(mode: Option<&str>) -> Self {
        match mode {
            Some("plan") => Self::Plan,
            Some("ask") => Self::Ask,
            _ => Self::Agent,
        }
    }

    pub(crate) fn applied_to(self, mut answer: policy::CheckAnswer) -> ModeAnswer {
        match (self, answer.decision) {
            (Self::Plan, policy::Decision::Allow) if answer.read_only => ModeAnswer::Policy(answer),
            (Self::Plan, policy::Decision::Allow | policy::Decision::NeedsApproval) => {
                ModeAnswer::PlanRefuses
            }
            (Self::Ask, policy::Decision::Allow) => {
                answer.decision = policy::Decision::NeedsApproval;
                ModeAnswer::Policy(answer)
            }
            _ => ModeAnswer::Policy(answer),
        }
    }
}
