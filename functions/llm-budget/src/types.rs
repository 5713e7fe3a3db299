//! Wire contracts of `budget::*` (`budget::check` is shared: `harness_sdk::contracts::budget`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use harness_sdk::contracts::budget::{CheckAnswer, CheckRequest};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BudgetRef {
    pub budget_id: String,
}

/// `budget::create`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CreateRequest {
    /// More than 0.
    pub ceiling_usd: f64,
    /// `day | week | month` (UTC; weeks start on Monday).
    pub period: String,
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// Default: generated.
    #[serde(default)]
    pub budget_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WindowView {
    pub start_ms: u64,
    pub end_ms: u64,
    pub spent_usd: f64,
    pub records: u64,
}

/// A budget as every `budget::*` answer shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BudgetView {
    pub budget_id: String,
    pub name: Option<String>,
    pub workspace_id: Option<String>,
    pub agent_id: Option<String>,
    pub ceiling_usd: f64,
    pub period: String,
    pub enforced: bool,
    pub paused: bool,
    pub created_at_ms: u64,
    pub spent_usd: f64,
    pub remaining_usd: f64,
    pub window: WindowView,
    /// `{alert_id, threshold_pct, callback_function_id, callback_payload, fired_window_start}`.
    pub alerts: Vec<Value>,
    /// Principal → `{reason, until_ms}`.
    pub exemptions: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CreateAnswer {
    pub budget_id: String,
    pub budget: BudgetView,
}

/// `budget::list`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListRequest {
    /// Only budgets that govern a run of this workspace / agent.
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListAnswer {
    pub budgets: Vec<BudgetView>,
}

/// `budget::update`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct UpdateRequest {
    pub budget_id: String,
    /// Any of `name, workspace_id, agent_id, ceiling_usd, period, enforced, paused`.
    pub patch: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DeleteAnswer {
    pub budget_id: String,
    pub deleted: bool,
}

/// `budget::record`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordRequest {
    pub budget_id: String,
    /// At least 0.
    pub cost_usd: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordAnswer {
    pub budget_id: String,
    pub spent_usd: f64,
    pub remaining_usd: f64,
    /// The alerts this spend fired.
    pub alerts_fired: Vec<String>,
}

/// `budget::alert_set`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlertRequest {
    pub budget_id: String,
    /// In (0, 1].
    pub threshold_pct: f64,
    pub callback_function_id: String,
    #[serde(default)]
    pub callback_payload: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlertAnswer {
    pub budget_id: String,
    pub alert_id: String,
}

/// `budget::usage`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct UsageRequest {
    pub budget_id: String,
    /// `current | previous` (default current).
    #[serde(default)]
    pub window: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct UsageAnswer {
    pub budget_id: String,
    pub period: String,
    /// The window asked for.
    pub window: Option<WindowView>,
    pub current: WindowView,
    /// Every archived window.
    pub history: Vec<WindowView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ForecastAnswer {
    pub budget_id: String,
    pub projected_month_usd: f64,
    pub projected_period_usd: f64,
    pub on_track: bool,
    pub days_until_breach: Option<f64>,
}

/// `budget::enforce`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EnforceRequest {
    pub budget_id: String,
    pub enforced: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EnforceAnswer {
    pub budget_id: String,
    pub enforced: bool,
}

/// `budget::exempt` (24 hours).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExemptRequest {
    pub budget_id: String,
    pub principal_id: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExemptAnswer {
    pub budget_id: String,
    pub principal_id: String,
    pub until_ms: u64,
}

/// `budget::pause`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PauseRequest {
    pub budget_id: String,
    pub paused: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PauseAnswer {
    pub budget_id: String,
    pub paused: bool,
}
