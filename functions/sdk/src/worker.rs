//! `Worker`: a named set of functions and triggers. The same `Worker` runs embedded, as a
//! remote WebSocket worker, or as a Lambda; `dispatch` is the one code path that handles a
//! call in all three (span, context, panic containment).

use ::bus::protocol::{ErrorBody, RegisterFunction, RegisterTrigger, codes};
use bus_telemetry::trace::{ATTR_FUNCTION_ID, Span, TraceContext};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use crate::bus::Bus;
use crate::ctx::Ctx;

pub type FnResult = Result<Value, ErrorBody>;
pub type FnHandler = Arc<dyn Fn(Ctx, Value) -> BoxFuture<'static, FnResult> + Send + Sync>;

#[derive(Clone)]
pub struct FunctionSpec {
    pub def: RegisterFunction,
    pub handler: FnHandler,
    /// The handler reads [`Ctx::attachment`]: an in-process caller's attachment reaches it
    /// as it is instead of written into the payload.
    pub attachments: bool,
    /// The worker it came from when several are served as one ([`Worker::colocate`]): its
    /// spans keep that worker's name.
    pub service: Option<String>,
}

#[derive(Clone)]
pub struct Worker {
    pub name: String,
    functions: Vec<FunctionSpec>,
    index: HashMap<String, usize>,
    triggers: Vec<RegisterTrigger>,
    /// The workers served as this one ([`Worker::colocate`]); empty for a worker of its own.
    members: Vec<String>,
}

impl Worker {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            functions: Vec::new(),
            index: HashMap::new(),
            triggers: Vec::new(),
            members: Vec::new(),
        }
    }

    /// Several workers served as one (a co-located Lambda: `harness.yaml`'s
    /// `lambda.colocate`): every function and trigger of each, each function's spans still
    /// under the name of the worker it came from. A function ID two of them serve is refused,
    /// naming both.
    pub fn colocate(name: &str, members: Vec<Worker>) -> Result<Worker, String> {
        let mut out = Worker::new(name);
        for member in members {
            for mut spec in member.functions {
                if let Some(&i) = out.index.get(&spec.def.id) {
                    let other = out.functions[i].service.as_deref().unwrap_or_default();
                    return Err(format!(
                        "`{}` is served by both `{other}` and `{}`",
                        spec.def.id, member.name
                    ));
                }
                spec.service.get_or_insert_with(|| member.name.clone());
                out.index.insert(spec.def.id.clone(), out.functions.len());
                out.functions.push(spec);
            }
            out.triggers.extend(member.triggers);
            out.members.push(member.name);
        }
        Ok(out)
    }

    /// The workers served as this one, when it is several ([`Worker::colocate`]).
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Register a handler taking and returning raw JSON.
    pub fn register_function<F, Fut>(&mut self, def: RegisterFunction, handler: F) -> &mut Self
    where
        F: Fn(Ctx, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FnResult> + Send + 'static,
    {
        let handler: FnHandler = Arc::new(move |ctx, data| handler(ctx, data).boxed());
        let spec = FunctionSpec {
            def,
            handler,
            attachments: false,
            service: None,
        };
        match self.index.get(&spec.def.id) {
            Some(&i) => self.functions[i] = spec,
            None => {
                self.index.insert(spec.def.id.clone(), self.functions.len());
                self.functions.push(spec);
            }
        }
        self
    }

    /// `function_id`'s handler reads [`Ctx::attachment`] (and falls back to its payload when
    /// there is none): in process, a caller's attachment then reaches it unserialized.
    pub fn accept_attachments(&mut self, function_id: &str) -> &mut Self {
        if let Some(&i) = self.index.get(function_id) {
            self.functions[i].attachments = true;
        }
        self
    }

    /// Declare a registered function for humans and the harness only (`metadata.agent:
    /// false`): the turn orchestrator never dispatches it for the model.
    pub fn not_for_the_agent(mut self, function_id: &str) -> Self {
        if let Some(&i) = self.index.get(function_id) {
            let def = std::mem::replace(
                &mut self.functions[i].def,
                RegisterFunction::new(function_id),
            );
            self.functions[i].def = def.not_for_the_agent();
        }
        self
    }

    /// Builder form of [`register_function`](Self::register_function).
    pub fn function<F, Fut>(mut self, id: &str, description: &str, handler: F) -> Self
    where
        F: Fn(Ctx, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FnResult> + Send + 'static,
    {
        let mut def = RegisterFunction::new(id);
        def.description = Some(description.to_string());
        self.register_function(def, handler);
        self
    }

    /// A handler with typed request and response; a request that does not deserialize is
    /// answered with `invalid_message` naming the field.
    pub fn typed_function<Req, Resp, F, Fut>(mut self, def: RegisterFunction, handler: F) -> Self
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(Ctx, Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, ErrorBody>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let id = def.id.clone();
        self.register_function(def, move |ctx, data| {
            let handler = handler.clone();
            let id = id.clone();
            async move {
                // The error names the field that is wrong, not only what was wrong with it.
                let req: Req =
                    crate::contracts::parse(&format!("invalid request for `{id}`"), data)
                        .map_err(ErrorBody::invalid)?;
                let resp = handler(ctx, req).await?;
                serde_json::to_value(resp)
                    .map_err(|e| ErrorBody::new(codes::SERIALIZATION_ERROR, e.to_string()))
            }
        });
        self
    }

    /// Register a trigger; its id is derived from the worker and function so a reconnect
    /// replaces rather than duplicates it.
    pub fn register_trigger(
        &mut self,
        trigger_type: &str,
        function_id: &str,
        config: Value,
    ) -> &mut Self {
        let id = format!(
            "{}:{}:{}:{}",
            self.name,
            function_id,
            trigger_type,
            self.triggers.len()
        );
        self.triggers.push(RegisterTrigger {
            id,
            trigger_type: trigger_type.to_string(),
            function_id: function_id.to_string(),
            config,
        });
        self
    }

    pub fn trigger(mut self, trigger_type: &str, function_id: &str, config: Value) -> Self {
        self.register_trigger(trigger_type, function_id, config);
        self
    }

    pub fn functions(&self) -> &[FunctionSpec] {
        &self.functions
    }

    pub fn triggers(&self) -> &[RegisterTrigger] {
        &self.triggers
    }

    pub fn handler(&self, function_id: &str) -> Option<&FnHandler> {
        self.index
            .get(function_id)
            .map(|&i| &self.functions[i].handler)
    }

    /// Handle one call: open a span (child of the caller's), run the handler in its own task
    /// (a panic becomes an `invocation_error`), report the span.
    pub async fn dispatch(
        &self,
        bus: Arc<dyn Bus>,
        function_id: &str,
        data: Value,
        parent: &TraceContext,
    ) -> FnResult {
        self.dispatch_attached(bus, function_id, data, None, parent)
            .await
    }

    /// [`Self::dispatch`] with the caller's attachment, for the handler's [`Ctx`].
    pub async fn dispatch_attached(
        &self,
        bus: Arc<dyn Bus>,
        function_id: &str,
        data: Value,
        attachment: Option<bus::Attachment>,
        parent: &TraceContext,
    ) -> FnResult {
        let Some(spec) = self.index.get(function_id).map(|&i| &self.functions[i]) else {
            return Err(ErrorBody::new(
                codes::FUNCTION_NOT_FOUND,
                format!("worker `{}` does not serve `{function_id}`", self.name),
            ));
        };
        let handler = spec.handler.clone();
        let service = spec.service.as_deref().unwrap_or(&self.name);
        let mut span = Span::start(function_id, service, parent);
        span.attributes
            .insert(ATTR_FUNCTION_ID.into(), function_id.into());
        let position = span.context(&parent.baggage);
        // The handler's own `tracing` spans (its AWS calls, on a bus that makes them) become
        // children of this span.
        let target = bus.span_target().map(|t| t.for_service(service));
        let bridged = bus_telemetry::tracing_bridge::context_for(target.as_ref(), &position);
        let work = bus_telemetry::tracing_bridge::run_in(
            bridged,
            handler(
                Ctx::new(bus.clone(), position, function_id).with_attachment(attachment),
                data,
            ),
        );
        let result = match tokio::spawn(work).await {
            Ok(r) => r,
            Err(join) => Err(ErrorBody::new(
                codes::INVOCATION_ERROR,
                format!("`{function_id}` panicked: {join}"),
            )),
        };
        span.finish(result.is_err());
        if let Err(e) = &result {
            span.attributes.insert("error.code".into(), e.code.clone());
        }
        bus.report_span(span);
        result
    }
}

/// A function definition: id and description, plus the request and response shapes, error
/// codes and usage notes the directory turns into the function's skill (so the skill is
/// generated from what is registered and cannot drift from it).
pub fn def(id: &str, description: &str) -> RegisterFunction {
    let mut d = RegisterFunction::new(id);
    d.description = Some(description.to_string());
    d
}

pub trait DefExt: Sized {
    /// Request shape (a JSON-schema-like object: `{field: {type, description?}}`, `required`).
    fn request(self, shape: Value) -> Self;
    fn response(self, shape: Value) -> Self;
    /// `(code, when)` pairs.
    fn errors(self, errors: &[(&str, &str)]) -> Self;
    fn notes(self, notes: &str) -> Self;
    /// The request's and the answer's JSON Schemas, from their contract types
    /// ([`crate::contracts`]).
    fn contract<Req: schemars::JsonSchema, Resp: schemars::JsonSchema>(self) -> Self;
}

impl DefExt for RegisterFunction {
    fn contract<Req: schemars::JsonSchema, Resp: schemars::JsonSchema>(mut self) -> Self {
        self.request_format = Some(crate::contracts::schema_of::<Req>());
        self.response_format = Some(crate::contracts::schema_of::<Resp>());
        self
    }

    fn request(mut self, shape: Value) -> Self {
        self.request_format = Some(shape);
        self
    }
    fn response(mut self, shape: Value) -> Self {
        self.response_format = Some(shape);
        self
    }
    fn errors(mut self, errors: &[(&str, &str)]) -> Self {
        let list: Vec<Value> = errors
            .iter()
            .map(|(code, when)| serde_json::json!({"code": code, "when": when}))
            .collect();
        let meta = self.metadata.get_or_insert_with(|| serde_json::json!({}));
        meta["errors"] = Value::Array(list);
        self
    }
    fn notes(mut self, notes: &str) -> Self {
        let meta = self.metadata.get_or_insert_with(|| serde_json::json!({}));
        meta["notes"] = Value::String(notes.to_string());
        self
    }
}
