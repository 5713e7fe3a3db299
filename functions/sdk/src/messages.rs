//! Shared message types (SPEC §2): `AgentMessage`, `ContentBlock`, usage, stop reasons, and
//! the provider stream events (`AssistantMessageEvent`), plus `AssistantBuilder`, which
//! merges events into the assistant message (each progress event carries that `partial`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache_read: u64,
    #[serde(default)]
    pub cache_write: u64,
    #[serde(default)]
    pub cost_usd: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    End,
    Length,
    FunctionCall,
    Aborted,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No credentials at all for the provider (none stored, no key variable).
    AuthMissing,
    AuthExpired,
    RateLimited,
    ContextOverflow,
    Transient,
    Permanent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    Image {
        mime: String,
        data: String,
    },
    FunctionCall {
        id: String,
        function_id: String,
        arguments: Value,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum AgentMessage {
    User {
        content: Vec<ContentBlock>,
        timestamp: u64,
    },
    Assistant {
        content: Vec<ContentBlock>,
        stop_reason: StopReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_message: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<ErrorKind>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
        model: String,
        provider: String,
        timestamp: u64,
    },
    FunctionResult {
        function_call_id: String,
        function_id: String,
        content: Vec<ContentBlock>,
        #[serde(default)]
        details: Value,
        is_error: bool,
        timestamp: u64,
    },
    Custom {
        custom_type: String,
        content: Vec<ContentBlock>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        display: Option<String>,
        #[serde(default)]
        details: Value,
        timestamp: u64,
    },
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments.
    #[serde(default)]
    pub parameters: Value,
}

/// One frame on a provider channel (SPEC §2 provider stream events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssistantMessageEvent {
    Start {
        partial: AgentMessage,
    },
    TextStart {
        partial: AgentMessage,
    },
    TextDelta {
        delta: String,
        partial: AgentMessage,
    },
    TextEnd {
        partial: AgentMessage,
    },
    ThinkingStart {
        partial: AgentMessage,
    },
    ThinkingDelta {
        delta: String,
        partial: AgentMessage,
    },
    ThinkingEnd {
        partial: AgentMessage,
    },
    FunctioncallStart {
        partial: AgentMessage,
    },
    FunctioncallDelta {
        delta: String,
        partial: AgentMessage,
    },
    FunctioncallEnd {
        partial: AgentMessage,
    },
    Usage {
        usage: Usage,
    },
    Stop {
        stop_reason: StopReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_message: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<ErrorKind>,
    },
    Done {
        message: AgentMessage,
    },
    Error {
        error: AgentMessage,
    },
}

pub fn now_ms() -> u64 {
    bus_telemetry::trace::now_ms()
}

pub fn user_text(text: &str) -> AgentMessage {
    AgentMessage::User {
        content: vec![ContentBlock::Text {
            text: text.to_string(),
        }],
        timestamp: now_ms(),
    }
}

/// Builds the assistant message from stream events, as the events are emitted.
#[derive(Debug, Clone)]
pub struct AssistantBuilder {
    pub content: Vec<ContentBlock>,
    pub usage: Usage,
    pub model: String,
    pub provider: String,
    /// Raw JSON text of the function call being streamed (its arguments).
    args_buf: String,
    timestamp: u64,
}

impl AssistantBuilder {
    pub fn new(provider: &str, model: &str) -> Self {
        Self {
            content: Vec::new(),
            usage: Usage::default(),
            model: model.to_string(),
            provider: provider.to_string(),
            args_buf: String::new(),
            timestamp: now_ms(),
        }
    }

    pub fn message(
        &self,
        stop_reason: StopReason,
        error: Option<(ErrorKind, String)>,
    ) -> AgentMessage {
        AgentMessage::Assistant {
            content: self.content.clone(),
            stop_reason,
            error_message: error.as_ref().map(|e| e.1.clone()),
            error_kind: error.map(|e| e.0),
            usage: Some(self.usage.clone()),
            model: self.model.clone(),
            provider: self.provider.clone(),
            timestamp: self.timestamp,
        }
    }

    /// The in-progress message carried by progress events.
    pub fn partial(&self) -> AgentMessage {
        self.message(StopReason::End, None)
    }

    pub fn start_text(&mut self) {
        self.content.push(ContentBlock::Text {
            text: String::new(),
        });
    }

    pub fn push_text(&mut self, delta: &str) {
        match self.content.last_mut() {
            Some(ContentBlock::Text { text }) => text.push_str(delta),
            _ => self.content.push(ContentBlock::Text {
                text: delta.to_string(),
            }),
        }
    }

    pub fn start_thinking(&mut self) {
        self.content.push(ContentBlock::Thinking {
            text: String::new(),
            signature: None,
        });
    }

    pub fn push_thinking(&mut self, delta: &str) {
        match self.content.last_mut() {
            Some(ContentBlock::Thinking { text, .. }) => text.push_str(delta),
            _ => self.content.push(ContentBlock::Thinking {
                text: delta.to_string(),
                signature: None,
            }),
        }
    }

    pub fn set_signature(&mut self, sig: &str) {
        if let Some(ContentBlock::Thinking { signature, .. }) = self.content.last_mut() {
            *signature = Some(sig.to_string());
        }
    }

    pub fn start_call(&mut self, id: &str, function_id: &str) {
        self.args_buf.clear();
        self.content.push(ContentBlock::FunctionCall {
            id: id.to_string(),
            function_id: function_id.to_string(),
            arguments: Value::Object(Default::default()),
        });
    }

    pub fn push_call_args(&mut self, delta: &str) {
        self.args_buf.push_str(delta);
    }

    /// Parse the streamed arguments of the current call; invalid JSON is an error the
    /// provider reports (never a panic).
    pub fn end_call(&mut self) -> Result<(), String> {
        let raw = std::mem::take(&mut self.args_buf);
        let parsed: Value = if raw.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(&raw)
                .map_err(|e| format!("function call arguments are not valid JSON: {e}"))?
        };
        if let Some(ContentBlock::FunctionCall { arguments, .. }) = self.content.last_mut() {
            *arguments = parsed;
        }
        Ok(())
    }

    pub fn has_calls(&self) -> bool {
        self.content
            .iter()
            .any(|c| matches!(c, ContentBlock::FunctionCall { .. }))
    }
}

/// The hash an approval is bound to: SHA-256 of the arguments' JSON with keys sorted (the
/// form `serde_json` writes), hex. The same call always hashes the same; any change to the
/// arguments changes it.
pub fn args_hash(args: &Value) -> String {
    use sha2::{Digest, Sha256};
    ::bus::hash::hex(&Sha256::digest(args.to_string().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_shapes_follow_the_spec() {
        let m = AgentMessage::FunctionResult {
            function_call_id: "c1".into(),
            function_id: "fs::read".into(),
            content: vec![ContentBlock::Text { text: "x".into() }],
            details: json!({}),
            is_error: false,
            timestamp: 1,
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["role"], "function_result");
        assert_eq!(v["content"][0]["type"], "text");
        let e = AssistantMessageEvent::TextDelta {
            delta: "hi".into(),
            partial: user_text("x"),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "text_delta");
        let e = AssistantMessageEvent::Stop {
            stop_reason: StopReason::FunctionCall,
            error_message: None,
            error_kind: None,
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"type": "stop", "stop_reason": "function_call"})
        );
        let call = ContentBlock::FunctionCall {
            id: "1".into(),
            function_id: "f".into(),
            arguments: json!({"a": 1}),
        };
        assert_eq!(
            serde_json::to_value(&call).unwrap()["type"],
            "function_call"
        );
    }

    #[test]
    fn builder_merges_deltas_and_parses_arguments() {
        let mut b = AssistantBuilder::new("openai", "gpt-5.4");
        b.start_text();
        b.push_text("Hel");
        b.push_text("lo");
        b.start_call("c1", "agent_trigger");
        b.push_call_args("{\"function\":");
        b.push_call_args("\"fs::read\"}");
        b.end_call().unwrap();
        assert_eq!(
            b.content[0],
            ContentBlock::Text {
                text: "Hello".into()
            }
        );
        assert_eq!(
            b.content[1],
            ContentBlock::FunctionCall {
                id: "c1".into(),
                function_id: "agent_trigger".into(),
                arguments: json!({"function": "fs::read"})
            }
        );
        b.start_call("c2", "x");
        b.push_call_args("{broken");
        assert!(b.end_call().unwrap_err().contains("not valid JSON"));
    }
}
