//! The infrastructure template and what the code provisions never drift apart:
//! `infra/template.yaml` declares exactly the tables, queues (with their DLQs and settings)
//! and secrets of `localstack/resources.json` (itself checked against the code), every
//! function's memory and timeout are its crate's `[package.metadata.lambda.deploy]`, and
//! every worker binary is deployed, and every variable a deployed function reads is documented
//! in infra/README.md and set by the template where that table says.

use crate::workspace;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn template() -> Value {
    let text = std::fs::read_to_string("infra/template.yaml").expect("infra/template.yaml");
    serde_norway::from_str(&text).expect("the template is YAML without custom tags")
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string("localstack/resources.json").unwrap()).unwrap()
}

/// `{"Fn::Sub": "${Prefix}x"}` with the manifest's prefix.
fn name_of(v: &Value, prefix: &str) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => o["Fn::Sub"]
            .as_str()
            .expect("a Fn::Sub name")
            .replace("${Prefix}", prefix),
        other => panic!("unexpected name {other}"),
    }
}

fn resources_of<'a>(t: &'a Value, kind: &str) -> Vec<(&'a String, &'a Value)> {
    t["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .collect()
}

/// A Cargo.toml's `key = value` lines with the `[section]` each is in (just enough TOML).
fn toml_lines(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            out.push((
                section.clone(),
                k.trim().to_string(),
                v.trim().trim_matches('"').to_string(),
            ));
        }
    }
    out
}

/// Binaries and lambda deploy settings of every crate in the workspace.
fn crates() -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let dirs = workspace::crate_dirs();
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let (mut bins, mut memory, mut timeout) = (Vec::new(), None, None);
        // A binary's own settings (`[package.metadata.lambda.bin.<name>.deploy]`) win.
        let mut own: BTreeMap<String, (Option<u64>, Option<u64>)> = BTreeMap::new();
        for (section, k, v) in toml_lines(&text) {
            let (k, v) = (k.as_str(), v.as_str());
            let bin = section
                .strip_prefix("[package.metadata.lambda.bin.")
                .and_then(|s| s.strip_suffix(".deploy]"));
            match (section.as_str(), k, bin) {
                ("[[bin]]", "name", _) => bins.push(v.to_string()),
                ("[package.metadata.lambda.deploy]", "memory", _) => memory = v.parse().ok(),
                ("[package.metadata.lambda.deploy]", "timeout", _) => timeout = v.parse().ok(),
                (_, "memory", Some(b)) => own.entry(b.into()).or_default().0 = v.parse().ok(),
                (_, "timeout", Some(b)) => own.entry(b.into()).or_default().1 = v.parse().ok(),
                _ => {}
            }
        }
        // Every deployable crate (a bin and lambda settings) is listed; test-only tools have none.
        if let (Some(m), Some(t)) = (memory, timeout) {
            for b in &bins {
                let (bm, bt) = own.get(b).copied().unwrap_or_default();
                out.insert(b.clone(), (bm.unwrap_or(m), bt.unwrap_or(t)));
            }
        }
    }
    out
}

#[test]
fn tables_queues_and_secrets_match_what_is_provisioned() {
    let t = template();
    let m = manifest();
    let prefix = m["prefix"].as_str().unwrap();
    assert_eq!(t["Parameters"]["Prefix"]["Default"], prefix);

    let mut tables = BTreeMap::new();
    for (_, r) in resources_of(&t, "AWS::DynamoDB::Table") {
        let p = &r["Properties"];
        let keys: BTreeMap<String, String> = p["KeySchema"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["KeyType"].as_str().unwrap().to_string(),
                    k["AttributeName"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(p["BillingMode"], "PAY_PER_REQUEST");
        let stream = p["StreamSpecification"]["StreamViewType"].as_str();
        assert!(
            stream.is_none() || stream == Some("NEW_AND_OLD_IMAGES"),
            "state triggers need old and new images"
        );
        let ttl = &p["TimeToLiveSpecification"];
        let expires = (ttl["Enabled"] == true)
            .then(|| ttl["AttributeName"].as_str().map(str::to_owned))
            .flatten();
        tables.insert(
            name_of(&p["TableName"], prefix),
            (
                keys.get("HASH").cloned(),
                keys.get("RANGE").cloned(),
                stream.is_some(),
                expires,
            ),
        );
    }
    type Table = (Option<String>, Option<String>, bool, Option<String>);
    let expected: BTreeMap<String, Table> = m["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                (
                    x["hash_key"].as_str().map(str::to_owned),
                    x["range_key"].as_str().map(str::to_owned),
                    x["stream"] == true,
                    x["expires"].as_str().map(str::to_owned),
                ),
            )
        })
        .collect();
    assert_eq!(
        tables, expected,
        "tables: template vs localstack/resources.json"
    );

    let queues: BTreeMap<String, &Value> = resources_of(&t, "AWS::SQS::Queue")
        .into_iter()
        .map(|(id, r)| (id.clone(), r))
        .collect();
    let by_name: BTreeMap<String, &Value> = queues
        .values()
        .map(|r| {
            (
                name_of(&r["Properties"]["QueueName"], prefix),
                &r["Properties"],
            )
        })
        .collect();
    assert_eq!(
        by_name.len(),
        2 * m["queues"].as_array().unwrap().len(),
        "each queue and its DLQ, nothing else"
    );
    for q in m["queues"].as_array().unwrap() {
        let name = q["sqs_name"].as_str().unwrap();
        let props = by_name
            .get(name)
            .unwrap_or_else(|| panic!("queue {name} is not in the template"));
        let fifo = q["type"] == "fifo";
        assert_eq!(
            props["FifoQueue"].as_bool().unwrap_or(false),
            fifo,
            "{name}: FIFO"
        );
        assert_eq!(
            props["VisibilityTimeout"].as_u64().unwrap() * 1000,
            q["visibility_timeout_ms"].as_u64().unwrap(),
            "{name}: visibility timeout"
        );
        assert_eq!(
            props["RedrivePolicy"]["maxReceiveCount"], q["max_receive_count"],
            "{name}: maxReceiveCount"
        );
        let dlq_id = props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
            .as_str()
            .unwrap();
        let dlq_name = name_of(&queues[dlq_id]["Properties"]["QueueName"], prefix);
        assert_eq!(dlq_name, q["dlq_name"].as_str().unwrap(), "{name}: its DLQ");
        assert_eq!(
            queues[dlq_id]["Properties"]["FifoQueue"]
                .as_bool()
                .unwrap_or(false),
            fifo,
            "a FIFO queue needs a FIFO DLQ"
        );
    }

    let secrets: BTreeSet<String> = resources_of(&t, "AWS::SecretsManager::Secret")
        .into_iter()
        .map(|(_, r)| name_of(&r["Properties"]["Name"], prefix))
        .collect();
    let provisioned: BTreeSet<String> = m["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        secrets, provisioned,
        "secrets: template vs localstack/resources.json"
    );
}

#[test]
fn every_worker_is_deployed_with_its_crate_settings() {
    let t = template();
    let crates = crates();
    let mut deployed = BTreeSet::new();
    for (id, f) in resources_of(&t, "AWS::Serverless::Function") {
        assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda", "{id}");
        let binary = f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        let (memory, timeout) = crates
            .get(binary)
            .unwrap_or_else(|| panic!("{id}: no crate builds `{binary}` with lambda settings"));
        assert_eq!(
            f["Properties"]["MemorySize"].as_u64(),
            Some(*memory),
            "{id}: memory vs Cargo metadata"
        );
        assert_eq!(
            f["Properties"]["Timeout"].as_u64(),
            Some(*timeout),
            "{id}: timeout vs Cargo metadata"
        );
        deployed.insert(binary.to_string());
        // Every function has a log group with the stack's retention.
        let logs = id.replace("Function", "Logs");
        assert_eq!(
            t["Resources"][&logs]["Properties"]["RetentionInDays"]["Ref"], "LogRetentionDays",
            "{id}"
        );
    }
    let missing: Vec<&String> = crates
        .keys()
        .filter(|b| !deployed.contains(*b) && b.as_str() != "engine-gateway")
        .collect();
    assert!(
        missing.is_empty(),
        "worker binaries not in the template: {missing:?}"
    );
    // Event sources: turn steps with partial failures; state changes with bisect and partial failures.
    let orchestrator = &t["Resources"]["TurnOrchestratorFunction"]["Properties"];
    assert_eq!(
        orchestrator["Events"]["TurnSteps"]["Properties"]["FunctionResponseTypes"][0],
        "ReportBatchItemFailures"
    );
    let visibility = t["Resources"]["TurnStepsQueue"]["Properties"]["VisibilityTimeout"]
        .as_u64()
        .unwrap();
    assert!(
        visibility >= orchestrator["Timeout"].as_u64().unwrap(),
        "SQS requires visibility ≥ the function timeout"
    );
    // Whatever pushes to WebSocket connections (results; the stream items it stores and
    // stream::send's token deltas) has the management endpoint and the right to post to
    // connections. The stream router pushes nothing: stored items reach clients from their
    // writer.
    assert!(
        t["Resources"]["StreamRouterFunction"]["Properties"]["Environment"].is_null(),
        "the stream router posts to no connection"
    );
    for id in [
        "EngineRouterFunction",
        "TurnOrchestratorFunction",
        "ContextCompactionFunction",
    ] {
        let p = &t["Resources"][id]["Properties"];
        assert!(
            p["Environment"]["Variables"]["WS_MANAGEMENT_ENDPOINT"]["Fn::Sub"]
                .as_str()
                .is_some_and(|u| u.contains("${WebSocketApi}") && u.contains("${Stage}")),
            "{id}: WS_MANAGEMENT_ENDPOINT"
        );
        let grants = p["Policies"].to_string();
        assert!(
            grants.contains("execute-api:ManageConnections") && grants.contains("@connections"),
            "{id}: may post to connections"
        );
    }
    // The harness Lambda decides by the permissions secret the template creates, and may
    // read it (without it: the rules shipped with the build).
    let harness = &t["Resources"]["HarnessFunction"]["Properties"];
    let secret = harness["Environment"]["Variables"]["HARNESS_PERMISSIONS_SECRET"]
        .as_str()
        .expect("HarnessFunction: HARNESS_PERMISSIONS_SECRET");
    assert_eq!(
        t["Resources"]["HarnessPermissionsSecret"]["Properties"]["Name"]["Fn::Sub"],
        format!("${{Prefix}}secrets/{secret}")
    );
    let grants = harness["Policies"].to_string();
    assert!(
        grants.contains("secretsmanager:GetSecretValue") && grants.contains("secrets/harness/"),
        "HarnessFunction may read its permissions: {grants}"
    );
    let stream = &t["Resources"]["StreamRouterFunction"]["Properties"]["Events"]["StateChanges"]["Properties"];
    assert_eq!(stream["BisectBatchOnFunctionError"], true);
    assert_eq!(
        stream["FunctionResponseTypes"][0],
        "ReportBatchItemFailures"
    );
}

/// Variables the Lambda service sets itself.
const SET_BY_LAMBDA: [&str; 3] = [
    "AWS_LAMBDA_RUNTIME_API",
    "AWS_REGION",
    "AWS_LAMBDA_FUNCTION_NAME",
];

/// Every workspace crate: package name → (directory, workspace crates it depends on).
fn workspace_crates() -> BTreeMap<String, (std::path::PathBuf, Vec<String>)> {
    let dirs = workspace::crate_dirs();
    let mut out = BTreeMap::new();
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let (name, dependencies) = name_and_dependencies(&text);
        out.insert(name, (dir, dependencies));
    }
    let names: BTreeSet<String> = out.keys().cloned().collect();
    for (_, deps) in out.values_mut() {
        deps.retain(|d| names.contains(d));
    }
    out
}

/// A Cargo.toml's package name and `[dependencies]` keys.
fn name_and_dependencies(text: &str) -> (String, Vec<String>) {
    let (mut name, mut dependencies) = (String::new(), Vec::new());
    for (section, k, v) in toml_lines(text) {
        let k = k.trim_end_matches(".workspace").to_string();
        match section.as_str() {
            "[package]" if k == "name" => name = v,
            "[dependencies]" => dependencies.push(k),
            _ => {}
        }
    }
    (name, dependencies)
}

/// The environment variables named in a crate's code (tests left out), each with the first
/// file naming it. `library_only`: a dependency, whose own binaries are not this function.
fn variables_named(dir: &Path, library_only: bool, out: &mut BTreeMap<String, String>) {
    let re = regex::Regex::new(r#""((?:ENGINE|HARNESS|SLACK|WS|OTEL|MODELS|AWS|RUST|ANTHROPIC|OPENAI|KIMI|MOONSHOT|LMSTUDIO)_[A-Z0-9_]+)""#).unwrap();
    let mut stack = vec![dir.join("src")];
    while let Some(p) = stack.pop() {
        let shown = p.to_string_lossy().replace('\\', "/");
        if library_only && (shown.ends_with("src/main.rs") || shown.ends_with("src/bin")) {
            continue;
        }
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        // Unit tests sit at the end of a file, behind `#[cfg(test)]`.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for c in re.captures_iter(code) {
            out.entry(c[1].to_string()).or_insert_with(|| shown.clone());
        }
    }
}

/// The variables one deployed binary's code names: its crate and the workspace crates it
/// depends on.
fn variables_of_binary(binary: &str) -> BTreeMap<String, String> {
    let crates = workspace_crates();
    let root = crates
        .iter()
        .find(|(name, (dir, _))| {
            *name == binary
                || std::fs::read_to_string(dir.join("Cargo.toml"))
                    .unwrap()
                    .contains(&format!("name = \"{binary}\""))
        })
        .map(|(name, _)| name.clone())
        .unwrap_or_else(|| panic!("no crate builds `{binary}`"));
    // One of several Lambda binaries of a crate (engine-aws: engine-lambda, doors-lambda):
    // the library, plus its own file.
    let own_file = format!("{}/src/bin/{binary}.rs", crates[&root].0.display());
    let engine_bin = Path::new(&own_file).is_file();
    let mut out = BTreeMap::new();
    let (mut seen, mut todo) = (BTreeSet::new(), vec![root.clone()]);
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let (dir, deps) = &crates[&name];
        variables_named(dir, name != root || engine_bin, &mut out);
        todo.extend(deps.iter().cloned());
    }
    if engine_bin {
        let mut own = BTreeMap::new();
        let text = std::fs::read_to_string(&own_file).unwrap();
        let re = regex::Regex::new(r#""([A-Z]+_[A-Z0-9_]+)""#).unwrap();
        for c in re.captures_iter(&text) {
            own.insert(c[1].to_string(), own_file.clone());
        }
        out.extend(own);
    }
    for v in SET_BY_LAMBDA {
        out.remove(v);
    }
    out
}

/// `infra/README.md`'s table of variables: name → the functions the template sets it for
/// (`all` for the template's globals).
fn documented_variables() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string("infra/README.md").unwrap();
    let table = text
        .split("## Variables")
        .nth(1)
        .expect("infra/README.md has a `## Variables` section");
    let mut out = BTreeMap::new();
    for line in table.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let (Some(name), Some(set_for)) = (cells.first(), cells.last()) else {
            continue;
        };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            continue;
        };
        let set_for: BTreeSet<String> = set_for
            .split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "—")
            .collect();
        out.insert(name.to_string(), set_for);
    }
    out
}

#[test]
fn every_variable_a_function_reads_is_documented_and_set_where_it_must_be() {
    let t = template();
    let globals: BTreeSet<String> = t["Globals"]["Function"]["Environment"]["Variables"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let documented = documented_variables();
    let mut problems = Vec::new();
    let mut read_anywhere = BTreeSet::new();
    for (id, f) in resources_of(&t, "AWS::Serverless::Function") {
        let binary = f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        let reads = variables_of_binary(binary);
        let own: BTreeSet<String> = f["Properties"]["Environment"]["Variables"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for (var, file) in &reads {
            read_anywhere.insert(var.clone());
            match documented.get(var) {
                None => problems.push(format!(
                    "{id} reads {var} ({file}), which infra/README.md's variables table does not list"
                )),
                Some(set_for) => {
                    let must = set_for.contains("all") || set_for.contains(id.as_str());
                    let is = globals.contains(var) || own.contains(var);
                    if must && !is {
                        problems.push(format!("{id}: the template does not set {var}"));
                    }
                    if is && !must {
                        problems.push(format!(
                            "{id}: the template sets {var}, which the table says is not set for it"
                        ));
                    }
                }
            }
        }
        for var in &own {
            if !reads.contains_key(var) {
                problems.push(format!(
                    "{id}: the template sets {var}, which no code of `{binary}` reads"
                ));
            }
        }
    }
    for var in globals.iter().chain(documented.keys()) {
        if !read_anywhere.contains(var) {
            problems.push(format!(
                "{var} is set or documented, but no deployed function reads it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `localstack/deployed.sh` forwards template parameters from `Key=Value` arguments or
/// same-named environment variables, says which it used (without echoing Slack values), and
/// refuses an unknown key by name.
#[test]
fn the_local_deployed_shape_forwards_template_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/localstack/deployed.sh"
            ))
            .arg("params")
            .args(args)
            .env("CARGO_TARGET_DIR", dir.path())
            .env_remove("SlackApprovers")
            .env_remove("RunDefaults")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, _) = run(
        &[
            "SlackApprovers=U1,U2",
            "AllowedOrigins=https://chat.example.com",
        ],
        &[("RunDefaults", r#"{"mode":"plan"}"#)],
    );
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    for expected in [
        "SlackApprovers=U1,U2",
        "AllowedOrigins=https://chat.example.com",
        r#"RunDefaults={"mode":"plan"}"#,
    ] {
        let at = lines
            .iter()
            .position(|l| *l == expected)
            .unwrap_or_else(|| panic!("{expected} in {out}"));
        assert_eq!(lines[at - 1], "--parameter", "{out}");
    }
    assert!(
        out.contains("template parameter: SlackApprovers (set, 5 characters)"),
        "{out}"
    );
    assert!(
        out.contains("template parameter: AllowedOrigins=https://chat.example.com"),
        "{out}"
    );
    let (code, out, _) = run(&[], &[]);
    assert_eq!(
        (code, out.trim()),
        (Some(0), "template parameters: the template's defaults")
    );
    let (code, _, err) = run(&["SlackAprovers=U1"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("unknown template parameter `SlackAprovers`"),
        "{err}"
    );
}
