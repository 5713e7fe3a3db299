//! The system prompt: the mode paragraph, the identity preamble (how to call functions through
//! the single `agent_trigger` tool, fetch a skill before first use, never guess IDs), the
//! working directory and the default skills index; or the caller's `system_prompt`, verbatim.

use harness_sdk::messages::ToolSpec;
use serde_json::{Value, json};

pub fn mode_paragraph(mode: &str) -> &'static str {
    match mode {
        "plan" => {
            "Mode: plan. Investigate and propose a plan; do not change anything. Only functions the policy marks read-only run in this mode; any other call is denied."
        }
        "ask" => {
            "Mode: ask. Answer the user's question; call functions only to look things up. Every call waits for the user's approval."
        }
        _ => {
            "Mode: agent. Carry out the user's task end to end, calling functions as needed, and report what you did."
        }
    }
}

pub const IDENTITY: &str = "You work through a bus of functions. Call any of them with the single tool `agent_trigger` and arguments {\"function\": \"<function id>\", \"payload\": {...}}. Use only function ids listed in the tool's description; never guess an id. Before you use a function for the first time, fetch its skill with agent_trigger {\"function\": \"directory::skills::get\", \"payload\": {\"id\": \"iii://<worker>/<function>\"}} when one exists. A call may be denied by policy or wait for a human's approval; a denial comes back as a result with status \"denied\": do not retry it, explain or find another way.";

/// The agent's working directory, as the file and shell functions see it.
pub fn workdir_paragraph(workdir: &str) -> String {
    format!(
        "Your working directory is `{workdir}`: fs::* paths are relative to it and shell::exec runs in it; nothing outside it is reachable."
    )
}

pub fn system_prompt(mode: &str, skills_index: Option<&str>, workdir: Option<&str>) -> String {
    let mut s = format!("{}\n\n{IDENTITY}", mode_paragraph(mode));
    if let Some(w) = workdir.filter(|w| !w.is_empty()) {
        s.push_str("\n\n");
        s.push_str(&workdir_paragraph(w));
    }
    if let Some(idx) = skills_index.filter(|s| !s.trim().is_empty()) {
        s.push_str("\n\nSkills available:\n");
        s.push_str(idx);
    }
    s
}

/// Functions the agent is never shown (internal plumbing; the policy denies most anyway).
fn hidden(id: &str) -> bool {
    id.starts_with("engine::")
        || id.starts_with("iii::")
        || id.starts_with("turn::")
        || id.starts_with("run::")
        || id.starts_with("provider::")
        || id.starts_with("stream::")
        || id.starts_with("ui::")
}

/// The `agent_trigger` tool, describing the live catalogue of functions.
pub fn agent_trigger_tool(catalogue: &Value) -> ToolSpec {
    let mut lines = Vec::new();
    if let Some(fns) = catalogue["functions"].as_array() {
        for f in fns {
            let Some(id) = f["function_id"].as_str() else {
                continue;
            };
            if hidden(id) {
                continue;
            }
            let desc = f["description"].as_str().unwrap_or("");
            lines.push(format!("- {id}: {desc}"));
            if lines.len() >= 200 {
                break;
            }
        }
    }
    ToolSpec {
        name: crate::types::AGENT_TRIGGER.into(),
        description: format!(
            "Call a function on the bus. Functions:\n{}",
            lines.join("\n")
        ),
        parameters: json!({
            "type": "object",
            "required": ["function"],
            "properties": {
                "function": {"type": "string", "description": "The function id"},
                "payload": {"type": "object", "description": "The function's request"}
            }
        }),
    }
}
