//! `harness.yaml`: which workers run, where each runs, and their settings.
//!
//! A file is complete in itself: a worker it does not name is off. Two presets ship in
//! `presets/` (`thin`: orchestrator + one provider + credentials; `thick`: every worker) and
//! are built into the binary, so `--config thin` works from any directory. Every field is
//! checked when the file is read; an error names the field and its line, and the process
//! does not start.

use serde::Deserialize;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

pub const THIN: &str = include_str!("../presets/thin.yaml");
pub const THICK: &str = include_str!("../presets/thick.yaml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// Serde's message names the field path and the line.
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// Where a worker runs, as this process sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Started in this process.
    Embedded,
    /// Another process connects with `ENGINE_URL` and registers its function IDs; start-up
    /// waits for them (up to `remote_wait_secs`) before recovered steps are delivered.
    Remote,
    /// Deployed as a Lambda (the deployed shape's template); not run here.
    Lambda,
    /// Not run anywhere: its function IDs are absent, and optional callers skip them.
    #[default]
    Off,
}

impl Placement {
    pub fn embedded(self) -> bool {
        self == Placement::Embedded
    }
    /// Present somewhere: embedded, or expected from elsewhere.
    pub fn present(self) -> bool {
        self != Placement::Off
    }
}

/// The workers a harness can be composed of: ours by name, and any worker of your own run
/// `remote` with the function ids start-up waits for (`my-tools: {placement: remote,
/// expect: ["mytools::search"]}`). A name of ours misspelled is refused, naming ours.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Workers {
    #[serde(default)]
    pub turn_orchestrator: Placement,
    /// Every provider listed under `providers`.
    #[serde(default)]
    pub providers: Placement,
    #[serde(default)]
    pub auth_credentials: Placement,
    /// `policy::check_permissions` from the permissions file. Missing: every tool call is
    /// denied (`gate_unavailable`), as ARCHITECTURE.md's fail-closed rule says.
    #[serde(default)]
    pub policy: Placement,
    /// The front door: `harness::trigger` and the UI event plane.
    #[serde(default)]
    pub harness: Placement,
    #[serde(default)]
    pub approval_gate: Placement,
    #[serde(default)]
    pub tools: Placement,
    #[serde(default)]
    pub models_catalog: Placement,
    #[serde(default)]
    pub session: Placement,
    #[serde(default)]
    pub hook_fanout: Placement,
    #[serde(default)]
    pub llm_budget: Placement,
    #[serde(default)]
    pub directory: Placement,
    #[serde(default)]
    pub context_compaction: Placement,
    #[serde(default)]
    pub slack_approval: Placement,
    /// The tools of the MCP servers listed under `mcp_servers`, as `mcp::<server>::<tool>`.
    #[serde(default)]
    pub mcp: Placement,
    /// The SDK's example worker (`example::echo`).
    #[serde(default)]
    pub echo: Placement,
    /// Workers of your own (checked by [`Config::check`]).
    #[serde(flatten)]
    pub custom: std::collections::BTreeMap<String, CustomWorker>,
}

/// The standard doors' settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Doors {
    /// How long a door's response waits for a parked call to be decided before it ends,
    /// naming the call and how to decide it.
    #[serde(default = "default_approval_wait")]
    pub approval_wait_secs: u64,
}

impl Default for Doors {
    fn default() -> Self {
        Self {
            approval_wait_secs: default_approval_wait(),
        }
    }
}

fn default_approval_wait() -> u64 {
    300
}

/// A worker that is not ours: another process registers its functions.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CustomWorker {
    /// `remote` with what to wait for.
    Expecting {
        placement: Placement,
        #[serde(default)]
        expect: Vec<String>,
    },
    /// A bare placement (refused unless `off`: nothing to wait for).
    Bare(Placement),
}

impl CustomWorker {
    pub fn placement(&self) -> Placement {
        match self {
            CustomWorker::Expecting { placement, .. } | CustomWorker::Bare(placement) => *placement,
        }
    }
    pub fn expect(&self) -> &[String] {
        match self {
            CustomWorker::Expecting { expect, .. } => expect,
            CustomWorker::Bare(_) => &[],
        }
    }
}

/// One function ID each worker registers, to know it has arrived when it runs elsewhere.
impl Workers {
    pub fn all(&self) -> Vec<(&'static str, Placement, &'static str)> {
        vec![
            ("turn-orchestrator", self.turn_orchestrator, "run::start"),
            ("providers", self.providers, ""),
            ("auth-credentials", self.auth_credentials, "auth::get_token"),
            ("policy", self.policy, "policy::check_permissions"),
            ("harness", self.harness, "harness::trigger"),
            ("approval-gate", self.approval_gate, "approval::resolve"),
            ("tools", self.tools, "shell::exec"),
            ("models-catalog", self.models_catalog, "models::get"),
            ("session", self.session, "session-tree::messages"),
            (
                "hook-fanout",
                self.hook_fanout,
                "hook-fanout::publish_collect",
            ),
            ("llm-budget", self.llm_budget, "budget::check"),
            ("directory", self.directory, "directory::skills::get"),
            (
                "context-compaction",
                self.context_compaction,
                "context-compaction::compact_now",
            ),
            ("slack-approval", self.slack_approval, "slack::webhook"),
            ("mcp", self.mcp, "mcp::servers"),
            ("echo", self.echo, "example::echo"),
        ]
    }
}

/// `run.provider` (and a fallback's): one of ours, or the name of any worker that registers
/// `provider::<name>::stream` (start-up waits for it like a remote worker's functions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderChoice {
    Ours(ProviderName),
    Custom(String),
}

impl Default for ProviderChoice {
    fn default() -> Self {
        ProviderChoice::Ours(ProviderName::Auto)
    }
}

impl ProviderChoice {
    pub fn as_str(&self) -> &str {
        match self {
            ProviderChoice::Ours(p) => p.as_str(),
            ProviderChoice::Custom(n) => n,
        }
    }
    /// The model a run uses when none is named (none for a provider of your own).
    pub fn default_model(&self) -> Option<&'static str> {
        match self {
            ProviderChoice::Ours(p) => Some(p.default_model()),
            ProviderChoice::Custom(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for ProviderChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        use clap::ValueEnum;
        if let Some(p) = ProviderName::value_variants()
            .iter()
            .find(|p| p.as_str() == name)
        {
            return Ok(ProviderChoice::Ours(*p));
        }
        if !turn_orchestrator::types::is_provider_name(&name) {
            return Err(serde::de::Error::custom(format!(
                "a provider is one of ours (anthropic, openai, kimi, lmstudio, bedrock, scripted, auto) or the <name> of a worker registering provider::<name>::stream (1-64 of [a-z0-9_-]), not `{name}`"
            )));
        }
        Ok(ProviderChoice::Custom(name))
    }
}

/// The providers a harness knows; `auto` picks by the API keys in the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProviderName {
    /// Anthropic when `ANTHROPIC_API_KEY` is set, else OpenAI when `OPENAI_API_KEY` is, else
    /// the scripted model.
    #[default]
    Auto,
    Anthropic,
    Openai,
    Kimi,
    Lmstudio,
    /// Amazon Bedrock (Converse), authenticated by IAM: the AWS SDK's default credentials.
    Bedrock,
    Scripted,
}

impl ProviderName {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderName::Auto => "auto",
            ProviderName::Anthropic => "anthropic",
            ProviderName::Openai => "openai",
            ProviderName::Kimi => "kimi",
            ProviderName::Lmstudio => "lmstudio",
            ProviderName::Bedrock => "bedrock",
            ProviderName::Scripted => "scripted",
        }
    }
    /// The model a run uses when none is named.
    pub fn default_model(self) -> &'static str {
        match self {
            ProviderName::Anthropic => "claude-sonnet-5-5",
            ProviderName::Openai => "gpt-5.4",
            ProviderName::Kimi => "kimi-k2.5",
            ProviderName::Lmstudio => "local-model",
            ProviderName::Bedrock => "us.anthropic.claude-haiku-4-5-20251001-v1:0",
            ProviderName::Auto | ProviderName::Scripted => "scripted-demo",
        }
    }
}

/// What a run uses unless its `run::start` request says otherwise.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunDefaults {
    #[serde(default)]
    pub provider: ProviderChoice,
    /// Default: the provider's (see [`ProviderName::default_model`]).
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default = "default_max_turns")]
    pub max_turns: NonZeroU64,
    /// The prompt mode: `agent`, `plan` or `ask`.
    #[serde(default)]
    pub mode: Option<PromptMode>,
    /// Replaces the generated system prompt, verbatim.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Skill ids fetched at provisioning; absent: SPEC's default index; empty: none.
    #[serde(default)]
    pub system_default_skills: Option<Vec<String>>,
    /// Models asked in turn when a model call fails before its first token with a retryable
    /// error (rate limited, overloaded, unavailable, a timeout), in the same step.
    #[serde(default)]
    pub fallback: Vec<Fallback>,
    /// `false`: no provider is asked to cache the prompt (writes to a cache cost more than
    /// plain input: a run of one or two model calls is cheaper without).
    #[serde(default = "yes")]
    pub prompt_cache: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    pub provider: ProviderChoice,
    /// Default: the provider's.
    #[serde(default)]
    pub model: Option<String>,
}

impl Default for RunDefaults {
    fn default() -> Self {
        Self {
            provider: ProviderChoice::default(),
            model: None,
            max_turns: default_max_turns(),
            mode: None,
            system_prompt: None,
            system_default_skills: None,
            fallback: Vec::new(),
            prompt_cache: true,
        }
    }
}

fn default_max_turns() -> NonZeroU64 {
    NonZeroU64::new(12).expect("nonzero")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptMode {
    Agent,
    Plan,
    Ask,
}

impl PromptMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PromptMode::Agent => "agent",
            PromptMode::Plan => "plan",
            PromptMode::Ask => "ask",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    /// The API's address; default: the provider's variable (`ANTHROPIC_BASE_URL`, …) or its
    /// public address.
    #[serde(default)]
    pub base_url: Option<url::Url>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedSettings {
    /// A cassette file; default: the demo cassette built into the binary.
    #[serde(default)]
    pub cassette: Option<PathBuf>,
    /// A scripted model server already running (its address, without `/v1`); default: one is
    /// started in this process.
    #[serde(default)]
    pub base_url: Option<url::Url>,
}

/// The providers to register; each listed one is registered whether or not its key is set
/// (credentials resolve per call through `auth::get_token`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Providers {
    #[serde(default)]
    pub anthropic: Option<ProviderSettings>,
    #[serde(default)]
    pub openai: Option<ProviderSettings>,
    #[serde(default)]
    pub kimi: Option<ProviderSettings>,
    #[serde(default)]
    pub lmstudio: Option<ProviderSettings>,
    /// `base_url`: the Bedrock runtime endpoint (default: the SDK's, from the region, or
    /// `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`).
    #[serde(default)]
    pub bedrock: Option<ProviderSettings>,
    #[serde(default)]
    pub scripted: Option<ScriptedSettings>,
}

impl Providers {
    /// Lists `p` (with default settings) if it is not listed.
    pub fn include(&mut self, p: ProviderName) {
        match p {
            ProviderName::Anthropic => {
                self.anthropic.get_or_insert_with(Default::default);
            }
            ProviderName::Openai => {
                self.openai.get_or_insert_with(Default::default);
            }
            ProviderName::Kimi => {
                self.kimi.get_or_insert_with(Default::default);
            }
            ProviderName::Lmstudio => {
                self.lmstudio.get_or_insert_with(Default::default);
            }
            ProviderName::Bedrock => {
                self.bedrock.get_or_insert_with(Default::default);
            }
            ProviderName::Scripted => {
                self.scripted.get_or_insert_with(Default::default);
            }
            ProviderName::Auto => {}
        }
    }

    pub fn names(&self) -> Vec<ProviderName> {
        let mut out = Vec::new();
        if self.anthropic.is_some() {
            out.push(ProviderName::Anthropic);
        }
        if self.openai.is_some() {
            out.push(ProviderName::Openai);
        }
        if self.kimi.is_some() {
            out.push(ProviderName::Kimi);
        }
        if self.lmstudio.is_some() {
            out.push(ProviderName::Lmstudio);
        }
        if self.bedrock.is_some() {
            out.push(ProviderName::Bedrock);
        }
        if self.scripted.is_some() {
            out.push(ProviderName::Scripted);
        }
        out
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default = "default_permissions")]
    pub permissions: PathBuf,
    /// How often the file is checked for changes.
    #[serde(default = "default_reload_ms")]
    pub reload_ms: NonZeroU64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            permissions: default_permissions(),
            reload_ms: default_reload_ms(),
        }
    }
}

fn default_permissions() -> PathBuf {
    "iii-permissions.yaml".into()
}
fn default_reload_ms() -> NonZeroU64 {
    NonZeroU64::new(500).expect("nonzero")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Week,
    Month,
}

/// A spend ceiling made (or brought up to date) at start-up through `budget::create` /
/// `budget::update`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub budget_id: String,
    pub ceiling_usd: f64,
    pub period: Period,
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// The before/after-call hooks (`agent::before_function_call`, `agent::after_function_call`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    #[serde(default = "default_before_ms")]
    pub before_call_timeout_ms: NonZeroU64,
    #[serde(default = "default_after_ms")]
    pub after_call_timeout_ms: NonZeroU64,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            before_call_timeout_ms: default_before_ms(),
            after_call_timeout_ms: default_after_ms(),
        }
    }
}

fn default_before_ms() -> NonZeroU64 {
    NonZeroU64::new(turn_orchestrator::hooks::BEFORE_TIMEOUT_MS).expect("nonzero")
}
fn default_after_ms() -> NonZeroU64 {
    NonZeroU64::new(turn_orchestrator::hooks::AFTER_TIMEOUT_MS).expect("nonzero")
}

/// When and how a long session's head is summarised.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compaction {
    /// Tokens kept free for the answer (at most half the window is reserved).
    #[serde(default = "default_reserved")]
    pub reserved_tokens: u64,
    /// Model turns always kept verbatim.
    #[serde(default = "default_keep_turns")]
    pub keep_turns: NonZeroU64,
    /// Older tool results longer than this are pruned.
    #[serde(default = "default_prune")]
    pub prune_over_chars: NonZeroU64,
}

impl Default for Compaction {
    fn default() -> Self {
        Self {
            reserved_tokens: default_reserved(),
            keep_turns: default_keep_turns(),
            prune_over_chars: default_prune(),
        }
    }
}

fn default_reserved() -> u64 {
    context_compaction::plan::RESERVED
}
fn default_keep_turns() -> NonZeroU64 {
    NonZeroU64::new(context_compaction::plan::KEEP_TURNS as u64).expect("nonzero")
}
fn default_prune() -> NonZeroU64 {
    NonZeroU64::new(context_compaction::PRUNE_OVER_CHARS as u64).expect("nonzero")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    Required,
    #[default]
    BestEffort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    #[default]
    Auto,
    Namespaces,
    Landlock,
    Process,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub cpu_secs: Option<NonZeroU64>,
    pub memory_bytes: Option<NonZeroU64>,
    pub processes: Option<NonZeroU64>,
    pub file_size_bytes: Option<NonZeroU64>,
    pub open_files: Option<NonZeroU64>,
}

/// The agent's working directory and how `shell::exec` is confined (the `HARNESS_SANDBOX*`
/// variables, when set, still win: they are how an operator overrides a file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    #[serde(default = "default_workdir")]
    pub workdir: PathBuf,
    #[serde(default)]
    pub mode: SandboxMode,
    #[serde(default)]
    pub isolation: Isolation,
    #[serde(default)]
    pub bwrap: Option<PathBuf>,
    #[serde(default)]
    pub limits: Limits,
    /// The most `fs::read` returns in one call.
    #[serde(default)]
    pub fs_read_max_bytes: Option<NonZeroU64>,
    /// Where each session's agent works: `per_session` (`<workdir>/<session-id>/`, the
    /// default) or `shared` (the working directory itself, for every session).
    #[serde(default)]
    pub workspace: Workspace,
    /// How long a finished session's directory is kept before it is removed.
    #[serde(default = "default_retention_hours")]
    pub workspace_retention_hours: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workspace {
    #[default]
    PerSession,
    Shared,
}

fn default_retention_hours() -> u64 {
    24
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            workdir: default_workdir(),
            mode: SandboxMode::default(),
            isolation: Isolation::default(),
            bwrap: None,
            limits: Limits::default(),
            fs_read_max_bytes: None,
            workspace: Workspace::default(),
            workspace_retention_hours: default_retention_hours(),
        }
    }
}

fn default_workdir() -> PathBuf {
    "./workspace".into()
}

/// Who may approve parked calls from Slack (the secrets stay in the secret store).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slack {
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub approvers: Vec<String>,
    #[serde(default)]
    pub approver_channels: Vec<String>,
    #[serde(default)]
    pub api_base: Option<url::Url>,
    /// Where the webhook listens (`POST /slack/commands`, `/slack/interactive`).
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub workers: Workers,
    /// How long start-up waits for `remote` workers to register.
    #[serde(default = "default_remote_wait")]
    pub remote_wait_secs: u64,
    #[serde(default)]
    pub run: RunDefaults,
    #[serde(default)]
    pub providers: Providers,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub budgets: Vec<Budget>,
    #[serde(default)]
    pub hooks: Hooks,
    #[serde(default)]
    pub compaction: Compaction,
    #[serde(default)]
    pub sandbox: Sandbox,
    #[serde(default)]
    pub slack: Slack,
    /// The MCP servers whose tools the `mcp` worker registers (see `presets/thick.yaml`).
    #[serde(default)]
    pub mcp_servers: Vec<mcp_client::ServerConfig>,
    /// The standard doors on the engine's port (OpenAI-compatible chat, …).
    #[serde(default)]
    pub doors: Doors,
    /// The deployed shape's layout: groups of workers that share one Lambda
    /// (`engine-gateway colocate` writes the template of it; not used by this process).
    #[serde(default)]
    pub lambda: engine_gateway::colocate::LambdaLayout,
}

fn default_remote_wait() -> u64 {
    10
}

impl Config {
    /// `thin`, `thick`, or a file's path.
    pub fn load(name_or_path: &str) -> Result<Config, ConfigError> {
        match name_or_path {
            "thin" => Config::parse(THIN, "preset thin"),
            "thick" => Config::parse(THICK, "preset thick"),
            path => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_string(),
                    source,
                })?;
                Config::parse(&text, path)
            }
        }
    }

    /// `--config` absent: `./harness.yaml` when there is one, else the thick preset.
    pub fn load_default() -> Result<(Config, String), ConfigError> {
        if Path::new("harness.yaml").exists() {
            Ok((Config::load("harness.yaml")?, "harness.yaml".into()))
        } else {
            Ok((Config::load("thick")?, "preset thick".into()))
        }
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let cfg: Config = serde_norway::from_str(text).map_err(|e| invalid(e.to_string()))?;
        cfg.check(text).map_err(invalid)?;
        Ok(cfg)
    }

    /// What serde cannot say: relations between fields, and bounds.
    fn check(&self, text: &str) -> Result<(), String> {
        let at = |path: &str| match line_of(text, path) {
            Some(n) => format!("{path} at line {n}"),
            None => path.to_string(),
        };
        if !self.workers.turn_orchestrator.present() {
            return Err(format!(
                "{}: the turn orchestrator is off, so nothing would run a turn (use embedded or remote)",
                at("workers.turn-orchestrator")
            ));
        }
        let listed = self.providers.names();
        if self.workers.providers.embedded() && listed.is_empty() {
            return Err(format!(
                "{}: providers run embedded but none is listed under `providers`",
                at("workers.providers")
            ));
        }
        if let ProviderChoice::Custom(name) = &self.run.provider
            && self.run.model.is_none()
        {
            return Err(format!(
                "{}: `{name}` is a provider of your own: name its model in run.model",
                at("run.provider")
            ));
        }
        if let ProviderChoice::Ours(wanted) = self.run.provider
            && wanted != ProviderName::Auto
            && self.workers.providers.embedded()
            && !listed.contains(&wanted)
        {
            return Err(format!(
                "{}: `{}` is not among the providers listed ({})",
                at("run.provider"),
                wanted.as_str(),
                listed
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(skills) = &self.run.system_default_skills {
            if skills.len() > turn_orchestrator::types::MAX_DEFAULT_SKILLS {
                return Err(format!(
                    "{}: at most {} skills",
                    at("run.system_default_skills"),
                    turn_orchestrator::types::MAX_DEFAULT_SKILLS
                ));
            }
            if let Some(bad) = skills.iter().find(|s| {
                s.is_empty()
                    || s.len() > turn_orchestrator::types::MAX_SKILL_ID_LEN
                    || s.chars().any(char::is_control)
            }) {
                return Err(format!(
                    "{}: `{}` is not a skill id (1-{} characters, no control characters)",
                    at("run.system_default_skills"),
                    bad.escape_debug(),
                    turn_orchestrator::types::MAX_SKILL_ID_LEN
                ));
            }
        }
        if let Err(m) = mcp_client::config::check_all(&self.mcp_servers) {
            let path = m.split(':').next().unwrap_or("mcp_servers");
            let index = path
                .split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .and_then(|(i, _)| i.parse::<usize>().ok());
            return Err(
                match index.and_then(|i| nth_item_line(text, "mcp_servers", i)) {
                    Some(n) => format!("{m} (the entry at line {n})"),
                    None => m,
                },
            );
        }
        if !self.mcp_servers.is_empty() && !self.workers.mcp.present() {
            return Err(format!(
                "{}: MCP servers are listed but the `mcp` worker is off (workers.mcp: embedded | remote | lambda)",
                at("mcp_servers")
            ));
        }
        if self.workers.mcp == Placement::Lambda
            && let Some(s) = self
                .mcp_servers
                .iter()
                .find(|s| matches!(s.transport(), mcp_client::config::Transport::Stdio(_)))
        {
            return Err(format!(
                "{}: `{}` is a stdio server, and the mcp worker runs as a Lambda: a Lambda cannot keep a server process between invocations; give it a `url` (streamable HTTP) or run the worker embedded or remote",
                at("mcp_servers"),
                s.name
            ));
        }
        if self.run.fallback.len() > turn_orchestrator::types::MAX_FALLBACK {
            return Err(format!(
                "{}: at most {} fallback models",
                at("run.fallback"),
                turn_orchestrator::types::MAX_FALLBACK
            ));
        }
        if let Some(f) = self.run.fallback.iter().find(|f| match f.provider {
            ProviderChoice::Ours(p) => {
                p == ProviderName::Auto
                    || (self.workers.providers.embedded() && !listed.contains(&p))
            }
            ProviderChoice::Custom(_) => false,
        }) {
            return Err(format!(
                "{}: `{}` is not a provider listed under `providers`",
                at("run.fallback"),
                f.provider.as_str()
            ));
        }
        if let Some(f) = self
            .run
            .fallback
            .iter()
            .find(|f| matches!(f.provider, ProviderChoice::Custom(_)) && f.model.is_none())
        {
            return Err(format!(
                "{}: `{}` is a provider of your own: name its model",
                at("run.fallback"),
                f.provider.as_str()
            ));
        }
        let ours: Vec<&str> = self.workers.all().iter().map(|(n, _, _)| *n).collect();
        for (name, w) in &self.workers.custom {
            let named_ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !named_ok {
                return Err(format!(
                    "{}: a worker name is 1-64 of [A-Za-z0-9_-], not `{name}`",
                    at("workers")
                ));
            }
            match (w.placement(), w.expect().is_empty()) {
                (Placement::Off, _) => {}
                (Placement::Remote, false) => {}
                (Placement::Remote, true) => {
                    return Err(format!(
                        "{}: `{name}` is not one of ours; a worker of your own runs remote with the function ids to wait for: `{name}: {{placement: remote, expect: [\"ns::fn\"]}}` (ours: {})",
                        at(&format!("workers.{name}")),
                        ours.join(", ")
                    ));
                }
                (p, _) => {
                    let p = match p {
                        Placement::Embedded => "embedded",
                        _ => "lambda",
                    };
                    return Err(format!(
                        "{}: `{name}` is not one of ours ({}); a worker of your own can only run remote (another process registers its functions), not {p}",
                        at(&format!("workers.{name}")),
                        ours.join(", ")
                    ));
                }
            }
            for id in w.expect() {
                let (ns, f) = id.split_once("::").unwrap_or(("", ""));
                if ns.is_empty()
                    || f.is_empty()
                    || id.len() > 256
                    || id.chars().any(char::is_control)
                {
                    return Err(format!(
                        "{}: `{id}` is not a function id (namespace::name)",
                        at(&format!("workers.{name}.expect"))
                    ));
                }
            }
        }
        let mut ids = std::collections::HashSet::new();
        for (i, b) in self.budgets.iter().enumerate() {
            if !(b.ceiling_usd.is_finite() && b.ceiling_usd > 0.0) {
                return Err(format!(
                    "{}: budgets[{i}].ceiling_usd must be a positive number of dollars, not {}",
                    at("budgets"),
                    b.ceiling_usd
                ));
            }
            if b.budget_id.is_empty() || !ids.insert(b.budget_id.as_str()) {
                return Err(format!(
                    "{}: budgets[{i}].budget_id `{}` is empty or given twice",
                    at("budgets"),
                    b.budget_id
                ));
            }
        }
        if self.remote_wait_secs > 600 {
            return Err(format!("{}: at most 600 seconds", at("remote_wait_secs")));
        }
        // The deployed layout is checked here too, so a mistake shows before a deploy.
        self.lambda.check().map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The line of the `index`th `- ` item of the top-level list `key`.
fn nth_item_line(text: &str, key: &str, index: usize) -> Option<usize> {
    let start = line_of(text, key)?;
    let mut seen = 0;
    let mut item_indent = None;
    for (n, line) in text.lines().enumerate().skip(start) {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 && !trimmed.starts_with('-') {
            return None;
        }
        if trimmed.starts_with('-') && item_indent.is_none_or(|i| i == indent) {
            item_indent = Some(indent);
            if seen == index {
                return Some(n + 1);
            }
            seen += 1;
        }
    }
    None
}

/// The line (1-based) of a dotted key path in block-style YAML, to point at a field that
/// parsed but does not fit with the rest.
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let mut want = path.split('.').peekable();
    let mut indent_above: Option<usize> = None;
    let mut key = want.next()?;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if let Some(above) = indent_above
            && indent <= above
        {
            return None; // left the parent's block without finding the key
        }
        let name = trimmed.split(':').next().unwrap_or("").trim();
        if name == key && trimmed[name.len()..].trim_start().starts_with(':') {
            match want.next() {
                None => return Some(n + 1),
                Some(next) => {
                    indent_above = Some(indent);
                    key = next;
                }
            }
        }
    }
    None
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
