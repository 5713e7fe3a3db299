//! The durable turn state machine (SPEC §3 turn-orchestrator).
//!
//! A run is a record at `agent/session/<sid>/turn_state`; each state is a step function
//! `turn::<state> {session_id}` consumed from the `turn-steps` FIFO queue (grouped by session).
//! A step loads the record, does its work, and saves with the version it loaded (a conflict
//! or a state that moved on means the delivery was stale: skipped). The conversation lives in
//! the record, so appends commit with the transition; every executed call is saved before the
//! next one, so a redelivered step never runs a call twice, and the target gets
//! `function_call_id` to make its own effect idempotent.

mod api;
mod carried;
mod driver;
pub mod fsm;
mod history;
pub mod hooks;
pub mod ports;
pub mod prompt;
mod record;
mod states;
pub mod types;

pub use history::InstanceCache;

use api::{get_state, on_approval, run_abort, run_start};
use driver::step;
use harness_sdk::{DefExt, RegisterFunction, Worker};
use history::CACHE;
use hooks::Hooks;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use types::*;

/// What every module of the orchestrator uses.
mod prelude {
    pub(crate) use crate::fsm::Outcome;
    pub(crate) use crate::history::*;
    pub(crate) use crate::hooks::{self, Hooks};
    pub(crate) use crate::ports::*;
    pub(crate) use crate::prompt;
    pub(crate) use crate::record::*;
    pub(crate) use crate::states::{
        approval::*, calls::*, execute::*, provisioning::*, steering::*, streaming::*,
    };
    pub(crate) use crate::types::*;
    pub(crate) use crate::{
        BEST_EFFORT_TIMEOUT, CALL_TIMEOUT, COMPACTION_TIMEOUT, POLICY_TIMEOUT, PROVIDER_TIMEOUT,
    };
    pub(crate) use bus::builtins::req_str;
    pub(crate) use bus::state::DURABILITY_BAGGAGE;
    pub(crate) use futures_util::FutureExt;
    pub(crate) use harness_sdk::contracts::{
        self, approval, budget, compaction, inbox, policy, session_tree,
    };
    pub(crate) use harness_sdk::messages::{
        AgentMessage, AssistantMessageEvent, ContentBlock, ErrorKind, StopReason, args_hash,
    };
    pub(crate) use harness_sdk::{BusError, ChannelFrame, Ctx, EnqueueOptions, ErrorBody};
    pub(crate) use serde_json::{Value, json};
    pub(crate) use std::sync::Arc;
    pub(crate) use std::time::{Duration, Instant};
}

pub const POLICY_TIMEOUT: Duration = Duration::from_secs(5);

pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(300);

pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

pub const BEST_EFFORT_TIMEOUT: Duration = Duration::from_secs(5);

pub const COMPACTION_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a read (the policy's `read_only`) runs before its start is saved, and so shown: a
/// read that ends sooner is saved once, with its end (`states::calls::dispatch_with`).
pub const READ_START_SHOWN_AFTER: Duration = Duration::from_millis(100);

/// How long one queued `assistant_streaming` step goes on into the run's next turns before it
/// queues the next one (`driver::Chain`): the default of one process, where a queue hop is
/// cheap. `HARNESS_CHAIN_BUDGET_MS` sets another (the deployed template: 1 s, where a hop is an
/// SQS send, receive and delete, an invocation and the record's read).
pub const CHAIN_BUDGET: Duration = Duration::from_millis(100);

/// The longest chain budget `HARNESS_CHAIN_BUDGET_MS` may ask for: a busy step queue still
/// goes round its sessions at least this often (plus one turn).
pub const MAX_CHAIN_BUDGET: Duration = Duration::from_secs(10);

/// The chain budget `HARNESS_CHAIN_BUDGET_MS` asks for (`None`: not set): whole milliseconds,
/// at most [`MAX_CHAIN_BUDGET`]; anything else is refused with what is wrong.
pub fn chain_budget_from(value: Option<&str>) -> Result<Duration, String> {
    let Some(v) = value else {
        return Ok(CHAIN_BUDGET);
    };
    let ms: u64 = v.trim().parse().map_err(|_| {
        format!("HARNESS_CHAIN_BUDGET_MS must be a whole number of milliseconds, not {v:?}")
    })?;
    let budget = Duration::from_millis(ms);
    if budget > MAX_CHAIN_BUDGET {
        return Err(format!(
            "HARNESS_CHAIN_BUDGET_MS is {ms}, over the most a step may chain turns for ({} ms)",
            MAX_CHAIN_BUDGET.as_millis()
        ));
    }
    Ok(budget)
}

/// Tokens kept free when the model's window is large (SPEC: reserved 20 000); at most half of
/// a small window.
pub const RESERVED_TOKENS: u64 = 20_000;

fn def(id: &str, description: &str) -> RegisterFunction {
    let mut d = RegisterFunction::new(id);
    d.description = Some(description.to_string());
    d
}

/// First retry delay of a failed step; each next one doubles (SPEC's exponential backoff).
pub const STEP_BACKOFF_MS: u64 = bus::queue::DEFAULT_BACKOFF_MS;

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
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Tokens kept free below the model's window before a pre-flight compaction.
    pub reserved_tokens: u64,
    pub before_call_timeout_ms: u64,
    pub after_call_timeout_ms: u64,
    /// How long a read runs before its start is saved and shown
    /// ([`READ_START_SHOWN_AFTER`] by default).
    pub read_start_shown_after: Duration,
    /// How long a step chains the run's next turns ([`CHAIN_BUDGET`] by default).
    pub chain_budget: Duration,
}

impl Settings {
    /// The defaults, with what the process's environment sets (`HARNESS_CHAIN_BUDGET_MS`; a
    /// value it refuses is logged and the default kept, so a typo does not stop the worker).
    pub fn from_env() -> Self {
        let var = std::env::var("HARNESS_CHAIN_BUDGET_MS").ok();
        let chain_budget = chain_budget_from(var.as_deref()).unwrap_or_else(|why| {
            tracing::warn!(%why, default_ms = CHAIN_BUDGET.as_millis() as u64, "chain budget refused; using the default");
            CHAIN_BUDGET
        });
        Self {
            chain_budget,
            ..Self::default()
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            reserved_tokens: RESERVED_TOKENS,
            before_call_timeout_ms: hooks::BEFORE_TIMEOUT_MS,
            after_call_timeout_ms: hooks::AFTER_TIMEOUT_MS,
            read_start_shown_after: READ_START_SHOWN_AFTER,
            chain_budget: CHAIN_BUDGET,
        }
    }
}

pub fn worker() -> Worker {
    worker_with(Settings::from_env())
}

pub fn worker_with(settings: Settings) -> Worker {
    let hooks = Arc::new(Hooks::new(
        settings.before_call_timeout_ms,
        settings.after_call_timeout_ms,
    ));
    let cache = Arc::new(InstanceCache::new(settings));
    let mut w = Worker::new("turn-orchestrator");
    w.register_function(
        def("run::start", "Start (or resume) a run: {session_id, provider, model, messages?, mode?, max_turns?, system_prompt?, system_default_skills?}.")
        .not_for_the_agent()
            .contract::<RunRequest, RunStartAnswer>(),
        run_start,
    );
    w.register_function(
        def("run::abort", "Stop a run now: {session_id}.")
            .not_for_the_agent()
            .public()
            .contract::<SessionRequest, RunAbortAnswer>(),
        run_abort,
    );
    w.register_function(
        def(
            "turn::get_state",
            "The TurnStateView of a session, or null.",
        )
        .public()
        .contract::<SessionRequest, Option<TurnStateView>>(),
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
            def(&state.step_function(), "A turn step (queue consumer).").not_for_the_agent(),
            {
                let hooks = hooks.clone();
                let cache = cache.clone();
                move |ctx, data: Value| {
                    let hooks = hooks.clone();
                    let cache = cache.clone();
                    CACHE.scope(cache.clone(), async move {
                        let out = step(&ctx, &hooks, state, &data).await;
                        if let Ok(answer) = &out
                            && matches!(answer["to_state"].as_str(), Some("stopped" | "failed"))
                            && let Some(sid) = data["session_id"].as_str()
                        {
                            cache.forget(sid);
                        }
                        out
                    })
                }
            },
        );
    }
    w.register_function(
        def(
            "turn::on_approval",
            "State trigger on approvals: wakes the parked session.",
        )
        .not_for_the_agent(),
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

#[cfg(test)]
mod chain_budget_tests {
    use super::*;

    #[test]
    fn a_chain_budget_is_whole_milliseconds_within_the_bound() {
        assert_eq!(chain_budget_from(None), Ok(CHAIN_BUDGET));
        assert_eq!(chain_budget_from(Some("1000")), Ok(Duration::from_secs(1)));
        assert_eq!(chain_budget_from(Some(" 0 ")), Ok(Duration::ZERO));
        assert_eq!(chain_budget_from(Some("10000")), Ok(MAX_CHAIN_BUDGET));
        for (bad, says) in [
            ("10001", "over the most"),
            ("1.5", "whole number"),
            ("-1", "whole number"),
            ("", "whole number"),
            ("1s", "whole number"),
            ("99999999999999999999999", "whole number"),
        ] {
            let why = chain_budget_from(Some(bad)).unwrap_err();
            assert!(
                why.contains(says) && why.contains("HARNESS_CHAIN_BUDGET_MS"),
                "{bad:?}: {why}"
            );
        }
    }
}
