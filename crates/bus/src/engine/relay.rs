//! Relayed calls: a connection's synchronous call to a function another connection serves.
//! The engine forwards it and answers the caller from the callee's result, with no task
//! waiting in between: a task per call (spawned, woken by a oneshot, with its own timer) was
//! the largest share of the engine's own CPU per call. The call's span, deadline and caller
//! travel in its pending entry; one sweeper task answers the calls whose deadline passed.

use super::invoke::reply;
use super::*;
use std::collections::BTreeMap;
use tokio::time::Instant;

/// How a pending call is answered.
pub(super) enum Reply {
    /// A task waits for it (in-process callers, void calls, everything but a relay).
    Waiter(oneshot::Sender<HandlerResult>),
    /// Answered straight to the connection that made it.
    Relay(Box<Relay>),
}

pub(super) struct Relay {
    outbox: Outbox,
    /// The caller's id for its call (the engine's own id keys the pending entry).
    invocation_id: String,
    function_id: String,
    span: Span,
    deadline: (Instant, u64),
    timeout: Duration,
}

/// The deadlines of relayed calls, earliest first, and the sweeper's wake-up.
#[derive(Default)]
pub(super) struct RelayTimers {
    deadlines: Mutex<Deadlines>,
    earlier: tokio::sync::Notify,
}

#[derive(Default)]
struct Deadlines {
    by_time: BTreeMap<(Instant, u64), String>,
    /// When the sweeper wakes next on its own (`None`: only when told). A deadline at or
    /// after it needs no wake-up: calls come with ever later deadlines, and telling the
    /// sweeper of each (a task woken, a timer set) was a cost on every lone call.
    armed: Option<Instant>,
}

impl RelayTimers {
    fn add(&self, key: (Instant, u64), pending_id: String) {
        let mut d = lock(&self.deadlines);
        let sooner = d.armed.is_none_or(|at| key.0 < at);
        if sooner {
            d.armed = Some(key.0);
        }
        d.by_time.insert(key, pending_id);
        drop(d);
        if sooner {
            self.earlier.notify_one();
        }
    }

    fn remove(&self, key: &(Instant, u64)) {
        // The sweeper stays armed: at worst it wakes once for a call already answered.
        lock(&self.deadlines).by_time.remove(key);
    }

    /// The ids of calls due by `now`, taken off the list.
    fn due(&self, now: Instant) -> Vec<String> {
        let mut d = lock(&self.deadlines);
        let later = d.by_time.split_off(&(now, u64::MAX));
        std::mem::replace(&mut d.by_time, later)
            .into_values()
            .collect()
    }

    /// The earliest deadline, which the sweeper then sleeps until (`None`: until told).
    fn arm(&self) -> Option<Instant> {
        let mut d = lock(&self.deadlines);
        d.armed = d.by_time.first_key_value().map(|(k, _)| k.0);
        d.armed
    }
}

/// Answers relayed calls that passed their deadline; ends with the engine.
pub(super) async fn run_relay_sweeper(timers: Arc<RelayTimers>, engine: Weak<Engine>) {
    loop {
        match timers.arm() {
            None => timers.earlier.notified().await,
            Some(at) if at > Instant::now() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = timers.earlier.notified() => {}
                }
            }
            Some(_) => {
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                for id in timers.due(Instant::now()) {
                    let call = lock(&engine.pending).remove(&id);
                    if let Some(PendingCall {
                        reply: Reply::Relay(r),
                        ..
                    }) = call
                    {
                        let error = timed_out(&r.function_id, r.timeout);
                        r.answer(&engine, Err(error), false);
                    }
                }
            }
        }
    }
}

/// The error of a call whose callee's connection went away.
pub(super) fn callee_gone() -> ErrorBody {
    ErrorBody::new(
        codes::INVOCATION_STOPPED,
        "the worker serving this call disconnected",
    )
}

pub(super) fn timed_out(function_id: &str, timeout: Duration) -> ErrorBody {
    ErrorBody::new(
        codes::TIMEOUT,
        format!(
            "`{function_id}` did not answer within {} ms",
            timeout.as_millis()
        ),
    )
}

impl Relay {
    /// Finish the call's span and answer the caller. `settled_early`: the deadline is still
    /// listed and goes.
    fn answer(mut self, engine: &Engine, r: HandlerResult, settled_early: bool) {
        if settled_early {
            engine.relay_timers.remove(&self.deadline);
        }
        self.span.finish(r.is_err());
        if let Err(e) = &r {
            self.span
                .attributes
                .insert("error.code".into(), e.code.clone());
        }
        engine.spans.record(self.span);
        reply(&self.outbox, self.invocation_id, self.function_id, r);
    }
}

impl PendingCall {
    /// Answer the call, whoever waits for it.
    pub(super) fn settle(self, engine: &Engine, r: HandlerResult) {
        match self.reply {
            Reply::Waiter(tx) => {
                let _ = tx.send(r);
            }
            Reply::Relay(relay) => relay.answer(engine, r, true),
        }
    }
}

impl Engine {
    /// The connection serving `function_id` (its outbox and worker id), if one does.
    pub(super) fn remote_target(&self, function_id: &str) -> Option<(Outbox, String)> {
        match read(&self.functions).get(function_id) {
            Some(FunctionEntry {
                target: Target::Remote(o),
                owner,
                ..
            }) => Some((o.clone(), owner.clone())),
            _ => None,
        }
    }

    /// Forward a connection's synchronous call to `target`, the connection serving it (see
    /// [`Engine::remote_target`]): the answer goes back from [`Engine::complete`] (or the
    /// sweeper, at the deadline).
    pub(super) fn relay(
        &self,
        caller_outbox: &Outbox,
        (callee_outbox, callee): (Outbox, String),
        inv: InvokeFunction,
        invocation_id: String,
        parent: &TraceContext,
        timeout: Option<Duration>,
    ) {
        let timeout = timeout.unwrap_or(self.config.default_timeout);
        let mut span = Span::start(&inv.function_id, "engine", parent);
        span.attributes
            .insert(ATTR_FUNCTION_ID.to_string(), inv.function_id.clone());
        let ctx = span.context(&parent.baggage);
        let pending_id = self.next_invocation_id();
        let now = Instant::now();
        // A deadline past what the clock holds is no deadline (as `tokio::time::timeout`).
        let at = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30));
        let deadline = (at, self.call_seq.fetch_add(1, Ordering::Relaxed));
        let relay = PendingCall {
            callee,
            reply: Reply::Relay(Box::new(Relay {
                outbox: caller_outbox.clone(),
                invocation_id,
                function_id: inv.function_id.clone(),
                span,
                deadline,
                timeout,
            })),
        };
        match self.forward(
            &callee_outbox,
            &pending_id,
            &inv.function_id,
            inv.data,
            &ctx,
            relay,
        ) {
            // Listed after the send: an answer that came first leaves a deadline whose call
            // is gone, which the sweeper passes over.
            Ok(()) => self.relay_timers.add(deadline, pending_id),
            Err(Some(call)) => call.settle(self, Err(callee_gone())),
            Err(None) => {}
        }
    }

    /// Put `call` under `pending_id` and send `function_id`'s invocation to the connection
    /// behind `outbox`. When that connection is gone, the entry is taken back (`Err`; `None`
    /// when something else settled it meanwhile).
    pub(super) fn forward(
        &self,
        outbox: &Outbox,
        pending_id: &str,
        function_id: &str,
        data: Value,
        ctx: &TraceContext,
        call: PendingCall,
    ) -> Result<(), Option<PendingCall>> {
        lock(&self.pending).insert(pending_id.to_string(), call);
        let msg = Message::InvokeFunction(InvokeFunction {
            invocation_id: Some(pending_id.to_string()),
            function_id: function_id.to_string(),
            data,
            traceparent: ctx.traceparent(),
            baggage: ctx.baggage_header(),
            action: None,
            timeout_ms: None,
            accept_parts: false,
        });
        match outbox.send(Outbound::Text(msg.to_json())) {
            Ok(_) => Ok(()),
            Err(_) => Err(lock(&self.pending).remove(pending_id)),
        }
    }

    /// A fresh id for a call the engine sends a connection.
    pub(super) fn next_invocation_id(&self) -> String {
        use std::fmt::Write;
        let mut id = String::with_capacity(self.boot_id.len() + 21);
        id.push_str(&self.boot_id);
        let _ = write!(id, "-{}", self.call_seq.fetch_add(1, Ordering::Relaxed));
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_sweeper_is_told_only_of_a_deadline_sooner_than_it_wakes() {
        let timers = RelayTimers::default();
        let now = Instant::now();
        let s = Duration::from_secs;
        let told = |t: &RelayTimers| {
            let t = t.earlier.notified();
            futures_util::FutureExt::now_or_never(t).is_some()
        };
        timers.add((now + s(30), 1), "a".into());
        assert!(
            told(&timers),
            "a sweeper waiting for any deadline is told of the first"
        );
        assert_eq!(timers.arm(), Some(now + s(30)));
        timers.add((now + s(31), 2), "b".into());
        assert!(
            !told(&timers),
            "a later deadline: the sweeper wakes before it anyway"
        );
        timers.add((now + s(10), 3), "c".into());
        assert!(told(&timers), "a sooner one: told");
        assert_eq!(timers.arm(), Some(now + s(10)));
        for k in [(now + s(30), 1), (now + s(31), 2), (now + s(10), 3)] {
            timers.remove(&k);
        }
        assert_eq!(
            timers.arm(),
            None,
            "nothing left: the sweeper waits to be told"
        );
        timers.add((now + s(40), 4), "d".into());
        assert!(told(&timers), "and is told of the next deadline");
    }

    #[tokio::test]
    async fn due_calls_come_off_the_list_in_deadline_order_and_the_rest_stay() {
        let timers = RelayTimers::default();
        let now = Instant::now();
        let ms = Duration::from_millis;
        timers.add((now + ms(30), 1), "c".into());
        timers.add((now + ms(10), 2), "a".into());
        timers.add((now + ms(10), 3), "b".into());
        timers.add((now + ms(90), 4), "d".into());
        assert_eq!(timers.arm(), Some(now + ms(10)));
        assert_eq!(timers.due(now + ms(30)), ["a", "b", "c"]);
        assert!(timers.due(now + ms(30)).is_empty());
        timers.remove(&(now + ms(90), 4));
        assert_eq!(timers.arm(), None, "an answered call leaves nothing behind");
    }
}
