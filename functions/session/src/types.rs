//! Wire contracts of the session store (SPEC §3 session).

use harness_sdk::messages::ContentBlock;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `<sid>` → [`SessionMeta`]; `<sid>/<entry_id>` → [`Entry`] (the layout a caller may carry
/// an append in, `harness_sdk::session_layout`).
pub use harness_sdk::session_layout::{ENTRIES, INBOX, INDEX, entry_key};
/// A fork copies at most this many entries of the path; older ones become one summary root.
pub const FORK_COPY_LIMIT: usize = 50;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The entry the last one-transaction append created, written only in the transaction
    /// that creates it (so it names an entry that exists). An append after it that comes with
    /// the index it was answered (`index_seen`) reads neither the index nor its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_entry: Option<String>,
}

// ------------------------------------------------------------------ requests and answers

/// Where an append attaches: absent → the current leaf; null → a new root; an id → that entry.
type ParentField = Option<Value>;

pub use harness_sdk::contracts::session_tree::{
    AppendBatchAnswer, AppendBatchRequest, Entry, EntryBody, EntryInput, StoredEntry,
};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SessionRef {
    /// Non-empty, without `/`.
    pub session_id: String,
}

/// `session-tree::create`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CreateRequest {
    /// Default: generated.
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub metadata: Value,
}

/// `session-tree::create`, `session-tree::ensure`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SessionAnswer {
    pub session_id: String,
    /// False: it existed already.
    pub created: bool,
    pub session: SessionMeta,
}

/// `session-tree::append`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AppendRequest {
    pub session_id: String,
    pub entry: EntryInput,
    #[serde(default)]
    #[schemars(with = "Option<Option<String>>")]
    pub parent_id: ParentField,
}

/// `session-tree::fork`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ForkRequest {
    pub source_session_id: String,
    pub from_entry_id: String,
    #[serde(default)]
    pub new_session_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ForkAnswer {
    pub session_id: String,
    pub leaf_id: Option<String>,
    pub copied: u64,
    /// Older entries folded into one branch_summary root.
    #[serde(default)]
    pub summarized: u64,
}

/// `session-tree::clone`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CloneRequest {
    pub source_session_id: String,
    #[serde(default)]
    pub new_session_id: Option<String>,
}

/// `session-tree::compact`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CompactRequest {
    pub session_id: String,
    pub summary: String,
    /// An entry on the path: the context keeps it and what follows.
    #[serde(default)]
    pub tail_start_id: Option<String>,
    #[serde(default)]
    pub tokens_before: u64,
    #[serde(default)]
    pub details: Value,
    #[serde(default)]
    #[schemars(with = "Option<Option<String>>")]
    pub parent_id: ParentField,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CompactionsAnswer {
    pub compactions: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TreeNode {
    pub id: String,
    pub parent_id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub children: Vec<String>,
    pub label: String,
}

/// `session-tree::tree`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TreeAnswer {
    pub leaf_id: Option<String>,
    pub entries: Vec<TreeNode>,
}

/// `session-tree::list`: every session, or one page of them (`limit`, from `offset`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ListRequest {
    /// At most this many (1 to 500); absent: all of them.
    #[serde(default)]
    pub limit: Option<u64>,
    /// How many of the newest to skip.
    #[serde(default)]
    pub offset: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListAnswer {
    pub sessions: Vec<SessionMeta>,
    /// How many sessions there are in all.
    #[serde(default)]
    pub total: u64,
    /// The `offset` of the next page, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
}

/// `session-tree::export_html`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExportRequest {
    pub session_id: String,
    #[serde(default)]
    pub leaf_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExportAnswer {
    pub html: String,
    pub leaf_id: Option<String>,
}

/// `session-tree::update_part`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct UpdatePartRequest {
    pub session_id: String,
    pub entry_id: String,
    pub part_index: u64,
    pub part: ContentBlock,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct UpdatePartAnswer {
    pub ok: bool,
    pub entry: Entry,
}
