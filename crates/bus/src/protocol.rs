//! The worker wire protocol of SPEC §1: one JSON object per WebSocket text message, tagged by
//! `type`. These types are the single source of truth for the field names; `PROTOCOL.md`
//! documents them with one example each.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The metadata flag that makes a function callable by clients.
pub const PUBLIC_FLAG: &str = "public";

/// The metadata flag (`agent: false`) by which a worker declares a function for humans and
/// the harness only: the orchestrator never dispatches it for the model.
pub const AGENT_FLAG: &str = "agent";

/// What one read from a bus WebSocket's socket may take, at either end. tungstenite zero-fills
/// its whole read buffer before every read (its default, 128 KiB, was a twentieth of the
/// engine's CPU under sixteen callers, with the reallocations it caused); the protocol's
/// messages are a few hundred bytes, and a larger one is read in several.
pub const SOCKET_READ_BYTES: usize = 16 * 1024;

/// Error codes the engine answers with (SPEC §1).
pub mod codes {
    pub const FUNCTION_NOT_FOUND: &str = "function_not_found";
    pub const INVOCATION_ERROR: &str = "invocation_error";
    pub const INVOCATION_STOPPED: &str = "invocation_stopped";
    pub const TIMEOUT: &str = "timeout";
    pub const FORBIDDEN: &str = "forbidden";
    pub const ENQUEUE_ERROR: &str = "enqueue_error";
    pub const SERIALIZATION_ERROR: &str = "serialization_error";
    pub const TRIGGER_TYPE_NOT_FOUND: &str = "trigger_type_not_found";
    pub const INVALID_MESSAGE: &str = "invalid_message";
    pub const VERSION_CONFLICT: &str = "version_conflict";
    pub const STORAGE_ERROR: &str = "storage_error";
    pub const GONE: &str = "gone";
    /// An answer too large for the transport (a deployed WebSocket message holds 128 KiB).
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
}

/// Namespaces only the engine serves: no connection, embedded worker or Lambda may register
/// (and so replace) a function in them.
pub const RESERVED_NAMESPACES: &[&str] = &["engine::", "iii::", "state::", "stream::"];

/// `Err(forbidden)` when `id` lies in a [`RESERVED_NAMESPACES`] namespace.
pub fn check_not_reserved(id: &str) -> Result<(), ErrorBody> {
    match RESERVED_NAMESPACES.iter().find(|ns| id.starts_with(**ns)) {
        Some(ns) => Err(ErrorBody::new(
            codes::FORBIDDEN,
            format!("`{id}` is in the engine's own namespace `{ns}*`, which cannot be registered"),
        )),
        None => Ok(()),
    }
}

/// `{code, message, stacktrace?}`: the error half of every answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacktrace: Option<String>,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            stacktrace: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_MESSAGE, message)
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorBody {}

/// What the engine does with an invocation instead of answering it synchronously.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Action {
    /// Put the invocation on a named queue; the engine answers at once with `{message_receipt_id}`.
    Enqueue {
        queue: String,
        /// Explicit FIFO group; otherwise the queue's `message_group_field` is read from `data`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_group_id: Option<String>,
        /// Deterministic deduplication id (a second enqueue with the same id within the
        /// dedup window is accepted but not stored twice).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deduplication_id: Option<String>,
    },
    /// Fire and forget: no answer, even with an `invocation_id`.
    Void,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterFunction {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

impl RegisterFunction {
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            description: None,
            request_format: None,
            response_format: None,
            metadata: None,
        }
    }

    /// Mark the function as for humans and the harness only (`metadata.agent: false`): the
    /// turn orchestrator never dispatches it for the model, whatever the policy answers.
    pub fn not_for_the_agent(self) -> Self {
        self.with_flag(AGENT_FLAG, false)
    }

    /// `metadata.<flag> = value`, keeping the rest of the metadata.
    fn with_flag(mut self, flag: &str, value: bool) -> Self {
        let mut meta = match self.metadata.take() {
            Some(Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        meta.insert(flag.into(), Value::Bool(value));
        self.metadata = Some(Value::Object(meta));
        self
    }

    /// Mark the function callable by client credentials (`metadata.public = true`).
    pub fn public(self) -> Self {
        self.with_flag(PUBLIC_FLAG, true)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterTrigger {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    #[serde(default)]
    pub config: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InvokeFunction {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    pub function_id: String,
    #[serde(default)]
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Per-call override of the engine's default call timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The caller takes an answer too large for one message in [`ResultPart`]s (the deployed
    /// WebSocket API's 128 KB). Only `true` asks; the embedded engine answers whole anyway.
    #[serde(
        default,
        deserialize_with = "only_true",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub accept_parts: bool,
}

/// A flag that only `true` sets: any other value reads as not set, not as an error (as the
/// deployed router reads `accept_parts`).
fn only_true<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Value::deserialize(d)? == Value::Bool(true))
}

/// `type` of a [`ResultPart`].
pub const RESULT_PART_TYPE: &str = "invocationresultpart";
/// The most parts one answer comes in.
pub const RESULT_PARTS_MAX: u32 = 128;

/// Engine → a caller that set `accept_parts`: one slice of the JSON text of an
/// `invocationresult` too large for one message. The slices, joined in `index` order, are
/// that message. Only the deployed WebSocket API sends them (PROTOCOL.md), so this is not a
/// [`Message`] the embedded engine takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultPart {
    pub invocation_id: String,
    pub index: u32,
    pub count: u32,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InvocationResult {
    pub invocation_id: String,
    pub function_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
}

/// Every message of the protocol. `type` carries the lower-case variant name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Message {
    WorkerRegistered {
        worker_id: String,
    },
    RegisterFunction(RegisterFunction),
    UnregisterFunction {
        id: String,
    },
    RegisterTrigger(RegisterTrigger),
    UnregisterTrigger {
        id: String,
    },
    TriggerRegistrationResult {
        id: String,
        trigger_type: String,
        function_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorBody>,
    },
    InvokeFunction(InvokeFunction),
    InvocationResult(InvocationResult),
    Ping,
    Pong,
    /// Engine → client: a message that could not be handled and has no invocation to answer.
    Error {
        error: ErrorBody,
        /// The `type` of the offending message, when it had one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_reply_to: Option<String>,
    },
    /// Client → engine: receive pushes of a stream group (browsers, CLIs).
    StreamSubscribe {
        stream_name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group_id: Option<String>,
        /// The client also takes `streamevents`: several events of one write in one message.
        /// The engine may still send any event alone (the embedded engine always does).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        batch: bool,
    },
    StreamUnsubscribe {
        stream_name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group_id: Option<String>,
    },
    /// Engine → client: one stream event for a subscription.
    StreamEvent {
        stream_name: String,
        group_id: String,
        item_id: String,
        event: StreamEventBody,
    },
    /// Engine → a client subscribed with `batch`: events of one stream group from one write,
    /// in the order written (the deployed shape: one post instead of one per event).
    StreamEvents {
        stream_name: String,
        group_id: String,
        events: Vec<BatchedStreamEvent>,
    },
    /// Engine → client: a server push (`engine::connections::post`, the `@connections` model).
    Push {
        data: Value,
    },
}

/// One event of a `streamevents` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchedStreamEvent {
    pub item_id: String,
    pub event: StreamEventBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEventBody {
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: Value,
}

impl Message {
    pub fn to_json(&self) -> String {
        // Serializing these types cannot fail: every field is a String, number, or Value.
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!(
                r#"{{"type":"error","error":{{"code":"serialization_error","message":"{e}"}}}}"#
            )
        })
    }
}

/// Why a frame could not be turned into a [`Message`], with what the engine can still answer.
#[derive(Debug, Clone)]
pub struct ParseFailure {
    pub error: ErrorBody,
    /// The `type` field, if the frame had a readable one.
    pub message_type: Option<String>,
    /// For a broken `invokefunction`, its `invocation_id` so the caller gets a matched answer.
    pub invocation_id: Option<String>,
    pub function_id: Option<String>,
}

const KNOWN_TYPES: &[&str] = &[
    "workerregistered",
    "registerfunction",
    "unregisterfunction",
    "registertrigger",
    "unregistertrigger",
    "triggerregistrationresult",
    "invokefunction",
    "invocationresult",
    "ping",
    "pong",
    "error",
    "streamsubscribe",
    "streamunsubscribe",
    "streamevent",
    "streamevents",
    "push",
];

/// Parse one text frame. Errors name the problem: invalid JSON, a missing or unknown `type`,
/// or the missing/mistyped field.
pub fn parse(text: &str) -> Result<Message, Box<ParseFailure>> {
    if let Some(msg) = parse_call_frame(text) {
        return Ok(msg);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Box::new(ParseFailure {
            error: ErrorBody::invalid(format!("malformed JSON: {e}")),
            message_type: None,
            invocation_id: None,
            function_id: None,
        })
    })?;
    parse_value(value)
}

/// The two messages of every call (`invokefunction`, `invocationresult`) read straight into
/// their types in one pass. The general path reads a tree first and then the tagged enum
/// (which buffers the tree once more): three copies of every payload, a tenth of the engine's
/// CPU under load. `None` sends the frame down the general path, which accepts the same
/// frames (a field of the other message is ignored there as here) and names what is wrong
/// with the rest, duplicate keys included.
fn parse_call_frame(text: &str) -> Option<Message> {
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum CallType {
        InvokeFunction,
        InvocationResult,
    }
    #[derive(Deserialize)]
    struct CallFrame {
        #[serde(rename = "type")]
        ty: CallType,
        invocation_id: Option<String>,
        function_id: String,
        #[serde(default)]
        data: Value,
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<ErrorBody>,
        #[serde(default)]
        traceparent: Option<String>,
        #[serde(default)]
        baggage: Option<String>,
        #[serde(default)]
        action: Option<Action>,
        #[serde(default)]
        timeout_ms: Option<u64>,
        #[serde(default, deserialize_with = "only_true")]
        accept_parts: bool,
    }
    let f: CallFrame = serde_json::from_str(text).ok()?;
    Some(match f.ty {
        CallType::InvokeFunction => Message::InvokeFunction(InvokeFunction {
            invocation_id: f.invocation_id,
            function_id: f.function_id,
            data: f.data,
            traceparent: f.traceparent,
            baggage: f.baggage,
            action: f.action,
            timeout_ms: f.timeout_ms,
            accept_parts: f.accept_parts,
        }),
        CallType::InvocationResult => Message::InvocationResult(InvocationResult {
            invocation_id: f.invocation_id?,
            function_id: f.function_id,
            result: f.result,
            error: f.error,
            traceparent: f.traceparent,
            baggage: f.baggage,
        }),
    })
}

pub fn parse_value(value: Value) -> Result<Message, Box<ParseFailure>> {
    let fail = |msg: String, ty: Option<String>, v: &Value| {
        Box::new(ParseFailure {
            error: ErrorBody::invalid(msg),
            message_type: ty,
            invocation_id: v
                .get("invocation_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            function_id: v
                .get("function_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    };
    let Some(obj) = value.as_object() else {
        return Err(fail(
            format!("a message must be a JSON object, got {}", kind_of(&value)),
            None,
            &Value::Null,
        ));
    };
    let ty = match obj.get("type") {
        None => return Err(fail("missing field `type`".into(), None, &value)),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(fail(
                format!("field `type` must be a string, got {}", kind_of(other)),
                None,
                &value,
            ));
        }
    };
    if !KNOWN_TYPES.contains(&ty.as_str()) {
        return Err(fail(
            format!("unknown message type `{ty}`"),
            Some(ty),
            &value,
        ));
    }
    let ids = (
        value
            .get("invocation_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        value
            .get("function_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
    );
    serde_json::from_value::<Message>(value).map_err(|e| {
        Box::new(ParseFailure {
            error: ErrorBody::invalid(format!("invalid `{ty}` message: {e}")),
            message_type: Some(ty),
            invocation_id: ids.0,
            function_id: ids.1,
        })
    })
}

pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_accept_parts_true_asks_for_parts_and_nothing_else_is_an_error() {
        let asks = |extra: &str| {
            let text = format!(
                r#"{{"type":"invokefunction","invocation_id":"i1","function_id":"a::b"{extra}}}"#
            );
            let Ok(Message::InvokeFunction(inv)) = parse(&text) else {
                panic!("{text} is an invocation");
            };
            let general = parse_value(serde_json::from_str(&text).unwrap());
            assert_eq!(
                general.ok(),
                Some(Message::InvokeFunction(inv.clone())),
                "both paths read {text} alike"
            );
            inv.accept_parts
        };
        assert!(asks(r#","accept_parts":true"#));
        for other in [
            "",
            r#","accept_parts":false"#,
            r#","accept_parts":"true""#,
            r#","accept_parts":1"#,
            r#","accept_parts":null"#,
            r#","accept_parts":[true]"#,
            r#","accept_parts":{"a":true}"#,
        ] {
            assert!(!asks(other), "{other}");
        }
        let mut inv = InvokeFunction {
            invocation_id: None,
            function_id: "a::b".into(),
            data: Value::Null,
            traceparent: None,
            baggage: None,
            action: None,
            timeout_ms: None,
            accept_parts: false,
        };
        assert!(
            !Message::InvokeFunction(inv.clone())
                .to_json()
                .contains("accept_parts")
        );
        inv.accept_parts = true;
        assert!(
            Message::InvokeFunction(inv)
                .to_json()
                .contains(r#""accept_parts":true"#)
        );
    }

    #[test]
    fn round_trips_every_example() {
        let examples = vec![
            json!({"type":"workerregistered","worker_id":"w1"}),
            json!({"type":"registerfunction","id":"a::b","description":"d","request_format":{"type":"object"}}),
            json!({"type":"unregisterfunction","id":"a::b"}),
            json!({"type":"registertrigger","id":"t1","trigger_type":"state","function_id":"a::b","config":{"scope":"s"}}),
            json!({"type":"unregistertrigger","id":"t1"}),
            json!({"type":"triggerregistrationresult","id":"t1","trigger_type":"state","function_id":"a::b"}),
            json!({"type":"invokefunction","invocation_id":"i1","function_id":"a::b","data":{"x":1},"action":{"type":"enqueue","queue":"q"}}),
            json!({"type":"invokefunction","function_id":"a::b","data":null,"action":{"type":"void"}}),
            json!({"type":"invocationresult","invocation_id":"i1","function_id":"a::b","result":{"ok":true}}),
            json!({"type":"invocationresult","invocation_id":"i1","function_id":"a::b","error":{"code":"timeout","message":"m"}}),
            json!({"type":"ping"}),
            json!({"type":"pong"}),
        ];
        for ex in examples {
            let msg = parse(&ex.to_string()).expect("parses");
            let back: Value = serde_json::from_str(&msg.to_json()).expect("json");
            assert_eq!(back, ex);
        }
    }

    #[test]
    fn call_frames_read_as_the_general_path_reads_them() {
        let general = |t: &str| {
            serde_json::from_str::<Value>(t)
                .map_err(|e| e.to_string())
                .and_then(|v| parse_value(v).map_err(|e| e.error.message))
        };
        let frames = [
            r#"{"type":"invokefunction","invocation_id":"i1","function_id":"a::b","data":{"x":[1,2.5,"s"]}}"#,
            r#"{"type":"invokefunction","function_id":"a::b"}"#,
            r#"{"type":"invokefunction","function_id":"a::b","data":null,"action":{"type":"void"},"timeout_ms":5}"#,
            r#"{"type":"invokefunction","function_id":"a::b","traceparent":"00-x","baggage":"k=v","result":7}"#,
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"a::b","result":null}"#,
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"a::b","error":{"code":"c","message":"m"},"data":[1]}"#,
            // Fields of the other message, even ill-typed ones, are ignored as before.
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"a::b","action":{"type":"nope"}}"#,
            // Duplicate keys: the general path keeps the last.
            r#"{"type":"invokefunction","function_id":"a::b","function_id":"c::d"}"#,
            r#"{"type":"invocationresult","type":"invokefunction","function_id":"a::b"}"#,
            // Broken ones: the same named errors.
            r#"{"type":"invocationresult","function_id":"a::b"}"#,
            r#"{"type":"invokefunction","invocation_id":"i1","function_id":7}"#,
            r#"{"type":"invokefunction","function_id":"a::b","timeout_ms":-1}"#,
            r#"{"type":"invokefunction","function_id":"a::b","action":{"type":"enqueue"}}"#,
        ];
        for f in frames {
            let fast = parse(f).map_err(|e| e.error.message);
            assert_eq!(fast, general(f), "{f}");
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let e = parse("{nope").unwrap_err();
        assert!(e.error.message.contains("malformed JSON"), "{}", e.error);
        let e = parse("[1]").unwrap_err();
        assert!(e.error.message.contains("JSON object"), "{}", e.error);
        let e = parse(r#"{"type":"frobnicate"}"#).unwrap_err();
        assert!(e.error.message.contains("frobnicate"), "{}", e.error);
        let e = parse(r#"{"type":"invokefunction","invocation_id":"i9"}"#).unwrap_err();
        assert!(e.error.message.contains("function_id"), "{}", e.error);
        assert_eq!(e.invocation_id.as_deref(), Some("i9"));
        let e = parse(r#"{"type":"registerfunction","id":7}"#).unwrap_err();
        assert!(e.error.message.contains("invalid type"), "{}", e.error);
        let e = parse(r#"{"id":"x"}"#).unwrap_err();
        assert!(e.error.message.contains("`type`"), "{}", e.error);
    }
}
