//! Credentials against the real `harness` binary: a client (a browser, a CLI, Slack) reaches
//! the public functions of the real workers and nothing else; a worker credential registers
//! only in its namespaces, so it cannot replace the policy.

use crate::common;

use common::process::spawn_harness;
use harness_sdk::{RemoteOptions, connect_client};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_the_public_functions_only_and_a_worker_its_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("perms.yaml"), "version: 1\nrules: []\n").unwrap();
    std::fs::write(
        dir.path().join("cassette.json"),
        json!({"turns": [{"text": "hello"}]}).to_string(),
    )
    .unwrap();
    let hash = engine_gateway::access::hash_token;
    std::fs::write(
        dir.path().join("access.yaml"),
        format!(
            "credentials:\n  - name: browser\n    role: client\n    token_sha256: {}\n  - name: extra-tools\n    role: worker\n    token_sha256: {}\n    namespaces: [extra]\n",
            hash("client-secret"),
            hash("worker-secret")
        ),
    )
    .unwrap();
    let access = dir.path().join("access.yaml");
    let harness = spawn_harness(dir.path(), &["--access", access.to_str().unwrap()]);

    let client = connect_client(
        "browser",
        RemoteOptions::new(&harness.url_with("client-secret")),
    )
    .await;
    let ctx = client.ctx();
    // Public: start a run, watch it, list what waits for approval, read the session.
    let r = ctx
        .trigger("harness::trigger", json!({"session_id": "r1", "payload": {"provider": "scripted", "model": "scripted-demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]}}))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    ctx.trigger("approval::list_pending", json!({}))
        .await
        .unwrap();
    ctx.trigger("session-tree::list", json!({})).await.unwrap();
    let s = common::process::wait_finished(
        &ctx,
        "r1",
        std::time::Duration::from_secs(20),
        "the run never stopped",
    )
    .await;
    assert_eq!(s["state"], "stopped", "{s}");
    // Everything else answers forbidden, naming the function and the role: the agent's tools,
    // keys, the run start that skips the harness, state, the engine, session writes.
    for (id, data) in [
        ("shell::exec", json!({"command": "id"})),
        ("fs::read", json!({"path": "x"})),
        ("auth::get_token", json!({"provider": "anthropic"})),
        (
            "auth::set_token",
            json!({"provider": "anthropic", "token": "x"}),
        ),
        ("run::start", json!({"session_id": "r2"})),
        ("policy::check_permissions", json!({})),
        (
            "state::get",
            json!({"scope": "agent", "key": "session/r1/turn_state"}),
        ),
        ("engine::functions::list", json!({})),
        (
            "session-tree::append",
            json!({"session_id": "r1", "entry": {}}),
        ),
        ("ui::on_event", json!({})),
    ] {
        let e = ctx.trigger(id, data).await.unwrap_err();
        assert_eq!(e.code(), "forbidden", "{id}: {e}");
        assert!(
            e.message().contains(id) && e.message().contains("client `browser`"),
            "{id}: {e}"
        );
    }

    // A worker credential for `extra` cannot take over the policy; its own namespace is fine.
    use futures_util::{SinkExt, StreamExt};
    let (mut ws, _) = tokio_tungstenite::connect_async(harness.url_with("worker-secret"))
        .await
        .unwrap();
    for id in ["policy::check_permissions", "extra::tool"] {
        ws.send(tokio_tungstenite::tungstenite::Message::text(
            json!({"type": "registerfunction", "id": id}).to_string(),
        ))
        .await
        .unwrap();
    }
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        json!({"type": "ping"}).to_string(),
    ))
    .await
    .unwrap();
    let mut errors = Vec::new();
    while let Some(Ok(m)) = ws.next().await {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(m.to_text().unwrap_or("")) else {
            continue;
        };
        match v["type"].as_str() {
            Some("pong") => break,
            Some("error") => errors.push(v),
            _ => {}
        }
    }
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["error"]["code"], "forbidden");
    let msg = errors[0]["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("worker `extra-tools`") && msg.contains("namespace `policy`"),
        "{msg}"
    );
    let admin = connect_client("admin", RemoteOptions::new(&harness.url())).await;
    let list = admin.ctx().functions(false).await.unwrap();
    let owner_name = |id: &str| {
        list.iter()
            .find(|f| f["function_id"] == id)
            .map(|f| f["worker_id"].clone())
    };
    assert!(owner_name("extra::tool").is_some());
    assert_ne!(
        owner_name("policy::check_permissions"),
        owner_name("extra::tool"),
        "the policy stayed with its worker"
    );
}
