//! MCP servers' tools in whole turns, against servers nobody here wrote: the reference
//! `@modelcontextprotocol/server-everything` (npm; stdio and streamable HTTP),
//! `mcp-server-time` (PyPI), a server built on the official Python SDK whose tools change,
//! and a protocol-level script for hostile listings and results (tests/mcp/servers/).
//! `scripts/test.sh` installs them (pinned): `tests/mcp/node_modules` and the Python of
//! `HARNESS_MCP_PYTHON`.

use crate::common;

use agent_harness::config::{Config, Placement};
use common::mcp::*;
use common::*;
use scripted_model::Cassette;
use serde_json::{Value, json};
use std::time::Duration;

/// Never reaches a server: the test process has it, and a server's environment is cleared.
const PLANTED_KEY: &str = "sk-ant-planted-must-never-reach-a-server";

fn config(servers: Value) -> Config {
    let mut cfg = Config::load("thick").unwrap();
    cfg.sandbox.workspace = agent_harness::config::Workspace::Shared;
    cfg.workers.mcp = Placement::Embedded;
    cfg.mcp_servers = serde_json::from_value(servers).unwrap();
    cfg
}

async fn wait_parked(ctx: &harness_sdk::Ctx, sid: &str, call: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = ctx
            .trigger("turn::get_state", json!({"session_id": sid}))
            .await
            .unwrap();
        if v["state"] == "function_awaiting_approval"
            && v["awaiting_approval"][0]["function_call_id"] == call
        {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{call} never parked: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ends(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "function_execution_end")
        .cloned()
        .collect()
}

fn end_of<'a>(ends: &'a [Value], call: &str) -> &'a Value {
    ends.iter()
        .find(|e| e["function_call_id"] == call)
        .unwrap_or_else(|| panic!("no end for {call}: {ends:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_servers_tools_run_in_a_turn_under_the_policy() {
    // SAFETY: set before any server starts; nextest runs each test in its own process.
    unsafe { std::env::set_var("ANTHROPIC_API_KEY", PLANTED_KEY) };
    let http = http_everything().await;
    let mut cfg = config(json!([
        {"name": "everything", "command": ["node", everything_js(), "stdio"]},
        {"name": "everything-http", "url": http.url},
        {"name": "time", "command": [python(), "-m", "mcp_server_time", "--local-timezone", "UTC"]},
        {"name": "plain", "command": [python(), server_script("raw_server.py"), "plain"]},
        {"name": "old", "command": [python(), server_script("raw_server.py"), "plain"], "env": {"PROTOCOL_VERSION": "2025-06-18"}},
    ]));
    let s = stack_config(
        &mut cfg,
        harness_worker::SHIPPED_PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    let ctx = s.client.ctx();

    // Registered as function IDs, with their schemas and annotations; paging followed.
    let fns = ctx.functions(true).await.unwrap();
    let f = |id: &str| {
        fns.iter()
            .find(|f| f["function_id"] == id)
            .unwrap_or_else(|| panic!("{id} is not registered"))
            .clone()
    };
    let echo = f("mcp::everything::echo");
    assert_eq!(
        echo["request_format"]["properties"]["message"]["type"], "string",
        "{echo}"
    );
    assert_eq!(echo["metadata"]["annotations"]["readOnlyHint"], true);
    assert_eq!(echo["metadata"]["read_only"], true);
    assert_eq!(
        f("mcp::everything-http::get-sum")["metadata"]["read_only"],
        false,
        "a url server's annotations are not trusted"
    );
    f("mcp::plain::unannotated");
    f("mcp::time::get_current_time");
    let servers = ctx.trigger("mcp::servers", json!({})).await.unwrap();
    for s in servers["servers"].as_array().unwrap() {
        assert_eq!(s["state"], "ready", "{s}");
        // The version we ask for, or the older one a server answers with.
        let expected = if s["name"] == "old" {
            "2025-06-18"
        } else {
            "2025-11-25"
        };
        assert_eq!(s["protocol_version"], expected, "{s}");
    }
    let old = ctx.trigger("mcp::old::pid", json!({})).await.unwrap();
    assert!(old["content"][0]["text"].as_str().is_some(), "{old}");

    s.model.load(Cassette {
        turns: vec![
            call(
                "c-echo",
                "mcp::everything::echo",
                json!({"message": "hello over stdio"}),
            ),
            call(
                "c-time",
                "mcp::time::get_current_time",
                json!({"timezone": "UTC"}),
            ),
            call("c-image", "mcp::everything::get-tiny-image", json!({})),
            call("c-env", "mcp::everything::get-env", json!({})),
            call(
                "c-sum",
                "mcp::everything-http::get-sum",
                json!({"a": 2, "b": 40}),
            ),
            call("c-plain", "mcp::plain::unannotated", json!({})),
            text("done"),
        ],
        ..Default::default()
    });
    start(&ctx, "m1", Some(12)).await;
    // The HTTP server's tool is not trusted read-only: it parks; then the unannotated one.
    for call in ["c-sum", "c-plain"] {
        let view = wait_parked(&ctx, "m1", call).await;
        assert_eq!(
            view["awaiting_approval"][0]["function_id"]
                .as_str()
                .map(|f| f.starts_with("mcp::")),
            Some(true),
            "{view}"
        );
        let ok = ctx
            .trigger(
                "approval::resolve",
                json!({"session_id": "m1", "function_call_id": call, "decision": "allow"}),
            )
            .await
            .unwrap();
        assert_eq!(ok["ok"], true, "{ok}");
    }
    let view = wait_state(&ctx, "m1", "stopped").await;
    assert_eq!(view["error"], Value::Null, "{view}");
    let events = events(&ctx, "m1").await;
    let ends = ends(&events);
    for c in ["c-echo", "c-time", "c-image", "c-env", "c-sum", "c-plain"] {
        assert_eq!(
            end_of(&ends, c)["is_error"],
            false,
            "{c}: {:#}",
            end_of(&ends, c)
        );
    }
    let text_of = |c: &str| end_of(&ends, c)["result"]["content"].to_string();
    assert!(
        text_of("c-echo").contains("Echo: hello over stdio"),
        "{}",
        text_of("c-echo")
    );
    assert!(text_of("c-time").contains("UTC"), "{}", text_of("c-time"));
    assert_eq!(
        end_of(&ends, "c-sum")["result"]["content"][0]["text"]
            .as_str()
            .map(|t| t.contains("42")),
        Some(true),
        "{}",
        text_of("c-sum")
    );
    assert!(text_of("c-plain").contains("unannotated ran"));
    // get-env: the server's whole environment, and none of the harness's secrets.
    let env = text_of("c-env");
    assert!(env.contains("PATH"), "{env}");
    assert!(
        !env.contains(PLANTED_KEY),
        "a provider key reached the server: {env}"
    );
    let token =
        std::fs::read_to_string(s._dir.path().join("data/engine.token")).unwrap_or_default();
    if !token.trim().is_empty() {
        assert!(
            !env.contains(token.trim()),
            "the engine token reached the server"
        );
    }
    // The tiny image reached the model as an image block of the tool result.
    let requests = s.model.requests();
    let image = requests.iter().any(|r| {
        r["body"]["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| {
                m["content"].as_array().into_iter().flatten().any(|b| {
                    b["type"] == "tool_result"
                        && b["content"].as_array().is_some_and(|c| {
                            c.iter().any(|x| {
                                x["type"] == "image" && x["source"]["media_type"] == "image/png"
                            })
                        })
                })
            })
    });
    assert!(
        image,
        "no image block in the provider requests: {:#}\n{}",
        end_of(&ends, "c-image"),
        requests
            .last()
            .map(|r| r["body"]["messages"].to_string())
            .unwrap_or_default()
            .chars()
            .take(3000)
            .collect::<String>()
    );
    // The console shows each call with its server and tool, from the same events.
    let starts: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "function_execution_start")
        .map(|e| e["function_id"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        starts.contains(&"mcp::time::get_current_time".to_string()),
        "{starts:?}"
    );
    // One span per call, named after the tool, with the server named.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let spans = s.srv.engine.spans.snapshot();
        let tool = spans
            .iter()
            .find(|sp| sp.name == "execute_tool mcp::time::get_current_time");
        if let Some(sp) = tool {
            assert_eq!(
                sp.attributes.get("mcp.server.name").map(String::as_str),
                Some("time")
            );
            assert_eq!(
                sp.attributes.get("gen_ai.tool.name").map(String::as_str),
                Some("mcp::time::get_current_time")
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no execute_tool span for the MCP call"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(http);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_rule_on_a_server_denies_even_its_read_only_tools() {
    let mut cfg =
        config(json!([{"name": "everything", "command": ["node", everything_js(), "stdio"]}]));
    let perms = harness_worker::SHIPPED_PERMISSIONS
        .replace("rules:\n", "rules:\n  - \"!mcp::everything::*\"\n");
    let s = stack_config(&mut cfg, &perms, models_catalog::Catalog::builtin()).await;
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        turns: vec![
            call("c-echo", "mcp::everything::echo", json!({"message": "x"})),
            text("denied"),
        ],
        ..Default::default()
    });
    start(&ctx, "d1", Some(4)).await;
    wait_state(&ctx, "d1", "stopped").await;
    let ends = ends(&events(&ctx, "d1").await);
    let r = &end_of(&ends, "c-echo")["result"];
    assert_eq!(r["status"], "denied", "{r}");
    assert_eq!(r["denied_by"], "permissions", "{r}");
}

/// The `pid` tool's answer.
fn pid_of(v: &Value) -> i32 {
    v["content"][0]["text"].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_answers_unavailable_and_is_restarted_and_an_abort_cancels_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cancel_log = dir.path().join("cancelled.jsonl");
    let mut cfg = config(json!([
        {"name": "plain", "command": [python(), server_script("raw_server.py"), "plain"], "env": {"CANCEL_LOG": cancel_log.display().to_string()}},
    ]));
    let s = stack_config(
        &mut cfg,
        harness_worker::SHIPPED_PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    let ctx = s.client.ctx();
    let first = pid_of(&ctx.trigger("mcp::plain::pid", json!({})).await.unwrap());

    // A turn's call is in flight when the server dies: the model gets `mcp_unavailable`
    // naming the server, and the turn finishes.
    s.model.load(Cassette {
        turns: vec![
            call("c-hang", "mcp::plain::hang", json!({})),
            text("the server went away"),
        ],
        ..Default::default()
    });
    start(&ctx, "k1", Some(4)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !events(&ctx, "k1")
        .await
        .iter()
        .any(|e| e["type"] == "function_execution_start")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: a signal to the server's process, which this test read from the server.
    unsafe { libc::kill(first, libc::SIGKILL) };
    let view = wait_state(&ctx, "k1", "stopped").await;
    assert_eq!(view["error"], Value::Null, "{view}");
    let ends = ends(&events(&ctx, "k1").await);
    let r = end_of(&ends, "c-hang");
    assert_eq!(r["is_error"], true, "{r}");
    assert_eq!(r["result"]["error"]["code"], "mcp_unavailable", "{r}");
    assert!(
        r["result"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`plain`"),
        "{r}"
    );

    // The next call finds it restarted (a new process).
    let second = pid_of(&ctx.trigger("mcp::plain::pid", json!({})).await.unwrap());
    assert_ne!(first, second);
    let status = ctx.trigger("mcp::servers", json!({})).await.unwrap();
    assert!(
        status["servers"][0]["restarts"].as_u64().unwrap() >= 1,
        "{status}"
    );

    // An aborted run's call is cancelled on the server (notifications/cancelled).
    s.model.load(Cassette {
        turns: vec![
            call("c-hang2", "mcp::plain::hang", json!({})),
            text("never"),
        ],
        ..Default::default()
    });
    start(&ctx, "k2", Some(4)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !events(&ctx, "k2")
        .await
        .iter()
        .any(|e| e["type"] == "function_execution_start")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second call never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let aborted = ctx
        .trigger("run::abort", json!({"session_id": "k2"}))
        .await
        .unwrap();
    assert_eq!(aborted["aborted"], true, "{aborted}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&cancel_log).unwrap_or_default();
        if log.lines().any(|l| l.contains("requestId")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server was never told: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changing_tool_list_registers_and_unregisters_function_ids() {
    let mut cfg = config(json!([
        {"name": "changing", "command": [python(), server_script("changing_server.py")]},
    ]));
    let s = stack_config(
        &mut cfg,
        harness_worker::SHIPPED_PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    let ctx = s.client.ctx();
    let has = |id: &'static str| {
        let engine = s.srv.engine.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let now = engine.has_function(id);
                if now {
                    return true;
                }
                if tokio::time::Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(!s.srv.engine.has_function("mcp::changing::extra"));
    ctx.trigger("mcp::changing::add_extra", json!({}))
        .await
        .unwrap();
    assert!(
        has("mcp::changing::extra").await,
        "list_changed did not add the tool"
    );
    let r = ctx
        .trigger("mcp::changing::extra", json!({}))
        .await
        .unwrap();
    assert!(r.to_string().contains("extra ran"), "{r}");
    ctx.trigger("mcp::changing::remove_extra", json!({}))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.srv.engine.has_function("mcp::changing::extra") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "list_changed did not remove the tool"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The others stayed registered throughout.
    assert!(s.srv.engine.has_function("mcp::changing::add_extra"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_servers_get_clear_errors_or_bounded_answers_and_the_harness_goes_on() {
    let mut cfg = config(json!([
        {"name": "hostile", "command": [python(), server_script("raw_server.py"), "hostile"]},
        {"name": "deep", "command": [python(), server_script("raw_server.py"), "deep"], "timeout_secs": 3},
        {"name": "silent", "command": [python(), server_script("raw_server.py"), "silent"], "timeout_secs": 2},
        {"name": "everything", "command": ["node", everything_js(), "stdio"]},
    ]));
    cfg.remote_wait_secs = 6;
    let started = std::time::Instant::now();
    let s = stack_config(
        &mut cfg,
        harness_worker::SHIPPED_PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "start-up stalled on a hostile server"
    );
    let ctx = s.client.ctx();
    let report = s.composition.report.join("\n");
    assert!(report.contains("`silent` not ready"), "{report}");

    // A 10 MB description is cut to the limit, marked.
    let fns = ctx.functions(false).await.unwrap();
    let big = fns
        .iter()
        .find(|f| f["function_id"] == "mcp::hostile::big")
        .expect("big registered");
    let d = big["description"].as_str().unwrap();
    assert!(
        d.len() < 9 * 1024 && d.contains("[truncated: 8192 of 10485760 bytes]"),
        "{}",
        d.len()
    );
    // A name with a slash and spaces: mapped by the documented rule, and callable.
    let r = ctx
        .trigger("mcp::hostile::search%2Ffiles%20now", json!({"q": "x"}))
        .await
        .unwrap();
    assert!(r.to_string().contains("found"), "{r}");
    // A 10 MB result: 1 MiB of it, marked.
    let r = ctx
        .trigger("mcp::hostile::huge_result", json!({}))
        .await
        .unwrap();
    assert_eq!(r["truncated"], true);
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.len() < 1024 * 1024 + 200 && text.ends_with("of 10485760 bytes]"),
        "{}",
        text.len()
    );
    // A schema 200 levels deep, and a server that never answers initialize: each says why.
    let status = ctx.trigger("mcp::servers", json!({})).await.unwrap();
    let of = |name: &str| {
        status["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()
            .clone()
    };
    let deep = of("deep");
    let why = format!("{} {}", deep["error"], deep["refused"]);
    assert!(
        why.contains("levels deep") || why.contains("128 levels"),
        "{deep}"
    );
    assert!(!s.srv.engine.has_function("mcp::deep::deep"));
    let silent = of("silent");
    assert_ne!(silent["state"], "ready");
    assert!(
        silent["error"]
            .as_str()
            .unwrap_or("")
            .contains("initialize"),
        "{silent}"
    );
    let e = ctx
        .trigger("mcp::everything::echo", json!({"message": "still here"}))
        .await
        .unwrap();
    assert!(e.to_string().contains("Echo: still here"), "{e}");
    // Bad arguments are refused by the worker with the reason.
    let e = ctx
        .trigger("mcp::hostile::big", json!([1, 2]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("object of arguments"), "{e}");
}

#[test]
fn an_invalid_mcp_entry_stops_start_up_with_the_field_and_line() {
    let yaml = "workers:\n  turn-orchestrator: embedded\n  mcp: embedded\nmcp_servers:\n  - name: ok\n    command: [x]\n  - name: bad name\n    command: [x]\n";
    let e = Config::parse(yaml, "h.yaml").unwrap_err().to_string();
    assert!(
        e.contains("mcp_servers[1].name") && e.contains("line 7"),
        "{e}"
    );
    let lambda = "workers:\n  turn-orchestrator: embedded\n  mcp: lambda\nmcp_servers:\n  - name: s\n    command: [x]\n";
    let e = Config::parse(lambda, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("stdio server") && e.contains("Lambda"), "{e}");
    let off =
        "workers:\n  turn-orchestrator: embedded\nmcp_servers:\n  - name: s\n    command: [x]\n";
    let e = Config::parse(off, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("`mcp` worker is off"), "{e}");
    let unknown = "workers:\n  turn-orchestrator: embedded\n  mcp: embedded\nmcp_servers:\n  - name: s\n    command: [x]\n    comand: [y]\n";
    let e = Config::parse(unknown, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("comand"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_worker_serves_as_a_remote_worker_with_secrets_from_the_vault() {
    // The harness without its own mcp worker: this test runs it remote, over the WebSocket.
    let mut cfg = Config::load("thick").unwrap();
    cfg.sandbox.workspace = agent_harness::config::Workspace::Shared;
    // Off here: the preset's own mcp worker (no servers) would register `mcp::servers` too,
    // and which of the two answers it is the engine's pick.
    cfg.workers.mcp = Placement::Off;
    let s = stack_config(
        &mut cfg,
        harness_worker::SHIPPED_PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    let ctx = s.client.ctx();
    let stored = ctx
        .trigger(
            "auth::set_token",
            json!({"provider": "mcp/everything", "type": "api_key", "key": "vault-value-42"}),
        )
        .await
        .unwrap();
    assert_eq!(stored["ok"], true, "{stored}");
    let servers: Vec<mcp_client::ServerConfig> = serde_json::from_value(json!([
        {"name": "everything", "command": ["node", everything_js(), "stdio"], "env": {"FROM_VAULT": "${secret:mcp/everything}"}},
    ]))
    .unwrap();
    let opts = harness_sdk::RemoteOptions::new(&s.srv.url());
    let vault = harness_sdk::connect_client("mcp-vault", opts.clone()).await;
    let mcp = mcp_client::Mcp::start(
        servers,
        s.work.clone(),
        std::sync::Arc::new(mcp_client::publish::Remote(opts.clone())),
        mcp_client::secrets::from_vault(vault.ctx()),
    );
    std::fs::create_dir_all(&s.work).unwrap();
    assert!(
        mcp.wait_listed(Duration::from_secs(30)).await.is_empty(),
        "{:?}",
        mcp.statuses()
    );
    let _worker = harness_sdk::run_remote(mcp_client::worker(mcp.clone()), opts);
    let r = ctx
        .trigger("mcp::everything::echo", json!({"message": "remote"}))
        .await
        .unwrap();
    assert!(r.to_string().contains("Echo: remote"), "{r}");
    let env = ctx
        .trigger("mcp::everything::get-env", json!({}))
        .await
        .unwrap()
        .to_string();
    assert!(
        env.contains("vault-value-42"),
        "the secret did not reach the server's env: {env}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        match ctx.trigger("mcp::servers", json!({})).await {
            Ok(v) => break v,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(status["servers"][0]["state"], "ready", "{status}");
    // The tools came through the bus's registration: their skill pages are served.
    let skill = ctx
        .trigger(
            "directory::skills::get",
            json!({"id": "iii://mcp-everything/mcp::everything::echo"}),
        )
        .await
        .unwrap();
    assert!(
        skill["body"]
            .as_str()
            .unwrap()
            .contains("mcp::everything::echo"),
        "{skill}"
    );
    // A secret that is not in the vault: the server does not start, and says which.
    let missing: Vec<mcp_client::ServerConfig> = serde_json::from_value(json!([
        {"name": "nokey", "command": ["node", everything_js(), "stdio"], "env": {"K": "${secret:mcp/none}"}},
    ]))
    .unwrap();
    let m2 = mcp_client::Mcp::start(
        missing,
        s.work.clone(),
        std::sync::Arc::new(mcp_client::publish::Embedded::new(&s.srv.engine)),
        mcp_client::secrets::from_vault(vault.ctx()),
    );
    let not = m2.wait_listed(Duration::from_secs(3)).await;
    assert!(not[0].1.contains("secret `mcp/none`"), "{not:?}");
}

#[test]
fn a_stdio_servers_processes_end_when_the_harness_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(
        dir.path().join("perms.yaml"),
        harness_worker::SHIPPED_PERMISSIONS,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("cassette.json"),
        r#"{"turns": [{"text": "hi"}]}"#,
    )
    .unwrap();
    // A name of its own on the command line, so only this test's server is counted.
    let marker = dir
        .path()
        .join(format!("everything-{}.js", std::process::id()));
    std::os::unix::fs::symlink(everything_js(), &marker).unwrap();
    let config = agent_harness::config::THICK.replace(
        "mcp_servers: []\n",
        &format!(
            // A child of its own that would outlive a server stopped alone (a sleeper that
            // reads no stdin): only killing the whole group ends it.
            "mcp_servers:\n  - {{name: everything, command: [sh, -c, \"python3 -c 'import time; time.sleep(3000)' {m} & exec node {m} stdio\"]}}\n",
            m = marker.display()
        ),
    );
    let config_path = dir.path().join("harness.yaml");
    std::fs::write(&config_path, config).unwrap();
    let marker = marker.display().to_string();
    let harness =
        common::process::spawn_harness(dir.path(), &["--config", config_path.to_str().unwrap()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while common::process::processes(&marker, None, None) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    harness.kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while common::process::processes(&marker, None, None) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server outlived the harness killed with SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_a_timeout_and_is_cancelled_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cancel_log = dir.path().join("cancelled.jsonl");
    let mut cfg = config(json!([
        {"name": "plain", "command": [python(), server_script("raw_server.py"), "plain"],
         "env": {"CANCEL_LOG": cancel_log.display().to_string()}, "timeout_secs": 1},
    ]));
    let s = stack_config(
        &mut cfg,
        harness_worker::SHIPPED_PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    let ctx = s.client.ctx();
    let started = std::time::Instant::now();
    let e = ctx
        .trigger("mcp::plain::hang", json!({}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "timeout", "{e}");
    assert!(e.to_string().contains("within 1 s"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&cancel_log)
        .unwrap_or_default()
        .contains("requestId")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no notifications/cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server still answers afterwards: a slow tool is not a dead server.
    let first = pid_of(&ctx.trigger("mcp::plain::pid", json!({})).await.unwrap());
    // A server that stops answering altogether (frozen): the call past its deadline finds no
    // answer to a ping either, so it is `mcp_unavailable`, and the server is restarted.
    // SAFETY: a signal to the server's process, which this test read from the server.
    unsafe { libc::kill(first, libc::SIGSTOP) };
    let e = ctx.trigger("mcp::plain::pid", json!({})).await.unwrap_err();
    assert_eq!(e.code(), "mcp_unavailable", "{e}");
    assert!(e.to_string().contains("answers no ping"), "{e}");
    let second = pid_of(&ctx.trigger("mcp::plain::pid", json!({})).await.unwrap());
    assert_ne!(first, second, "a new server process answers");
    // SAFETY: as above; the frozen process is gone, or is killed here.
    unsafe { libc::kill(first, libc::SIGKILL) };
}

/// `mcp::cancel` with a hostile request: a clear error naming the field, nothing cancelled,
/// and the worker goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_cancel_refuses_a_request_without_a_session_by_name() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    for bad in [
        json!({}),
        json!({"session_id": 7}),
        json!({"session_id": null}),
        json!([1]),
    ] {
        let e = ctx
            .trigger("mcp::cancel", bad.clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("session_id") || (bad.is_array() && e.contains("invalid")),
            "{bad}: {e}"
        );
    }
    let r = ctx
        .trigger("mcp::cancel", json!({"session_id": "nobody"}))
        .await
        .unwrap();
    assert_eq!(r, json!({"cancelled": 0}));
}
