//! Wire contracts of `harness::trigger` and the UI plane.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `harness::trigger`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TriggerRequest {
    /// Default: the payload's, else a new one.
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub message_id: Option<String>,
    /// The `run::start` request (fields it leaves out come from the harness's run defaults).
    pub payload: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TriggerAnswer {
    /// 200: started; 409: a run is live on the session.
    pub status_code: u16,
    /// `run::start`'s answer.
    pub body: Value,
}

/// `ui::subscribe`, `ui::unsubscribe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UiRequest {
    pub browser_id: String,
    /// null: every session.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UiAnswer {
    pub ok: bool,
    pub browser_id: String,
    /// Pushed every session's events.
    pub all: bool,
    pub sessions: Vec<String>,
}

/// `ui::history {session_id}`: what a console needs to draw a session's tool calls after a
/// reload, from its stored events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryRequest {
    pub session_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryAnswer {
    /// The stored `function_execution_start`, `function_execution_end`, `approval_applied`
    /// and `model_fallback` events, oldest first (the latest [`crate::HISTORY_EVENTS`]).
    pub events: Vec<Value>,
    /// Older ones were left out.
    pub truncated: bool,
}
