//! The infrastructure template and what the code provisions never drift apart:
//! `infra/template.yaml` declares exactly the tables, queues (with their DLQs and settings)
//! and secrets of `localstack/resources.json` (itself checked against the code), every
//! function's memory and timeout are its crate's `[package.metadata.lambda.deploy]`, and
//! every worker binary is deployed.

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

/// Binaries and lambda deploy settings of every crate in the workspace.
fn crates() -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir("functions")
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.push(Path::new("engine-gateway").to_path_buf());
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let mut section = String::new();
        let (mut bins, mut memory, mut timeout) = (Vec::new(), None, None);
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim().trim_matches('"'));
            match (section.as_str(), k) {
                ("[[bin]]", "name") => bins.push(v.to_string()),
                ("[package.metadata.lambda.deploy]", "memory") => memory = v.parse().ok(),
                ("[package.metadata.lambda.deploy]", "timeout") => timeout = v.parse().ok(),
                _ => {}
            }
        }
        // Every deployable crate (a bin and lambda settings) is listed; test-only tools have none.
        if let (Some(m), Some(t)) = (memory, timeout) {
            for b in &bins {
                out.insert(b.clone(), (m, t));
            }
            if dir.ends_with("engine-gateway") {
                out.insert("engine-lambda".into(), (m, t));
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
        tables.insert(
            name_of(&p["TableName"], prefix),
            (
                keys.get("HASH").cloned(),
                keys.get("RANGE").cloned(),
                stream.is_some(),
            ),
        );
    }
    let expected: BTreeMap<String, (Option<String>, Option<String>, bool)> = m["tables"]
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
    // Whatever pushes to WebSocket connections (results, stored stream items, stream::send's
    // token deltas) has the management endpoint and the right to post to connections.
    for id in [
        "EngineRouterFunction",
        "StreamRouterFunction",
        "TurnOrchestratorFunction",
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
