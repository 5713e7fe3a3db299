//! Wire contracts of the function IDs one worker calls on another (SPEC §3), as serde types
//! with JSON Schemas. The callee registers them ([`crate::DefExt::contract`]) so
//! `engine::functions::list` documents the function; the caller reads the answer into the
//! same type instead of indexing JSON. Each worker's `types` module re-exports its own.
//!
//! Fields a newer callee may add are ignored (no `deny_unknown_fields` on answers); requests
//! refuse what they do not know only where a typo would change the meaning.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `serde_json::from_value` with an error that names the contract.
/// The error names the field that is wrong (`mode: invalid type: integer `7`, expected a
/// string`), not only what was wrong with it.
pub fn parse<T: serde::de::DeserializeOwned>(what: &str, v: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "" | "." => format!("{what}: {}", e.inner()),
            _ => format!("{what}: `{path}`: {}", e.inner()),
        }
    })
}

/// The JSON Schema of `T`, as registered in `request_format` / `response_format`.
pub fn schema_of<T: JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
}

/// `provider::<name>::stream` and `provider::<name>::complete` (their request type is
/// `provider_core::StreamRequest`).
pub mod provider {
    use crate::messages::AgentMessage;
    use serde_json::Value;
    use std::sync::Arc;

    /// The request's conversation as an attachment: a provider in the caller's process reads
    /// it as it is, any other gets it as the payload's `messages` (the wire contract).
    pub fn messages_attachment(messages: Arc<Vec<AgentMessage>>) -> bus::Attachment {
        bus::Attachment::new(messages, |messages, payload| {
            if let Some(o) = payload.as_object_mut() {
                o.insert(
                    "messages".into(),
                    serde_json::to_value(messages).unwrap_or(Value::Null),
                );
            }
        })
    }
}

/// `policy::check_permissions`.
pub mod policy {
    use super::*;

    pub const CHECK: &str = "policy::check_permissions";

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct CheckRequest {
        pub function_id: String,
        #[serde(default)]
        pub args: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub session_id: Option<String>,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Decision {
        Allow,
        Deny,
        NeedsApproval,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct CheckAnswer {
        pub decision: Decision,
        /// The rule that decided (allow and deny).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub rule_id: Option<String>,
        /// That rule's human name (`name:` in the permissions file), for people to read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub rule_name: Option<String>,
        /// The argument constraint that made a deny.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub matched_constraint: Option<Value>,
        /// The allow rule opens the network to this call's sandbox.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub network: bool,
        /// What was allowed only reads (a rule's `read_only: true`, or a built-in read): a
        /// run in `plan` mode may call it, and nothing else.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub read_only: bool,
    }
}

/// `approval::resolve`, and the decision record it writes at `approvals/<sid>/<cid>`.
pub mod approval {
    use super::*;

    pub const RESOLVE: &str = "approval::resolve";

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Verdict {
        Allow,
        Deny,
        /// The call is not run: denied with its reason, as `deny` (the seeds' meaning); the
        /// batch and the run go on. `run::abort` stops a run.
        Aborted,
    }

    /// Unknown fields are ignored (SPEC): a newer or older caller's extras change nothing.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ResolveRequest {
        pub session_id: String,
        pub function_call_id: String,
        pub decision: Verdict,
        #[serde(default)]
        pub reason: Option<String>,
        #[serde(default)]
        pub decided_by: Option<String>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ResolveAnswer {
        pub ok: bool,
        /// `invalid_payload | not_pending | resume_failed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub message: Option<String>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ListPendingRequest {
        /// Only this session's parked calls.
        #[serde(default)]
        pub session_id: Option<String>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PendingCall {
        pub session_id: String,
        pub function_call_id: String,
        pub function_id: String,
        #[serde(default)]
        pub args: Value,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ListPendingAnswer {
        pub pending: Vec<PendingCall>,
    }

    /// What `approvals/<sid>/<cid>` holds. The seeds' record is `{decision, reason}` (`reason`
    /// absent or `null`), which an approval gate written to them writes; ours also binds the
    /// decision to the parked call (`function_id`, `args_hash`: when present they must match)
    /// and says who decided when. Call ids are unique within a session, so the key alone
    /// names one call; anything else in the record is ignored.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct DecisionRecord {
        pub decision: Verdict,
        #[serde(default, deserialize_with = "null_as_default")]
        pub reason: String,
        #[serde(default, deserialize_with = "null_as_default")]
        pub decided_by: String,
        #[serde(default, deserialize_with = "null_as_default")]
        pub decided_at: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub function_id: Option<String>,
        /// `messages::args_hash` of the call's arguments.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub args_hash: Option<String>,
    }

    /// `null` reads as the field's default (the seeds write `reason: null`).
    fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: serde::Deserializer<'de>,
        T: Default + Deserialize<'de>,
    {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }
}

/// `auth::get_token`.
pub mod auth {
    use super::*;

    pub const GET_TOKEN: &str = "auth::get_token";

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct GetTokenRequest {
        pub provider: String,
    }

    /// A credential (`null` when there is none). Its `Debug` never shows the secret.
    #[derive(Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Token {
        ApiKey {
            key: String,
        },
        Oauth {
            access_token: String,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            refresh_token: Option<String>,
            /// Unix milliseconds.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            expires_at: Option<u64>,
        },
    }

    // Never print a secret, even in a debug log.
    impl std::fmt::Debug for Token {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Token::ApiKey { .. } => f.write_str("Token::ApiKey { key: <redacted> }"),
                Token::Oauth { expires_at, .. } => write!(
                    f,
                    "Token::Oauth {{ <redacted>, expires_at: {expires_at:?} }}"
                ),
            }
        }
    }

    impl Token {
        /// What goes in the request's credential header.
        pub fn secret(&self) -> &str {
            match self {
                Token::ApiKey { key } => key,
                Token::Oauth { access_token, .. } => access_token,
            }
        }
    }

    pub type GetTokenAnswer = Option<Token>;

    /// `auth::set_token`: the provider and its credential.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct SetTokenRequest {
        pub provider: String,
        #[serde(flatten)]
        pub token: Token,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct SetTokenAnswer {
        pub ok: bool,
        pub provider: String,
    }

    /// `auth::delete_token`, `auth::status`.
    pub type ProviderRequest = GetTokenRequest;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct DeleteTokenAnswer {
        /// False: nothing was stored.
        pub deleted: bool,
        pub provider: String,
    }

    /// `auth::status` (never the secret).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct Status {
        pub provider: String,
        pub configured: bool,
        /// `stored | env | none`.
        pub source: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub expires_at: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub expired: Option<bool>,
    }

    /// `auth::list_providers` takes nothing.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ListProvidersRequest {}

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ListProvidersAnswer {
        pub providers: Vec<Status>,
    }
}

/// `budget::check`.
pub mod budget {
    use super::*;

    pub const CHECK: &str = "budget::check";

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct CheckRequest {
        pub budget_id: String,
        /// What the caller is about to spend.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub estimated_cost_usd: Option<f64>,
        /// Who spends (an exemption may let them through).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub principal_id: Option<String>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct CheckAnswer {
        pub budget_id: String,
        pub allowed: bool,
        pub remaining_usd: f64,
        pub spent_usd: f64,
        pub ceiling_usd: f64,
        /// Why not (or why despite the ceiling: exempt, not enforced, paused).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub reason: Option<String>,
    }
}

/// `hook-fanout::publish_collect`.
pub mod hooks {
    use super::*;

    pub const PUBLISH_COLLECT: &str = "hook-fanout::publish_collect";

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum MergeRule {
        FirstBlockWins,
        FieldMerge,
        PipelineLastWins,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PublishCollectRequest {
        pub topic: String,
        pub payload: Value,
        pub merge_rule: MergeRule,
        /// Default 10 000, at least 50.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub timeout_ms: Option<u64>,
        /// Default: every subscriber.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub expected_replies: Option<u64>,
        /// Default 200.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub quiescence_ms: Option<u64>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PublishCollectAnswer {
        #[serde(default)]
        pub event_id: String,
        #[serde(default)]
        pub replies: Vec<Value>,
        /// The replies merged by the rule.
        #[serde(default)]
        pub merged: Value,
        /// `{ok, failures?}`: how the publish itself went.
        #[serde(default)]
        pub publish: Value,
        /// Callers that gate on the hook treat this as a deny.
        #[serde(default)]
        pub publish_failed: bool,
    }
}

/// `context-compaction::compact_now` (and `compact_session`).
pub mod compaction {
    use super::*;

    pub const COMPACT_NOW: &str = "context-compaction::compact_now";

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct CompactRequest {
        pub session_id: String,
        /// Default: the run's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub provider: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub model: Option<String>,
        /// Compact whatever the size.
        #[serde(default)]
        pub force: bool,
        /// Emit `compaction_done` (default true).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub emit_event: Option<bool>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct CompactAnswer {
        /// `ok` (see `compacted`), `busy` (another compactor holds the lease), `overflow`
        /// (still over the window after compaction, or the summary call overflowed), `empty`
        /// (nothing old enough to summarize).
        pub status: String,
        #[serde(default)]
        pub compacted: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tokens_before: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tokens_after: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub compaction_entry_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tail_start_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub summary_text: Option<String>,
    }

    /// `context-compaction::prune_tool_outputs`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PruneRequest {
        pub session_id: String,
        /// Results longer than this are shortened (default 2 000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub max_chars: Option<u64>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PruneAnswer {
        /// `ok | empty`.
        pub status: String,
        #[serde(default)]
        pub pruned: u64,
        #[serde(default)]
        pub tokens_saved: u64,
    }
}

/// `session-inbox::*`: per-session queues (`steering`, `followup`, …).
pub mod inbox {
    use super::*;

    pub const PUSH: &str = "session-inbox::push";
    pub const PEEK: &str = "session-inbox::peek";
    pub const DRAIN: &str = "session-inbox::drain";

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PushRequest {
        pub name: String,
        pub session_id: String,
        /// A string (a user message) or an AgentMessage.
        pub item: Value,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PushAnswer {
        pub ok: bool,
        /// Items queued now.
        pub depth: u64,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct PeekRequest {
        pub name: String,
        pub session_id: String,
        /// Several inboxes in one read: the answer is the first of them (in this order) that
        /// holds items, and names it. A worker that does not know this field answers `name`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub names: Option<Vec<String>>,
    }

    /// The most inboxes one peek names.
    pub const PEEK_MAX_NAMES: usize = 8;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct DrainRequest {
        pub name: String,
        pub session_id: String,
        /// The first `max` items (default: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub max: Option<u64>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ItemsAnswer {
        pub items: Vec<Value>,
        /// A peek of several `names`: the inbox the items come from (null: all are empty).
        /// Absent from a peek of one inbox and from a worker that reads only `name`.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        #[schemars(with = "Option<String>")]
        pub name: Option<Option<String>>,
    }

    /// A field that is present (`null` included) is `Some`; an absent one takes the default.
    fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
        Option::<String>::deserialize(d).map(Some)
    }
}

/// `session-tree::messages`, `session-tree::append_batch` and the entries they carry.
pub mod session_tree {
    use super::*;
    use crate::messages::{AgentMessage, ContentBlock};

    pub const MESSAGES: &str = "session-tree::messages";
    pub const APPEND_BATCH: &str = "session-tree::append_batch";

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct MessagesRequest {
        pub session_id: String,
        /// Default: the current leaf.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub leaf_id: Option<String>,
    }

    /// One node of the tree.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
    pub struct EntryInput {
        /// A deterministic id makes the append idempotent.
        #[serde(default)]
        pub id: Option<String>,
        #[serde(default)]
        pub timestamp: Option<u64>,
        #[serde(flatten)]
        pub body: EntryBody,
    }

    /// One entry as an append stored it.
    #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
    pub struct StoredEntry {
        pub entry_id: String,
        /// False when an entry with that id already existed (an idempotent retry).
        pub created: bool,
        pub entry: Entry,
    }
    /// `session-tree::append_batch`.
    #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
    pub struct AppendBatchRequest {
        pub session_id: String,
        pub entries: Vec<EntryInput>,
        /// Absent: the current leaf; null: a new root; an id: that entry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "Option<Option<String>>")]
        pub parent_id: Option<Value>,
        /// Inboxes to peek once the entries are stored, as `session-inbox::peek`'s `names`:
        /// the answer's `inbox`. The append that ends a turn's step asks it, so deciding
        /// whether a steering message came takes no call of its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub peek_inboxes: Option<Vec<String>>,
        /// Answer the model context at the new leaf as `messages`, as `session-tree::messages`
        /// does: a run's first append continues a history it has not read yet, in one call.
        /// Without `parent_id` the context at the current leaf is read first, and the entries
        /// go there.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub with_messages: bool,
        /// The session's index as the caller's last append (or `session-tree::ensure`) was
        /// answered it (`index`): where its `last_entry` is the parent, or the entries start a
        /// new root, the worker appends on it without reading the index or the parent, in a
        /// transaction that also requires the stored index to be exactly this (at this
        /// version). A stale or altered one costs that transaction, then the append reads as
        /// without it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub index_seen: Option<IndexSeen>,
    }
    /// A session's index and its version, as an append answers it (`index`) and a later
    /// append hands it back (`index_seen`).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct IndexSeen {
        pub value: Value,
        pub version: u64,
        /// How the session worker stores the tree (`crate::session_layout::LAYOUT`): a
        /// caller may write an append on this index in a transaction of its own. Absent:
        /// only the session worker appends.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub layout: Option<String>,
    }
    #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
    pub struct AppendBatchAnswer {
        pub entry_ids: Vec<String>,
        pub leaf_id: Option<String>,
        pub entries: Vec<StoredEntry>,
        /// With `peek_inboxes`: the peek's answer, read beside the append. Absent from a
        /// worker that does not know the field, or that could not read the inboxes (the
        /// caller then peeks itself).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub inbox: Option<super::inbox::ItemsAnswer>,
        /// With `with_messages`: the model context at the new leaf. Absent from a worker
        /// that does not know the field (the caller then reads it itself).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub messages: Option<MessagesAnswer>,
        /// The session's index as this append wrote it, where the entries and the index
        /// were written in one transaction (and the index is at most 4 KB of JSON): the
        /// caller's next append may hand it back as `index_seen`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub index: Option<IndexSeen>,
    }

    /// The model context of a branch: leaf → root, compaction applied.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct MessagesAnswer {
        pub session_id: String,
        pub leaf_id: Option<String>,
        pub path_length: u64,
        /// The entry each message came from, in the same order.
        pub entry_ids: Vec<String>,
        pub messages: Vec<AgentMessage>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_read_what_the_workers_write() {
        let a: policy::CheckAnswer =
            parse("policy", json!({"decision": "needs_approval"})).unwrap();
        assert_eq!(a.decision, policy::Decision::NeedsApproval);
        assert!(!a.network);
        let a: policy::CheckAnswer = parse(
            "policy",
            json!({"decision": "allow", "rule_id": "r1", "network": true, "extra": 1}),
        )
        .unwrap();
        assert!(a.network && a.rule_id.as_deref() == Some("r1"));
        let e =
            parse::<policy::CheckAnswer>("policy::check_permissions", json!({"decision": "maybe"}))
                .unwrap_err();
        assert!(
            e.starts_with("policy::check_permissions: ") && e.contains("maybe"),
            "{e}"
        );
        let t: auth::GetTokenAnswer = parse("auth", json!(null)).unwrap();
        assert!(t.is_none());
        let t: auth::GetTokenAnswer =
            parse("auth", json!({"type": "oauth", "access_token": "a"})).unwrap();
        assert_eq!(t.as_ref().unwrap().secret(), "a");
        let shown = format!(
            "{:?}",
            auth::Token::ApiKey {
                key: "sk-live-1".into()
            }
        );
        assert!(!shown.contains("sk-live-1"), "{shown}");
        // SPEC: approval::resolve ignores fields it does not know (a newer caller's extras).
        let r = parse::<approval::ResolveRequest>(
            "approval::resolve",
            json!({"session_id": "s", "function_call_id": "c", "decision": "allow", "note": "x"}),
        )
        .unwrap();
        assert_eq!(r.decision, approval::Verdict::Allow);
        // The seeds' record reads: {decision, reason: null}; ours too; junk does not.
        let seeds = parse::<approval::DecisionRecord>(
            "an approval record",
            json!({"decision": "deny", "reason": null}),
        )
        .unwrap();
        assert_eq!((seeds.reason.as_str(), seeds.function_id), ("", None));
        let ours = parse::<approval::DecisionRecord>(
            "an approval record",
            json!({"decision": "allow", "reason": "ok", "decided_by": "bob", "decided_at": 5, "function_id": "fs::write", "args_hash": "ab", "extra": 1}),
        )
        .unwrap();
        assert_eq!(ours.function_id.as_deref(), Some("fs::write"));
        for junk in [
            json!({}),
            json!({"decision": "maybe"}),
            json!("allow"),
            json!({"decision": "allow", "reason": 7}),
        ] {
            assert!(
                parse::<approval::DecisionRecord>("r", junk.clone()).is_err(),
                "{junk}"
            );
        }
    }

    #[test]
    fn schemas_are_json_schemas_of_the_fields() {
        let s = schema_of::<policy::CheckRequest>();
        assert_eq!(s["type"], "object");
        assert!(s["properties"]["function_id"].is_object(), "{s}");
        assert_eq!(s["required"], json!(["function_id"]));
        let s = schema_of::<auth::GetTokenAnswer>();
        assert!(s.to_string().contains("api_key"), "{s}");
    }
}
