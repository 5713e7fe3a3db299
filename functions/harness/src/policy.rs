//! `policy::check_permissions`: the one choke point every tool call goes through.
//!
//! Rules come from `iii-permissions.yaml` (`version: 1`, `rules:`): a bare string allows a
//! function pattern, a quoted `"!pattern"` denies it, or a mapping
//! `{rule_id?, function, action: allow|deny, args?: {field: {equals: v} | {matches: regex}}}`.
//! `*` is the only wildcard (anchored). The first matching rule wins; a rule with `args`
//! matches only if every constraint holds; no match → `needs_approval`.
//!
//! An allow rule may say `read_only: true`: what it allows only reads (fetches, lists, looks
//! up), so a run in `plan` mode may call it; the built-in allows are read-only too.
//!
//! Order of evaluation: the built-in denials of internal and human-only functions (the agent
//! may never call them, whatever the file says), then the file's rules, then the built-in
//! allows of read-only functions, then `needs_approval`.

use regex::Regex;
use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    Allow {
        rule_id: String,
    },
    Deny {
        rule_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        matched_constraint: Option<Value>,
    },
    NeedsApproval,
}

/// A decision as `policy::check_permissions` answers it.
pub fn answer(
    d: Decision,
    network: bool,
    read_only: bool,
) -> harness_sdk::contracts::policy::CheckAnswer {
    use harness_sdk::contracts::policy::{CheckAnswer, Decision as D};
    let (decision, rule_id, matched_constraint) = match d {
        Decision::Allow { rule_id } => (D::Allow, Some(rule_id), None),
        Decision::Deny {
            rule_id,
            matched_constraint,
        } => (D::Deny, Some(rule_id), matched_constraint),
        Decision::NeedsApproval => (D::NeedsApproval, None, None),
    };
    CheckAnswer {
        decision,
        rule_id,
        rule_name: None,
        matched_constraint,
        network,
        read_only,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Debug, Clone)]
pub enum Constraint {
    Equals(Value),
    Matches(Regex),
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub rule_id: String,
    pub function: String,
    pub action: Action,
    pub args: Vec<(String, Constraint)>,
    /// An allow rule may open the network to the command it allows (`network: true`):
    /// `shell::exec` runs without network otherwise.
    pub network: bool,
    /// Constraints on what the function registered in its `metadata` (an MCP tool's
    /// `read_only`, say): the worker's claim about the function, never the agent's.
    pub metadata: Vec<(String, Constraint)>,
    /// What this allow rule allows only reads: a `plan` run may call it.
    pub read_only: bool,
    /// A human name (`name:`), shown to people in place of the rule id.
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: line {line}: {message}")]
pub struct PolicyError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// Functions the agent may never call: internal or human-only.
pub const DEFAULT_DENY: &[&str] = &[
    "approval::resolve",
    "policy::*",
    "state::set",
    "state::update",
    "state::delete",
    "state::transact",
    // Forces the store's disk syncs: the harness's own pacing, not the agent's.
    "state::sync",
    // The UI's event stream is the harness's to write: an agent could forge events.
    "stream::set",
    "stream::set_many",
    "stream::delete",
    "run::start",
    "auth::set_token",
    "auth::delete_token",
    // Provider keys are the harness's, never the agent's.
    "auth::get_token",
    "engine::durable::publish",
    "iii::durable::publish",
    "hook-fanout::publish_collect",
];

/// Read-only functions allowed unless the file says otherwise.
pub const DEFAULT_ALLOW: &[&str] = &[
    "state::get",
    "state::list",
    "models::*",
    "directory::skills::*",
    "auth::status",
];

/// Whether a `state::get` / `state::list` stays in the session's keys, read by the engine's
/// own definition of what the call reaches (once, the policy checked a list's `key` while
/// the engine listed by `prefix`, and another session's state came back).
fn in_session(function_id: &str, args: &Value, session: Option<&str>) -> bool {
    use bus::state_api::{StateReach, read_reach};
    let Some(sid) = session.filter(|s| !s.is_empty() && !s.contains('/')) else {
        return false;
    };
    let own = format!("session/{sid}/");
    match read_reach(function_id, args) {
        Some(Ok(StateReach::Key { scope, key })) => {
            scope == "agent" && key.starts_with(&own) && !key.contains("..")
        }
        Some(Ok(StateReach::Prefix { scope, prefix })) => {
            scope == "agent" && prefix.starts_with(&own)
        }
        _ => false,
    }
}

/// `*` is the only wildcard, anchored at both ends.
pub fn pattern_matches(pattern: &str, function_id: &str) -> bool {
    bus::engine::glob_match(pattern, function_id)
}

impl Rule {
    fn simple(rule_id: String, function: &str, action: Action) -> Self {
        Self {
            rule_id,
            function: function.to_string(),
            action,
            args: Vec::new(),
            network: false,
            metadata: Vec::new(),
            read_only: false,
            name: None,
        }
    }

    /// `None` when it matches; otherwise the first constraint that failed.
    fn failed_constraint(&self, args: &Value) -> Option<Value> {
        failed(&self.args, args)
    }

    fn constraint_json(&self, field: &str, c: &Constraint) -> Value {
        constraint_json(field, c)
    }

    fn matches(&self, function_id: &str, args: &Value, metadata: &Value) -> bool {
        pattern_matches(&self.function, function_id)
            && self.failed_constraint(args).is_none()
            && failed(&self.metadata, metadata).is_none()
    }
}

fn constraint_json(field: &str, c: &Constraint) -> Value {
    match c {
        Constraint::Equals(v) => json!({field: {"equals": v}}),
        Constraint::Matches(re) => json!({field: {"matches": re.as_str()}}),
    }
}

/// The first of `constraints` that `values` fails, as JSON.
fn failed(constraints: &[(String, Constraint)], values: &Value) -> Option<Value> {
    {
        let args = values;
        for (field, c) in constraints {
            let actual = args.get(field);
            let ok = match (c, actual) {
                (Constraint::Equals(v), Some(a)) => a == v,
                (Constraint::Matches(re), Some(Value::String(s))) => re.is_match(s),
                (Constraint::Matches(re), Some(other)) if !other.is_null() => {
                    re.is_match(&other.to_string())
                }
                _ => false,
            };
            if !ok {
                return Some(constraint_json(field, c));
            }
        }
        None
    }
}

/// The rules in force: defaults around the file's rules.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub file_rules: Vec<Rule>,
}

impl Policy {
    pub fn decide(&self, function_id: &str, args: &Value) -> Decision {
        self.decide_in(function_id, args, None)
    }

    /// [`Policy::decide`] for a call made in `session`: by default `state::get` and
    /// `state::list` reach only that session's keys (scope `agent`, keys under
    /// `session/<sid>/`); a file rule may allow more.
    pub fn decide_in(&self, function_id: &str, args: &Value, session: Option<&str>) -> Decision {
        self.decide_with(function_id, args, session, &Value::Null)
    }

    /// Whether a rule that could match `function_id` reads its registered metadata (the
    /// caller then looks it up for [`Policy::decide_with`]).
    pub fn reads_metadata(&self, function_id: &str) -> bool {
        self.file_rules
            .iter()
            .any(|r| !r.metadata.is_empty() && pattern_matches(&r.function, function_id))
    }

    /// [`Policy::decide_in`] with the function's registered `metadata` (`Null`: unknown, so
    /// a rule that constrains it does not match).
    pub fn decide_with(
        &self,
        function_id: &str,
        args: &Value,
        session: Option<&str>,
        metadata: &Value,
    ) -> Decision {
        for (i, p) in DEFAULT_DENY.iter().enumerate() {
            if pattern_matches(p, function_id) {
                return Decision::Deny {
                    rule_id: format!("default-deny-{i}:{p}"),
                    matched_constraint: None,
                };
            }
        }
        for rule in &self.file_rules {
            if rule.matches(function_id, args, metadata) {
                return match rule.action {
                    Action::Allow => Decision::Allow {
                        rule_id: rule.rule_id.clone(),
                    },
                    Action::Deny => Decision::Deny {
                        rule_id: rule.rule_id.clone(),
                        matched_constraint: match rule.args.is_empty() {
                            true => None,
                            false => Some(Value::Object(
                                rule.args
                                    .iter()
                                    .flat_map(|(f, c)| {
                                        rule.constraint_json(f, c)
                                            .as_object()
                                            .cloned()
                                            .unwrap_or_default()
                                    })
                                    .collect(),
                            )),
                        },
                    },
                };
            }
        }
        if matches!(
            function_id,
            "state::get" | "state::get_versioned" | "state::list"
        ) && !in_session(function_id, args, session)
        {
            return Decision::Deny {
                rule_id: "default-deny:state-outside-the-session".into(),
                matched_constraint: Some(
                    json!({"scope": {"equals": "agent"}, "key": {"matches": format!("^session/{}/", session.unwrap_or("<session>"))}}),
                ),
            };
        }
        for (i, p) in DEFAULT_ALLOW.iter().enumerate() {
            if pattern_matches(p, function_id) {
                return Decision::Allow {
                    rule_id: format!("default-allow-{i}:{p}"),
                };
            }
        }
        Decision::NeedsApproval
    }

    /// Whether the file rule that allows this call grants it the network.
    pub fn network_granted(&self, function_id: &str, args: &Value) -> bool {
        self.network_granted_with(function_id, args, &Value::Null)
    }

    /// The human name of the file rule with this id.
    pub fn rule_name(&self, rule_id: &str) -> Option<String> {
        self.file_rules
            .iter()
            .find(|r| r.rule_id == rule_id)
            .and_then(|r| r.name.clone())
    }

    /// Whether the call is allowed as a read: by a file rule marked `read_only: true`, or by
    /// a built-in allow of a read-only function (when no file rule matched).
    pub fn read_only_with(
        &self,
        function_id: &str,
        args: &Value,
        session: Option<&str>,
        metadata: &Value,
    ) -> bool {
        match self.decide_with(function_id, args, session, metadata) {
            Decision::Allow { rule_id } if rule_id.starts_with("default-allow-") => true,
            Decision::Allow { .. } => self
                .file_rules
                .iter()
                .find(|r| r.matches(function_id, args, metadata))
                .is_some_and(|r| r.read_only),
            _ => false,
        }
    }

    pub fn network_granted_with(&self, function_id: &str, args: &Value, metadata: &Value) -> bool {
        self.file_rules
            .iter()
            .find(|r| r.matches(function_id, args, metadata))
            .is_some_and(|r| r.action == Action::Allow && r.network)
    }

    /// Parse `iii-permissions.yaml`. Every error names the line it is about.
    pub fn parse(file: &str, text: &str) -> Result<Policy, PolicyError> {
        let err = |line: usize, message: String| PolicyError {
            file: file.to_string(),
            line,
            message,
        };
        let doc: serde_norway::Value = serde_norway::from_str(text).map_err(|e| {
            let line = e.location().map(|l| l.line()).unwrap_or(1);
            err(line, format!("not valid YAML: {e}"))
        })?;
        let map = doc.as_mapping().ok_or_else(|| {
            err(
                1,
                "the file must be a mapping with `version` and `rules`".into(),
            )
        })?;
        match map.get("version") {
            Some(v) if v.as_u64() == Some(1) => {}
            Some(v) => {
                return Err(err(
                    line_of_key(text, "version"),
                    format!("unsupported `version` {v:?}; expected 1"),
                ));
            }
            None => return Err(err(1, "missing `version: 1`".into())),
        }
        let rules = match map.get("rules") {
            None | Some(serde_norway::Value::Null) => return Ok(Policy::default()),
            Some(serde_norway::Value::Sequence(s)) => s,
            Some(_) => {
                return Err(err(
                    line_of_key(text, "rules"),
                    "`rules` must be a list".into(),
                ));
            }
        };
        let item_lines = rule_item_lines(text);
        let mut out = Vec::new();
        for (i, item) in rules.iter().enumerate() {
            let line = item_lines
                .get(i)
                .copied()
                .unwrap_or_else(|| line_of_key(text, "rules"));
            let default_id = format!("rule-{}", i + 1);
            let rule = match item {
                serde_norway::Value::String(s) => match s.strip_prefix('!') {
                    Some(p) => Rule::simple(
                        default_id,
                        check_pattern(p).map_err(|m| err(line, m))?,
                        Action::Deny,
                    ),
                    None => Rule::simple(
                        default_id,
                        check_pattern(s).map_err(|m| err(line, m))?,
                        Action::Allow,
                    ),
                },
                serde_norway::Value::Mapping(m) => {
                    for k in m.keys() {
                        let k = k.as_str().unwrap_or("?");
                        if ![
                            "rule_id",
                            "function",
                            "action",
                            "args",
                            "network",
                            "metadata",
                            "read_only",
                            "name",
                        ]
                        .contains(&k)
                        {
                            return Err(err(
                                line,
                                format!(
                                    "unknown field `{k}` (rule_id, name, function, action, args, metadata, network, read_only)"
                                ),
                            ));
                        }
                    }
                    let function = m
                        .get("function")
                        .and_then(|v| v.as_str())
                        .ok_or_else(|| err(line, "rule is missing `function`".into()))?;
                    let function = check_pattern(function).map_err(|m| err(line, m))?;
                    let action = match m.get("action").and_then(|v| v.as_str()) {
                        Some("allow") => Action::Allow,
                        Some("deny") => Action::Deny,
                        Some(other) => {
                            return Err(err(
                                line,
                                format!("`action` must be allow or deny, got `{other}`"),
                            ));
                        }
                        None => {
                            return Err(err(
                                line,
                                "rule is missing `action` (allow or deny)".into(),
                            ));
                        }
                    };
                    let rule_id = match m.get("rule_id") {
                        None => default_id,
                        Some(v) => v
                            .as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| err(line, "`rule_id` must be a string".into()))?,
                    };
                    let args = match m.get("args") {
                        Some(a) => constraints(a, "args").map_err(|m| err(line, m))?,
                        None => Vec::new(),
                    };
                    let metadata = match m.get("metadata") {
                        Some(a) => constraints(a, "metadata").map_err(|m| err(line, m))?,
                        None => Vec::new(),
                    };
                    let network = match m.get("network") {
                        None => false,
                        Some(v) => v
                            .as_bool()
                            .ok_or_else(|| err(line, "`network` must be true or false".into()))?,
                    };
                    if network && action != Action::Allow {
                        return Err(err(line, "`network: true` belongs on an allow rule".into()));
                    }
                    let read_only = match m.get("read_only") {
                        None => false,
                        Some(v) => v
                            .as_bool()
                            .ok_or_else(|| err(line, "`read_only` must be true or false".into()))?,
                    };
                    let name = match m.get("name") {
                        None => None,
                        Some(v) => Some(
                            v.as_str()
                                .filter(|n| !n.trim().is_empty() && n.len() <= 120)
                                .map(str::to_owned)
                                .ok_or_else(|| {
                                    err(
                                        line,
                                        "`name` must be a string of 1 to 120 characters".into(),
                                    )
                                })?,
                        ),
                    };
                    if read_only && action != Action::Allow {
                        return Err(err(
                            line,
                            "`read_only: true` belongs on an allow rule".into(),
                        ));
                    }
                    Rule {
                        rule_id,
                        function: function.to_string(),
                        action,
                        args,
                        network,
                        metadata,
                        read_only,
                        name,
                    }
                }
                other => {
                    return Err(err(
                        line,
                        format!("a rule must be a string or a mapping, got {other:?}"),
                    ));
                }
            };
            out.push(rule);
        }
        Ok(Policy { file_rules: out })
    }
}

/// `{field: {equals: v} | {matches: regex}}` of a rule's `args` or `metadata`.
fn constraints(a: &serde_norway::Value, what: &str) -> Result<Vec<(String, Constraint)>, String> {
    let a = a
        .as_mapping()
        .ok_or_else(|| format!("`{what}` must be a mapping of field → constraint"))?;
    let mut out = Vec::new();
    for (field, c) in a {
        let field = field
            .as_str()
            .ok_or_else(|| format!("`{what}` keys must be field names"))?
            .to_string();
        let c = c.as_mapping().ok_or_else(|| {
            format!("constraint on `{field}` must be {{equals: value}} or {{matches: regex}}")
        })?;
        let constraint = match (c.get("equals"), c.get("matches"), c.len()) {
            (Some(v), None, 1) => Constraint::Equals(
                serde_json::to_value(v).map_err(|e| format!("`{field}.equals`: {e}"))?,
            ),
            (None, Some(re), 1) => {
                let re = re
                    .as_str()
                    .ok_or_else(|| format!("`{field}.matches` must be a string"))?;
                Constraint::Matches(
                    Regex::new(re)
                        .map_err(|e| format!("`{field}.matches` is not a valid regex: {e}"))?,
                )
            }
            _ => {
                return Err(format!(
                    "constraint on `{field}` must be exactly one of `equals` or `matches`"
                ));
            }
        };
        out.push((field, constraint));
    }
    Ok(out)
}

fn check_pattern(p: &str) -> Result<&str, String> {
    if p.trim().is_empty() {
        return Err("empty function pattern".into());
    }
    if p.chars().any(|c| c.is_whitespace() || "?[]{}|".contains(c)) {
        return Err(format!(
            "`{p}`: `*` is the only wildcard and patterns have no spaces"
        ));
    }
    Ok(p)
}

fn line_of_key(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(&format!("{key}:")))
        .map(|i| i + 1)
        .unwrap_or(1)
}

/// 1-based line of each top-level item of the `rules:` list.
fn rule_item_lines(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut in_rules = false;
    let mut item_indent: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 {
            in_rules = trimmed.starts_with("rules:");
            continue;
        }
        if in_rules && trimmed.starts_with('-') {
            match item_indent {
                None => {
                    item_indent = Some(indent);
                    out.push(i + 1);
                }
                Some(n) if n == indent => out.push(i + 1),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
