//! Wire contracts of the session store (SPEC §3 session).

use harness_sdk::messages::{AgentMessage, ContentBlock};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `<sid>` → [`SessionMeta`].
pub const INDEX: &str = "session-index";
/// `<sid>/<entry_id>` → [`Entry`].
pub const ENTRIES: &str = "session-entries";
/// `<sid>/<name>` → `{items: [...]}`.
pub const INBOX: &str = "session-inbox";
/// A fork copies at most this many entries of the path; older ones become one summary root.
pub const FORK_COPY_LIMIT: usize = 50;

pub fn entry_key(sid: &str, entry_id: &str) -> String {
    format!("{sid}/{entry_id}")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionMeta {
    pub session_id: String,
    pub created_at_ms: u64,
    #[serde(default)]
    pub updated_at_ms: u64,
    /// Allocation counter for entry `seq` numbers (the newest entry has the highest).
    #[serde(default)]
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `{session_id, entry_id, mode: fork|clone}` when copied from another session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_from: Option<Value>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
}

/// One node of the tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub parent_id: Option<String>,
    pub timestamp: u64,
    /// Order of creation within the session (ties in `timestamp` are common).
    #[serde(default)]
    pub seq: u64,
    #[serde(flatten)]
    pub body: EntryBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryBody {
    Message {
        message: AgentMessage,
    },
    CustomMessage {
        custom_type: String,
        #[serde(default)]
        content: Vec<ContentBlock>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        display: Option<String>,
        #[serde(default)]
        details: Value,
    },
    /// Stands for the part of a path a fork did not copy.
    BranchSummary {
        summary: String,
        #[serde(default)]
        entries_summarized: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_session_id: Option<String>,
    },
    /// Everything on the path before `tail_start_id` is replaced by `summary` in the context.
    Compaction {
        summary: String,
        #[serde(default)]
        tail_start_id: Option<String>,
        #[serde(default)]
        tokens_before: u64,
        #[serde(default)]
        details: Value,
    },
}

impl EntryBody {
    pub fn kind(&self) -> &'static str {
        match self {
            EntryBody::Message { .. } => "message",
            EntryBody::CustomMessage { .. } => "custom_message",
            EntryBody::BranchSummary { .. } => "branch_summary",
            EntryBody::Compaction { .. } => "compaction",
        }
    }
}

/// An entry as a caller hands it in: `id` (deterministic ids make appends idempotent) and
/// `parent_id` are optional.
#[derive(Debug, Clone, Deserialize)]
pub struct EntryInput {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub timestamp: Option<u64>,
    #[serde(flatten)]
    pub body: EntryBody,
}
