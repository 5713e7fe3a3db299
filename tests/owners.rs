//! Sessions belong to whoever started them, against the real `harness` binary: a client
//! credential sees and acts only on its own sessions, over the bus and the HTTP API, and
//! another's session answers exactly as an id that never existed does; an operator
//! (`sessions: all`) and the admin see every session; who decided an approval comes from the
//! credential, never from the request.

use crate::common;

use common::process::spawn_harness;
use engine_gateway::protocol::Message;
use harness_sdk::{Ctx, RemoteOptions, connect_client};
use serde_json::{Value, json};
use std::time::Duration;

fn start_payload(sid: &str) -> Value {
    json!({"session_id": sid, "payload": {"provider": "scripted", "model": "scripted-demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "write it"}], "timestamp": 1}]}})
}

async fn wait_parked(ctx: &Ctx, sid: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = ctx
            .trigger("turn::get_state", json!({"session_id": sid}))
            .await
            .unwrap();
        if v["state"] == "function_awaiting_approval" {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never parked: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `ctx` gets back for each public function about session `sid` (its id replaced by
/// `<sid>` so answers about two ids compare).
async fn answers_about(ctx: &Ctx, sid: &str) -> Vec<(String, String)> {
    let calls = [
        ("turn::get_state", json!({"session_id": sid})),
        ("run::abort", json!({"session_id": sid})),
        ("session-tree::messages", json!({"session_id": sid})),
        ("session-tree::tree", json!({"session_id": sid})),
        ("session-tree::compactions", json!({"session_id": sid})),
        ("session-tree::export_html", json!({"session_id": sid})),
        (
            "session-tree::fork",
            json!({"source_session_id": sid, "from_entry_id": "e1", "new_session_id": "copy"}),
        ),
        ("approval::list_pending", json!({"session_id": sid})),
        (
            "approval::resolve",
            json!({"session_id": sid, "function_call_id": "w1", "decision": "allow"}),
        ),
    ];
    let mut out = Vec::new();
    for (id, data) in calls {
        let answer = match ctx.trigger(id, data).await {
            Ok(v) => format!("ok {v}"),
            Err(e) => format!("error {} {}", e.code(), e),
        };
        out.push((id.to_string(), answer.replace(sid, "<sid>")));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_and_acts_only_on_its_own_sessions() {
    engine_gateway::ensure_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("perms.yaml"), "version: 1\nrules: []\n").unwrap();
    std::fs::write(
        dir.path().join("cassette.json"),
        json!({"turns": [
            {"text": "Writing.", "tool_calls": [{"id": "w1", "name": "agent_trigger", "arguments": {"function": "fs::write", "payload": {"path": "a.txt", "content": "from alice"}}}]},
            {"text": "Done."}
        ]})
        .to_string(),
    )
    .unwrap();
    let hash = engine_gateway::access::hash_token;
    std::fs::write(
        dir.path().join("access.yaml"),
        format!(
            "credentials:\n  - name: alice\n    role: client\n    token_sha256: {}\n  - name: bob\n    role: client\n    token_sha256: {}\n  - name: ops\n    role: client\n    sessions: all\n    token_sha256: {}\n",
            hash("alice-secret"),
            hash("bob-secret"),
            hash("ops-secret"),
        ),
    )
    .unwrap();
    let access = dir.path().join("access.yaml");
    let harness = spawn_harness(dir.path(), &["--access", access.to_str().unwrap()]);
    let alice = connect_client(
        "alice",
        RemoteOptions::new(&harness.url_with("alice-secret")),
    )
    .await;
    let bob = connect_client("bob", RemoteOptions::new(&harness.url_with("bob-secret"))).await;
    let ops = connect_client("ops", RemoteOptions::new(&harness.url_with("ops-secret"))).await;
    let admin = connect_client("admin", RemoteOptions::new(&harness.url())).await;
    let (a, b, o) = (alice.ctx(), bob.ctx(), ops.ctx());

    // Bob subscribes to every session's events, and to the id alice is about to use, before
    // the session exists.
    let mut bob_pushes = bob.pushes().unwrap();
    for group_id in [None, Some("a1".to_string())] {
        bob.send_raw(&Message::StreamSubscribe {
            stream_name: "agent::events".into(),
            group_id,
            batch: false,
        })
        .unwrap();
    }
    let mut alice_pushes = alice.pushes().unwrap();
    alice
        .send_raw(&Message::StreamSubscribe {
            stream_name: "agent::events".into(),
            group_id: None,
            batch: false,
        })
        .unwrap();
    // And to every session's UI pushes (the harness's UI plane).
    let r = b
        .trigger(
            "ui::subscribe",
            json!({"browser_id": bob.worker_id(), "session_id": null}),
        )
        .await
        .unwrap();
    assert_eq!(r["ok"], true, "{r}");
    // Give the subscriptions a round trip before the session starts.
    b.trigger("session-tree::list", json!({})).await.unwrap();
    a.trigger("session-tree::list", json!({})).await.unwrap();

    let r = a
        .trigger("harness::trigger", start_payload("a1"))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let view = wait_parked(&a, "a1").await;
    assert_eq!(
        view["owner"],
        json!({"name": "alice", "role": "client"}),
        "{view}"
    );

    // To bob, alice's session is exactly an id that never existed.
    let about_a1 = answers_about(&b, "a1").await;
    let about_nothing = answers_about(&b, "never-was").await;
    assert_eq!(about_a1, about_nothing);
    assert!(
        about_a1[0].1 == "ok null",
        "turn::get_state answers null: {about_a1:?}"
    );
    let listed = b
        .trigger("session-tree::list", json!({"limit": 50}))
        .await
        .unwrap();
    assert_eq!(listed["total"], 0, "{listed}");
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let pending = b
        .trigger("approval::list_pending", json!({}))
        .await
        .unwrap();
    assert_eq!(pending["pending"], json!([]), "{pending}");
    // Nor can he plant a message in it, or start a run under its id.
    let push = b
        .trigger(
            "session-inbox::push",
            json!({"name": "steering", "session_id": "a1", "item": {"text": "rm -rf"}}),
        )
        .await
        .unwrap_err();
    assert_eq!(push.code(), "not_found", "{push}");
    let r = b
        .trigger("harness::trigger", start_payload("a1"))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 404, "{r}");
    assert_eq!(r["body"]["reason"], "not_found", "{r}");
    // The same holds on the HTTP API.
    let http = reqwest::Client::new();
    let base = format!("http://{}", harness.address.trim_start_matches("ws://"));
    let get = |token: &'static str, path: String| {
        http.get(format!("{base}{path}")).bearer_auth(token).send()
    };
    let mine = get("bob-secret", "/api/sessions/a1".into()).await.unwrap();
    let none = get("bob-secret", "/api/sessions/never-was".into())
        .await
        .unwrap();
    assert_eq!(mine.status(), none.status());
    assert_eq!(
        mine.text().await.unwrap().replace("a1", "<sid>"),
        none.text().await.unwrap().replace("never-was", "<sid>")
    );
    let list: Value = get("bob-secret", "/api/sessions?limit=50".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["total"], 0, "{list}");

    // Alice sees hers; the operator sees and decides it, and the event says who decided
    // (the credential, not the `decided_by` the request carries).
    let listed = a.trigger("session-tree::list", json!({})).await.unwrap();
    assert_eq!(listed["total"], 1, "{listed}");
    let seen = o
        .trigger("approval::list_pending", json!({}))
        .await
        .unwrap();
    assert_eq!(seen["pending"][0]["session_id"], "a1", "{seen}");
    let r = o
        .trigger(
            "approval::resolve",
            json!({"session_id": "a1", "function_call_id": "w1", "decision": "allow", "decided_by": "mallory"}),
        )
        .await
        .unwrap();
    assert_eq!(r["ok"], true, "{r}");
    let done =
        common::process::wait_finished(&a, "a1", Duration::from_secs(20), "a1 finishes").await;
    assert_eq!(done["state"], "stopped", "{done}");
    let events = admin
        .ctx()
        .trigger(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "a1"}),
        )
        .await
        .unwrap();
    let applied = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["data"])
        .find(|e| e["type"] == "approval_applied")
        .cloned()
        .expect("an approval_applied event");
    assert_eq!(applied["decided_by"], "ops", "{applied}");

    // Alice got her session's events pushed; bob got none of them, on either subscription.
    let mut alice_saw = 0;
    while let Ok(Some(m)) =
        tokio::time::timeout(Duration::from_millis(300), alice_pushes.recv()).await
    {
        if matches!(m, Message::StreamEvent { ref group_id, .. } if group_id == "a1") {
            alice_saw += 1;
        }
    }
    assert!(alice_saw >= 5, "alice saw {alice_saw} events");
    while let Ok(Some(m)) =
        tokio::time::timeout(Duration::from_millis(300), bob_pushes.recv()).await
    {
        match &m {
            Message::StreamEvent { group_id, .. } => {
                panic!("bob was pushed an event of {group_id}: {m:?}")
            }
            Message::Push { data } => panic!("bob was pushed a UI event: {data}"),
            _ => {}
        }
    }
    // The admin sees every session.
    let all = admin
        .ctx()
        .trigger("session-tree::list", json!({}))
        .await
        .unwrap();
    assert_eq!(all["total"], 1, "{all}");
    // Bob's own session is his, and alice cannot see it either.
    let r = b
        .trigger("harness::trigger", start_payload("b1"))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    assert!(
        a.trigger("turn::get_state", json!({"session_id": "b1"}))
            .await
            .unwrap()
            .is_null()
    );
}
