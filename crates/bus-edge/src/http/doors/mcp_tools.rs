//! The MCP door's tools: their schemas, argument checks, and the answer every tool gives.

use serde_json::{Value, json};

use crate::http::api::check_id;

/// What every tool answers: `structuredContent` against this schema.
pub(super) fn schema_answer() -> Value {
    json!({"type": "object", "required": ["session_id", "state", "text", "pending"], "properties": {
        "session_id": {"type": "string"},
        "state": {"type": "string", "enum": ["answered", "awaiting_approval", "aborted", "failed", "running"]},
        "text": {"type": "string"},
        "pending": {"type": "array", "items": {"type": "object", "required": ["function_call_id", "function_id"], "properties": {
            "function_call_id": {"type": "string"}, "function_id": {"type": "string"}, "args": {}}}}}})
}

/// The door's tools, with their input and output schemas.
pub(super) fn tools() -> Value {
    let sid = json!({"type": "string", "pattern": "^[A-Za-z0-9_.:@-]{1,128}$"});
    json!([
        {"name": "run_agent", "title": "Run the agent",
         "description": "Run one turn of the harness's agent with this message (in session_id's conversation, or a new one) and answer its final text, or the calls that wait for approval.",
         "inputSchema": {"type": "object", "required": ["message"], "additionalProperties": false, "properties": {
             "message": {"type": "string", "minLength": 1}, "session_id": sid,
             "provider": {"type": "string"}, "model": {"type": "string"}}},
         "outputSchema": schema_answer()},
        {"name": "get_session", "title": "Read a session",
         "description": "A session's state, its last answer and the calls that wait for approval.",
         "inputSchema": {"type": "object", "required": ["session_id"], "additionalProperties": false, "properties": {"session_id": sid}},
         "outputSchema": schema_answer()},
        {"name": "list_pending_approvals", "title": "Calls waiting for approval",
         "description": "Every call of your sessions that waits for a person's decision.",
         "inputSchema": {"type": "object", "additionalProperties": false, "properties": {}},
         "outputSchema": {"type": "object", "required": ["pending"], "properties": {"pending": {"type": "array", "items": {"type": "object", "properties": {
             "session_id": {"type": "string"}, "function_call_id": {"type": "string"}, "function_id": {"type": "string"}, "args": {}}}}}}},
        {"name": "resolve_approval", "title": "Decide a parked call",
         "description": "Allow or deny a call that waits for approval; the turn goes on, and its final text (or the next calls to decide) is answered.",
         "inputSchema": {"type": "object", "required": ["session_id", "function_call_id", "decision"], "additionalProperties": false, "properties": {
             "session_id": sid, "function_call_id": sid, "decision": {"enum": ["allow", "deny"]},
             "reason": {"type": "string", "maxLength": 2000}}},
         "outputSchema": schema_answer()},
    ])
}

/// A tool's failure: a result the model reads, not a protocol error.
pub(super) fn tool_error(message: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": message.into()}], "isError": true})
}

/// Check a call's arguments: only these names, each of its kind.
pub(super) fn check_args(args: &Value, allowed: &[&str]) -> Result<(), String> {
    let Some(map) = args.as_object() else {
        return Err("`arguments` must be an object".into());
    };
    if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "unknown argument `{k}` (takes {})",
            allowed.join(", ")
        ));
    }
    Ok(())
}

pub(super) fn opt_str(args: &Value, name: &str, max: usize) -> Result<Option<String>, String> {
    match &args[name] {
        Value::Null => Ok(None),
        Value::String(s) if !s.is_empty() && s.len() <= max => Ok(Some(s.clone())),
        _ => Err(format!("`{name}` must be a string of 1 to {max} bytes")),
    }
}

pub(super) fn id_arg(args: &Value, name: &str) -> Result<String, String> {
    let Some(v) = args[name].as_str() else {
        return Err(format!("`{name}` must be a string"));
    };
    check_id(name, v).map_err(|e| e.body.message)?;
    Ok(v.to_string())
}

/// What a turn came to, as every tool answers it.
pub(super) struct Outcome {
    pub sid: String,
    pub state: &'static str,
    pub text: String,
    pub pending: Vec<Value>,
}

impl Outcome {
    pub fn result(&self) -> Value {
        let mut shown = self.text.clone();
        match self.state {
            "awaiting_approval" => {
                for p in &self.pending {
                    shown.push_str(&format!(
                        "\n[{} ({}) waits for approval: call resolve_approval with session_id {}]",
                        p["function_id"].as_str().unwrap_or("?"),
                        p["function_call_id"].as_str().unwrap_or("?"),
                        self.sid
                    ));
                }
            }
            "aborted" => shown.push_str("\n[the turn was aborted]"),
            "failed" => shown.push_str("\n[the turn failed]"),
            _ => {}
        }
        json!({"content": [{"type": "text", "text": shown}],
               "structuredContent": {"session_id": self.sid, "state": self.state, "text": self.text, "pending": self.pending},
               "isError": self.state == "failed"})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_by_name() {
        assert!(check_args(&json!({"message": "x"}), &["message"]).is_ok());
        assert!(
            check_args(&json!({"mesage": "x"}), &["message"])
                .unwrap_err()
                .contains("`mesage`")
        );
        assert!(
            check_args(&json!([1]), &["message"])
                .unwrap_err()
                .contains("object")
        );
        assert!(
            id_arg(&json!({"session_id": "a/b"}), "session_id")
                .unwrap_err()
                .contains("session_id")
        );
        assert!(
            id_arg(&json!({"session_id": 5}), "session_id")
                .unwrap_err()
                .contains("string")
        );
        assert!(
            opt_str(&json!({"model": ""}), "model", 256)
                .unwrap_err()
                .contains("`model`")
        );
    }

    #[test]
    fn every_tool_has_both_schemas_and_an_object_input() {
        for t in tools().as_array().unwrap() {
            assert_eq!(t["inputSchema"]["type"], "object", "{t}");
            assert_eq!(t["outputSchema"]["type"], "object", "{t}");
        }
    }
}
