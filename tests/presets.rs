//! Composition by configuration: the thin and thick presets each run a whole turn; a layer is
//! swapped by a remote worker that the configuration expects; a key stored while the engine
//! runs is used at once, and a missing one is named.

use crate::common;

use agent_harness::config::{Config, Placement};
use common::*;
use harness_sdk::{RegisterFunction, RemoteOptions, Worker, run_remote};
use scripted_model::{Cassette, Turn};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `run::start` from inside the composition (`run::start` is not a client's to call).
async fn run_start(s: &Stack, sid: &str, provider: &str, model: &str) -> Value {
    s.composition.workers[0]
        .ctx()
        .trigger(
            "run::start",
            json!({"session_id": sid, "provider": provider, "model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": "look around"}], "timestamp": 1}]}),
        )
        .await
        .unwrap()
}

fn list_then_answer() -> Cassette {
    Cassette {
        turns: vec![call("c1", "fs::list", json!({})), text("done looking")],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thin_and_thick_presets_each_run_a_whole_turn() {
    for preset in ["thin", "thick"] {
        let s = stack_from(preset, PERMISSIONS, models_catalog::Catalog::builtin()).await;
        let thick = preset == "thick";
        std::fs::create_dir_all(&s.work).unwrap();
        std::fs::write(s.work.join("notes.txt"), "hello").unwrap();
        s.model.load(list_then_answer());
        // Thin lists only the scripted provider; thick registers all five.
        let (provider, model) = if thick {
            ("anthropic", "claude-sonnet-5-5")
        } else {
            ("scripted", "scripted-demo")
        };
        let started = run_start(&s, preset, provider, model).await;
        assert_eq!(started["started"], true, "{preset}: {started}");
        let ctx = s.client.ctx();
        let view = wait_state(&ctx, preset, "stopped").await;
        assert!(view["error"].is_null(), "{preset}: {view}");
        assert_eq!(view["turn_count"], 2, "{preset}: {view}");
        let evs = events(&ctx, preset).await;
        let end = evs
            .iter()
            .find(|e| e["type"] == "function_execution_end")
            .unwrap_or_else(|| panic!("{preset}: the call ended: {evs:?}"));
        if thick {
            assert_eq!(end["is_error"], false, "{end}");
            assert!(end["result"].to_string().contains("notes.txt"), "{end}");
        } else {
            // No policy worker: fail-closed, and the run goes on to the model's answer.
            assert_eq!(end["result"]["status"], "denied", "{end}");
            assert_eq!(end["result"]["denied_by"], "gate_unavailable", "{end}");
        }
        assert!(
            evs.iter().any(|e| e["type"] == "message_complete"
                && e["message"]["content"].to_string().contains("done looking")),
            "{preset}: the final answer"
        );
        // Removing a worker removes its function IDs, nothing else.
        let engine = &s.srv.engine;
        for id in [
            "policy::check_permissions",
            "shell::exec",
            "session-tree::messages",
            "provider::openai::stream",
        ] {
            assert_eq!(engine.has_function(id), thick, "{preset}: {id}");
        }
        // Both have the front door (the thin harness's minimal harness worker).
        for id in [
            "run::start",
            "harness::trigger",
            "auth::get_token",
            "provider::scripted::stream",
        ] {
            assert!(engine.has_function(id), "{preset}: {id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_policy_under_a_granted_credential_replaces_the_layer_and_start_up_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = test_options(dir.path());
    let access = dir.path().join("access.yaml");
    std::fs::write(
        &access,
        format!(
            "credentials:\n  - name: policy-v2\n    role: worker\n    token_sha256: {}\n    namespaces: [policy]\n",
            engine_gateway::access::hash_token("w-policy")
        ),
    )
    .unwrap();
    opts.access_file = Some(access);
    let srv = engine_gateway::server::start(&opts).await.unwrap();

    // The replacement allows everything and remembers what it was asked.
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut policy = Worker::new("policy-v2");
    let seen = asked.clone();
    policy.register_function(
        RegisterFunction::new("policy::check_permissions"),
        move |_ctx, data: Value| {
            seen.lock()
                .unwrap()
                .push(data["function_id"].as_str().unwrap_or("?").to_string());
            async { Ok(json!({"decision": "allow", "rule_id": "policy-v2"})) }
        },
    );
    let url = format!("ws://{}/?token=w-policy", srv.local_addr);
    // It connects after start-up has begun: the composition waits for it.
    let remote = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        run_remote(policy, RemoteOptions::new(&url))
    });
    let mut cfg = Config::load("thick").unwrap();
    cfg.workers.policy = Placement::Remote;
    let s = stack_on(
        dir,
        srv,
        &mut cfg,
        PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    assert!(
        s.srv.engine.has_function("policy::check_permissions"),
        "start-up waited for the remote policy: {:?}",
        s.composition.report
    );
    assert!(
        s.composition.report.iter().any(|l| l == "remote: policy"),
        "{:?}",
        s.composition.report
    );

    // The permissions file allows only fs::read and fs::list: the write goes through only
    // because the remote layer decides.
    s.model.load(Cassette {
        turns: vec![
            call(
                "w1",
                "fs::write",
                json!({"path": "out.txt", "content": "by policy-v2"}),
            ),
            text("written"),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "swap", None).await;
    let view = wait_state(&ctx, "swap", "stopped").await;
    assert!(view["error"].is_null(), "{view}");
    assert_eq!(
        std::fs::read_to_string(s.work.join("swap").join("out.txt")).unwrap(),
        "by policy-v2"
    );
    assert!(
        asked.lock().unwrap().iter().any(|f| f == "fs::write"),
        "the remote policy was asked: {:?}",
        asked.lock().unwrap()
    );
    drop(remote.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_stored_while_the_engine_runs_is_used_at_once_and_a_missing_one_is_named() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        require_api_key: Some("sk-stored-live".into()),
        turns: vec![text("hello from openai")],
        ..Default::default()
    });
    // OpenAI is registered though no key is set: the call says which provider lacks one.
    assert!(s.srv.engine.has_function("provider::openai::stream"));
    run_start(&s, "nokey", "openai", "gpt-5.4").await;
    let view = wait_state(&ctx, "nokey", "stopped").await;
    assert_eq!(view["error"]["kind"], "auth_missing", "{view}");
    assert!(
        view["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`openai`") && m.contains("auth::set_token")),
        "{view}"
    );
    assert!(
        s.model.requests().is_empty(),
        "nothing went out without a key"
    );

    // Stored now, used by the very next call: no restart, no re-registration.
    s.composition.workers[0]
        .ctx()
        .trigger(
            "auth::set_token",
            json!({"provider": "openai", "type": "api_key", "key": "sk-stored-live"}),
        )
        .await
        .unwrap();
    run_start(&s, "stored", "openai", "gpt-5.4").await;
    let view = wait_state(&ctx, "stored", "stopped").await;
    assert!(view["error"].is_null(), "{view}");
    let evs = events(&ctx, "stored").await;
    assert!(
        evs.iter().any(|e| e["type"] == "message_complete"
            && e["message"]["content"]
                .to_string()
                .contains("hello from openai")),
        "{evs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_in_the_configuration_exist_after_start_up_and_are_brought_up_to_date() {
    let mut cfg = Config::parse(
        &agent_harness::config::THICK.replace(
            "budgets: []",
            "budgets:\n  - budget_id: daily\n    ceiling_usd: 5\n    period: day\n    agent_id: demo",
        ),
        "test",
    )
    .unwrap();
    let s = stack_config(&mut cfg, PERMISSIONS, models_catalog::Catalog::builtin()).await;
    let ctx = s.composition.workers[0].ctx();
    let b = ctx
        .trigger("budget::get", json!({"budget_id": "daily"}))
        .await
        .unwrap();
    assert_eq!(b["ceiling_usd"], 5.0, "{b}");
    assert_eq!(b["agent_id"], "demo", "{b}");
    // Started again on the same store with another ceiling: updated, not refused. (Only the
    // budget worker this time; the running orchestrator counts as the remote one.)
    let mut again = cfg.clone();
    again.budgets[0].ceiling_usd = 7.5;
    again.workers = agent_harness::config::Workers {
        turn_orchestrator: Placement::Remote,
        llm_budget: Placement::Embedded,
        ..Default::default()
    };
    // (Kept: it replaced the first budget worker's registrations, the last one wins.)
    let _again = agent_harness::compose::start(
        &again,
        &s.srv.engine,
        agent_harness::compose::Inputs::default(),
    )
    .await
    .unwrap();
    let b = ctx
        .trigger("budget::get", json!({"budget_id": "daily"}))
        .await
        .unwrap();
    assert_eq!(b["ceiling_usd"], 7.5, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thin_preset_ends_runs_on_max_turns_provider_errors_and_abort() {
    let s = stack_from("thin", PERMISSIONS, models_catalog::Catalog::builtin()).await;
    let ctx = s.client.ctx();
    let inner = s.composition.workers[0].ctx();
    let start = |sid: &'static str, max_turns: Option<u32>| {
        let inner = inner.clone();
        async move {
            inner
                .trigger(
                    "run::start",
                    json!({"session_id": sid, "provider": "scripted", "model": "scripted-demo", "max_turns": max_turns, "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]}),
                )
                .await
                .unwrap()
        }
    };
    // max_turns: two model turns, each with a (denied) call, then the run stops.
    s.model.load(Cassette {
        turns: vec![
            call("m1", "fs::list", json!({})),
            call("m2", "fs::list", json!({})),
            call("m3", "fs::list", json!({})),
        ],
        ..Default::default()
    });
    start("maxed", Some(2)).await;
    let view = wait_state(&ctx, "maxed", "stopped").await;
    assert_eq!(view["error"]["kind"], "max_turns", "{view}");
    assert_eq!(view["turn_count"], 2);
    // The provider fails: the run ends with its error kind.
    s.model.load(Cassette {
        turns: vec![Turn {
            http_status: Some(429),
            error_message: Some("slow down".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    start("limited", None).await;
    let view = wait_state(&ctx, "limited", "stopped").await;
    assert_eq!(view["error"]["kind"], "rate_limited", "{view}");
    // run::abort stops a run, and a second start on a stopped session resumes it.
    s.model.load(Cassette {
        turns: vec![text("resumed")],
        ..Default::default()
    });
    let aborted = ctx
        .trigger("run::abort", json!({"session_id": "limited"}))
        .await
        .unwrap();
    assert_eq!(aborted["aborted"], false, "already stopped: {aborted}");
    let again = start("limited", None).await;
    assert_eq!(again["started"], true, "{again}");
    let view = wait_state(&ctx, "limited", "stopped").await;
    assert!(view["error"].is_null(), "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_run_defaults_and_sandbox_settings_reach_the_workers() {
    let text_of_file = agent_harness::config::THICK
        .replace("  mode: agent\n", "  mode: plan\n  max_turns: 3\n")
        .replace("  max_turns: 12\n", "")
        .replace("  isolation: auto ", "  isolation: process ");
    let mut cfg = Config::parse(&text_of_file, "test").unwrap();
    let s = stack_config(&mut cfg, PERMISSIONS, models_catalog::Catalog::builtin()).await;
    s.model.load(Cassette {
        turns: vec![
            call("d1", "fs::list", json!({})),
            call("d2", "fs::list", json!({})),
            call("d3", "fs::list", json!({})),
            call("d4", "fs::list", json!({})),
        ],
        ..Default::default()
    });
    // harness::trigger with neither mode nor max_turns: the file's run defaults fill them.
    let ctx = s.client.ctx();
    ctx.trigger(
        "harness::trigger",
        json!({"session_id": "defaults", "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": [{"type": "text", "text": "plan it"}], "timestamp": 1}]}}),
    )
    .await
    .unwrap();
    let view = wait_state(&ctx, "defaults", "stopped").await;
    assert_eq!(view["max_turns"], 3, "{view}");
    assert_eq!(view["error"]["kind"], "max_turns", "{view}");
    let first = &s.model.requests()[0];
    assert!(
        first["body"].to_string().contains("Mode: plan"),
        "the plan paragraph: {}",
        first["body"]
    );
    // The sandbox's isolation came from the file.
    let report = s.composition.workers[0]
        .ctx()
        .trigger("shell::sandbox", json!({}))
        .await
        .unwrap();
    assert_eq!(report["isolation"], "process", "{report}");
    assert_eq!(
        report["workdir"],
        s.work.canonicalize().unwrap().display().to_string()
    );
}

/// A worker of your own in `workers:` (remote, with what to wait for) and a fifth provider as
/// the run's default: start-up waits for it, and a run with the file's defaults streams from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_your_own_and_a_fifth_provider_as_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let srv = engine_gateway::server::start(&test_options(dir.path()))
        .await
        .unwrap();
    // "acme": an OpenAI-dialect provider of its own, on its own model server.
    let acme_model = scripted_model::ScriptedModel::default();
    acme_model.load(Cassette {
        turns: vec![text("hello from acme")],
        ..Default::default()
    });
    let acme_url = acme_model.serve().await.unwrap();
    let acme = provider_core::worker(Arc::new(provider_openai::OpenAiDialect {
        name: "acme".into(),
        base_url: format!("{acme_url}/v1"),
        key_optional: true,
    }));
    let url = srv.url();
    let remote = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        run_remote(acme, RemoteOptions::new(&url))
    });
    let mut cfg = Config::load("thick").unwrap();
    cfg.run.provider = agent_harness::config::ProviderChoice::Custom("acme".into());
    cfg.run.model = Some("acme-1".into());
    cfg.workers.custom.insert(
        "acme-provider".into(),
        agent_harness::config::CustomWorker::Expecting {
            placement: Placement::Remote,
            expect: vec!["provider::acme::stream".into()],
        },
    );
    let s = stack_on(
        dir,
        srv,
        &mut cfg,
        PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await;
    assert!(
        s.srv.engine.has_function("provider::acme::stream"),
        "start-up waited for it: {:?}",
        s.composition.report
    );
    assert!(
        s.composition
            .report
            .iter()
            .any(|l| l.starts_with("remote:") && l.contains("acme-provider")),
        "{:?}",
        s.composition.report
    );
    assert_eq!(s.composition.provider, "acme");
    let mut payload = s.composition.run_defaults.clone();
    payload["messages"] =
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]);
    let ctx = s.client.ctx();
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": "acme1", "payload": payload}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let view = wait_state(&ctx, "acme1", "stopped").await;
    assert!(view["error"].is_null(), "{view}");
    let asked = acme_model.requests();
    assert_eq!(asked.len(), 1, "the run's model call went to acme");
    assert_eq!(asked[0]["body"]["model"], "acme-1");
    assert!(
        s.model.requests().is_empty(),
        "not to the stack's own model"
    );
    drop(remote.await.unwrap());
}
