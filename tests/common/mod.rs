//! The whole stack for end-to-end tests: the engine (embedded backend, or the AWS backend
//! with `HARNESS_TEST_BACKEND=aws`) and every worker real, with the providers streaming from
//! the scripted model server over HTTP.
#![allow(dead_code)]

use agent_harness::compose::{self, Composition, Inputs};
use agent_harness::config::Config;
use engine_gateway::secrets::FileSecrets;
use engine_gateway::server::{self, RunningServer, ServeOptions};
use harness_sdk::{Ctx, RemoteOptions, WorkerHandle, connect_client};
use scripted_model::{ScriptedModel, ToolCall, Turn, TurnUsage};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub struct Stack {
    pub _dir: tempfile::TempDir,
    pub work: std::path::PathBuf,
    pub srv: RunningServer,
    /// The workers the preset names, started as `cargo run` starts them.
    pub composition: Composition,
    pub client: WorkerHandle,
    pub model: ScriptedModel,
}

pub async fn stack(permissions: &str) -> Stack {
    stack_with(permissions, models_catalog::Catalog::builtin()).await
}

pub async fn stack_with(permissions: &str, catalog: models_catalog::Catalog) -> Stack {
    stack_from("thick", permissions, catalog).await
}

/// A preset (`thin`, `thick`) composed on a fresh engine, with the providers pointed at one
/// scripted model server, the permissions and the workdir in a temporary directory, and an
/// Anthropic key in the credentials' environment.
pub async fn stack_from(
    preset: &str,
    permissions: &str,
    catalog: models_catalog::Catalog,
) -> Stack {
    let mut cfg = Config::load(preset).unwrap();
    // The whole-turn tests look for the agent's files in `work` itself; tests/workspaces.rs
    // composes the per-session default.
    cfg.sandbox.workspace = agent_harness::config::Workspace::Shared;
    stack_config(&mut cfg, permissions, catalog).await
}

pub async fn stack_config(
    cfg: &mut Config,
    permissions: &str,
    catalog: models_catalog::Catalog,
) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&test_options(dir.path())).await.unwrap();
    stack_on(dir, srv, cfg, permissions, catalog).await
}

/// The engine's options for a test in `dir`: the embedded backend, or the AWS one with
/// `HARNESS_TEST_BACKEND=aws` (the same turns on DynamoDB + Streams and SQS FIFO).
pub fn test_options(dir: &std::path::Path) -> ServeOptions {
    let mut opts = ServeOptions::for_data_dir(dir.join("data"));
    if server::aws_test_backend() {
        opts.backend = server::BackendKind::Aws;
        opts.aws.prefix = format!("turn{}-", engine_gateway::trace::random_hex(4));
        opts.aws.create_resources = true;
    }
    opts
}

/// Composes `cfg` on a running engine (for tests that shape the engine or start remote
/// workers first).
pub async fn stack_on(
    dir: tempfile::TempDir,
    srv: RunningServer,
    cfg: &mut Config,
    permissions: &str,
    catalog: models_catalog::Catalog,
) -> Stack {
    let work = dir.path().join("work");
    let model = ScriptedModel::default();
    let base: url::Url = model.serve().await.unwrap().parse().unwrap();
    let perms = dir.path().join("iii-permissions.yaml");
    std::fs::write(&perms, permissions).unwrap();
    cfg.policy.permissions = perms;
    cfg.policy.reload_ms = std::num::NonZeroU64::new(200).unwrap();
    cfg.sandbox.workdir = work.clone();
    if let Some(a) = &mut cfg.providers.anthropic {
        a.base_url = Some(base.clone());
    }
    if let Some(o) = &mut cfg.providers.openai {
        o.base_url = Some(base.join("v1").unwrap());
    }
    if let Some(s) = &mut cfg.providers.scripted {
        s.base_url = Some(base.clone());
    }
    if let Some(b) = &mut cfg.providers.bedrock {
        b.base_url = Some(base.clone());
    }
    let env: HashMap<String, String> =
        HashMap::from([("ANTHROPIC_API_KEY".into(), "sk-test".into())]);
    let inputs = Inputs {
        secrets: Some(Arc::new(FileSecrets::new(dir.path().join("secrets.json")))),
        env: Some(Arc::new(move |k| env.get(k).cloned())),
        catalog: Some(catalog),
    };
    let composition = compose::start(cfg, &srv.engine, inputs).await.unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    Stack {
        _dir: dir,
        work,
        srv,
        composition,
        client,
        model,
    }
}

/// Take `function_id` away from the stack's worker that registered it (a test then runs
/// without it, or registers a stand-in).
pub async fn unregister(s: &Stack, function_id: &str) {
    let owner = s
        .client
        .ctx()
        .functions(false)
        .await
        .unwrap()
        .iter()
        .find(|f| f["function_id"] == function_id)
        .map(|f| f["worker_id"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("nobody registered {function_id}"));
    assert!(s.srv.engine.unregister_function(&owner, function_id));
}

pub const PERMISSIONS: &str = "version: 1\nrules:\n  - \"fs::read\"\n  - \"fs::list\"\n";

pub fn call(id: &str, function: &str, payload: Value) -> Turn {
    Turn {
        text: Some(format!("Calling {function}.")),
        tool_calls: vec![ToolCall {
            id: id.into(),
            name: "agent_trigger".into(),
            arguments: json!({"function": function, "payload": payload}),
        }],
        usage: TurnUsage {
            input: 100,
            output: 20,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn text(t: &str) -> Turn {
    Turn {
        text: Some(t.into()),
        usage: TurnUsage {
            input: 100,
            output: 10,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub async fn start(ctx: &Ctx, sid: &str, max_turns: Option<u32>) -> Value {
    ctx.trigger(
        "harness::trigger",
        json!({"session_id": sid, "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "max_turns": max_turns, "messages": [{"role": "user", "content": [{"type": "text", "text": "do the task"}], "timestamp": 1}]}}),
    )
    .await
    .unwrap()
}

pub async fn wait_state(ctx: &Ctx, sid: &str, state: &str) -> Value {
    // Long enough for a 17-turn session on the emulator (seconds per tool call there).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let v = ctx
            .trigger("turn::get_state", json!({"session_id": sid}))
            .await
            .unwrap();
        if v["state"] == state {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session {sid} never reached {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn events(ctx: &Ctx, sid: &str) -> Vec<Value> {
    let items = ctx
        .trigger(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": sid}),
        )
        .await
        .unwrap();
    items["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["data"].clone())
        .collect()
}

/// The turn record, with `messages` filled in from the session tree (where the history lives).
/// The roles of a turn record's messages, in order.
pub fn roles(rec: &Value) -> Vec<&str> {
    rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect()
}

/// The roles of a run's history that made `calls` calls, one per turn: the user's message,
/// each call's answer and result, the last answer.
pub fn roles_of_calls(calls: usize) -> Vec<&'static str> {
    let mut roles = vec!["user"];
    for _ in 0..calls {
        roles.extend(["assistant", "function_result"]);
    }
    roles.push("assistant");
    roles
}

pub async fn record(s: &Stack, sid: &str) -> Value {
    let ctx = s.client.ctx();
    let mut rec = ctx
        .state_get("agent", &format!("session/{sid}/turn_state"))
        .await
        .unwrap();
    assert_eq!(
        rec["tree"], true,
        "the run keeps its history in the session tree"
    );
    let tree = ctx
        .trigger("session-tree::messages", json!({"session_id": sid}))
        .await
        .unwrap();
    rec["messages"] = tree["messages"].clone();
    rec
}
pub mod mcp;
pub mod process;
