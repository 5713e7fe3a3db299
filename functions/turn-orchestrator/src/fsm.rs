//! The turn's state machine as data: given the state a step ran in and what its effects found
//! out ([`Outcome`]), [`transition`] returns the next state and the effects the step driver
//! applies, in order ([`Effect`]). Pure: no bus, no clock, no record; tested row by row below.
//!
//! ```text
//! provisioning ──Provisioned──▶ assistant_streaming
//! assistant_streaming ──Answered(calls)──▶ function_execute (in the same step; saved before a call runs, a read excepted)
//!                     ──Answered(none)───▶ steering_check (in the same step)
//!                     ──BudgetRefused / ModelFailed──▶ stopped
//! function_execute ──Parked──▶ function_awaiting_approval
//! function_execute, function_awaiting_approval ──BatchDone──▶ steering_check (same step)
//!                                              ──BatchDone(terminated)──▶ stopped
//! function_awaiting_approval ──Undecided──▶ (stays)
//! steering_check ──Steered / ResultsPending──▶ assistant_streaming
//!                ──MaxTurns / Idle──▶ stopped
//! any running state ──Fatal──▶ failed
//! ```

use crate::types::{Call, TurnState};
use harness_sdk::messages::AgentMessage;

/// What a state's effects found out.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// provisioning: the prompt, the budgets and the history are in place.
    Provisioned,
    /// assistant_streaming: a budget refuses another model call (its note is in the history).
    BudgetRefused { reason: String },
    /// assistant_streaming: the model call ended in an error or was aborted.
    ModelFailed { kind: String, message: String },
    /// assistant_streaming: the model answered, with these calls to run (maybe none).
    Answered { calls: Vec<Call> },
    /// function_execute: some calls wait for a human.
    Parked,
    /// function_awaiting_approval: no parked call is decided yet.
    Undecided,
    /// Every call of the batch has its result (appended to the history, in call order);
    /// `terminated`: the user aborted one of them.
    BatchDone {
        results: Vec<AgentMessage>,
        terminated: bool,
    },
    /// steering_check: the run used its turns; `results_pending`: the model has not seen the
    /// last results (a note says so in the history).
    MaxTurns { turns: u32, results_pending: bool },
    /// steering_check: steering or follow-up messages were added to the history.
    Steered,
    /// steering_check: the model has function results to read.
    ResultsPending,
    /// steering_check: nothing more to do.
    Idle,
    /// Anything unexpected: the run fails with this message.
    Fatal(String),
}

impl Outcome {
    fn name(&self) -> &'static str {
        match self {
            Outcome::Provisioned => "Provisioned",
            Outcome::BudgetRefused { .. } => "BudgetRefused",
            Outcome::ModelFailed { .. } => "ModelFailed",
            Outcome::Answered { .. } => "Answered",
            Outcome::Parked => "Parked",
            Outcome::Undecided => "Undecided",
            Outcome::BatchDone { .. } => "BatchDone",
            Outcome::MaxTurns { .. } => "MaxTurns",
            Outcome::Steered => "Steered",
            Outcome::ResultsPending => "ResultsPending",
            Outcome::Idle => "Idle",
            Outcome::Fatal(_) => "Fatal",
        }
    }
}

/// What the driver does, in this order, after setting the record's state to the new one.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Why the run ends (`record.error`).
    SetError { kind: String, message: String },
    /// The model's calls become the batch to run.
    PrepareBatch(Vec<Call>),
    /// The batch is over: its results are what the model reads next.
    CloseBatch(Vec<AgentMessage>),
    /// `turn_end` (once per model turn), with these function results.
    EmitTurnEnd(Vec<AgentMessage>),
    /// `message_complete` of an error message (a failed run shows why).
    EmitFailure(String),
    /// `agent_end` with the history.
    EmitAgentEnd,
    /// `turn_state_changed`.
    EmitStateChanged,
    /// Write the events held so far (a step that stays saves nothing).
    FlushEvents,
    /// Save the record; `durable`: at once, not with the step's acknowledgement.
    Save { durable: bool },
    /// Queue the new state's step.
    Enqueue,
    /// Run the new state in this step (a load, a send, a receive and a delete fewer per
    /// model turn). After a save, a redelivery of the step resumes the saved state
    /// ([`resumes`]).
    ContinueInline,
}

/// The next state (`None`: stay) and the effects that go with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub to: Option<TurnState>,
    pub effects: Vec<Effect>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("no transition from {from:?} on {outcome}")]
pub struct InvalidTransition {
    pub from: TurnState,
    pub outcome: &'static str,
}

fn to(state: TurnState, mut effects: Vec<Effect>) -> Transition {
    if state.terminal() {
        effects.extend([
            Effect::EmitAgentEnd,
            Effect::EmitStateChanged,
            // A run that ends is durable at once.
            Effect::Save { durable: true },
        ]);
    } else {
        effects.extend([
            Effect::EmitStateChanged,
            // A run that waits for a human is durable at once; other transitions become
            // durable with the step's acknowledgement (or the next executed call).
            Effect::Save {
                durable: state == TurnState::FunctionAwaitingApproval,
            },
            Effect::Enqueue,
        ]);
    }
    Transition {
        to: Some(state),
        effects,
    }
}

/// The model's calls run in the step that got them, instead of a step of their own. The
/// batch (the truth a crash resumes from) is saved before anything comes of it: with the
/// first call's start, just before it runs, or when a call is decided without running or
/// parks; that save carries the events so far, so no write of its own is needed here.
fn batch_inline(state: TurnState, mut effects: Vec<Effect>) -> Transition {
    effects.extend([Effect::EmitStateChanged, Effect::ContinueInline]);
    Transition {
        to: Some(state),
        effects,
    }
}

/// A delivery of `expected`'s step that finds the record in `stored` runs `stored`: the state
/// was entered inline and saved by an earlier delivery of the same step, which died before
/// queuing anything (no other step is queued for it). `None`: the delivery is stale. A
/// `provisioning` step goes on into the run's first turns (`driver::Chain`), so its
/// redelivery resumes the turn it saved, as an `assistant_streaming` step's does.
pub fn resumes(expected: TurnState, stored: TurnState) -> Option<TurnState> {
    use TurnState::{AssistantStreaming, FunctionExecute, Provisioning};
    match (expected, stored) {
        _ if expected == stored && !expected.terminal() => Some(stored),
        (AssistantStreaming | Provisioning, AssistantStreaming | FunctionExecute) => Some(stored),
        _ => None,
    }
}

/// Whether a step queued as `expected` may go on into the run's next turns
/// (`driver::Chain`): only when its redelivery resumes whatever the chain saved, a turn's
/// start or its batch ([`resumes`]).
pub fn chains(expected: TurnState) -> bool {
    [TurnState::AssistantStreaming, TurnState::FunctionExecute]
        .into_iter()
        .all(|saved| resumes(expected, saved).is_some())
}

/// steering_check is decided in the step that leads to it; the UI still sees the state pass.
fn inline(state: TurnState, mut effects: Vec<Effect>) -> Transition {
    effects.extend([Effect::EmitStateChanged, Effect::ContinueInline]);
    Transition {
        to: Some(state),
        effects,
    }
}

fn stop(kind: &str, message: String, mut effects: Vec<Effect>) -> Transition {
    effects.push(Effect::SetError {
        kind: kind.into(),
        message,
    });
    to(TurnState::Stopped, effects)
}

/// The closing of a batch, wherever it happens.
fn batch_done(results: &[AgentMessage], terminated: bool) -> Transition {
    let effects = vec![
        Effect::CloseBatch(results.to_vec()),
        Effect::EmitTurnEnd(results.to_vec()),
    ];
    if terminated {
        stop("aborted", "a call was aborted by the user".into(), effects)
    } else {
        inline(TurnState::SteeringCheck, effects)
    }
}

pub fn transition(from: TurnState, outcome: &Outcome) -> Result<Transition, InvalidTransition> {
    use Outcome as O;
    use TurnState as S;
    let t = match (from, outcome) {
        (S::Stopped | S::Failed, _) => None,
        (_, O::Fatal(message)) => Some(Transition {
            to: Some(S::Failed),
            effects: vec![
                Effect::SetError {
                    kind: "transition_error".into(),
                    message: message.clone(),
                },
                Effect::EmitFailure(message.clone()),
                Effect::EmitAgentEnd,
                Effect::Save { durable: false },
            ],
        }),
        (S::Provisioning, O::Provisioned) => Some(to(S::AssistantStreaming, Vec::new())),
        (S::AssistantStreaming, O::BudgetRefused { reason }) => {
            Some(stop("budget_exceeded", reason.clone(), Vec::new()))
        }
        (S::AssistantStreaming, O::ModelFailed { kind, message }) => Some(stop(
            kind,
            message.clone(),
            vec![Effect::EmitTurnEnd(Vec::new())],
        )),
        (S::AssistantStreaming, O::Answered { calls }) if calls.is_empty() => Some(inline(
            S::SteeringCheck,
            vec![Effect::EmitTurnEnd(Vec::new())],
        )),
        (S::AssistantStreaming, O::Answered { calls }) => Some(batch_inline(
            S::FunctionExecute,
            vec![Effect::PrepareBatch(calls.clone())],
        )),
        (S::FunctionExecute, O::Parked) => Some(to(S::FunctionAwaitingApproval, Vec::new())),
        (S::FunctionAwaitingApproval, O::Undecided) => Some(Transition {
            to: None,
            effects: vec![Effect::FlushEvents],
        }),
        (
            S::FunctionExecute | S::FunctionAwaitingApproval,
            O::BatchDone {
                results,
                terminated,
            },
        ) => Some(batch_done(results, *terminated)),
        (
            S::SteeringCheck,
            O::MaxTurns {
                turns,
                results_pending,
            },
        ) => Some(if *results_pending {
            stop(
                "max_turns",
                format!("max_turns ({turns}) reached"),
                Vec::new(),
            )
        } else {
            to(S::Stopped, Vec::new())
        }),
        (S::SteeringCheck, O::Steered | O::ResultsPending) => {
            Some(to(S::AssistantStreaming, Vec::new()))
        }
        (S::SteeringCheck, O::Idle) => Some(to(S::Stopped, Vec::new())),
        _ => None,
    };
    t.ok_or(InvalidTransition {
        from,
        outcome: outcome.name(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Effect as E;
    use Outcome as O;
    use TurnState as S;
    use serde_json::json;

    fn call() -> Call {
        Call {
            function_call_id: "c1".into(),
            function_id: "fs::list".into(),
            args: json!({}),
        }
    }

    fn result() -> AgentMessage {
        harness_sdk::messages::user_text("a result")
    }

    fn err(kind: &str, message: &str) -> Effect {
        E::SetError {
            kind: kind.into(),
            message: message.into(),
        }
    }

    const ENDS: [Effect; 3] = [
        E::EmitAgentEnd,
        E::EmitStateChanged,
        E::Save { durable: true },
    ];
    const MOVES: [Effect; 3] = [E::EmitStateChanged, E::Save { durable: false }, E::Enqueue];

    fn cat(a: &[Effect], b: &[Effect]) -> Vec<Effect> {
        a.iter().chain(b).cloned().collect()
    }

    #[test]
    fn every_transition_of_the_turn() {
        let rows: Vec<(S, O, Option<S>, Vec<Effect>)> = vec![
            (
                S::Provisioning,
                O::Provisioned,
                Some(S::AssistantStreaming),
                MOVES.to_vec(),
            ),
            (
                S::AssistantStreaming,
                O::BudgetRefused {
                    reason: "over".into(),
                },
                Some(S::Stopped),
                cat(&[err("budget_exceeded", "over")], &ENDS),
            ),
            (
                S::AssistantStreaming,
                O::ModelFailed {
                    kind: "rate_limited".into(),
                    message: "429".into(),
                },
                Some(S::Stopped),
                cat(&[E::EmitTurnEnd(vec![]), err("rate_limited", "429")], &ENDS),
            ),
            (
                S::AssistantStreaming,
                O::Answered { calls: vec![] },
                Some(S::SteeringCheck),
                vec![
                    E::EmitTurnEnd(vec![]),
                    E::EmitStateChanged,
                    E::ContinueInline,
                ],
            ),
            (
                S::AssistantStreaming,
                O::Answered {
                    calls: vec![call()],
                },
                Some(S::FunctionExecute),
                vec![
                    E::PrepareBatch(vec![call()]),
                    E::EmitStateChanged,
                    E::ContinueInline,
                ],
            ),
            (
                S::FunctionExecute,
                O::Parked,
                Some(S::FunctionAwaitingApproval),
                vec![E::EmitStateChanged, E::Save { durable: true }, E::Enqueue],
            ),
            (
                S::FunctionExecute,
                O::BatchDone {
                    results: vec![result()],
                    terminated: false,
                },
                Some(S::SteeringCheck),
                vec![
                    E::CloseBatch(vec![result()]),
                    E::EmitTurnEnd(vec![result()]),
                    E::EmitStateChanged,
                    E::ContinueInline,
                ],
            ),
            (
                S::FunctionExecute,
                O::BatchDone {
                    results: vec![result()],
                    terminated: true,
                },
                Some(S::Stopped),
                cat(
                    &[
                        E::CloseBatch(vec![result()]),
                        E::EmitTurnEnd(vec![result()]),
                        err("aborted", "a call was aborted by the user"),
                    ],
                    &ENDS,
                ),
            ),
            (
                S::FunctionAwaitingApproval,
                O::Undecided,
                None,
                vec![E::FlushEvents],
            ),
            (
                S::FunctionAwaitingApproval,
                O::BatchDone {
                    results: vec![],
                    terminated: false,
                },
                Some(S::SteeringCheck),
                vec![
                    E::CloseBatch(vec![]),
                    E::EmitTurnEnd(vec![]),
                    E::EmitStateChanged,
                    E::ContinueInline,
                ],
            ),
            (
                S::FunctionAwaitingApproval,
                O::BatchDone {
                    results: vec![],
                    terminated: true,
                },
                Some(S::Stopped),
                cat(
                    &[
                        E::CloseBatch(vec![]),
                        E::EmitTurnEnd(vec![]),
                        err("aborted", "a call was aborted by the user"),
                    ],
                    &ENDS,
                ),
            ),
            (
                S::SteeringCheck,
                O::MaxTurns {
                    turns: 3,
                    results_pending: true,
                },
                Some(S::Stopped),
                cat(&[err("max_turns", "max_turns (3) reached")], &ENDS),
            ),
            (
                S::SteeringCheck,
                O::MaxTurns {
                    turns: 3,
                    results_pending: false,
                },
                Some(S::Stopped),
                ENDS.to_vec(),
            ),
            (
                S::SteeringCheck,
                O::Steered,
                Some(S::AssistantStreaming),
                MOVES.to_vec(),
            ),
            (
                S::SteeringCheck,
                O::ResultsPending,
                Some(S::AssistantStreaming),
                MOVES.to_vec(),
            ),
            (S::SteeringCheck, O::Idle, Some(S::Stopped), ENDS.to_vec()),
        ];
        for (from, outcome, want_to, want_effects) in rows {
            let t = transition(from, &outcome)
                .unwrap_or_else(|e| panic!("{from:?} on {outcome:?}: {e}"));
            assert_eq!(t.to, want_to, "{from:?} on {outcome:?}");
            assert_eq!(t.effects, want_effects, "{from:?} on {outcome:?}");
        }
    }

    #[test]
    fn any_running_state_fails_on_the_unexpected() {
        for from in [
            S::Provisioning,
            S::AssistantStreaming,
            S::FunctionExecute,
            S::FunctionAwaitingApproval,
            S::SteeringCheck,
        ] {
            let t = transition(from, &O::Fatal("unreadable".into())).unwrap();
            assert_eq!(t.to, Some(S::Failed), "{from:?}");
            assert_eq!(
                t.effects,
                vec![
                    err("transition_error", "unreadable"),
                    E::EmitFailure("unreadable".into()),
                    E::EmitAgentEnd,
                    E::Save { durable: false },
                ]
            );
        }
    }

    #[test]
    fn only_steps_whose_redelivery_resumes_a_chained_turn_chain() {
        assert!(chains(S::AssistantStreaming));
        assert!(chains(S::Provisioning));
        for s in [
            S::FunctionExecute,
            S::FunctionAwaitingApproval,
            S::SteeringCheck,
            S::Stopped,
            S::Failed,
        ] {
            assert!(!chains(s), "{s:?}");
        }
    }

    #[test]
    fn a_redelivered_step_resumes_only_a_state_its_own_step_entered_inline() {
        assert_eq!(
            resumes(S::AssistantStreaming, S::AssistantStreaming),
            Some(S::AssistantStreaming)
        );
        assert_eq!(
            resumes(S::AssistantStreaming, S::FunctionExecute),
            Some(S::FunctionExecute)
        );
        // Provisioning goes on into the run's first turns in its step.
        assert_eq!(
            resumes(S::Provisioning, S::AssistantStreaming),
            Some(S::AssistantStreaming)
        );
        assert_eq!(
            resumes(S::Provisioning, S::FunctionExecute),
            Some(S::FunctionExecute)
        );
        for (expected, stored) in [
            // Queued steps of their own, or not entered from the delivered step.
            (S::AssistantStreaming, S::FunctionAwaitingApproval),
            (S::AssistantStreaming, S::Stopped),
            (S::FunctionExecute, S::AssistantStreaming),
            (S::Provisioning, S::FunctionAwaitingApproval),
            (S::FunctionAwaitingApproval, S::AssistantStreaming),
            (S::SteeringCheck, S::FunctionExecute),
            (S::Stopped, S::Stopped),
            (S::Failed, S::Failed),
        ] {
            assert_eq!(resumes(expected, stored), None, "{expected:?} → {stored:?}");
        }
    }

    #[test]
    fn outcomes_that_do_not_belong_to_a_state_are_refused() {
        for (from, outcome) in [
            (S::Provisioning, O::Idle),
            (S::AssistantStreaming, O::Parked),
            (S::FunctionExecute, O::Undecided),
            (S::FunctionAwaitingApproval, O::Provisioned),
            (S::SteeringCheck, O::Answered { calls: vec![] }),
            (S::Stopped, O::Provisioned),
            (S::Failed, O::Fatal("again".into())),
        ] {
            let e = transition(from, &outcome).unwrap_err();
            assert_eq!(e.from, from);
            assert!(e.to_string().contains("no transition from"), "{e}");
        }
    }
}
