//! Wire contracts of the turn (SPEC §3 turn-orchestrator).

use harness_sdk::messages::AgentMessage;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const SCOPE: &str = "agent";
pub const QUEUE: &str = "turn-steps";
pub const EVENTS: &str = "agent::events";
pub const TURN_END_STREAM: &str = "agent::turn_end";
pub const APPROVALS: &str = "approvals";
/// The single tool the model calls everything through.
pub const AGENT_TRIGGER: &str = "agent_trigger";
pub const BEFORE_CALL_TOPIC: &str = "agent::before_function_call";
pub const AFTER_CALL_TOPIC: &str = "agent::after_function_call";

pub fn record_key(sid: &str) -> String {
    format!("session/{sid}/turn_state")
}
pub fn request_key(sid: &str) -> String {
    format!("session/{sid}/run_request")
}
/// The run's system prompt and tools, written once at provisioning: kept out of the record,
/// which every step loads and saves.
pub fn prompt_key(sid: &str) -> String {
    format!("session/{sid}/prompt")
}

/// What the model is told besides the conversation, fixed for a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Prompt {
    /// The run it belongs to (`Record::run_key`).
    pub run_key: String,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub tools: Vec<harness_sdk::messages::ToolSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    Provisioning,
    AssistantStreaming,
    FunctionExecute,
    FunctionAwaitingApproval,
    SteeringCheck,
    Stopped,
    Failed,
}

impl TurnState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "provisioning",
            Self::AssistantStreaming => "assistant_streaming",
            Self::FunctionExecute => "function_execute",
            Self::FunctionAwaitingApproval => "function_awaiting_approval",
            Self::SteeringCheck => "steering_check",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
        }
    }
    pub fn terminal(self) -> bool {
        matches!(self, Self::Stopped | Self::Failed)
    }
    pub fn step_function(self) -> String {
        format!("turn::{}", self.as_str())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct RunRequest {
    pub session_id: String,
    #[serde(default)]
    pub message_id: Option<String>,
    pub provider: String,
    pub model: String,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub messages: Vec<AgentMessage>,
    #[serde(default)]
    pub max_turns: Option<u32>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    /// A budget to charge and check, besides those found by `workspace_id`/`agent_id`.
    #[serde(default)]
    pub budget_id: Option<String>,
    /// Skills downloaded at provisioning (`directory::skills::download` each, best effort);
    /// absent: [`DEFAULT_SKILLS`]; empty: none.
    #[serde(default)]
    pub system_default_skills: Option<Vec<String>>,
    /// Models tried in turn, in the same step, when a model call fails before its first
    /// token with a retryable error (rate limited, overloaded, unavailable, a timeout).
    #[serde(default)]
    pub fallback: Vec<FallbackModel>,
    /// `false`: ask no provider to cache the prompt (caching writes cost more than plain
    /// input, so a one-shot run may be cheaper without). Absent or `true`: cache where the
    /// catalogue says the model can.
    #[serde(default)]
    pub prompt_cache: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct FallbackModel {
    pub provider: String,
    pub model: String,
}

/// The modes a run may ask for (`run::start`'s `mode`; absent: `agent`).
pub const MODES: &[&str] = &["agent", "plan", "ask"];

/// A provider's name as `provider::<name>::stream` carries it: 1-64 of `[a-z0-9_-]`.
pub fn is_provider_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// At most this many fallback models.
pub const MAX_FALLBACK: usize = 4;
pub const DEFAULT_SKILLS: &[&str] = &["iii://iii-directory/index"];
/// At most this many default skills, each at most this long.
pub const MAX_DEFAULT_SKILLS: usize = 16;
pub const MAX_SKILL_ID_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Call {
    pub function_call_id: String,
    /// The function the agent asked for (`agent_trigger`'s `function`).
    pub function_id: String,
    pub args: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Executed {
    pub call: Call,
    pub result: Value,
    pub is_error: bool,
    pub duration_ms: u64,
    #[serde(default)]
    pub terminate: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub prepared: Vec<Call>,
    #[serde(default)]
    pub executed: std::collections::BTreeMap<String, Executed>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnError {
    pub kind: String,
    pub message: String,
}

/// One append of the run to the session tree: the path grew from `from` to `to` by
/// `messages`, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecentAppend {
    pub from: Option<String>,
    pub to: String,
    pub messages: Vec<AgentMessage>,
}

impl RecentAppend {
    /// Appends kept: two instances taking turns need the last two.
    pub const MAX_BATCHES: usize = 4;
    /// Their JSON in all: the record is written on every save (a DynamoDB item is billed by
    /// the kilobyte and holds at most 400 KB); a larger append is not kept, and an instance
    /// that missed it reads the history as before.
    pub const MAX_BYTES: usize = 16 * 1024;

    /// Keep `batch` after `recent`, dropping the oldest to stay within the bounds.
    pub fn keep(recent: &mut Vec<RecentAppend>, batch: RecentAppend) {
        let size = |b: &RecentAppend| serde_json::to_vec(b).map(|v| v.len()).unwrap_or(usize::MAX);
        if size(&batch) > Self::MAX_BYTES {
            recent.clear();
            return;
        }
        recent.push(batch);
        while recent.len() > Self::MAX_BATCHES
            || recent.iter().map(size).sum::<usize>() > Self::MAX_BYTES
        {
            recent.remove(0);
        }
    }
}

/// The first inbox that holds items, with its items; `None`: all are empty.
pub type PeekedInbox = Option<(String, Vec<Value>)>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub session_id: String,
    pub state: TurnState,
    pub turn_count: u32,
    #[serde(default)]
    pub max_turns: Option<u32>,
    #[serde(default)]
    pub function_results: Vec<AgentMessage>,
    #[serde(default)]
    pub turn_end_emitted: bool,
    pub started_at_ms: u64,
    pub updated_at_ms: u64,
    #[serde(default)]
    pub model_meta: Option<Value>,
    #[serde(default)]
    pub error: Option<TurnError>,
    #[serde(default)]
    pub last_assistant: Option<AgentMessage>,
    #[serde(default)]
    pub work: Option<Work>,
    #[serde(default)]
    pub awaiting_approval: Option<Vec<Call>>,
    /// The conversation, when no session store runs (`tree == false`); with one, the
    /// session tree holds it and this stays empty.
    #[serde(default)]
    pub messages: Vec<AgentMessage>,
    /// The history lives in the session tree (`session-tree::*`).
    #[serde(default)]
    pub tree: bool,
    /// The entry this run appends after (deterministic ids make re-appends no-ops).
    #[serde(default)]
    pub tree_leaf: Option<String>,
    /// Unique per run: the prefix of the entry ids this run appends.
    #[serde(default)]
    pub run_key: String,
    /// Budgets checked before each model call and charged by the provider.
    #[serde(default)]
    pub budget_ids: Vec<String>,
    /// The model's last answer (`last_assistant`, which has calls) is not in the session
    /// tree yet: the next append writes it first, so a batch's call and results go in one
    /// write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub assistant_pending: bool,
    /// The run's last appends to the session tree, newest last, within
    /// [`RecentAppend::MAX_BATCHES`] and [`RecentAppend::MAX_BYTES`]: a step that lands on
    /// another orchestrator instance (a Lambda's second warm instance) brings that
    /// instance's cached history up to the record's leaf from these instead of reading the
    /// whole history again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_appends: Vec<RecentAppend>,
    /// The session's index as the run's last append was answered it: handed back with the
    /// next append (`index_seen`), so a session instance that did not write it last appends
    /// without reading it (the session's transaction checks it is what is stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_index: Option<harness_sdk::contracts::session_tree::IndexSeen>,
    /// The inboxes as the step's last append found them (`peek_inboxes`), for the
    /// steering check that follows it in the same step; never stored: a step that runs
    /// again peeks again.
    #[serde(skip)]
    pub peeked_inbox: Option<PeekedInbox>,
    /// Counter for event item ids.
    #[serde(default)]
    pub event_seq: u64,
    /// What the session's runs have used so far (carried from one run to the next).
    #[serde(default)]
    pub totals: RunTotals,
    /// Events emitted since the last flush: written with the record's next save (one
    /// `state::transact`), or on their own before a call that may take a while. Never stored
    /// in the record.
    #[serde(skip)]
    pub outbox: Vec<(String, String, String, Value)>,
    /// The record just after the batch's last call ran, when its save was left to the step's
    /// next one (which is then durable). A step that ends in an error before that save saves
    /// this instead, durably, so no redelivery runs the call again. Never stored.
    #[serde(skip)]
    pub unsaved_call: Option<Box<Record>>,
    /// A sync started in the background for a record saved without waiting for its disk
    /// (`record::save_syncing_later`): no call runs, and the step does not end,
    /// before it is done. Never stored.
    #[serde(skip)]
    pub pending_sync: PendingSync,
    /// The last token deltas' pushes of the step's model call, if still going out. Never
    /// stored.
    #[serde(skip)]
    pub pending_push: PendingPush,
    /// The save a chained turn left running beside its next model call
    /// (`record::save_syncing_later`). Never stored.
    #[serde(skip)]
    pub pending_save: PendingSave,
    /// A batch's results planned into the record's next save (the `carried` module): the
    /// session tree's index and entries written in the record's transaction. Never stored.
    #[serde(skip)]
    pub carried: Carried,
    /// The reads the turn started beside its model call, for its batch's end. Never stored.
    #[serde(skip)]
    pub beside_the_calls: Pending<BesideTheCalls>,
}

/// What a step started and has not taken back yet (a task, reads beside the calls), shared by
/// the record's clones.
pub struct Pending<X>(std::sync::Arc<std::sync::Mutex<Option<X>>>);

/// The sync a step started ([`crate::record::save_syncing_later`]).
pub type PendingSync = Pending<tokio::task::JoinHandle<Result<(), String>>>;

/// The last token deltas' pushes of a model call, still going out after its stream ended:
/// the step goes on (policy, the calls, the append) while they do, and anything that writes
/// or pushes the session's events waits for them first, so a client still gets them in
/// order ([`crate::record::flush_events`], the record's save, [`crate::record::emit_transient`]).
pub type PendingPush = Pending<tokio::task::JoinHandle<()>>;

/// Why a step could not finish: transient errors are re-thrown so the queue retries with
/// backoff (and dead-letters); anything else fails the run with events the UI can show.
#[derive(Debug, Clone)]
pub enum StepError {
    Transient(harness_sdk::ErrorBody),
    Fatal(String),
    Stale,
}

impl From<harness_sdk::BusError> for StepError {
    fn from(e: harness_sdk::BusError) -> Self {
        StepError::Transient(e.into())
    }
}

impl StepError {
    /// The store could not make the step's writes durable (`state::sync` failed).
    pub fn not_durable(why: impl std::fmt::Display) -> Self {
        StepError::Transient(harness_sdk::ErrorBody::new(
            "storage",
            format!("the turn record could not be made durable: {why}"),
        ))
    }
}

pub type StepResult<T> = Result<T, StepError>;

/// A save started in a task of its own (and the sync after it, where it holds a call) → the
/// record's new version.
pub type SaveHandle = tokio::task::JoinHandle<StepResult<u64>>;

/// The save a chained turn left running beside its next model call, and the sync after it.
/// What writes or pushes the session's events next waits for it ([`PendingSave::done`]: they
/// go after its events); the next save, and every call, takes its outcome first
/// ([`crate::record::settle_save`]: the new version, or the error that ends the step).
#[derive(Clone, Default)]
pub struct PendingSave(std::sync::Arc<std::sync::Mutex<Option<SaveOutcome>>>);

/// A save's outcome, awaited by as many as wait for it.
type SaveOutcome =
    futures_util::future::Shared<futures_util::future::BoxFuture<'static, StepResult<u64>>>;

impl PendingSave {
    pub fn start(&self, save: SaveHandle) {
        use futures_util::FutureExt;
        let outcome = async move {
            save.await.unwrap_or_else(|e| {
                Err(StepError::Transient(harness_sdk::ErrorBody::new(
                    "storage",
                    format!("the turn record's save failed: {e}"),
                )))
            })
        }
        .boxed()
        .shared();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
    }

    /// Once the save is done, whatever its outcome (for order only).
    pub async fn done(&self) {
        let _ = self.outcome().await;
    }

    /// Its outcome, without taking it (the next settle still gets it); `None`: no save is
    /// pending.
    pub async fn outcome(&self) -> Option<StepResult<u64>> {
        let running = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match running {
            Some(running) => Some(running.await),
            None => None,
        }
    }

    /// Its outcome, once; `None`: no save is pending.
    pub async fn take(&self) -> Option<StepResult<u64>> {
        let running = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        match running {
            Some(running) => Some(running.await),
            None => None,
        }
    }
}

impl std::fmt::Debug for PendingSave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingSave")
    }
}

/// Not part of a record's value.
impl PartialEq for PendingSave {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A started `state::sync`: `Err` names why the store could not make the writes durable.
pub type SyncHandle = tokio::task::JoinHandle<Result<(), String>>;

impl<X> Pending<X> {
    /// One at a time: a second start comes after the first was taken, or replaces it: a sync
    /// after a later save, whose sync covers the earlier one's writes too (the store's log is
    /// in commit order); the reads of a turn whose model answered without calls.
    pub fn start(&self, started: X) {
        let previous = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(started);
        drop(previous);
    }

    pub fn take(&self) -> Option<X> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl PendingSync {
    /// Wait for the started sync, if any.
    pub async fn settle(&self) -> Result<(), String> {
        match self.take() {
            None => Ok(()),
            Some(handle) => match handle.await {
                Ok(synced) => synced,
                Err(e) => Err(format!("the sync task failed: {e}")),
            },
        }
    }
}

impl PendingPush {
    /// Wait for the started pushes, if any (best effort, as a push is: a failed one was
    /// logged where it failed).
    pub async fn settle(&self) {
        if let Some(handle) = self.take()
            && let Err(e) = handle.await
        {
            tracing::warn!(error = %e, "the token deltas' last pushes failed");
        }
    }
}

impl<X> Clone for Pending<X> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<X> Default for Pending<X> {
    fn default() -> Self {
        Self(Default::default())
    }
}

impl<X> std::fmt::Debug for Pending<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// Not part of a record's value.
impl<X> PartialEq for Pending<X> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Record {
    /// What the UI sees (never the work list).
    pub fn view(&self) -> Value {
        serde_json::to_value(self.state_view()).unwrap_or(Value::Null)
    }

    pub fn state_view(&self) -> TurnStateView {
        TurnStateView {
            session_id: self.session_id.clone(),
            state: self.state,
            turn_count: self.turn_count,
            max_turns: self.max_turns,
            awaiting_approval: self.awaiting_approval.clone(),
            error: self.error.clone(),
            totals: self.totals.clone(),
            started_at_ms: self.started_at_ms,
            updated_at_ms: self.updated_at_ms,
            run_key: self.run_key.clone(),
            owner: None,
        }
    }
}

/// What a session's runs used, for consoles and lists: tool calls made (allowed, denied and
/// decided alike) and the providers' reported tokens and cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunTotals {
    #[serde(default)]
    pub tool_calls: u64,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    /// Of `input_tokens`: read from the provider's prompt cache, and written to it.
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    #[serde(default)]
    pub cost_usd: f64,
}

impl RunTotals {
    /// Add one model call's usage (input counts cache reads and writes, as prices do).
    pub fn add_usage(&mut self, u: &harness_sdk::messages::Usage) {
        self.input_tokens += u.input + u.cache_read + u.cache_write;
        self.cache_read_tokens += u.cache_read;
        self.cache_write_tokens += u.cache_write;
        self.output_tokens += u.output;
        if u.cost_usd.is_finite() && u.cost_usd > 0.0 {
            self.cost_usd += u.cost_usd;
        }
    }
}

/// SPEC `TurnStateView`: a session's turn as `turn::get_state` and `turn_state_changed` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnStateView {
    pub session_id: String,
    pub state: TurnState,
    pub turn_count: u32,
    pub max_turns: Option<u32>,
    /// The calls waiting for a human.
    pub awaiting_approval: Option<Vec<Call>>,
    /// Why the run ended, when it did not end by itself.
    pub error: Option<TurnError>,
    /// What the session's runs used so far.
    #[serde(default)]
    pub totals: RunTotals,
    /// When the current run started and when its record last changed.
    #[serde(default)]
    pub started_at_ms: u64,
    #[serde(default)]
    pub updated_at_ms: u64,
    /// The current (or last) run's key: the `message_id` it was started with.
    #[serde(default)]
    pub run_key: String,
    /// Who started the session (`{name, role}`), shown to whoever may see it
    /// (`turn::get_state`; not on the record's change events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Value>,
}

/// `run::abort`, `turn::get_state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionRequest {
    pub session_id: String,
}

/// `run::start`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunStartAnswer {
    pub session_id: String,
    pub started: bool,
    /// `session_busy` when a run is live on the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `run::abort`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunAbortAnswer {
    pub session_id: String,
    pub aborted: bool,
    /// The state the run is in afterwards (null: no run).
    pub state: Option<TurnState>,
    /// Commands of the run the tools worker killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands_killed: Option<u64>,
}

/// SPEC `DenialEnvelope`.
pub fn denial(
    denied_by: &str,
    function_id: &str,
    rule_id: Option<&str>,
    matched: Option<&Value>,
    args: &Value,
    reason: &str,
) -> Value {
    let mut v = serde_json::json!({
        "schema_version": 1,
        "status": "denied",
        "denied_by": denied_by,
        "function_id": function_id,
        "args_excerpt": redact(args),
        "reason": reason,
    });
    if let Some(r) = rule_id {
        v["rule_id"] = serde_json::json!(r);
    }
    if let Some(m) = matched {
        v["matched_constraint"] = m.clone();
    }
    v
}

/// Args with anything that looks like a secret replaced, cut to a short excerpt.
pub fn redact(args: &Value) -> Value {
    fn walk(v: &Value, key: Option<&str>) -> Value {
        let secret_key = key.is_some_and(|k| {
            let k = k.to_ascii_lowercase();
            [
                "key",
                "token",
                "secret",
                "password",
                "authorization",
                "credential",
            ]
            .iter()
            .any(|s| k.contains(s))
        });
        match v {
            _ if secret_key => Value::String("[redacted]".into()),
            Value::String(s) if looks_secret(s) => Value::String("[redacted]".into()),
            Value::String(s) if s.chars().count() > 200 => {
                Value::String(format!("{}…", s.chars().take(200).collect::<String>()))
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), walk(v, Some(k))))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().take(20).map(|v| walk(v, None)).collect()),
            other => other.clone(),
        }
    }
    walk(args, None)
}

fn looks_secret(s: &str) -> bool {
    let t = s.trim();
    t.starts_with("sk-")
        || t.starts_with("Bearer ")
        || t.starts_with("xox")
        || t.starts_with("ghp_")
        || t.starts_with("AKIA")
}

// ------------------------------------------------------------------ a carried append

/// Where a step's batch results carried in the record's save are (the `carried` module).
#[derive(Debug, Clone, Default)]
pub enum Carried {
    #[default]
    None,
    /// Planned: the record's next save writes it.
    Planned(Box<CarriedAppend>),
    /// In a save: the index as that save left the tree, once it went through.
    Saving(std::sync::Arc<std::sync::OnceLock<harness_sdk::contracts::session_tree::IndexSeen>>),
}

/// Not part of a record's value.
impl PartialEq for Carried {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[derive(Debug, Clone)]
pub struct CarriedAppend {
    /// The session tree's writes: its index first, then each entry.
    pub writes: Vec<bus::state::TxWrite>,
    /// The index as the writes leave it.
    pub index: Value,
    /// The same append for the session worker (ids, parent, entries), when the tree moved.
    pub fallback: harness_sdk::contracts::session_tree::AppendBatchRequest,
    /// Set by the save that wrote the entries: the index as the tree holds it now.
    pub landed:
        std::sync::Arc<std::sync::OnceLock<harness_sdk::contracts::session_tree::IndexSeen>>,
}

impl Carried {
    pub fn planned(&self) -> Option<&CarriedAppend> {
        match self {
            Carried::Planned(c) => Some(c),
            _ => None,
        }
    }

    /// A save took the planned writes: from now on, what it landed.
    pub fn handed_to_a_save(&mut self) {
        if let Carried::Planned(c) = self {
            *self = Carried::Saving(c.landed.clone());
        }
    }

    /// After the save that carried it went through: the index it left (`None`: the store
    /// did not say, and the next append reads it).
    pub fn landed(&mut self) -> Option<harness_sdk::contracts::session_tree::IndexSeen> {
        match std::mem::take(self) {
            Carried::Saving(landed) => landed.get().cloned(),
            other => {
                *self = other;
                None
            }
        }
    }
}

// ------------------------------------------------------------------ reads beside the calls

/// What a batch's end needs, read beside its turn's model call and its calls (started by the
/// `states::calls` module): the inboxes, for the steering check after them (the batch's
/// results go in the record's save, so no append answers the peek), and the session's index
/// where the record's is behind the run's leaf (a step that loaded a record saved with a
/// carried append). A peek too old when the batch ends is not used (the check peeks again);
/// reads not used are stopped.
pub struct BesideTheCalls {
    pub(crate) started: std::time::Instant,
    pub(crate) peek: tokio::task::JoinHandle<PeekedInbox>,
    pub(crate) index:
        Option<tokio::task::JoinHandle<Option<harness_sdk::contracts::session_tree::IndexSeen>>>,
}

impl Drop for BesideTheCalls {
    fn drop(&mut self) {
        self.peek.abort();
        if let Some(index) = &self.index {
            index.abort();
        }
    }
}
