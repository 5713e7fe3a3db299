//! Invocations: routing a call to its owner (in process, over a connection, or a Lambda),
//! timeouts, panics turned into errors, and answers to remote callers.

use super::*;

/// What a panic carried, for the error that replaces it.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the handler panicked".into())
}

impl Engine {
    /// Call a function and wait for its answer (bounded by `timeout`, default from config).
    pub async fn invoke(
        &self,
        function_id: &str,
        data: Value,
        parent: &TraceContext,
        caller: Option<&str>,
        timeout: Option<Duration>,
    ) -> HandlerResult {
        self.invoke_attached(function_id, data, None, parent, caller, timeout)
            .await
    }

    /// [`Self::invoke`] with part of the payload beside it (see [`Attachment`]).
    pub async fn invoke_attached(
        &self,
        function_id: &str,
        data: Value,
        attachment: Option<Attachment>,
        parent: &TraceContext,
        caller: Option<&str>,
        timeout: Option<Duration>,
    ) -> HandlerResult {
        let timeout = timeout.unwrap_or(self.config.default_timeout);
        let mut span = Span::start(function_id, "engine", parent);
        span.attributes
            .insert(ATTR_FUNCTION_ID.to_string(), function_id.to_string());
        let ctx = span.context(&parent.baggage);
        // The call's `tracing` spans (AWS SDK operations on the AWS backends) become its
        // children.
        let bridged = bus_telemetry::tracing_bridge::context_for(self.bridge.as_ref(), &ctx);
        let work = self.dispatch(function_id, data, attachment, ctx, caller, timeout);
        let result = bus_telemetry::tracing_bridge::run_in(bridged, work).await;
        span.finish(result.is_err());
        if let Err(e) = &result {
            span.attributes.insert("error.code".into(), e.code.clone());
        }
        self.spans.record(span);
        result
    }

    pub(super) async fn dispatch(
        &self,
        function_id: &str,
        mut data: Value,
        attachment: Option<Attachment>,
        ctx: TraceContext,
        caller: Option<&str>,
        timeout: Duration,
    ) -> HandlerResult {
        enum Route {
            Local(Handler, bool),
            Remote(Outbox, String),
        }
        let route = {
            let functions = read(&self.functions);
            match functions.get(function_id) {
                None => None,
                Some(FunctionEntry {
                    target:
                        Target::Local {
                            handler,
                            attachments,
                        },
                    ..
                }) => Some(Route::Local(handler.clone(), *attachments)),
                Some(FunctionEntry {
                    target: Target::Remote(o),
                    owner,
                    ..
                }) => Some(Route::Remote(o.clone(), owner.clone())),
            }
        };
        let Some(route) = route else {
            return Err(ErrorBody::new(
                codes::FUNCTION_NOT_FOUND,
                format!("function `{function_id}` is not registered"),
            ));
        };
        let timed_out = || relay::timed_out(function_id, timeout);
        // Only a handler that asked for attachments gets one as it is.
        let attachment = match (&route, attachment) {
            (Route::Local(_, true), a) => a,
            (_, Some(a)) => {
                a.inline_into(&mut data);
                None
            }
            (_, None) => None,
        };
        match route {
            Route::Local(handler, _) => {
                let inv = Invocation {
                    function_id: function_id.to_string(),
                    data,
                    trace: ctx,
                    caller: caller.map(str::to_owned),
                    attachment,
                };
                // Polled in the caller's task: a task per call cost a spawn and, more often
                // than not, a wake-up of another worker thread. A panicking handler still
                // becomes an error, not a crash.
                let call = std::panic::AssertUnwindSafe(handler(inv)).catch_unwind();
                match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(panic)) => Err(ErrorBody::new(
                        codes::INVOCATION_ERROR,
                        format!("`{function_id}` failed: {}", panic_message(&*panic)),
                    )),
                    Err(_) => Err(timed_out()),
                }
            }
            Route::Remote(outbox, callee) => {
                let invocation_id = self.next_invocation_id();
                let (tx, rx) = oneshot::channel();
                let waiter = PendingCall {
                    callee,
                    reply: Reply::Waiter(tx),
                };
                if self
                    .forward(&outbox, &invocation_id, function_id, data, &ctx, waiter)
                    .is_err()
                {
                    return Err(relay::callee_gone());
                }
                match tokio::time::timeout(timeout, rx).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err(ErrorBody::new(
                        codes::INVOCATION_STOPPED,
                        "the call was dropped",
                    )),
                    Err(_) => {
                        lock(&self.pending).remove(&invocation_id);
                        Err(timed_out())
                    }
                }
            }
        }
    }

    /// A worker answered a call the engine sent it. Only the callee may answer.
    pub fn complete(&self, from_worker: &str, result: InvocationResult) {
        let pending = {
            let mut p = lock(&self.pending);
            match p.get(&result.invocation_id) {
                Some(call) if call.callee == from_worker => p.remove(&result.invocation_id),
                _ => None,
            }
        };
        let Some(call) = pending else {
            tracing::debug!(invocation_id = %result.invocation_id, "result for no pending call (late or foreign)");
            return;
        };
        let answer = match result.error {
            Some(e) => Err(e),
            None => Ok(result.result.unwrap_or(Value::Null)),
        };
        call.settle(self, answer);
    }

    /// Handle an `invokefunction` from a connection: sync, void or enqueue.
    pub fn handle_invoke(&self, caller: &str, outbox: &Outbox, inv: InvokeFunction) {
        let Some(engine) = self.arc() else { return };
        let caller = caller.to_string();
        let outbox = outbox.clone();
        let parent = TraceContext::from_headers(inv.traceparent.as_deref(), inv.baggage.as_deref());
        // Who the call is made for travels on with it: a client's own identity, whatever it
        // sent; a worker's or the admin's on-behalf-of, or itself. One read of the caller for
        // both, and a copy of its principal only for a client (checked against the functions).
        let (parent, client) = {
            let workers = read(&self.workers);
            match workers.get(&caller) {
                Some(w) => {
                    let client = (w.principal.role == crate::access::Role::Client)
                        .then(|| w.principal.clone());
                    (w.principal.stamp(parent), Some(client))
                }
                None => (parent, None),
            }
        };
        let timeout = inv.timeout_ms.map(Duration::from_millis);
        let checked = match client {
            None => Err(ErrorBody::new(codes::FORBIDDEN, "unknown connection")),
            Some(None) => Ok(()),
            Some(Some(p)) => p.may_call(&inv.function_id, self.is_public(&inv.function_id)),
        };
        if let Err(e) = checked {
            tracing::warn!(function_id = %inv.function_id, caller = %caller, error = %e.message, "call refused");
            if let Some(invocation_id) = inv.invocation_id {
                reply(&outbox, invocation_id, inv.function_id, Err(e));
            }
            return;
        }
        let mut inv = inv;
        match inv.action.take() {
            Some(Action::Enqueue {
                queue,
                message_group_id,
                deduplication_id,
            }) => {
                tokio::spawn(async move {
                    let r = engine
                        .enqueue(
                            &queue,
                            Some(&inv.function_id),
                            inv.data,
                            &parent,
                            message_group_id.as_deref(),
                            deduplication_id,
                        )
                        .await
                        .map(|id| json!({ "message_receipt_id": id }));
                    if let Some(invocation_id) = inv.invocation_id {
                        reply(&outbox, invocation_id, inv.function_id, r);
                    }
                });
            }
            action => {
                // No invocation id, or an explicit void: nobody waits for an answer.
                let answer_to = match action {
                    Some(Action::Void) => None,
                    _ => inv.invocation_id.take(),
                };
                // A call for another connection is relayed; the rest runs in a task.
                let (inv, answer_to) = match answer_to {
                    Some(invocation_id) => match self.remote_target(&inv.function_id) {
                        Some(target) => {
                            self.relay(&outbox, target, inv, invocation_id, &parent, timeout);
                            return;
                        }
                        None => (inv, Some(invocation_id)),
                    },
                    None => (inv, None),
                };
                tokio::spawn(async move {
                    let r = engine
                        .invoke(&inv.function_id, inv.data, &parent, Some(&caller), timeout)
                        .await;
                    match answer_to {
                        Some(invocation_id) => reply(&outbox, invocation_id, inv.function_id, r),
                        None => {
                            if let Err(e) = r {
                                tracing::debug!(function_id = %inv.function_id, error = %e, "void invocation failed");
                            }
                        }
                    }
                });
            }
        }
    }

    // ---------------------------------------------------------------- queues
}

pub(super) fn reply(outbox: &Outbox, invocation_id: String, function_id: String, r: HandlerResult) {
    let (result, error) = match r {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e)),
    };
    let msg = Message::InvocationResult(InvocationResult {
        invocation_id,
        function_id,
        result,
        error,
        traceparent: None,
        baggage: None,
    });
    let _ = outbox.send(Outbound::Text(msg.to_json()));
}
