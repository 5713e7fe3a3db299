//! The deployed shape, on this machine: every function of `infra/template.yaml` as its own
//! `bootstrap` under the local Runtime API host (a process pool each), the engine router
//! behind the emulated API Gateway WebSocket API, the template's event-source mappings (the
//! turn-step FIFO queue → the turn orchestrator, the state table's stream → the stream
//! router), and the Slack webhook behind an emulated Function URL. State, queues and secrets
//! are LocalStack's (or AWS's: whatever `AWS_ENDPOINT_URL` names).
//!
//! What the functions get is what the template gives them (its `Globals` and their own
//! variables, its intrinsics resolved for the local stage), plus the local endpoints: the
//! management API of the emulated WebSocket API, the host's Invoke API, and the AWS endpoint.

use crate::apigw_ws::{WebSocketApi, WebSocketApiConfig};
use crate::filter::FilterCriteria;
use crate::lambda_host::{LambdaFunction, LambdaSpec};
use crate::mappings::{QueueMapping, StreamMapping};
use bus_aws::{AwsClients, AwsNames};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// One function of the template.
#[derive(Debug, Clone)]
pub struct TemplateFunction {
    /// Its logical id (`TurnOrchestratorFunction`).
    pub resource: String,
    /// `FunctionName`, with the prefix.
    pub name: String,
    /// The binary `cargo lambda` builds for it.
    pub binary: String,
    pub memory_mb: u32,
    pub timeout: Duration,
    /// `Globals` and its own variables, resolved; empty values left out.
    pub env: Vec<(String, String)>,
    /// The queue an SQS event source feeds it from (its logical queue name).
    pub queue: Option<QueueEvent>,
    /// A DynamoDB stream event source on the state table.
    pub stream: Option<StreamEvent>,
    /// Whether it has a Function URL.
    pub function_url: bool,
    /// Whether its Function URL streams the answer (`InvokeMode: RESPONSE_STREAM`).
    pub url_streams: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueEvent {
    pub queue: String,
    pub batch_size: usize,
    /// `FilterCriteria.Filters[].Pattern`, resolved and checked ([`FilterCriteria::parse`]).
    pub filters: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    pub batch_size: usize,
    pub max_retries: u32,
    /// `MaximumBatchingWindowInSeconds`: how long records are gathered before an invocation.
    pub batching_window: Duration,
    /// `FilterCriteria.Filters[].Pattern`, resolved and checked.
    pub filters: Vec<String>,
}

/// An event's `FilterCriteria` → its patterns, refused here if AWS would read them otherwise.
fn event_filters(r: &Resolver, id: &str, e: &Value) -> Result<Vec<String>, String> {
    let mut patterns = Vec::new();
    for (i, f) in e["FilterCriteria"]["Filters"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        patterns.push(
            r.value(&f["Pattern"])
                .ok_or_else(|| format!("{id}: FilterCriteria.Filters[{i}] has no Pattern"))?,
        );
    }
    FilterCriteria::parse(&patterns).map_err(|e| format!("{id}: FilterCriteria: {e}"))?;
    Ok(patterns)
}

/// Resolves the intrinsics the template's functions use.
struct Resolver<'a> {
    template: &'a Value,
    vars: HashMap<String, String>,
}

impl Resolver<'_> {
    fn sub(&self, s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let Some(j) = rest[i..].find('}') else {
                out.push_str(&rest[i..]);
                return out;
            };
            let name = &rest[i + 2..i + j];
            out.push_str(self.vars.get(name).map(String::as_str).unwrap_or(""));
            rest = &rest[i + j + 1..];
        }
        out.push_str(rest);
        out
    }

    fn value(&self, v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Object(o) => {
                if let Some(name) = o.get("Ref").and_then(Value::as_str) {
                    return self.vars.get(name).cloned();
                }
                if let Some(s) = o.get("Fn::Sub").and_then(Value::as_str) {
                    return Some(self.sub(s));
                }
                if let Some([res, attr]) = o
                    .get("Fn::GetAtt")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                {
                    let props = &self.template["Resources"][res.as_str()?]["Properties"];
                    return match attr.as_str()? {
                        "QueueName" => self.value(&props["QueueName"]),
                        "Arn" => self
                            .value(&props["QueueName"])
                            .map(|q| bus::events::queue_arn(&q)),
                        _ => None,
                    };
                }
                None
            }
            _ => None,
        }
    }
}

/// The template's functions, for `prefix` and `stage`; `local` overrides variables (the
/// local endpoints).
pub fn template_functions(
    template: &Value,
    prefix: &str,
    stage: &str,
    parameters: &[(String, String)],
    local: &[(String, String)],
) -> Result<Vec<TemplateFunction>, String> {
    let mut vars: HashMap<String, String> = template["Parameters"]
        .as_object()
        .map(|p| {
            p.iter()
                .filter_map(|(k, v)| {
                    Some((
                        k.clone(),
                        v["Default"]
                            .as_str()
                            .map(str::to_owned)
                            .or_else(|| v["Default"].as_u64().map(|n| n.to_string()))?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    for (k, v) in parameters {
        vars.insert(k.clone(), v.clone());
    }
    vars.insert("Prefix".into(), prefix.into());
    vars.insert("Stage".into(), stage.into());
    vars.insert("AWS::Region".into(), bus::events::REGION.into());
    vars.insert("AWS::AccountId".into(), bus::events::ACCOUNT.into());
    vars.insert("AWS::Partition".into(), "aws".into());
    vars.insert("WebSocketApi".into(), "local".into());
    let r = Resolver { template, vars };
    let globals = &template["Globals"]["Function"]["Environment"]["Variables"];
    let resources = template["Resources"]
        .as_object()
        .ok_or("the template has no Resources")?;
    let mut out = Vec::new();
    for (id, res) in resources {
        if res["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let p = &res["Properties"];
        let name = r
            .value(&p["FunctionName"])
            .ok_or_else(|| format!("{id}: FunctionName"))?;
        let binary = res["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .ok_or_else(|| format!("{id}: Metadata.BuildProperties.Binary"))?
            .to_string();
        let mut env: Vec<(String, String)> = Vec::new();
        for vars in [globals, &p["Environment"]["Variables"]] {
            for (k, v) in vars.as_object().into_iter().flatten() {
                if let Some(v) = r.value(v) {
                    env.retain(|(e, _)| e != k);
                    env.push((k.clone(), v));
                }
            }
        }
        for (k, v) in local {
            if env.iter().any(|(e, _)| e == k) {
                env.retain(|(e, _)| e != k);
                env.push((k.clone(), v.clone()));
            }
        }
        env.retain(|(_, v)| !v.is_empty());
        let mut queue = None;
        let mut stream = None;
        for (_, ev) in p["Events"].as_object().into_iter().flatten() {
            let e = &ev["Properties"];
            match ev["Type"].as_str() {
                Some("SQS") => {
                    let q = r
                        .value(&e["Queue"])
                        .ok_or_else(|| format!("{id}: its SQS event names no queue"))?;
                    let q = q.rsplit(':').next().unwrap_or(&q);
                    let logical = q
                        .strip_prefix(prefix)
                        .unwrap_or(q)
                        .trim_end_matches(".fifo")
                        .to_string();
                    queue = Some(QueueEvent {
                        queue: logical,
                        batch_size: e["BatchSize"].as_u64().unwrap_or(10) as usize,
                        filters: event_filters(&r, id, e)?,
                    });
                }
                Some("DynamoDB") => {
                    stream = Some(StreamEvent {
                        batch_size: e["BatchSize"].as_u64().unwrap_or(100) as usize,
                        max_retries: e["MaximumRetryAttempts"].as_u64().unwrap_or(10) as u32,
                        batching_window: Duration::from_secs(
                            e["MaximumBatchingWindowInSeconds"].as_u64().unwrap_or(0),
                        ),
                        filters: event_filters(&r, id, e)?,
                    });
                }
                _ => {}
            }
        }
        out.push(TemplateFunction {
            resource: id.clone(),
            name,
            binary,
            memory_mb: p["MemorySize"].as_u64().unwrap_or(128) as u32,
            timeout: Duration::from_secs(p["Timeout"].as_u64().unwrap_or(3)),
            env,
            queue,
            stream,
            function_url: p.get("FunctionUrlConfig").is_some(),
            url_streams: p["FunctionUrlConfig"]["InvokeMode"] == "RESPONSE_STREAM",
        });
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct DeployedOptions {
    pub template: PathBuf,
    /// Where `cargo lambda build` put the bootstraps (`<dir>/<binary>/bootstrap`).
    pub lambda_dir: PathBuf,
    pub prefix: String,
    pub stage: String,
    /// Processes per function.
    pub max_processes: usize,
    /// Template parameters besides `Prefix` and `Stage` (`SlackApprovers`, …); the others
    /// keep their defaults.
    pub parameters: Vec<(String, String)>,
    /// Variables passed to every function from this environment when set (the providers'
    /// base URLs and keys).
    pub pass_env: Vec<String>,
}

impl DeployedOptions {
    pub fn new(template: PathBuf, lambda_dir: PathBuf, prefix: &str) -> Self {
        Self {
            template,
            lambda_dir,
            prefix: prefix.into(),
            stage: "local".into(),
            max_processes: 4,
            parameters: Vec::new(),
            pass_env: [
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_API_KEY",
                "OPENAI_BASE_URL",
                "OPENAI_API_KEY",
                "MOONSHOT_BASE_URL",
                "MOONSHOT_API_KEY",
                "LMSTUDIO_BASE_URL",
                "HARNESS_API_CALLS_DIR",
                "SLACK_API_BASE",
                "RUST_LOG",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

/// Whether a change a state trigger watches (its `scope`, and `key` with each `*` as some
/// text) gets past the stream router's `FilterCriteria`: one that does not would never fire
/// on AWS, so bringing the shape up fails instead, naming what to add to the template.
pub fn reaches_the_stream_router(
    filter: &FilterCriteria,
    table: &str,
    config: &Value,
) -> Result<(), String> {
    let scope = config["scope"].as_str().unwrap_or("any-scope");
    let key = config["key"]
        .as_str()
        .unwrap_or("any-key")
        .replace('*', "x");
    // The changes it takes: any, or (`changed`) those where that path gets or loses a value.
    let empty = serde_json::json!({});
    let values = match config["changed"].as_str() {
        None => vec![(empty.clone(), empty)],
        Some(path) => {
            let set = bus::state::UpdateOp::Set {
                path: path.to_string(),
                value: serde_json::json!(["something"]),
            };
            let filled = bus::state::apply_ops(empty.clone(), &[set]).unwrap_or_default();
            vec![(empty.clone(), filled.clone()), (filled, empty)]
        }
    };
    let passes = values.into_iter().all(|(old, new)| {
        let change = bus::state::ChangeRecord::updated(scope, &key, old, new);
        let event = bus::events::dynamodb_event(std::slice::from_ref(&change), table);
        filter.passes(&event["Records"][0])
    });
    if passes {
        Ok(())
    } else {
        Err(format!(
            "it watches scope `{scope}` (key `{key}`), which the stream router's FilterCriteria \
             in infra/template.yaml drop: those changes would never reach it; add a filter that \
             passes them"
        ))
    }
}

/// The running topology.
pub struct Deployed {
    /// `ws://…` for clients (`?token=` or `Authorization: Bearer`).
    pub url: String,
    pub token: String,
    pub management_url: String,
    /// The Slack webhook's Function URL.
    pub slack_url: Option<String>,
    /// The standard doors' Function URL (OpenAI chat, AG-UI, MCP, A2A).
    pub doors_url: Option<String>,
    pub functions: Vec<(TemplateFunction, Arc<LambdaFunction>)>,
    pub api: Arc<WebSocketApi>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Deployed {
    /// The running function for a template resource.
    /// Every function, by its template resource id.
    pub fn functions(&self) -> impl Iterator<Item = (&str, &Arc<LambdaFunction>)> {
        self.functions.iter().map(|(t, f)| (t.resource.as_str(), f))
    }

    pub fn function(&self, resource: &str) -> Option<&Arc<LambdaFunction>> {
        self.functions
            .iter()
            .find(|(t, _)| t.resource == resource)
            .map(|(_, f)| f)
    }

    /// Stop every process and task.
    pub fn shutdown(&self) {
        for (_, f) in &self.functions {
            f.shutdown();
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for Deployed {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn listener() -> anyhow::Result<tokio::net::TcpListener> {
    Ok(tokio::net::TcpListener::bind("127.0.0.1:0").await?)
}

/// Bring the deployed shape up: resources provisioned, the `$connect` token generated into
/// its secret when there is none, every function started and registered, the API, the
/// mappings and the Function URL served.
pub async fn up(opts: &DeployedOptions) -> anyhow::Result<Deployed> {
    use bus::secrets::SecretStore;
    let text = std::fs::read_to_string(&opts.template)
        .map_err(|e| anyhow::anyhow!("{}: {e}", opts.template.display()))?;
    let template: Value = serde_norway::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", opts.template.display()))?;
    let names = AwsNames::new(&opts.prefix);
    let clients = AwsClients::from_env().await;
    bus_aws::resources::ensure_all(&clients, &names).await?;
    let secrets = bus_aws::secrets::AwsSecrets::new(clients.clone(), names.clone());
    let token = match secrets.get("engine/token").await? {
        Some(t) if !t.trim().is_empty() && t.trim() != "{}" => t,
        _ => {
            let t = bus_telemetry::trace::random_hex(32);
            secrets.put("engine/token", &t).await?;
            t
        }
    };
    let (invoke_l, ws_l, mgmt_l) = (listener().await?, listener().await?, listener().await?);
    let invoke_url = format!("http://{}", invoke_l.local_addr()?);
    let management_url = format!("http://{}/{}", mgmt_l.local_addr()?, opts.stage);
    let local = vec![
        ("WS_MANAGEMENT_ENDPOINT".to_string(), management_url.clone()),
        (
            "ENGINE_WEBSOCKET_URL".to_string(),
            format!("ws://{}", ws_l.local_addr()?),
        ),
    ];
    let defs = template_functions(
        &template,
        &opts.prefix,
        &opts.stage,
        &opts.parameters,
        &local,
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", opts.template.display()))?;
    let mut common: Vec<(String, String)> =
        vec![("AWS_ENDPOINT_URL_LAMBDA".into(), invoke_url.clone())];
    for k in [
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_EC2_METADATA_DISABLED",
    ]
    .iter()
    .map(|k| k.to_string())
    .chain(opts.pass_env.iter().cloned())
    {
        if let Ok(v) = std::env::var(&k) {
            common.push((k, v));
        }
    }
    let mut functions = Vec::new();
    for d in &defs {
        let bootstrap = opts.lambda_dir.join(&d.binary).join("bootstrap");
        anyhow::ensure!(
            bootstrap.is_file(),
            "{}: no bootstrap at {} (build it: bash scripts/lambda-builds.sh)",
            d.resource,
            bootstrap.display()
        );
        let mut spec = LambdaSpec::new(&d.name, bootstrap);
        spec.env = d.env.clone();
        spec.max_processes = opts.max_processes;
        spec.timeout = d.timeout;
        spec.memory_mb = d.memory_mb;
        functions.push((d.clone(), LambdaFunction::new(spec, common.clone())));
    }
    let (_, invoke_task) = crate::lambda_host::serve_invoke_api_on(
        invoke_l,
        functions.iter().map(|(_, f)| f.clone()).collect(),
    )?;
    let mut tasks = vec![invoke_task];
    let invoking = clients.clone().with_lambda_endpoint(&invoke_url);
    // Every worker describes itself into the registry (the routers and the doors serve no
    // function IDs).
    let stream_filter = match functions.iter().find_map(|(d, _)| d.stream.as_ref()) {
        Some(s) => FilterCriteria::parse(&s.filters).map_err(anyhow::Error::msg)?,
        None => FilterCriteria::default(),
    };
    for (d, _) in functions
        .iter()
        .filter(|(d, _)| !["engine-lambda", "doors-lambda"].contains(&d.binary.as_str()))
    {
        let registered = bus_aws::invoke::register_lambda(&invoking, &names, &d.name)
            .await
            .map_err(|e| anyhow::anyhow!("register {}: {e}", d.name))?;
        for w in registered["watches"].as_array().into_iter().flatten() {
            reaches_the_stream_router(&stream_filter, &names.state_table(), &w["config"])
                .map_err(|e| anyhow::anyhow!("{}: state trigger {}: {e}", d.name, w["trigger"]))?;
        }
    }
    let router = functions
        .iter()
        .find(|(d, _)| d.binary == "engine-lambda" && d.stream.is_none())
        .map(|(_, f)| f.clone())
        .ok_or_else(|| anyhow::anyhow!("the template has no engine router function"))?;
    let api = WebSocketApi::new(
        router,
        WebSocketApiConfig {
            stage: opts.stage.clone(),
            ..WebSocketApiConfig::default()
        },
    );
    let served = api.serve(ws_l, mgmt_l)?;
    tasks.extend(served.tasks);
    let (mut slack_url, mut doors_url) = (None, None);
    for (d, f) in &functions {
        if let Some(q) = &d.queue {
            let queues = bus_aws::queues::SqsQueues::new(invoking.clone(), names.clone());
            if let Some(spec) = bus_aws::resources::manifest(&names)
                .queues
                .into_iter()
                .find(|s| s.config.name == q.queue)
            {
                use bus::queue::QueueBackend;
                queues
                    .declare(&spec.config)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            let m = QueueMapping {
                queue: q.queue.clone(),
                batch_size: q.batch_size,
                wait: Duration::from_secs(1),
                pollers: opts.max_processes,
                filter: FilterCriteria::parse(&q.filters).map_err(anyhow::Error::msg)?,
            };
            tasks.push(tokio::spawn(crate::mappings::run_queue_mapping(
                Arc::new(queues),
                f.clone(),
                m,
            )));
        }
        if let Some(s) = &d.stream {
            let feed =
                bus_aws::changes::StreamsFeed::for_stream_router(invoking.clone(), &names, &d.name);
            let m = StreamMapping {
                table: names.state_table(),
                batch_size: s.batch_size,
                wait: Duration::from_secs(1),
                batching_window: s.batching_window,
                max_retries: s.max_retries,
                retry_pause: Duration::from_millis(200),
                filter: FilterCriteria::parse(&s.filters).map_err(anyhow::Error::msg)?,
            };
            tasks.push(tokio::spawn(crate::mappings::run_stream_mapping(
                Arc::new(feed),
                f.clone(),
                m,
            )));
        }
        if d.function_url {
            let (url, task) =
                crate::function_url::serve(f.clone(), listener().await?, d.url_streams)?;
            match d.binary.as_str() {
                "doors-lambda" => doors_url = Some(url),
                _ => slack_url = Some(url),
            }
            tasks.push(task);
        }
    }
    Ok(Deployed {
        url: served.url,
        token,
        management_url,
        slack_url,
        doors_url,
        functions,
        api,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_templates_functions_resolve_for_the_local_stage() {
        let t: Value =
            serde_norway::from_str(include_str!("../../../infra/template.yaml")).unwrap();
        let local = vec![(
            "WS_MANAGEMENT_ENDPOINT".to_string(),
            "http://127.0.0.1:9/local".to_string(),
        )];
        let params = vec![("SlackApprovers".to_string(), "U1,U2".to_string())];
        let fs = template_functions(&t, "dx-", "local", &params, &local).unwrap();
        let by = |r: &str| fs.iter().find(|f| f.resource == r).unwrap();
        let o = by("TurnOrchestratorFunction");
        assert_eq!(o.name, "dx-turn-orchestrator");
        assert_eq!(o.binary, "turn-orchestrator");
        assert_eq!(
            o.queue,
            Some(QueueEvent {
                queue: "turn-steps".into(),
                batch_size: 10,
                filters: vec![],
            })
        );
        let env: HashMap<_, _> = o.env.iter().cloned().collect();
        assert_eq!(env["HARNESS_AWS_PREFIX"], "dx-");
        assert_eq!(env["ENGINE_BACKEND"], "aws");
        assert_eq!(env["WS_MANAGEMENT_ENDPOINT"], "http://127.0.0.1:9/local");
        let s = by("StreamRouterFunction");
        assert_eq!(
            s.stream,
            Some(StreamEvent {
                batch_size: 100,
                max_retries: 10,
                batching_window: Duration::ZERO,
                filters: vec![
                    r#"{"dynamodb": {"Keys": {"scope": {"S": ["approvals"]}}}}"#.into(),
                    r#"{"dynamodb": {"Keys": {"scope": {"S": ["agent"]}, "key": {"S": [{"suffix": "/turn_state"}]}}, "NewImage": {"filled": {"SS": ["awaiting_approval"]}}}}"#.into(),
                    r#"{"dynamodb": {"Keys": {"scope": {"S": ["agent"]}, "key": {"S": [{"suffix": "/turn_state"}]}}, "OldImage": {"filled": {"SS": ["awaiting_approval"]}}}}"#.into(),
                ],
            })
        );
        // What the deployed workers' state triggers watch gets through; other scopes do not.
        let filter = FilterCriteria::parse(&s.stream.as_ref().unwrap().filters).unwrap();
        for watched in [
            json!({"scope": "approvals"}),
            json!({"scope": "agent", "key": "session/*/turn_state", "changed": "awaiting_approval"}),
        ] {
            reaches_the_stream_router(&filter, "dx-state", &watched).unwrap();
        }
        let err = reaches_the_stream_router(&filter, "dx-state", &json!({"scope": "demo-watch"}))
            .unwrap_err();
        assert!(err.starts_with("it watches scope `demo-watch` (key `any-key`), which the stream router's FilterCriteria"), "{err}");
        assert!(
            reaches_the_stream_router(
                &filter,
                "dx-state",
                &json!({"scope": "agent", "key": "session/*/notes"})
            )
            .is_err()
        );
        // The turn record passes only when its parked calls change: a trigger on its every
        // save, or on another field, would be starved.
        for starved in [
            json!({"scope": "agent", "key": "session/*/turn_state"}),
            json!({"scope": "agent", "key": "session/*/turn_state", "changed": "state"}),
        ] {
            assert!(
                reaches_the_stream_router(&filter, "dx-state", &starved).is_err(),
                "{starved}"
            );
        }
        let slack = by("SlackApprovalFunction");
        assert!(slack.function_url);
        assert!(
            slack
                .env
                .contains(&("SLACK_APPROVERS".to_string(), "U1,U2".to_string()))
        );
        assert!(
            !slack.env.iter().any(|(k, _)| k == "SLACK_CHANNEL"),
            "empty: left out"
        );
        assert!(
            slack.function_url && !slack.url_streams,
            "Slack answers whole"
        );
        let doors = by("DoorsFunction");
        assert!(doors.function_url && doors.url_streams, "the doors stream");
        let env: HashMap<_, _> = doors.env.iter().cloned().collect();
        assert!(
            env["ENGINE_WEBSOCKET_URL"].starts_with("wss://local.execute-api."),
            "{env:?}"
        );
        assert_eq!(
            fs.iter().filter(|f| f.binary == "engine-lambda").count(),
            2,
            "the router and the stream router"
        );
        assert!(fs.len() >= 17, "{}", fs.len());
    }
}
