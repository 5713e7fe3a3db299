//! Co-location: `harness.yaml`'s `lambda.colocate` names groups of workers that share one
//! Lambda, and [`colocate`] turns `infra/template.yaml` (one Lambda per worker, the default)
//! into the template of that layout: each group one function running the `colocated-lambda`
//! bootstrap, with its members' variables, policies, event sources, largest memory and
//! timeout, and their log groups replaced by its own. Calls between a group's workers then
//! stay in its process (`harness_sdk::colocated`).
//!
//! ```yaml
//! lambda:
//!   colocate:
//!     core: [turn-orchestrator, policy, session, hook-fanout]
//!     catalogue: [auth-credentials, llm-budget, models-catalog]
//! ```

use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// `harness.yaml`'s `lambda` section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LambdaLayout {
    /// Group name (the Lambda's name after the prefix) → the workers it serves.
    #[serde(default)]
    pub colocate: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ColocateError {
    #[error("lambda.colocate.{group}: {message}")]
    Group { group: String, message: String },
    #[error("the template: {0}")]
    Template(String),
    #[error("{origin}: {message}")]
    Config { origin: String, message: String },
}

/// The bootstrap every group runs.
pub const BINARY: &str = "colocated-lambda";

/// A worker's name in `harness.yaml` → the binary of its Lambda in the template, for the
/// workers the co-located bootstrap serves (`colocated_lambda::WORKERS`). `policy` and
/// `harness` are one Lambda: naming either moves both.
const SHAREABLE: &[(&str, &str)] = &[
    ("turn-orchestrator", "turn-orchestrator"),
    ("policy", "harness-worker"),
    ("harness", "harness-worker"),
    ("approval-gate", "approval-gate"),
    ("session", "session"),
    ("llm-budget", "llm-budget"),
    ("hook-fanout", "hook-fanout"),
    ("auth-credentials", "auth-credentials"),
    ("models-catalog", "models-catalog"),
    ("directory", "directory"),
    ("context-compaction", "context-compaction"),
];

/// The binaries the co-located bootstrap serves (what `HARNESS_COLOCATED_WORKERS` may name).
pub fn shareable_binaries() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for (_, b) in SHAREABLE {
        if !out.contains(b) {
            out.push(b);
        }
    }
    out
}

/// The cargo features of `colocated-lambda` a layout needs: its groups' members' binaries
/// (one bootstrap serves every group), so that its bootstrap links only what it serves.
pub fn bootstrap_features(layout: &LambdaLayout) -> Vec<&'static str> {
    let named: Vec<&str> = layout
        .colocate
        .values()
        .flatten()
        .map(String::as_str)
        .collect();
    shareable_binaries()
        .into_iter()
        .filter(|b| {
            SHAREABLE
                .iter()
                .any(|(name, binary)| binary == b && named.contains(name))
        })
        .collect()
}

/// Workers that keep a Lambda of their own, and why.
const APART: &[(&str, &str)] = &[
    (
        "providers",
        "each provider keeps its Lambda (its keys, its streamed answers)",
    ),
    (
        "tools",
        "the tools run in their own sandboxed Lambda, away from the harness's credentials",
    ),
    (
        "mcp",
        "the MCP client keeps its Lambda (its servers' processes and secrets)",
    ),
    (
        "slack-approval",
        "the Slack webhook keeps its Lambda (its Function URL)",
    ),
];

/// Lambdas that stay apart and call back into shareable workers while a call to them is in
/// flight (a provider asks for its key, records the cost, reads the model's entry; the MCP
/// client asks for a server's token), with the shareable workers that call them.
const CALLED_AND_CALLING_BACK: &[(&str, &[&str], &[&str])] = &[
    (
        "providers",
        &["turn-orchestrator", "context-compaction"],
        &["auth-credentials", "llm-budget", "models-catalog"],
    ),
    ("mcp", &["turn-orchestrator"], &["auth-credentials"]),
];

/// The properties a member function may have; anything else is refused rather than dropped.
const MERGED_PROPERTIES: &[&str] = &[
    "FunctionName",
    "Description",
    "MemorySize",
    "Timeout",
    "Environment",
    "Policies",
    "Events",
];

impl LambdaLayout {
    /// Only the `lambda` section of a `harness.yaml` (the rest is the harness's).
    pub fn from_config(text: &str, origin: &str) -> Result<Self, ColocateError> {
        let invalid = |message: String| ColocateError::Config {
            origin: origin.to_string(),
            message,
        };
        let doc: Value = serde_norway::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let layout: LambdaLayout = match doc.get("lambda") {
            None | Some(Value::Null) => LambdaLayout::default(),
            Some(section) => serde_json::from_value(section.clone())
                .map_err(|e| invalid(format!("lambda: {e}")))?,
        };
        layout.check()?;
        Ok(layout)
    }

    /// What needs no template: names, known workers, each in one group, two Lambdas a group.
    pub fn check(&self) -> Result<(), ColocateError> {
        let mut placed: BTreeMap<&str, &str> = BTreeMap::new();
        for (group, workers) in &self.colocate {
            let err = |message: String| ColocateError::Group {
                group: group.clone(),
                message,
            };
            let valid = group.len() <= 40
                && group.starts_with(|c: char| c.is_ascii_lowercase())
                && group
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid {
                return Err(err(
                    "a group's name is its Lambda's (after the prefix): lowercase letters, digits and `-`, starting with a letter, at most 40".into(),
                ));
            }
            for w in workers {
                let Some((_, binary)) = SHAREABLE.iter().find(|(n, _)| n == w) else {
                    return Err(err(match APART.iter().find(|(n, _)| n == w) {
                        Some((_, why)) => format!("`{w}` cannot share a Lambda: {why}"),
                        None => format!(
                            "`{w}` is not a worker that can share a Lambda (any of: {})",
                            SHAREABLE
                                .iter()
                                .map(|(n, _)| *n)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }));
                };
                if let Some(other) = placed.insert(binary, group)
                    && other != group
                {
                    return Err(err(format!(
                        "`{w}` is also in group `{other}` (policy and harness are one Lambda)"
                    )));
                }
            }
            if self.binaries(group).len() < 2 {
                return Err(err(
                    "a group shares one Lambda among at least two workers' Lambdas".into(),
                ));
            }
            // A member waiting on a Lambda that calls back into the same group holds one of
            // its instances while the call back needs another: with the group's concurrency
            // taken by such calls (a reserved concurrency, or the account's limit), every
            // call back waits until it times out.
            for (apart, callers, called_back) in CALLED_AND_CALLING_BACK {
                let caller = workers.iter().find(|w| callers.contains(&w.as_str()));
                let back = workers.iter().find(|w| called_back.contains(&w.as_str()));
                if let (Some(caller), Some(back)) = (caller, back) {
                    return Err(err(format!(
                        "`{caller}` calls the {apart}' Lambdas, which call `{back}` back while it waits: in one Lambda those calls need a second instance each and wait for one when its concurrency is taken; put `{back}` in another group"
                    )));
                }
            }
        }
        Ok(())
    }

    /// A group's binaries, deduplicated, in the order named.
    fn binaries(&self, group: &str) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for w in self.colocate.get(group).into_iter().flatten() {
            if let Some((_, b)) = SHAREABLE.iter().find(|(n, _)| n == w)
                && !out.contains(b)
            {
                out.push(b);
            }
        }
        out
    }
}

fn pascal(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// `FunctionName`'s `Fn::Sub` text (`${Prefix}session`).
fn function_name(resource: &Value) -> Option<&str> {
    resource["Properties"]["FunctionName"]["Fn::Sub"].as_str()
}

/// The template of `layout`: each group's members replaced by one function. No group: the
/// template as it is.
pub fn colocate(template: &Value, layout: &LambdaLayout) -> Result<Value, ColocateError> {
    layout.check()?;
    let mut out = template.clone();
    let resources = out["Resources"]
        .as_object_mut()
        .ok_or_else(|| ColocateError::Template("no Resources".into()))?;
    let mut renamed: BTreeMap<String, String> = BTreeMap::new();
    for group in layout.colocate.keys() {
        let err = |message: String| ColocateError::Group {
            group: group.clone(),
            message,
        };
        let mut members: Vec<(String, Value)> = Vec::new();
        for binary in layout.binaries(group) {
            let found: Vec<String> = resources
                .iter()
                .filter(|(_, r)| {
                    r["Type"] == "AWS::Serverless::Function"
                        && r["Metadata"]["BuildProperties"]["Binary"] == binary
                })
                .map(|(id, _)| id.clone())
                .collect();
            let [id] = found.as_slice() else {
                return Err(err(format!(
                    "the template has {} functions of binary `{binary}` (one expected)",
                    found.len()
                )));
            };
            members.push((id.clone(), resources[id].clone()));
        }
        let id = format!("Colocated{}Function", pascal(group));
        let sub_name = format!("${{Prefix}}{group}");
        let taken = resources.iter().any(|(rid, r)| {
            function_name(r) == Some(&sub_name) && !members.iter().any(|(m, _)| m == rid)
        });
        if taken || resources.contains_key(&id) {
            return Err(err(format!(
                "another function of the template is already named `{group}`"
            )));
        }
        let merged = merge(group, &sub_name, &members).map_err(err)?;
        // Each member's log group goes with it; the group's own takes their retention.
        let mut retention = None;
        for (member, r) in &members {
            let logs = function_name(r).map(|n| format!("/aws/lambda/{n}"));
            let log_ids: Vec<String> = resources
                .iter()
                .filter(|(_, l)| {
                    l["Type"] == "AWS::Logs::LogGroup"
                        && l["Properties"]["LogGroupName"]["Fn::Sub"].as_str() == logs.as_deref()
                })
                .map(|(lid, _)| lid.clone())
                .collect();
            for lid in log_ids {
                if let Some(l) = resources.remove(&lid) {
                    retention.get_or_insert(l["Properties"]["RetentionInDays"].clone());
                }
            }
            resources.remove(member);
            renamed.insert(member.clone(), id.clone());
        }
        let mut logs = json!({
            "Type": "AWS::Logs::LogGroup",
            "Properties": {"LogGroupName": {"Fn::Sub": format!("/aws/lambda/{sub_name}")}},
        });
        if let Some(r) = retention.filter(|r| !r.is_null()) {
            logs["Properties"]["RetentionInDays"] = r;
        }
        resources.insert(format!("Colocated{}Logs", pascal(group)), logs);
        resources.insert(id, merged);
    }
    if !renamed.is_empty() {
        rewrite_references(&mut out, &renamed);
    }
    Ok(out)
}

/// One function serving `members`.
fn merge(group: &str, sub_name: &str, members: &[(String, Value)]) -> Result<Value, String> {
    let mut env = Map::new();
    let mut policies: Vec<Value> = Vec::new();
    let mut events = Map::new();
    let (mut memory, mut timeout) = (0u64, 0u64);
    let mut served = Vec::new();
    for (id, r) in members {
        let p = &r["Properties"];
        if let Some(extra) = p
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
            .find(|k| !MERGED_PROPERTIES.contains(&k.as_str()))
        {
            return Err(format!(
                "{id} has `{extra}`, which a shared function cannot take over"
            ));
        }
        for (k, v) in p["Environment"]["Variables"]
            .as_object()
            .into_iter()
            .flatten()
        {
            match env.get(k) {
                Some(other) if other != v => {
                    return Err(format!(
                        "{id} sets {k} to {v}, another member to {other}: one process has one environment"
                    ));
                }
                _ => {
                    env.insert(k.clone(), v.clone());
                }
            }
        }
        for policy in p["Policies"].as_array().into_iter().flatten() {
            if !policies.contains(policy) {
                policies.push(policy.clone());
            }
        }
        for (name, e) in p["Events"].as_object().into_iter().flatten() {
            if events.insert(name.clone(), e.clone()).is_some() {
                return Err(format!("two members have an event source named `{name}`"));
            }
        }
        memory = memory.max(p["MemorySize"].as_u64().unwrap_or(128));
        timeout = timeout.max(p["Timeout"].as_u64().unwrap_or(3));
        served.push(
            r["Metadata"]["BuildProperties"]["Binary"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    env.insert(
        "HARNESS_COLOCATED_WORKERS".into(),
        Value::String(served.join(",")),
    );
    let mut properties = json!({
        "FunctionName": {"Fn::Sub": sub_name},
        "Description": format!("Co-located ({group}): {}; calls between them stay in process.", served.join(", ")),
        "MemorySize": memory,
        "Timeout": timeout,
        "Environment": {"Variables": env},
        "Policies": policies,
    });
    if !events.is_empty() {
        properties["Events"] = Value::Object(events);
    }
    Ok(json!({
        "Type": "AWS::Serverless::Function",
        "Metadata": {"BuildMethod": "rust-cargolambda", "BuildProperties": {"Binary": BINARY}},
        "Properties": properties,
    }))
}

/// `Ref`, `Fn::GetAtt` and `Fn::Sub` references to a member now name its group's function.
fn rewrite_references(v: &mut Value, renamed: &BTreeMap<String, String>) {
    match v {
        Value::Object(o) => {
            for (k, child) in o.iter_mut() {
                match (k.as_str(), &mut *child) {
                    ("Ref", Value::String(s)) => {
                        if let Some(n) = renamed.get(s.as_str()) {
                            *s = n.clone();
                        }
                    }
                    ("Fn::GetAtt", Value::Array(a)) => {
                        if let Some(Value::String(s)) = a.first_mut()
                            && let Some(n) = renamed.get(s.as_str())
                        {
                            *s = n.clone();
                        }
                    }
                    ("Fn::Sub", Value::String(s)) => {
                        for (old, new) in renamed {
                            *s = s
                                .replace(&format!("${{{old}}}"), &format!("${{{new}}}"))
                                .replace(&format!("${{{old}."), &format!("${{{new}."));
                        }
                    }
                    _ => rewrite_references(child, renamed),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| rewrite_references(c, renamed)),
        _ => {}
    }
}

/// [`colocate`] from files: the template's YAML and a `harness.yaml`, as YAML text for
/// `sam deploy` or `engine-gateway deployed --template`.
pub fn colocate_files(
    template: &std::path::Path,
    config: &std::path::Path,
) -> Result<String, ColocateError> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| ColocateError::Config {
            origin: p.display().to_string(),
            message: e.to_string(),
        })
    };
    let t: Value = serde_norway::from_str(&read(template)?)
        .map_err(|e| ColocateError::Template(format!("{}: {e}", template.display())))?;
    let layout = LambdaLayout::from_config(&read(config)?, &config.display().to_string())?;
    let out = colocate(&t, &layout)?;
    let yaml = serde_norway::to_string(&out).map_err(|e| ColocateError::Template(e.to_string()))?;
    Ok(format!(
        "# Generated by `engine-gateway colocate` from {} and {}: edit those, not this.\n\
         # Its bootstrap needs only: cargo lambda build -p {BINARY} --no-default-features --features {}\n{yaml}",
        template.display(),
        config.display(),
        bootstrap_features(&layout).join(",")
    ))
}

#[cfg(test)]
#[path = "colocate_tests.rs"]
mod tests;
