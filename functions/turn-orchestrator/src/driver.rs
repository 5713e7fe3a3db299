//! The step driver: load the record, run the state's effects, decide the transition
//! ([`crate::fsm`]), apply it, save, and queue the next step. It sees the outside only
//! through [`crate::ports`] and a [`States`] runner, so it is tested without a bus.

use crate::fsm::{self, Effect, Outcome};
use crate::prelude::*;
use async_trait::async_trait;

/// Runs one state's effects on the record (saving as they must, at `version`).
#[async_trait]
pub trait States: Send + Sync {
    async fn run(
        &self,
        state: TurnState,
        rec: &mut Record,
        version: &mut u64,
    ) -> StepResult<Outcome>;
}

/// The states as the worker runs them, on the bus.
struct OnTheBus<'a> {
    ctx: &'a Ctx,
    hooks: &'a Hooks,
}

#[async_trait]
impl States for OnTheBus<'_> {
    async fn run(
        &self,
        state: TurnState,
        rec: &mut Record,
        version: &mut u64,
    ) -> StepResult<Outcome> {
        let (ctx, hooks) = (self.ctx, self.hooks);
        let req = match state {
            TurnState::AssistantStreaming => warm_turn(ctx, rec).await?,
            _ => run_request(ctx, rec).await?,
        };
        match state {
            TurnState::Provisioning => provisioning(ctx, rec, &req).await,
            TurnState::AssistantStreaming => assistant_streaming(ctx, rec, &req).await,
            TurnState::FunctionExecute => function_execute(ctx, hooks, rec, version, &req).await,
            TurnState::FunctionAwaitingApproval => {
                function_awaiting_approval(ctx, hooks, rec, version).await
            }
            TurnState::SteeringCheck => steering_check(ctx, rec).await,
            TurnState::Stopped | TurnState::Failed => Err(StepError::Stale),
        }
    }
}

/// `turn::<state>`: one queued step.
pub(crate) async fn step(
    ctx: &Ctx,
    hooks: &Hooks,
    expected: TurnState,
    data: &Value,
) -> Result<Value, ErrorBody> {
    // Everything this step writes (record, events, history, the next step) becomes durable
    // with the step's queue acknowledgement; only what must outlive a crash on its own (the
    // record after each executed call) is made durable before anything else runs (a chained
    // turn's, before its next call: `save_syncing_later`).
    let ctx = &ctx.with_baggage(DURABILITY_BAGGAGE, "deferred");
    let sid = req_str(data, "session_id")?;
    let chain = Chain::step(crate::history::settings().chain_budget);
    let mut out = drive(ctx, &OnTheBus { ctx, hooks }, expected, &sid, chain).await;
    if let Err(e) = &out
        && last_delivery(data)
    {
        // The queue dead-letters this message now: the run ends `failed` (the message is
        // still dead-lettered, so an operator sees it; redriving it finds a failed run).
        let _ = fail_after_retries(ctx, &sid, expected, e).await;
        out = Err(e.clone());
    }
    if let Some(m) = bus_telemetry::metrics::get() {
        let outcome = match &out {
            Ok(v) if v["skipped"] == true => "stale",
            Ok(v) if v["to_state"] == "failed" => "failed",
            Ok(_) => "ok",
            Err(_) => "error",
        };
        let state = serde_json::to_value(expected).unwrap_or(Value::Null);
        m.turn_step(state.as_str().unwrap_or("?"), outcome);
    }
    out
}

/// Whether the queue says this delivery is the message's last (`iii_delivery.last`, added by
/// the engine's queue consumer and the Lambda SQS runner).
fn last_delivery(data: &Value) -> bool {
    data.pointer("/iii_delivery/last").and_then(Value::as_bool) == Some(true)
}

/// A step that failed on its last delivery ends the run `failed`, with the reason, the UI's
/// `message_complete {stop_reason: "error"}` and `agent_end`, as an unexpected error does.
pub(crate) async fn fail_after_retries<P: Ports + ?Sized>(
    ports: &P,
    sid: &str,
    expected: TurnState,
    error: &ErrorBody,
) -> Result<Value, ErrorBody> {
    let (rec, _) = match RecordStore::load(ports, sid).await {
        Ok(Some(x)) => x,
        _ => return Ok(stale()),
    };
    if matches!(rec.state, TurnState::Stopped | TurnState::Failed) {
        return Ok(stale());
    }
    let state = serde_json::to_value(expected).unwrap_or(Value::Null);
    let message = format!(
        "the `{}` step failed on every retry; last error: {} ({})",
        state.as_str().unwrap_or("?"),
        error.message,
        error.code
    );
    let mut t = failure_of(rec.state, message);
    for effect in &mut t.effects {
        if let Effect::SetError { kind, .. } = effect {
            *kind = "retries_exhausted".into();
        }
    }
    tracing::warn!(session_id = %sid, error = %error.message, "a turn step failed on its last retry: the run ends failed");
    fail(ports, rec, expected, t.effects).await
}

fn stale() -> Value {
    json!({"ok": true, "skipped": true, "reason": "stale"})
}

fn invocation_error(e: StepError) -> Result<Value, ErrorBody> {
    match e {
        StepError::Stale => Ok(stale()),
        StepError::Transient(e) => Err(e),
        StepError::Fatal(m) => Err(ErrorBody::new("invocation_error", m)),
    }
}

/// How far one `assistant_streaming` (or `provisioning`) step goes on into the run's next
/// turns instead of queuing each of them: a turn that starts while the step is younger than
/// `budget` (and fewer than `max_turns` have started so) runs in the same step. Only fast turns chain (a
/// model that takes longer than the budget ends the step as before), so a step stays within
/// its queue's visibility timeout and a busy queue still goes round its sessions every
/// `budget`. Each chained turn is saved as a queued one is, so a crash mid-chain resumes from
/// the last saved turn: the redelivered step finds `assistant_streaming` or
/// `function_execute` ([`fsm::resumes`]). Its calls' results become durable beside the next
/// model call, before the next call runs ([`save_syncing_later`]).
#[derive(Debug, Clone, Copy)]
pub struct Chain {
    pub budget: Duration,
    pub max_turns: u32,
}

impl Chain {
    /// Every turn queued as its own step.
    #[cfg(test)]
    pub const NONE: Chain = Chain {
        budget: Duration::ZERO,
        max_turns: 0,
    };
    /// What a queued step does: a turn is a queue hop, a record load and an acknowledgement
    /// (a fifth of a fast tool call's cost) only when the step has run a while.
    #[cfg(test)]
    pub const STEP: Chain = Chain::step(crate::CHAIN_BUDGET);

    /// A queued step's chain with this instance's budget ([`crate::Settings::chain_budget`]).
    pub const fn step(budget: Duration) -> Chain {
        Chain {
            budget,
            max_turns: 64,
        }
    }
}

/// One step of session `sid` in state `expected`: a record in another state means the
/// delivery is stale (skipped), unless the state was entered inline by an earlier delivery
/// of this step that died ([`fsm::resumes`]): then that state runs. An `assistant_streaming`
/// step runs the next turns too while `chain` allows.
pub async fn drive<P, S>(
    ports: &P,
    states: &S,
    expected: TurnState,
    sid: &str,
    chain: Chain,
) -> Result<Value, ErrorBody>
where
    P: Ports + ?Sized,
    S: States + ?Sized,
{
    let pending = PendingSync::default();
    let pushes = PendingPush::default();
    let saving = PendingSave::default();
    let out = drive_turns(
        ports,
        states,
        expected,
        sid,
        chain,
        (&pending, &pushes, &saving),
    )
    .await;
    // However the step ends, not before the save and the pushes it left running are done (a
    // Lambda may be frozen once it answers) and the sync it started is done: its
    // acknowledgement is deferred, so that sync is what makes the last call's result
    // durable.
    let saved = saving.take().await;
    pushes.settle().await;
    match (saved, settle(&pending).await, out) {
        (Some(Err(e)), _, Ok(_)) | (_, Err(e), Ok(_)) => invocation_error(e),
        (_, _, out) => out,
    }
}

async fn drive_turns<P, S>(
    ports: &P,
    states: &S,
    expected: TurnState,
    sid: &str,
    chain: Chain,
    (pending, pushes, saving): (&PendingSync, &PendingPush, &PendingSave),
) -> Result<Value, ErrorBody>
where
    P: Ports + ?Sized,
    S: States + ?Sized,
{
    let (mut rec, mut version) = match RecordStore::load(ports, sid).await {
        Ok(Some(x)) => x,
        Ok(None) => return Ok(stale()),
        Err(e) => return invocation_error(e),
    };
    rec.pending_sync = pending.clone();
    rec.pending_push = pushes.clone();
    rec.pending_save = saving.clone();
    let Some(mut state) = fsm::resumes(expected, rec.state) else {
        return Ok(stale());
    };
    let loaded_version = version;
    let started = Instant::now();
    let mut chained = 0;
    loop {
        let outcome = match states.run(state, &mut rec, &mut version).await {
            Ok(o) => o,
            Err(StepError::Fatal(m)) => Outcome::Fatal(m),
            Err(StepError::Stale) => return Ok(stale()),
            Err(e) => {
                save_unsaved_call(ports, &mut rec, &mut version).await;
                return invocation_error(e);
            }
        };
        let t =
            fsm::transition(state, &outcome).unwrap_or_else(|e| failure_of(state, e.to_string()));
        if t.to == Some(TurnState::Failed) {
            return fail(ports, rec, expected, t.effects).await;
        }
        let Some(to) = t.to else {
            apply_all(ports, &mut rec, &mut version, t.effects, None).await?;
            return Ok(json!({"ok": true, "from_state": expected, "to_state": state}));
        };
        rec.state = to;
        // Only a step whose redelivery resumes whatever turn the chain had saved chains
        // ([`fsm::chains`]: assistant_streaming and provisioning; an approval's step would
        // skip it as stale).
        let next = if fsm::chains(expected)
            && to == TurnState::AssistantStreaming
            && chained < chain.max_turns
            && started.elapsed() < chain.budget
        {
            chained += 1;
            Next::InThisStep
        } else {
            Next::Queued(format!("{sid}-{to:?}-{loaded_version}"))
        };
        let applied = apply_all(ports, &mut rec, &mut version, t.effects, Some(next)).await;
        if applied.is_err() {
            save_unsaved_call(ports, &mut rec, &mut version).await;
        }
        match applied? {
            Flow::Done => {
                return Ok(json!({"ok": true, "from_state": expected, "to_state": to}));
            }
            Flow::Stale => return Ok(stale()),
            Flow::Continue => state = to,
        }
    }
}

fn failure_of(state: TurnState, message: String) -> fsm::Transition {
    fsm::transition(state, &Outcome::Fatal(message)).expect("a running state can always fail")
}

enum Flow {
    Done,
    Stale,
    Continue,
}

/// Where the next state runs, when the transition queues it.
enum Next {
    /// As its own step, with this deduplication id.
    Queued(String),
    /// In this step ([`Chain`]).
    InThisStep,
}

/// Apply a transition's effects in order (`None`: the transition stays in its state).
async fn apply_all<P: Ports + ?Sized>(
    ports: &P,
    rec: &mut Record,
    version: &mut u64,
    effects: Vec<Effect>,
    next: Option<Next>,
) -> Result<Flow, ErrorBody> {
    for effect in effects {
        match effect {
            Effect::Save { durable } => {
                // A turn that goes on in this step syncs its calls' results beside the next
                // model call rather than before it.
                let saved = if !durable && matches!(next, Some(Next::InThisStep)) {
                    save_syncing_later(ports, rec, version).await
                } else {
                    save(ports, rec, version, durable).await
                };
                if let Err(e) = saved {
                    return match invocation_error(e) {
                        Ok(_) => Ok(Flow::Stale),
                        Err(e) => Err(e),
                    };
                }
            }
            Effect::Enqueue => {
                let dedup = match &next {
                    Some(Next::InThisStep) => return Ok(Flow::Continue),
                    Some(Next::Queued(dedup)) => dedup.clone(),
                    None => String::new(),
                };
                // Entering function_awaiting_approval also queues one check: a decision
                // written before this transition found no parked session to wake.
                if let Err(StepError::Transient(e)) =
                    StepQueue::enqueue(ports, &rec.session_id, rec.state, dedup).await
                {
                    return Err(e);
                }
            }
            Effect::ContinueInline => return Ok(Flow::Continue),
            other => apply(ports, rec, other).await,
        }
    }
    Ok(Flow::Done)
}

/// The effects on the record and its events.
async fn apply<P: Ports + ?Sized>(ports: &P, rec: &mut Record, effect: Effect) {
    match effect {
        Effect::SetError { kind, message } => rec.error = Some(TurnError { kind, message }),
        Effect::PrepareBatch(calls) => {
            rec.work = Some(Work {
                prepared: calls,
                executed: Default::default(),
            });
            rec.awaiting_approval = None;
        }
        Effect::CloseBatch(results) => {
            rec.work = None;
            rec.function_results = results;
            rec.awaiting_approval = None;
        }
        Effect::EmitTurnEnd(results) => emit_turn_end(rec, results),
        Effect::EmitFailure(message) => {
            let failed = AgentMessage::Assistant {
                content: Vec::new(),
                stop_reason: StopReason::Error,
                error_message: Some(message),
                error_kind: Some(ErrorKind::Permanent),
                usage: None,
                model: String::new(),
                provider: String::new(),
                timestamp: now(),
            };
            emit(rec, "message_complete", json!({"message": failed}));
        }
        Effect::EmitAgentEnd => {
            // The run is over, whatever the path: its sandbox goes (best effort: the tools
            // worker may not run; its directory stays for the retention period), beside the
            // read of the history the event carries.
            let release = ports.call(
                "shell::release",
                json!({"session_id": rec.session_id}),
                BEST_EFFORT_TIMEOUT,
            );
            let (messages, _) = tokio::join!(history_for_event(ports, rec), release);
            emit(rec, "agent_end", json!({"messages": messages}));
        }
        Effect::EmitStateChanged => {
            // Goes out with the step's other events, in the write just before the save: a
            // delivery that loses the save to another delivery of the same step wrote the
            // same items (same loaded record, same seqs).
            let changed = state_changed(rec, "state:updated");
            emit(rec, "turn_state_changed", changed);
        }
        Effect::FlushEvents => flush_events(ports, rec).await,
        Effect::Save { .. } | Effect::Enqueue | Effect::ContinueInline => {}
    }
}

/// Unexpected: the run fails with events the UI can show, and the message is acknowledged.
/// What the step emitted before it failed is shown too; the failure is applied to the
/// record as stored (not to what the step had changed in memory).
async fn fail<P: Ports + ?Sized>(
    ports: &P,
    mut rec: Record,
    expected: TurnState,
    effects: Vec<Effect>,
) -> Result<Value, ErrorBody> {
    let message = effects
        .iter()
        .find_map(|e| match e {
            Effect::EmitFailure(m) => Some(m.clone()),
            _ => None,
        })
        .unwrap_or_default();
    flush_events(ports, &mut rec).await;
    let (mut rec, mut version) = match RecordStore::load(ports, &rec.session_id).await {
        Ok(Some(x)) => x,
        _ => return Ok(json!({"ok": false, "error": message})),
    };
    rec.state = TurnState::Failed;
    for effect in effects {
        match effect {
            Effect::Save { durable } => {
                let _ = save(ports, &mut rec, &mut version, durable).await;
            }
            other => apply(ports, &mut rec, other).await,
        }
    }
    Ok(json!({"ok": false, "from_state": expected, "to_state": "failed", "error": message}))
}

#[cfg(test)]
mod tests {
    //! The driver on the in-memory ports, with scripted state outcomes: what it saves,
    //! emits and queues for each kind of transition.
    use super::*;
    use crate::ports::Memory;
    use std::sync::Mutex;

    /// Answers each run of a state with the next scripted outcome (or error), and notes
    /// which states ran.
    #[derive(Default)]
    struct Scripted(Mutex<Vec<StepResult<Outcome>>>, Mutex<Vec<TurnState>>);

    impl Scripted {
        fn new(script: Vec<StepResult<Outcome>>) -> Self {
            Scripted(Mutex::new(script), Mutex::default())
        }
    }

    #[async_trait]
    impl States for Scripted {
        async fn run(&self, state: TurnState, _: &mut Record, _: &mut u64) -> StepResult<Outcome> {
            self.1.lock().unwrap().push(state);
            self.0.lock().unwrap().remove(0)
        }
    }

    fn record(state: TurnState) -> Record {
        let mut rec: Record = serde_json::from_value(json!({
            "session_id": "s1", "state": "provisioning", "turn_count": 1,
            "started_at_ms": 1, "updated_at_ms": 1, "run_key": "r1"
        }))
        .expect("a minimal record");
        rec.state = state;
        rec
    }

    /// In-memory ports holding session `s1`'s record at a version.
    fn ports_with(stored: (Record, u64)) -> Memory {
        let ports = Memory::default();
        ports.records.lock().unwrap().insert("s1".into(), stored);
        ports
    }

    async fn run(state: TurnState, script: Vec<StepResult<Outcome>>) -> (Memory, Value) {
        let ports = ports_with((record(state), 7));
        let out = drive(&ports, &Scripted::new(script), state, "s1", Chain::NONE)
            .await
            .expect("the step answers");
        (ports, out)
    }

    fn saved(m: &Memory) -> (Record, u64) {
        m.records.lock().unwrap()["s1"].clone()
    }

    fn event_types(m: &Memory) -> Vec<String> {
        m.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.0 == EVENTS)
            .map(|e| e.3["type"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn call() -> Call {
        Call {
            function_call_id: "c1".into(),
            function_id: "fs::list".into(),
            args: json!({}),
        }
    }

    #[tokio::test]
    async fn a_move_saves_the_new_state_emits_it_and_queues_its_step_once() {
        let (m, out) = run(TurnState::Provisioning, vec![Ok(Outcome::Provisioned)]).await;
        assert_eq!(out["to_state"], "assistant_streaming", "{out}");
        let (rec, version) = saved(&m);
        assert_eq!((rec.state, version), (TurnState::AssistantStreaming, 8));
        assert_eq!(event_types(&m), ["turn_state_changed"]);
        assert_eq!(
            *m.queued.lock().unwrap(),
            [(
                "s1".to_string(),
                TurnState::AssistantStreaming,
                "s1-AssistantStreaming-7".to_string()
            )]
        );
        assert!(m.durable_saves.lock().unwrap().is_empty(), "deferred");
    }

    #[tokio::test]
    async fn the_models_calls_run_in_the_same_step() {
        let script = Scripted::new(vec![
            Ok(Outcome::Answered {
                calls: vec![call()],
            }),
            Ok(Outcome::Parked),
        ]);
        let ports = ports_with((record(TurnState::AssistantStreaming), 7));
        let out = drive(
            &ports,
            &script,
            TurnState::AssistantStreaming,
            "s1",
            Chain::NONE,
        )
        .await
        .expect("the step answers");
        assert_eq!(out["to_state"], "function_awaiting_approval", "{out}");
        assert_eq!(
            *script.1.lock().unwrap(),
            [TurnState::AssistantStreaming, TurnState::FunctionExecute],
            "function_execute ran in the step that got the calls"
        );
        let (rec, version) = saved(&ports);
        assert_eq!(rec.state, TurnState::FunctionAwaitingApproval);
        // One save by the driver, the parked batch: no write between the model's answer and
        // function_execute, which saves the batch itself before anything comes of it (a call
        // run, decided or parked; scripted away here).
        assert_eq!(version, 8, "saved once, parked");
        assert_eq!(rec.work.unwrap().prepared, vec![call()]);
        assert_eq!(
            event_types(&ports),
            ["turn_state_changed", "turn_state_changed"]
        );
        // No step of function_execute's own: only the parked run's wake-up check.
        let queued = ports.queued.lock().unwrap().clone();
        assert_eq!(queued.len(), 1, "{queued:?}");
        assert_eq!(queued[0].1, TurnState::FunctionAwaitingApproval);
    }

    /// One turn with a call: the model answers, the batch runs, steering finds results.
    fn a_turn() -> Vec<StepResult<Outcome>> {
        vec![
            Ok(Outcome::Answered {
                calls: vec![call()],
            }),
            Ok(Outcome::BatchDone {
                results: vec![],
                terminated: false,
            }),
            Ok(Outcome::ResultsPending),
        ]
    }

    /// Runs the scripted outcomes as [`Scripted`] does, and a `function_execute` as the real
    /// one does around its calls: it waits for the save and the sync left running
    /// ([`settle_before_a_call`], as every call does first) and leaves its last call's record
    /// to the next save. Notes each state with the syncs finished when it ran.
    struct Calling<'a> {
        script: Mutex<Vec<StepResult<Outcome>>>,
        synced: &'a std::sync::atomic::AtomicUsize,
        ran: Mutex<Vec<(TurnState, usize)>>,
    }

    impl<'a> Calling<'a> {
        /// `script` run on `ports`.
        fn on(ports: &'a Memory, script: Vec<StepResult<Outcome>>) -> Self {
            Calling {
                script: Mutex::new(script),
                synced: &ports.synced,
                ran: Mutex::default(),
            }
        }
    }

    /// Two turns with a call each.
    fn two_turns() -> Vec<StepResult<Outcome>> {
        a_turn().into_iter().chain(a_turn()).collect()
    }

    #[async_trait]
    impl States for Calling<'_> {
        async fn run(
            &self,
            state: TurnState,
            rec: &mut Record,
            version: &mut u64,
        ) -> StepResult<Outcome> {
            if state == TurnState::FunctionExecute {
                settle_before_a_call(rec, version).await?;
                rec.unsaved_call = Some(Box::new(rec.clone()));
            }
            let synced = self.synced.load(std::sync::atomic::Ordering::SeqCst);
            self.ran.lock().unwrap().push((state, synced));
            self.script.lock().unwrap().remove(0)
        }
    }

    /// A turn that goes on in the step saves its calls' results without waiting for the
    /// disk: their sync runs beside the next model call, the next call waits for it, and the
    /// step ends only once the last one is done. A turn that is queued instead saves them
    /// durably, as before.
    #[tokio::test]
    async fn a_chained_turn_syncs_beside_the_next_model_call_and_before_the_next_call() {
        use TurnState::{AssistantStreaming as AS, FunctionExecute as FE, SteeringCheck as SC};
        let ports = ports_with((record(AS), 7));
        let states = Calling::on(&ports, two_turns());
        let chain = Chain {
            budget: Duration::from_secs(60),
            max_turns: 1,
        };
        drive(&ports, &states, AS, "s1", chain).await.unwrap();
        assert_eq!(
            *states.ran.lock().unwrap(),
            [(AS, 0), (FE, 0), (SC, 0), (AS, 0), (FE, 1), (SC, 1)],
            "the second model call ran while the first turn's sync did; its call after it"
        );
        assert_eq!(*ports.syncs_started.lock().unwrap(), 1);
        // The turn past the chain is queued: its results saved durably before the step ends.
        assert_eq!(
            *ports.durable_saves.lock().unwrap(),
            [("s1".to_string(), AS)]
        );

        // A run that ends in the chained turn (no more calls) ends the step only after the
        // sync of the turn before it.
        let ports = ports_with((record(AS), 7));
        let mut script = a_turn();
        script.extend([Ok(Outcome::Answered { calls: vec![] }), Ok(Outcome::Idle)]);
        let states = Calling::on(&ports, script);
        let out = drive(&ports, &states, AS, "s1", Chain::STEP).await.unwrap();
        assert_eq!(out["to_state"], "stopped", "{out}");
        assert_eq!(*ports.syncs_started.lock().unwrap(), 1);
        assert_eq!(ports.synced.load(std::sync::atomic::Ordering::SeqCst), 1);

        // A sync that fails stops the step before the next call: nothing runs on a result
        // the store could not keep, and the step answers an error (its redelivery finds the
        // record as the store has it).
        let ports = ports_with((record(AS), 7));
        ports
            .sync_fails
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let states = Calling::on(&ports, two_turns());
        let err = drive(&ports, &states, AS, "s1", Chain::STEP)
            .await
            .expect_err("the step fails");
        assert!(err.message.contains("could not be made durable"), "{err:?}");
        assert_eq!(
            states.ran.lock().unwrap().last(),
            Some(&(AS, 0)),
            "no call after the failed sync"
        );
    }

    /// Two chained turns as [`Calling`] runs them, watched on `ports`.
    fn watching(ports: &Memory) -> Watching<'_> {
        Watching {
            calling: Calling::on(ports, two_turns()),
            stored: ports,
            versions: Mutex::default(),
        }
    }

    /// Runs as [`Calling`] does, and notes the stored record's version at each state.
    struct Watching<'a> {
        calling: Calling<'a>,
        stored: &'a Memory,
        versions: Mutex<Vec<(TurnState, u64)>>,
    }

    #[async_trait]
    impl States for Watching<'_> {
        async fn run(
            &self,
            state: TurnState,
            rec: &mut Record,
            version: &mut u64,
        ) -> StepResult<Outcome> {
            let out = self.calling.run(state, rec, version).await;
            // After `Calling`'s settle: where a call would run.
            let stored = saved(self.stored).1;
            self.versions.lock().unwrap().push((state, stored));
            out
        }
    }

    /// On a store that saves in a task of its own (the bus), a chained turn's save runs
    /// beside the next model call: the next model call starts before it is written, and the
    /// call after it only once it is. A conflict ends the step as stale before the next
    /// call; a failed save ends it with the error, and the record after the last call is then
    /// saved durably instead, as a failed save in line does.
    #[tokio::test]
    async fn a_chained_turns_save_beside_the_next_model_call_is_settled_before_the_next_call() {
        use TurnState::{AssistantStreaming as AS, FunctionExecute as FE, SteeringCheck as SC};
        let chained = Chain {
            budget: Duration::from_secs(60),
            max_turns: 1,
        };
        let in_background = || {
            let ports = ports_with((record(AS), 7));
            ports
                .saves_in_background
                .store(true, std::sync::atomic::Ordering::SeqCst);
            ports
        };
        let ports = in_background();
        let states = watching(&ports);
        let out = drive(&ports, &states, AS, "s1", chained).await.unwrap();
        assert_eq!(out["to_state"], "assistant_streaming", "{out}");
        assert_eq!(
            *states.versions.lock().unwrap(),
            [(AS, 7), (FE, 7), (SC, 7), (AS, 7), (FE, 8), (SC, 8)],
            "the second model call ran before the first turn's save was written, its call after"
        );
        // The turn past the chain is saved in line (durably), after the one left running.
        assert_eq!(saved(&ports).1, 9);
        assert_eq!(
            *ports.durable_saves.lock().unwrap(),
            [("s1".to_string(), AS)]
        );

        // Another delivery moved on meanwhile: the step ends stale, before the next call.
        let ports = in_background();
        *ports.background_save_fails.lock().unwrap() = Some(StepError::Stale);
        let states = watching(&ports);
        let out = drive(&ports, &states, AS, "s1", chained).await.unwrap();
        assert_eq!(out["skipped"], true, "{out}");
        assert_eq!(
            states.calling.ran.lock().unwrap().last().map(|r| r.0),
            Some(AS),
            "no call after the conflict"
        );

        // The store failed: the step answers the error, and the record after the last call
        // is saved durably in its place (no redelivery runs that call again).
        let ports = in_background();
        *ports.background_save_fails.lock().unwrap() = Some(StepError::Transient(ErrorBody::new(
            "storage",
            "the table is throttled",
        )));
        let states = watching(&ports);
        let err = drive(&ports, &states, AS, "s1", chained)
            .await
            .expect_err("the step fails");
        assert!(err.message.contains("throttled"), "{err:?}");
        assert_eq!(
            states.calling.ran.lock().unwrap().last().map(|r| r.0),
            Some(AS),
            "no call after the failed save"
        );
        assert_eq!(
            *ports.durable_saves.lock().unwrap(),
            [("s1".to_string(), FE)],
            "the record just after the call, saved durably"
        );
    }

    #[tokio::test]
    async fn fast_turns_run_in_the_step_until_its_chain_ends() {
        use TurnState::{AssistantStreaming as AS, FunctionExecute as FE, SteeringCheck as SC};
        let chain = Chain {
            budget: Duration::from_secs(60),
            max_turns: 1,
        };
        let script = Scripted::new(a_turn().into_iter().chain(a_turn()).collect());
        let ports = ports_with((record(AS), 7));
        let out = drive(&ports, &script, AS, "s1", chain).await.unwrap();
        assert_eq!(out["to_state"], "assistant_streaming", "{out}");
        assert_eq!(*script.1.lock().unwrap(), [AS, FE, SC, AS, FE, SC]);
        // Each turn saved as a queued one is; only the turn past the chain is queued, under
        // the step's own deduplication id.
        assert_eq!(saved(&ports).1, 9);
        assert_eq!(
            *ports.queued.lock().unwrap(),
            [("s1".to_string(), AS, "s1-AssistantStreaming-7".to_string())]
        );
        // A spent budget chains nothing.
        let chain = Chain {
            budget: Duration::ZERO,
            max_turns: 64,
        };
        let script = Scripted::new(a_turn());
        let out = drive(&ports, &script, AS, "s1", chain).await.unwrap();
        assert_eq!(out["to_state"], "assistant_streaming", "{out}");
        assert_eq!(*script.1.lock().unwrap(), [AS, FE, SC]);
        assert_eq!(ports.queued.lock().unwrap().len(), 2);
        // A provisioning step goes on into the run's first turns (its redelivery resumes the
        // turn it saved, `fsm::resumes`); the turn past the chain is queued.
        let chain = Chain {
            budget: Duration::from_secs(60),
            max_turns: 1,
        };
        let ports = ports_with((record(TurnState::Provisioning), 3));
        let script = Scripted::new(
            std::iter::once(Ok(Outcome::Provisioned))
                .chain(a_turn())
                .collect(),
        );
        drive(&ports, &script, TurnState::Provisioning, "s1", chain)
            .await
            .unwrap();
        assert_eq!(
            *script.1.lock().unwrap(),
            [TurnState::Provisioning, AS, FE, SC]
        );
        assert_eq!(
            *ports.queued.lock().unwrap(),
            [("s1".to_string(), AS, "s1-AssistantStreaming-3".to_string())]
        );
        // With its budget spent it queues the first turn, as before.
        let ports = ports_with((record(TurnState::Provisioning), 3));
        let script = Scripted::new(vec![Ok(Outcome::Provisioned)]);
        let spent = Chain {
            budget: Duration::ZERO,
            max_turns: 64,
        };
        drive(&ports, &script, TurnState::Provisioning, "s1", spent)
            .await
            .unwrap();
        assert_eq!(*script.1.lock().unwrap(), [TurnState::Provisioning]);
        assert_eq!(ports.queued.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_redelivered_step_resumes_the_batch_its_first_delivery_saved() {
        // The first delivery of assistant_streaming saved function_execute and died running
        // the calls: the redelivery runs the batch (not the model again).
        let script = Scripted::new(vec![Ok(Outcome::Parked)]);
        let ports = ports_with((record(TurnState::FunctionExecute), 8));
        let out = drive(
            &ports,
            &script,
            TurnState::AssistantStreaming,
            "s1",
            Chain::NONE,
        )
        .await
        .expect("the step answers");
        assert_eq!(out["to_state"], "function_awaiting_approval", "{out}");
        assert_eq!(*script.1.lock().unwrap(), [TurnState::FunctionExecute]);
        // Any other state found is stale.
        let script = Scripted::new(vec![]);
        ports
            .records
            .lock()
            .unwrap()
            .insert("s1".into(), (record(TurnState::SteeringCheck), 9));
        let out = drive(
            &ports,
            &script,
            TurnState::AssistantStreaming,
            "s1",
            Chain::NONE,
        )
        .await
        .unwrap();
        assert_eq!(out["reason"], "stale", "{out}");
        assert!(script.1.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_answer_without_calls_runs_steering_in_the_same_step_and_stops() {
        let (m, out) = run(
            TurnState::AssistantStreaming,
            vec![Ok(Outcome::Answered { calls: vec![] }), Ok(Outcome::Idle)],
        )
        .await;
        assert_eq!(out["to_state"], "stopped", "{out}");
        assert_eq!(saved(&m).0.state, TurnState::Stopped);
        assert_eq!(
            event_types(&m),
            [
                "turn_end",
                "turn_state_changed",
                "agent_end",
                "turn_state_changed"
            ]
        );
        assert!(m.queued.lock().unwrap().is_empty(), "nothing after the end");
        assert_eq!(
            *m.durable_saves.lock().unwrap(),
            [("s1".to_string(), TurnState::Stopped)]
        );
        // turn_end also went to its own stream.
        assert!(
            m.events
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.0 == TURN_END_STREAM)
        );
    }

    #[tokio::test]
    async fn waiting_for_a_decision_saves_nothing_and_parking_is_durable() {
        let (m, out) = run(
            TurnState::FunctionAwaitingApproval,
            vec![Ok(Outcome::Undecided)],
        )
        .await;
        assert_eq!(out["to_state"], "function_awaiting_approval");
        assert_eq!(saved(&m).1, 7, "not saved");
        let (m, _) = run(TurnState::FunctionExecute, vec![Ok(Outcome::Parked)]).await;
        assert_eq!(
            *m.durable_saves.lock().unwrap(),
            [("s1".to_string(), TurnState::FunctionAwaitingApproval)]
        );
        assert_eq!(m.queued.lock().unwrap().len(), 1, "one wake-up check");
    }

    #[tokio::test]
    async fn the_unexpected_fails_the_run_from_the_stored_record() {
        let (m, out) = run(
            TurnState::Provisioning,
            vec![Err(StepError::Fatal("unreadable run request".into()))],
        )
        .await;
        assert_eq!(out["to_state"], "failed", "{out}");
        let (rec, _) = saved(&m);
        assert_eq!(rec.state, TurnState::Failed);
        let error = rec.error.unwrap();
        assert_eq!(
            (error.kind.as_str(), error.message.as_str()),
            ("transition_error", "unreadable run request")
        );
        assert_eq!(event_types(&m), ["message_complete", "agent_end"]);
        // An outcome that does not belong to the state fails it the same way.
        let (m, out) = run(TurnState::SteeringCheck, vec![Ok(Outcome::Parked)]).await;
        assert_eq!(out["to_state"], "failed");
        assert!(
            saved(&m)
                .0
                .error
                .unwrap()
                .message
                .contains("no transition from SteeringCheck on Parked")
        );
    }

    #[tokio::test]
    async fn stale_deliveries_and_transient_errors() {
        // The record is in another state: skipped, nothing written.
        let ports = ports_with((record(TurnState::Stopped), 3));
        let out = drive(
            &ports,
            &Scripted::new(vec![]),
            TurnState::Provisioning,
            "s1",
            Chain::NONE,
        )
        .await
        .unwrap();
        assert_eq!(out["reason"], "stale");
        // A transient error goes back to the queue (retried), the record untouched.
        let ports = ports_with((record(TurnState::Provisioning), 3));
        let err = drive(
            &ports,
            &Scripted::new(vec![Err(StepError::Transient(ErrorBody::new(
                "timeout", "slow",
            )))]),
            TurnState::Provisioning,
            "s1",
            Chain::NONE,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, "timeout");
        assert_eq!(saved(&ports).1, 3);
    }
}
