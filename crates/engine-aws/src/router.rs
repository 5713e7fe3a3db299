//! The engine as deployed in AWS (the `engine-lambda` binary):
//!
//! - **WebSocket router** ([`AwsRouter::websocket`]), behind an API Gateway WebSocket API:
//!   `$connect` checks the client's token (query `token` or `Authorization: Bearer`) and
//!   records the connection; `$disconnect` forgets it; `$default` routes each
//!   `invokefunction` message: the function is looked up in the registry table, its Lambda is
//!   invoked with the bus envelope, and the `invocationresult` is posted back to the
//!   connection through the API Gateway management API (a gone connection is forgotten).
//!   A `streamsubscribe` / `streamunsubscribe` message records / forgets the connection's
//!   subscription to a stream group (all groups without `group_id`) in the registry.
//! - **State-trigger router** ([`AwsRouter::stream`]): a DynamoDB Stream batch of the state
//!   table goes, record by matching record, to each registered state trigger's Lambda; the
//!   first failure is reported as `batchItemFailures` so the stream retries from there.
//!   It pushes nothing to connections: a stored stream item (`stream::set`, `state::transact`'s
//!   items, e.g. `agent::events`) is posted by the Lambda that stores it, once written and in
//!   order with the `stream::send` pushes (token deltas) of that Lambda, as the local engine
//!   pushes them (`bus_aws::connections`, through the SDK's `AwsBus`).
//! - **Registration** ([`register_lambda`]): a deployed worker Lambda is asked to describe
//!   itself (`{"describe": true}`) and its functions and state triggers are written to the
//!   registry, which is how the router and the other Lambdas find it.

use bus::access::{Access, Principal, Role};
use bus::protocol::{ErrorBody, RESULT_PART_TYPE, RESULT_PARTS_MAX, codes};
use bus::registry::Registry;
use bus::secrets::SecretStore;
pub use bus_aws::invoke::{
    call_function, call_function_as, envelope, function_record, invoke, lambda_named,
    register_lambda, state_trigger_picks, state_trigger_picks_with,
};
use bus_aws::registry::DynamoRegistry;
use bus_aws::{AwsClients, AwsNames};
use serde_json::{Value, json};
use std::sync::Arc;

use bus_aws::connections::{Connections, SUBSCRIPTION, subscription_id};
use bus_aws::router_trace::{RouterTrace, trigger_spans};

/// The credentials `$connect` accepts: the admin token, plus the worker and client
/// credentials of the optional secret `engine/access`; or why there are none (then nobody
/// connects). Shared by the router and the doors Lambda, which admit the same callers.
pub async fn load_access(token: &ConnectToken) -> Result<Access, String> {
    let (admin, store) = match token {
        ConnectToken::Fixed(t) if !t.is_empty() => (t.clone(), None),
        ConnectToken::Fixed(_) => {
            return Err("the configured engine token is empty".to_string());
        }
        ConnectToken::Secret(store) => {
            let token = match store.get("engine/token").await {
                Ok(Some(t)) if !t.is_empty() && t != "{}" => t,
                Ok(_) => {
                    return Err("the secret engine/token is missing or empty".into());
                }
                Err(e) => {
                    return Err(format!("the secret engine/token cannot be read: {e}"));
                }
            };
            (token, Some(store))
        }
    };
    let mut access = Access::admin_only(Some(admin));
    if let Some(store) = store {
        // Optional: absent means the admin token only; unreadable means nobody.
        match store.get("engine/access").await {
            Ok(Some(yaml)) if !yaml.trim().is_empty() && yaml != "{}" => {
                access = access
                    .with_file_text(&yaml)
                    .map_err(|e| format!("the secret engine/access: {e}"))?;
            }
            Ok(_) => {}
            Err(e) => {
                return Err(format!("the secret engine/access cannot be read: {e}"));
            }
        }
    }
    Ok(access)
}

/// A subscription's `batch` (absent: `false`), or the error naming what else it is.
pub(crate) fn batch_of(msg: &Value) -> Result<bool, ErrorBody> {
    match msg.get("batch") {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ErrorBody::invalid(format!(
            "invalid `streamsubscribe` message: field `batch` expected a boolean, got {}",
            bus::protocol::kind_of(other)
        ))),
    }
}

/// A (un)subscription that carries an `invocation_id` is answered like a call: each message
/// runs in its own invocation here, in no set order, so a client that must be subscribed
/// before it starts a turn (the doors Lambda) waits for this answer. Without the id, only a
/// refusal is answered, as before.
fn acknowledged(msg: &Value, refusal: Option<Value>) -> Option<Value> {
    let Some(id) = msg["invocation_id"].as_str() else {
        return refusal;
    };
    let mut reply =
        json!({"type": "invocationresult", "invocation_id": id, "function_id": msg["type"]});
    match refusal {
        Some(r) => reply["error"] = r["error"].clone(),
        None => {
            reply["result"] =
                json!({"stream_name": msg["stream_name"], "group_id": msg["group_id"]})
        }
    }
    Some(reply)
}

/// `ENGINE_ALLOWED_ORIGINS` (the template's `AllowedOrigins`): comma-separated
/// `scheme://host[:port]`, a trailing `/` dropped. Read by the router and the doors alike.
pub fn parse_origins(origins: &str) -> Vec<String> {
    origins
        .split(',')
        .map(|o| o.trim().trim_end_matches('/').to_string())
        .filter(|o| !o.is_empty())
        .collect()
}

/// Where `$connect` finds the token it requires. There is no "no token": a router that cannot
/// tell who may connect refuses everyone.
pub enum ConnectToken {
    /// A token given to the Lambda directly (`ENGINE_TOKEN`).
    Fixed(String),
    /// The secret `engine/token`, read at the first `$connect` (not during init, which would
    /// put a network call in every cold start) and kept. A failed or empty read refuses that
    /// connection and is tried again at the next one.
    Secret(Arc<dyn SecretStore>),
}

impl ConnectToken {
    /// `ENGINE_TOKEN` when set, else the secret.
    pub fn from_env_or(secrets: Arc<dyn SecretStore>) -> Self {
        match std::env::var("ENGINE_TOKEN") {
            Ok(t) if !t.is_empty() => ConnectToken::Fixed(t),
            _ => ConnectToken::Secret(secrets),
        }
    }
}

pub struct AwsRouter {
    clients: AwsClients,
    /// The state table, whose stream the router reads (for values stored apart).
    state_table: String,
    registry: DynamoRegistry,
    connections: Connections,
    token: ConnectToken,
    /// The admin token plus the worker and client credentials of the optional secret
    /// `engine/access` (the access file's YAML), read at the first `$connect`.
    access: tokio::sync::OnceCell<Access>,
    /// Principals of connections this instance has seen (others are read from the registry).
    principals: std::sync::Mutex<std::collections::HashMap<String, Principal>>,
    /// Origins (`scheme://host[:port]`) a browser may connect from (`ENGINE_ALLOWED_ORIGINS`;
    /// the template's `AllowedOrigins`). A `$connect` carrying any other `Origin` is refused,
    /// as on the local edge; one with no `Origin` (a worker, a CLI) is not a browser.
    allowed_origins: Vec<String>,
    /// The spans of the calls and trigger records routed here ([`bus_aws::router_trace`]).
    trace: RouterTrace,
    /// Connections this instance has sent `workerregistered` (bounded; see [`GREETED_KEPT`]).
    greeted: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Connections remembered as greeted; past this the set starts over (a connection greeted
/// twice gets the same `workerregistered` again, which a worker takes as it did the first).
const GREETED_KEPT: usize = 65_536;

fn status(code: u16) -> Value {
    json!({"statusCode": code})
}

impl AwsRouter {
    /// `management_endpoint`: `https://{api}.execute-api.{region}.amazonaws.com/{stage}`.
    pub fn new(
        clients: AwsClients,
        names: &AwsNames,
        management_endpoint: &str,
        token: ConnectToken,
    ) -> Self {
        Self {
            registry: DynamoRegistry::new(clients.clone(), names),
            connections: Connections::new(&clients, names, management_endpoint),
            state_table: names.state_table(),
            clients,
            token,
            access: tokio::sync::OnceCell::new(),
            principals: Default::default(),
            allowed_origins: Vec::new(),
            trace: RouterTrace::from_env(),
            greeted: Default::default(),
        }
    }

    /// Record spans through `trace` instead of the one the `OTEL_*` variables configure.
    pub fn with_trace(mut self, trace: RouterTrace) -> Self {
        self.trace = trace;
        self
    }

    /// Export this invocation's spans and metrics: `engine-lambda` does before it answers.
    pub async fn flush_telemetry(&self) {
        self.trace.flush().await;
        bus_telemetry::metrics::flush().await;
    }

    /// Admit browsers from these origins (comma-separated, as `ENGINE_ALLOWED_ORIGINS`).
    pub fn with_allowed_origins(mut self, origins: &str) -> Self {
        self.allowed_origins = parse_origins(origins);
        self
    }

    /// A `$connect` from a browser page: is its origin admitted? (No `Origin`: not a browser.)
    fn origin_allowed(&self, event: &Value) -> Result<(), String> {
        let origin = event["headers"]
            .as_object()
            .and_then(|h| h.iter().find(|(k, _)| k.eq_ignore_ascii_case("origin")))
            .and_then(|(_, v)| v.as_str());
        match origin {
            None => Ok(()),
            Some(o) if bus_edge::ws::origin_listed(o, &self.allowed_origins) => Ok(()),
            Some(o) => Err(o.trim_end_matches('/').to_string()),
        }
    }

    /// The credentials `$connect` accepts, or why there are none (then nobody connects).
    async fn access(&self) -> Result<&Access, String> {
        self.access
            .get_or_try_init(|| load_access(&self.token))
            .await
    }

    /// A `$connect` event → who it is, or `None` (refused).
    async fn authenticate(&self, event: &Value) -> Option<Principal> {
        let access = match self.access().await {
            Ok(a) => a,
            Err(why) => {
                tracing::error!(%why, "$connect refused: no credentials to check against (fail closed)");
                return None;
            }
        };
        let given = event["queryStringParameters"]["token"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| {
                event["headers"]
                    .as_object()
                    .and_then(|h| {
                        h.iter()
                            .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                    })
                    .and_then(|(_, v)| v.as_str())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::to_owned)
            });
        access.authenticate(given.as_deref())
    }

    /// Who a connection authenticated as: remembered here, else its registry record. An
    /// unknown connection is a client (the least it can be).
    async fn principal(&self, connection: &str) -> Principal {
        if let Some(p) = self
            .principals
            .lock()
            .ok()
            .and_then(|m| m.get(connection).cloned())
        {
            return p;
        }
        let record = self
            .registry
            .get("connection", connection)
            .await
            .ok()
            .flatten();
        let recorded = record.is_some();
        let body = record.map(|(_, b)| b).unwrap_or(Value::Null);
        let role = match body["role"].as_str() {
            Some("admin") => Role::Admin,
            Some("worker") => Role::Worker,
            _ => Role::Client,
        };
        let principal = Principal {
            name: body["name"].as_str().unwrap_or("unknown").to_string(),
            role,
            namespaces: body["namespaces"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            sessions_all: body["sessions_all"].as_bool() == Some(true),
        };
        // Only a recorded connection is remembered (an unknown one stays unknown).
        if recorded && let Ok(mut m) = self.principals.lock() {
            if m.len() > 10_000 {
                m.clear();
            }
            m.insert(connection.to_string(), principal.clone());
        }
        principal
    }

    /// Post a message to a connection → false when the connection is gone (then forgotten).
    pub async fn post(&self, connection_id: &str, message: &Value) -> Result<bool, String> {
        let posted = self.connections.post(connection_id, message).await?;
        if !posted && let Ok(mut m) = self.principals.lock() {
            m.remove(connection_id);
        }
        Ok(posted)
    }

    /// Whether `connection` is remembered here or recorded in the registry.
    async fn known(&self, connection: &str) -> bool {
        let remembered = self
            .principals
            .lock()
            .ok()
            .is_some_and(|m| m.contains_key(connection));
        remembered
            || self
                .registry
                .get("connection", connection)
                .await
                .ok()
                .flatten()
                .is_some()
    }

    /// An API Gateway WebSocket event → the integration response.
    pub async fn websocket(&self, event: &Value) -> Value {
        let ctx = &event["requestContext"];
        let Some(connection) = ctx["connectionId"].as_str() else {
            return status(400);
        };
        match ctx["eventType"].as_str() {
            Some("CONNECT") => {
                if let Err(origin) = self.origin_allowed(event) {
                    tracing::warn!(connection, %origin, "connection refused: origin not allowed (AllowedOrigins)");
                    return status(403);
                }
                let Some(principal) = self.authenticate(event).await else {
                    tracing::warn!(connection, "connection refused: bad or missing token");
                    return status(401);
                };
                let record = json!({
                    "connected_at_ms": bus_telemetry::trace::now_ms(),
                    "role": principal.role.as_str(),
                    "name": principal.name,
                    "namespaces": principal.namespaces,
                    "sessions_all": principal.sessions_all,
                });
                if let Ok(mut m) = self.principals.lock() {
                    m.insert(connection.to_string(), principal);
                }
                match self
                    .registry
                    .put("connection", connection, connection, record)
                    .await
                {
                    Ok(()) => status(200),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot record the connection");
                        status(500)
                    }
                }
            }
            Some("DISCONNECT") => {
                if let Ok(mut g) = self.greeted.lock() {
                    g.remove(connection);
                }
                self.forget(connection).await;
                status(200)
            }
            Some("MESSAGE") => {
                // PROTOCOL.md: a connection's first message is `workerregistered`. API Gateway
                // cannot post while `$connect` runs, so it goes before the answer to the
                // connection's first message (the iii SDKs send their registrations without
                // waiting for it). Its worker id is the connection id, as the registry's.
                if self.first_message(connection)
                    && let Err(e) = self
                        .post(
                            connection,
                            &json!({"type": "workerregistered", "worker_id": connection}),
                        )
                        .await
                {
                    tracing::warn!(error = %e, connection, "cannot post workerregistered");
                }
                let body = event["body"].as_str().unwrap_or("");
                let Some(reply) = self.route(connection, body).await else {
                    return status(200);
                };
                for message in fit_or_split(reply, || asks_for_parts(body)) {
                    if let Err(e) = self.post(connection, &message).await {
                        tracing::error!(error = %e, connection, "cannot post to the connection");
                        return status(500);
                    }
                }
                status(200)
            }
            _ => status(400),
        }
    }

    /// Whether this is the first message of `connection` this instance handles.
    fn first_message(&self, connection: &str) -> bool {
        let Ok(mut g) = self.greeted.lock() else {
            return false;
        };
        if g.len() >= GREETED_KEPT {
            g.clear();
        }
        g.insert(connection.to_string())
    }

    /// A connection and its stream subscriptions, forgotten.
    async fn forget(&self, connection: &str) {
        if let Ok(mut m) = self.principals.lock() {
            m.remove(connection);
        }
        self.connections.forget(connection).await;
    }

    /// `streamsubscribe` / `streamunsubscribe` from a connection → an error to send back, if any.
    /// (A subscription's `batch`, when given, must be a boolean, as the embedded engine reads it.)
    async fn subscription(&self, connection: &str, msg: &Value, subscribe: bool) -> Option<Value> {
        let Some(stream) = msg["stream_name"].as_str().filter(|s| !s.is_empty()) else {
            return Some(
                json!({"type": "error", "error": ErrorBody::invalid("missing required field `stream_name`"), "in_reply_to": msg["type"]}),
            );
        };
        let group = msg["group_id"].as_str();
        let batch = match batch_of(msg) {
            Ok(b) => b,
            Err(e) if subscribe => {
                return Some(json!({"type": "error", "error": e, "in_reply_to": msg["type"]}));
            }
            Err(_) => false,
        };
        if subscribe && let Err(e) = self.principal(connection).await.may_subscribe(stream) {
            return Some(json!({"type": "error", "error": e, "in_reply_to": msg["type"]}));
        }
        // A connection the router has no record of (gone, or its `$connect` never recorded)
        // subscribes to nothing: its subscription would never be pushed to (an unknown
        // connection is a client that owns no session), so never found gone and never freed.
        if subscribe && !self.known(connection).await {
            return Some(
                json!({"type": "error", "error": ErrorBody::new(codes::FORBIDDEN, "this connection is not known to the router (gone?): reconnect"), "in_reply_to": msg["type"]}),
            );
        }
        let id = subscription_id(connection, stream, group);
        let outcome = if subscribe {
            // A client that sees only its own sessions is named, so each pushed event goes
            // to it only when the session is its own.
            let acting = self.principal(connection).await.acting();
            let viewer = (!acting.sees_all()).then(|| acting.encode());
            self.registry
                .put(
                    SUBSCRIPTION,
                    &id,
                    connection,
                    json!({"connection_id": connection, "stream_name": stream, "group_id": group, "viewer": viewer, "batch": batch}),
                )
                .await
        } else {
            self.registry
                .remove(SUBSCRIPTION, &id, connection)
                .await
                .map(|_| ())
        };
        match outcome {
            Ok(()) => None,
            Err(e) => Some(
                json!({"type": "error", "error": ErrorBody::new(codes::INVOCATION_ERROR, format!("subscription not recorded: {e}")), "in_reply_to": msg["type"]}),
            ),
        }
    }

    /// One client message from `connection` → the message to send back (if any).
    async fn route(&self, connection: &str, body: &str) -> Option<Value> {
        let msg: Value = match serde_json::from_str(body) {
            Ok(v) => v,
            Err(e) => {
                return Some(
                    json!({"type": "error", "error": ErrorBody::invalid(format!("not a JSON message: {e}"))}),
                );
            }
        };
        match msg["type"].as_str() {
            Some("ping") => Some(json!({"type": "pong"})),
            Some("streamsubscribe") => {
                acknowledged(&msg, self.subscription(connection, &msg, true).await)
            }
            Some("streamunsubscribe") => {
                acknowledged(&msg, self.subscription(connection, &msg, false).await)
            }
            Some("invokefunction") => {
                let Some(function_id) = msg["function_id"].as_str() else {
                    return Some(
                        json!({"type": "error", "error": ErrorBody::invalid("missing required field `function_id`")}),
                    );
                };
                let invocation_id = msg["invocation_id"].as_str().map(str::to_owned);
                let principal = self.principal(connection).await;
                // Who the call is made for travels on with it (a client's own identity,
                // whatever it sent), so the workers can keep each session to its owner.
                let baggage = principal.stamp_baggage(msg["baggage"].as_str());
                let span = self.trace.start(
                    function_id,
                    function_id,
                    msg["traceparent"].as_str(),
                    baggage.as_deref(),
                );
                let outcome = self
                    .trace
                    .run(span, |traceparent| {
                        call_function_as(
                            &self.clients,
                            &self.registry,
                            &principal,
                            function_id,
                            msg.get("data").cloned().unwrap_or(Value::Null),
                            traceparent,
                            baggage.clone(),
                        )
                    })
                    .await;
                // Fire-and-forget calls (no invocation id) get no answer.
                let invocation_id = invocation_id?;
                let mut reply = json!({"type": "invocationresult", "invocation_id": invocation_id, "function_id": function_id});
                match outcome {
                    Ok(v) => reply["result"] = v,
                    Err(e) => reply["error"] = json!(e),
                }
                Some(reply)
            }
            Some(other) => Some(
                json!({"type": "error", "error": ErrorBody::invalid(format!("`{other}` is not routed by the AWS engine: workers deploy as Lambdas and register with `engine-gateway register-lambda`"))}),
            ),
            None => Some(
                json!({"type": "error", "error": ErrorBody::invalid("missing required field `type`")}),
            ),
        }
    }

    /// A DynamoDB Stream batch of the state table → each matching state trigger's Lambda,
    /// as a DynamoDB event of the records it watches; partial failure from the first miss.
    pub async fn stream(&self, event: &Value) -> Value {
        let records: Vec<Value> = event["Records"].as_array().cloned().unwrap_or_default();
        let triggers = match self.registry.list("trigger").await {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the triggers; the batch is retried");
                let first = records
                    .first()
                    .and_then(|r| r["dynamodb"]["SequenceNumber"].as_str())
                    .unwrap_or("");
                return json!({"batchItemFailures": [{"itemIdentifier": first}]});
            }
        };
        // Images of values stored apart (`bus_aws::spill`) are read once, for the filters;
        // the triggers get the images as they are. A record whose value cannot be read is
        // retried with those after it.
        let mut apart = std::collections::HashMap::new();
        let mut first_failure: Option<usize> = None;
        for (i, r) in records.iter().enumerate() {
            match bus_aws::spill::json_record_values(
                &self.clients.dynamodb,
                &self.state_table,
                &r["dynamodb"],
            )
            .await
            {
                Ok(None) => {}
                Ok(Some(values)) => {
                    apart.insert(i, values);
                }
                Err(e) => {
                    tracing::error!(error = %e, "a stream record's value stored apart could not be read; retried");
                    first_failure = Some(i);
                    break;
                }
            }
        }
        let readable = first_failure.unwrap_or(records.len());
        for (_, _, t) in &triggers {
            let Some(lambda) = t["lambda"].as_str() else {
                continue;
            };
            let picked: Vec<(usize, &Value)> = records[..readable]
                .iter()
                .enumerate()
                .filter(|(i, r)| state_trigger_picks_with(&t["config"], r, apart.get(i)))
                .collect();
            if picked.is_empty() {
                continue;
            }
            let function_id = t["function_id"].as_str().unwrap_or(lambda);
            let picked_records: Vec<&Value> = picked.iter().map(|(_, r)| *r).collect();
            let (spans, delivered) = trigger_spans(&self.trace, function_id, &picked_records);
            let sub = json!({"Records": delivered});
            let invoked = invoke(&self.clients, lambda, &sub).await;
            for mut span in spans {
                span.finish(invoked.is_err());
                self.trace.record(span);
            }
            let failed_seq = match invoked {
                Ok(answer) => answer["batchItemFailures"][0]["itemIdentifier"]
                    .as_str()
                    .map(str::to_owned),
                Err(e) => {
                    tracing::error!(lambda, error = %e.message, "state trigger failed");
                    picked[0].1["dynamodb"]["SequenceNumber"]
                        .as_str()
                        .map(str::to_owned)
                }
            };
            if let Some(seq) = failed_seq
                && let Some(i) = records
                    .iter()
                    .position(|r| r["dynamodb"]["SequenceNumber"].as_str() == Some(seq.as_str()))
            {
                first_failure = Some(first_failure.map_or(i, |f| f.min(i)));
            }
        }
        match first_failure {
            Some(i) => {
                json!({"batchItemFailures": [{"itemIdentifier": records[i]["dynamodb"]["SequenceNumber"]}]})
            }
            None => json!({"batchItemFailures": []}),
        }
    }
}

/// What API Gateway accepts in one WebSocket message.
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024;
/// How much of an answer's JSON text one `invocationresultpart` carries (escaped inside the
/// part as a JSON string, with room for the envelope).
pub const PART_TEXT_BYTES: usize = 96 * 1024;

/// Whether the `invokefunction` in `body` asked for a large answer in parts
/// (`"accept_parts": true`, PROTOCOL.md).
fn asks_for_parts(body: &str) -> bool {
    serde_json::from_str::<Value>(body).is_ok_and(|m| m["accept_parts"] == true)
}

/// The messages that carry `reply`: itself when it fits one WebSocket message; an answer
/// that does not, in `invocationresultpart` messages when the call asked for them
/// (`accepts_parts`), else an error answer naming its size. Most replies
/// are far under the limit, and their bound says so without writing their JSON.
pub fn fit_or_split(reply: Value, accepts_parts: impl FnOnce() -> bool) -> Vec<Value> {
    if reply["type"] != "invocationresult"
        || bus::state::json_len_bound(&reply) <= MAX_MESSAGE_BYTES
    {
        return vec![reply];
    }
    let text = reply.to_string();
    if text.len() <= MAX_MESSAGE_BYTES {
        return vec![reply];
    }
    if !accepts_parts() {
        return vec![too_large(&reply, text.len())];
    }
    let slices = json_string_slices(&text, PART_TEXT_BYTES);
    // At most `RESULT_PARTS_MAX` parts (a Lambda's answer is at most 6 MB anyway).
    if slices.len() > RESULT_PARTS_MAX as usize {
        return vec![too_large(&reply, text.len())];
    }
    let count = slices.len();
    slices
        .into_iter()
        .enumerate()
        .map(|(index, slice)| json!({"type": RESULT_PART_TYPE, "invocation_id": reply["invocation_id"], "index": index, "count": count, "text": slice}))
        .collect()
}

/// `text` cut at character boundaries into slices whose JSON string encoding (quotes and
/// backslashes escaped, control characters as `\uXXXX`) takes at most `budget` bytes.
fn json_string_slices(text: &str, budget: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, c) in text.char_indices() {
        let cost = match c {
            '"' | '\\' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if used + cost > budget && i > start {
            out.push(&text[start..i]);
            (start, used) = (i, 0);
        }
        used += cost;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// The error answer that names the size of an answer too large for one message.
fn too_large(reply: &Value, size: usize) -> Value {
    json!({
        "type": "invocationresult",
        "invocation_id": reply["invocation_id"],
        "function_id": reply["function_id"],
        "error": {
            "code": codes::PAYLOAD_TOO_LARGE,
            "message": format!(
                "the answer of `{}` is {size} bytes; one WebSocket message holds at most {MAX_MESSAGE_BYTES}. Ask for less (a list function takes `limit` and `after`)",
                reply["function_id"].as_str().unwrap_or("?")
            ),
        },
    })
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
