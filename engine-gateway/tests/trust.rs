//! The bus as a trust boundary, over real WebSockets on the selected backend: browser origins,
//! the engine's own namespaces, hostile nesting, unfinished handshakes and the connection cap.

use crate::common;

use common::{Raw, start, start_with};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn rejection(e: tokio_tungstenite::tungstenite::Error) -> u16 {
    match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => r.status().as_u16(),
        other => panic!("expected an HTTP rejection, got {other}"),
    }
}

async fn connect_from(url: &str, origin: &str) -> Result<(), u16> {
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert("origin", origin.parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok(_) => Ok(()),
        Err(e) => Err(rejection(e)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_connect_only_from_the_engines_own_or_allowed_origins() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.allowed_origins = vec!["https://console.example.com".into()];
    let srv = start_with(opts).await;
    let port = srv.local_addr.port();
    // No Origin header: a CLI or worker, not a browser.
    Raw::connect(&srv.url()).await.barrier().await;
    // A page from anywhere else, including a DNS-rebound name that resolves to us.
    for evil in [
        "http://evil.example".to_string(),
        format!("http://evil.example:{port}"),
        "null".to_string(),
        format!("http://127.0.0.1:{}", port.wrapping_add(1)),
    ] {
        assert_eq!(
            connect_from(&srv.url(), &evil).await,
            Err(403),
            "origin {evil}"
        );
    }
    // The engine's own address and the configured origin.
    for good in [
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
        "https://console.example.com".to_string(),
    ] {
        assert_eq!(
            connect_from(&srv.url(), &good).await,
            Ok(()),
            "origin {good}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_can_register_or_replace_the_engines_functions() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    for id in [
        "engine::functions::list",
        "engine::anything::new",
        "iii::durable::publish",
        "state::set",
        "state::mine",
        "stream::set",
    ] {
        raw.send(json!({"type": "registerfunction", "id": id}))
            .await;
        let err = raw.recv_until(|v| v["type"] == "error").await;
        assert_eq!(err["error"]["code"], "forbidden", "{id}: {err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(id),
            "the error names {id}: {err}"
        );
    }
    raw.barrier().await;
    // The built-ins still answer as the engine's.
    let r = raw
        .call("state::set", json!({"scope": "s", "key": "k", "value": 1}))
        .await;
    assert_eq!(r["result"]["new_value"], 1, "{r}");
    let r = raw.call("engine::functions::list", json!({})).await;
    assert!(r["result"]["functions"].is_array(), "{r}");
    // An ordinary namespace is still the connection's to take.
    raw.register("mine::f").await;
}

fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(1), |v, _| json!([v]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_paths_and_values_are_refused_by_name_and_nothing_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    // The frame that once overflowed the stack and aborted the process: ~30 KB, 15 000 segments.
    let long_path = vec!["a"; 15_000].join(".");
    let r = raw
        .call(
            "state::update",
            json!({"scope": "s", "key": "deep", "ops": [{"type": "set", "path": long_path, "value": 1}]}),
        )
        .await;
    assert_eq!(r["error"]["code"], "invalid_message", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("15000 segments") && msg.contains("64"),
        "{msg}"
    );
    // The same as a JSON pointer.
    let pointer = format!("/{}", vec!["a"; 65].join("/"));
    let r = raw
        .call(
            "state::update",
            json!({"scope": "s", "key": "deep", "ops": [{"type": "set", "path": pointer, "value": 1}]}),
        )
        .await;
    assert_eq!(r["error"]["code"], "invalid_message", "{r}");

    // Values: 64 levels are stored and read back; 65 are refused, on every write path.
    let r = raw
        .call(
            "state::set",
            json!({"scope": "s", "key": "ok", "value": nested(64)}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    let r = raw
        .call("state::get", json!({"scope": "s", "key": "ok"}))
        .await;
    assert_eq!(r["result"], nested(64));
    for (function_id, data) in [
        (
            "state::set",
            json!({"scope": "s", "key": "deep", "value": nested(65)}),
        ),
        (
            "stream::set",
            json!({"stream_name": "x", "group_id": "g", "item_id": "i", "data": nested(65)}),
        ),
        // 40 levels of path plus 30 of value: each within its limit, together too deep.
        (
            "state::update",
            json!({"scope": "s", "key": "deep", "ops": [{"type": "set", "path": vec!["b"; 40].join("."), "value": nested(30)}]}),
        ),
    ] {
        let r = raw.call(function_id, data).await;
        assert_eq!(r["error"]["code"], "invalid_message", "{function_id}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("64 levels"),
            "{function_id}: {r}"
        );
    }
    let r = raw
        .call("state::get", json!({"scope": "s", "key": "deep"}))
        .await;
    assert!(r["result"].is_null(), "nothing was written: {r}");
    // The connection and the engine are fine.
    raw.barrier().await;
    Raw::connect(&srv.url()).await.barrier().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_handshakes_are_closed_and_connections_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.handshake_timeout_secs = 1;
    opts.max_connections = 3;
    let srv = start_with(opts).await;
    // A socket that never sends its upgrade request is closed after the handshake timeout.
    let mut silent = tokio::net::TcpStream::connect(srv.local_addr)
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("the engine closes a silent socket within its handshake timeout")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    drop(silent);

    // Three connections fit; the fourth is turned away; closing one frees its slot.
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut r = Raw::connect(&srv.url()).await;
        r.barrier().await;
        open.push(r);
    }
    assert!(
        tokio_tungstenite::connect_async(srv.url()).await.is_err(),
        "a fourth connection is refused"
    );
    let first = open.remove(0);
    drop(first);
    common::wait_for("a slot to free up", || {
        let url = srv.url();
        async move { tokio_tungstenite::connect_async(url).await.is_ok() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_one_is_generated_kept_private_reused_and_required() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut opts = common::options(&data);
    opts.token = None;
    let srv = start_with(opts.clone()).await;
    let file = data.join("engine.token");
    assert_eq!(srv.token_file.as_deref(), Some(file.as_path()));
    let token = std::fs::read_to_string(&file).unwrap();
    assert_eq!(token.len(), 64, "256 bits in hex");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&data), 0o700);
    assert!(
        !srv.token_source().contains(&token),
        "{}",
        srv.token_source()
    );
    // Required: nothing connects without it.
    assert_eq!(
        rejection(
            tokio_tungstenite::connect_async(srv.address())
                .await
                .unwrap_err()
        ),
        401
    );
    Raw::connect(&srv.url()).await.barrier().await;
    srv.shutdown().await;
    // Reused on restart.
    let again = start_with(opts).await;
    assert_eq!(again.token, token);

    // A listener others can reach needs a token given on purpose.
    let mut open = common::options(&dir.path().join("other"));
    open.token = None;
    open.listen = "0.0.0.0:0".into();
    let err = engine_gateway::server::start(&open)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("without a token"), "{err}");
    open.token = Some("given".into());
    engine_gateway::server::start(&open)
        .await
        .expect("starts with a token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_cut_off_and_its_backlog_dropped() {
    use futures_util::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.max_queued_bytes = 256 * 1024;
    let srv = start_with(opts).await;
    let mut slow = Raw::connect(&srv.url()).await;
    slow.send(json!({"type": "streamsubscribe", "stream_name": "firehose", "group_id": "g"}))
        .await;
    slow.barrier().await;
    let slow_id = slow.worker_id.clone();
    // 16 KB events, far more than the socket buffers and the queue limit hold together.
    let mut pusher = Raw::connect(&srv.url()).await;
    let blob = "x".repeat(16 * 1024);
    let workers = |v: &Value| -> Vec<String> {
        v["result"]["workers"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|w| w["worker_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        workers(&pusher.call("engine::workers::list", json!({})).await).contains(&slow_id),
        "listed while it keeps up"
    );
    let mut cut_off = false;
    for i in 0..2_000 {
        let r = pusher
            .call(
                "stream::send",
                json!({"stream_name": "firehose", "group_id": "g", "data": {"i": i, "blob": blob}}),
            )
            .await;
        assert!(r["error"].is_null(), "{r}");
        if i % 50 == 49 {
            let list = pusher.call("engine::workers::list", json!({})).await;
            if !workers(&list).contains(&slow_id) {
                cut_off = true;
                break;
            }
        }
    }
    assert!(cut_off, "the engine dropped the subscriber that never read");
    // Reading now, the subscriber gets what the socket held, then the end of the connection.
    let drained = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut n = 0usize;
        while let Some(Ok(m)) = slow.ws.next().await {
            if m.is_close() {
                break;
            }
            n += 1;
        }
        n
    })
    .await
    .expect("the connection ends");
    assert!(
        drained < 2_000,
        "the backlog was dropped ({drained} frames arrived)"
    );
    // Everyone else is served as before.
    pusher.barrier().await;
}

/// An access file for `tokens`: (name, role, token, namespaces).
fn access_file(dir: &std::path::Path, creds: &[(&str, &str, &str, &[&str])]) -> std::path::PathBuf {
    let mut yaml = String::from("credentials:\n");
    for (name, role, token, namespaces) in creds {
        yaml += &format!(
            "  - name: {name}\n    role: {role}\n    token_sha256: {}\n    namespaces: [{}]\n",
            engine_gateway::access::hash_token(token),
            namespaces.join(", ")
        );
    }
    let path = dir.join("access.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn url_with(srv: &engine_gateway::server::RunningServer, token: &str) -> String {
    format!("ws://{}/?token={token}", srv.local_addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_carry_roles_workers_keep_to_their_namespaces_clients_to_public_functions() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(&dir.path().join("data"));
    opts.access_file = Some(access_file(
        dir.path(),
        &[
            ("tools", "worker", "w-tools", &["mine"]),
            ("policy-v2", "worker", "w-policy", &["policy"]),
            ("console", "client", "c-console", &[]),
        ],
    ));
    let srv = start_with(opts).await;
    // The admin token runs the real layers: a policy, a public function and an agent tool
    // that even claims to be public.
    let mut admin = Raw::connect(&srv.url()).await;
    admin.register("policy::check_permissions").await;
    for (id, public) in [
        ("pub::hello", true),
        ("shell::exec", true),
        ("priv::x", false),
    ] {
        admin
            .send(json!({"type": "registerfunction", "id": id, "metadata": {"public": public}}))
            .await;
    }
    admin.barrier().await;
    let policy_owner = |v: &Value| -> Option<String> {
        v["result"]["functions"]
            .as_array()?
            .iter()
            .find(|f| f["function_id"] == "policy::check_permissions")
            .and_then(|f| f["worker_id"].as_str().map(str::to_owned))
    };

    // A token nobody issued.
    assert_eq!(
        rejection(
            tokio_tungstenite::connect_async(url_with(&srv, "guess"))
                .await
                .unwrap_err()
        ),
        401
    );

    // A worker outside its namespace: refused, by name; the live policy stays in place.
    let mut tools = Raw::connect(&url_with(&srv, "w-tools")).await;
    tools
        .send(json!({"type": "registerfunction", "id": "policy::check_permissions"}))
        .await;
    let err = tools.recv_until(|v| v["type"] == "error").await;
    assert_eq!(err["error"]["code"], "forbidden", "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("worker `tools`") && msg.contains("namespace `policy`"),
        "{msg}"
    );
    let list = admin.call("engine::functions::list", json!({})).await;
    assert_eq!(
        policy_owner(&list).as_deref(),
        Some(admin.worker_id.as_str())
    );
    // Inside it: fine, and its triggers likewise.
    tools.register("mine::f").await;
    tools
        .send(json!({"type": "registertrigger", "id": "t-mine", "trigger_type": "state", "function_id": "mine::f", "config": {"scope": "s"}}))
        .await;
    let r = tools
        .recv_until(|v| v["type"] == "triggerregistrationresult")
        .await;
    assert!(r["error"].is_null(), "{r}");
    tools
        .send(json!({"type": "registertrigger", "id": "t-policy", "trigger_type": "state", "function_id": "policy::check_permissions", "config": {"scope": "s"}}))
        .await;
    let r = tools
        .recv_until(|v| v["type"] == "triggerregistrationresult")
        .await;
    assert_eq!(r["error"]["code"], "forbidden", "{r}");

    // The worker granted `policy` may swap the layer: that stays a feature.
    let mut policy_v2 = Raw::connect(&url_with(&srv, "w-policy")).await;
    policy_v2.register("policy::check_permissions").await;
    let list = admin.call("engine::functions::list", json!({})).await;
    assert_eq!(
        policy_owner(&list).as_deref(),
        Some(policy_v2.worker_id.as_str())
    );
    // But it may not take over another worker's trigger id.
    policy_v2
        .send(json!({"type": "registertrigger", "id": "t-mine", "trigger_type": "state", "function_id": "policy::check_permissions", "config": {"scope": "s"}}))
        .await;
    let r = policy_v2
        .recv_until(|v| v["type"] == "triggerregistrationresult")
        .await;
    assert_eq!(r["error"]["code"], "forbidden", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("t-mine"),
        "{r}"
    );

    // A client: public functions only, never an agent tool, no registrations, agent::events only.
    let mut console = Raw::connect(&url_with(&srv, "c-console")).await;
    let call = tokio::spawn(async move {
        let r = console.call("pub::hello", json!({"hi": 1})).await;
        (console, r)
    });
    let inv = admin.serve_one(|d| json!({"echo": d})).await;
    assert_eq!(inv["function_id"], "pub::hello");
    let (mut console, r) = call.await.unwrap();
    assert_eq!(r["result"]["echo"]["hi"], 1, "{r}");
    for id in [
        "shell::exec",
        "priv::x",
        "state::get",
        "engine::functions::list",
        "auth::get_token",
    ] {
        let r = console.call(id, json!({"scope": "s", "key": "k"})).await;
        assert_eq!(r["error"]["code"], "forbidden", "{id}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(id) && msg.contains("client `console`"),
            "{id}: {msg}"
        );
    }
    // Through a queue just the same.
    let r = console
        .call_with(
            "priv::x",
            json!({}),
            json!({"action": {"type": "enqueue", "queue": "q"}}),
        )
        .await;
    assert_eq!(r["error"]["code"], "forbidden", "{r}");
    console
        .send(json!({"type": "registerfunction", "id": "pub::hello"}))
        .await;
    let err = console.recv_until(|v| v["type"] == "error").await;
    assert_eq!(err["error"]["code"], "forbidden", "{err}");
    console
        .send(json!({"type": "streamsubscribe", "stream_name": "secrets"}))
        .await;
    let err = console.recv_until(|v| v["type"] == "error").await;
    assert_eq!(err["error"]["code"], "forbidden", "{err}");
    console
        .send(json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "s1"}))
        .await;
    console.barrier().await;
    // The subscription works: an event of the client's own session reaches it (a session's
    // events go only to its owner among clients; `owners/<sid>` says who that is).
    let r = admin
        .call(
            "state::set",
            json!({"scope": "owners", "key": "s1", "value": {"name": "console", "role": "client"}}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    let r = admin
        .call(
            "stream::send",
            json!({"stream_name": "agent::events", "group_id": "s1", "data": {"n": 1}}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    let ev = console.recv_until(|v| v["type"] == "streamevent").await;
    assert_eq!(ev["event"]["data"]["n"], 1, "{ev}");
    // Nothing the client tried took effect: the public function is still the admin's.
    let list = admin.call("engine::functions::list", json!({})).await;
    let owner = list["result"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function_id"] == "pub::hello")
        .unwrap()["worker_id"]
        .clone();
    assert_eq!(owner, admin.worker_id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_access_file_stops_the_engine_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(&dir.path().join("data"));
    let path = dir.path().join("access.yaml");
    std::fs::write(
        &path,
        "credentials:\n  - name: w\n    role: worker\n    token_sha256: 'plain-token'\n    namespaces: [x]\n",
    )
    .unwrap();
    opts.access_file = Some(path);
    let err = engine_gateway::server::start(&opts)
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("credential `w`") && err.to_string().contains("64 hex digits"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_list_is_paged_for_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    // Pipelined writes in windows of 50 (the emulator takes only so many at once).
    for window in (0..1_005).collect::<Vec<u32>>().chunks(50) {
        for i in window {
            raw.send(json!({"type": "invokefunction", "invocation_id": format!("w{i}"), "function_id": "state::set", "data": {"scope": "big", "key": format!("{i:05}"), "value": i}}))
                .await;
        }
        for _ in window {
            let r = raw.recv_until(|v| v["type"] == "invocationresult").await;
            assert!(r["error"].is_null(), "{r}");
        }
    }
    // No limit: one page of at most 1 000, and a cursor to the rest.
    let r = raw.call("state::list", json!({"scope": "big"})).await;
    let items = r["result"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1_000, "{}", r["result"]["next_cursor"]);
    let cursor = r["result"]["next_cursor"].as_str().unwrap().to_string();
    assert_eq!(cursor, "00999");
    let r = raw
        .call(
            "state::list",
            json!({"scope": "big", "cursor": cursor, "limit": 4}),
        )
        .await;
    let keys: Vec<&str> = r["result"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["01000", "01001", "01002", "01003"]);
    let r = raw
        .call("state::list", json!({"scope": "big", "cursor": "01003"}))
        .await;
    assert_eq!(r["result"]["items"].as_array().unwrap().len(), 1);
    assert!(r["result"]["next_cursor"].is_null(), "{r}");
    let r = raw
        .call("state::list", json!({"scope": "big", "limit": 0}))
        .await;
    assert_eq!(r["error"]["code"], "invalid_message", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("limit"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_events_approvals_and_replay_keys_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.slack_replay_retention_secs = 0;
    opts.retention_interval_secs = 1;
    let srv = start_with(opts).await;
    let mut raw = Raw::connect(&srv.url()).await;
    for (scope, key) in [("slack-replay", "sig1"), ("approvals", "s1/c1")] {
        let r = raw
            .call(
                "state::set",
                json!({"scope": scope, "key": key, "value": {"t": 1}}),
            )
            .await;
        assert!(r["error"].is_null(), "{r}");
    }
    let r = raw
        .call("stream::set", json!({"stream_name": "agent::events", "group_id": "s1", "item_id": "e1", "data": {"type": "x"}}))
        .await;
    assert!(r["error"].is_null(), "{r}");
    // The replay key (kept 0 s here) goes at the next sweep; a 7-day approval and event stay.
    common::wait_for("the sweep", || {
        let url = srv.url();
        async move {
            let mut raw = Raw::connect(&url).await;
            let r = raw
                .call(
                    "state::get",
                    json!({"scope": "slack-replay", "key": "sig1"}),
                )
                .await;
            r["result"].is_null() && r["error"].is_null()
        }
    })
    .await;
    let r = raw
        .call("state::get", json!({"scope": "approvals", "key": "s1/c1"}))
        .await;
    assert_eq!(r["result"]["t"], 1, "{r}");
    let r = raw
        .call(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "s1"}),
        )
        .await;
    assert_eq!(r["result"]["items"].as_array().unwrap().len(), 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_queue_consumers_and_left_subscriptions_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.idle_consumer_secs = 1;
    let srv = start_with(opts).await;
    let baseline = srv.engine.consumer_count();
    // Subscriptions to many groups are gone with their connection, not left empty.
    let before = srv.engine.subscription_count();
    let mut sub = Raw::connect(&srv.url()).await;
    for g in 0..50 {
        sub.send(json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": format!("g{g}")}))
            .await;
    }
    sub.send(
        json!({"type": "streamunsubscribe", "stream_name": "agent::events", "group_id": "g0"}),
    )
    .await;
    sub.barrier().await;
    assert_eq!(srv.engine.subscription_count(), before + 49);
    drop(sub);
    common::wait_for("subscriptions to go", || {
        let engine = srv.engine.clone();
        async move { engine.subscription_count() == before }
    })
    .await;
    let mut sink = Raw::connect(&srv.url()).await;
    sink.register("sink::take").await;
    let mut raw = Raw::connect(&srv.url()).await;
    // Messages to 20 queues nobody declared: a consumer each, while there is work.
    for i in 0..20 {
        let r = raw
            .call_with(
                "sink::take",
                json!({"i": i}),
                json!({"action": {"type": "enqueue", "queue": format!("burst-{i}")}}),
            )
            .await;
        assert!(r["error"].is_null(), "{r}");
    }
    // Each consumer is busy with its message until the sink answers.
    assert!(srv.engine.consumer_count() >= baseline + 20);
    for _ in 0..20 {
        sink.serve_one(|_| json!({})).await;
    }
    // Idle for a second (plus a receive wait): they stop. (SQS counts messages only
    // approximately, so on SQS a consumer cannot know its queue is empty and keeps running.)
    if common::aws_backend() {
        return;
    }
    let engine = srv.engine.clone();
    common::wait_for("idle consumers to stop", || {
        let engine = engine.clone();
        async move { engine.consumer_count() <= baseline }
    })
    .await;
    // A queue whose consumer stopped works again at the next message.
    let r = raw
        .call_with(
            "sink::take",
            json!({"again": true}),
            json!({"action": {"type": "enqueue", "queue": "burst-3"}}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    let inv = sink.serve_one(|_| json!({})).await;
    assert_eq!(inv["data"]["again"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_its_queue_limit_is_closed_with_1008_when_the_socket_takes_it() {
    use futures_util::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.max_queued_bytes = 1024;
    let srv = start_with(opts).await;
    let mut sub = Raw::connect(&srv.url()).await;
    sub.send(json!({"type": "streamsubscribe", "stream_name": "big", "group_id": "g"}))
        .await;
    sub.barrier().await;
    let mut pusher = Raw::connect(&srv.url()).await;
    let r = pusher
        .call(
            "stream::send",
            json!({"stream_name": "big", "group_id": "g", "data": "x".repeat(4096)}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    let close = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(Ok(m)) = sub.ws.next().await {
            if let tokio_tungstenite::tungstenite::Message::Close(frame) = m {
                return frame;
            }
        }
        None
    })
    .await
    .expect("closed");
    let frame = close.expect("a close frame");
    assert_eq!(u16::from(frame.code), 1008, "{frame:?}");
    assert!(frame.reason.contains("too far behind"), "{frame:?}");
}

#[test]
fn hash_token_reads_stdin_and_refuses_an_empty_token() {
    use std::io::Write;
    let run = |input: &[u8]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_engine-gateway"))
            .arg("hash-token")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run(b"s3cret\n");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        engine_gateway::access::hash_token("s3cret")
    );
    for empty in [&b""[..], b"\n", b"\r\n"] {
        let out = run(empty);
        assert!(!out.status.success(), "{empty:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no token"),
            "{out:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_list_paging_fields_of_the_wrong_type_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    for (data, field) in [
        (json!({"scope": "s", "limit": "ten"}), "limit"),
        (json!({"scope": "s", "limit": -1}), "limit"),
        (json!({"scope": "s", "cursor": 5}), "cursor"),
        (json!({"scope": "s", "cursor": {"deep": [[[1]]]}}), "cursor"),
    ] {
        let r = raw.call("state::list", data.clone()).await;
        assert_eq!(r["error"]["code"], "invalid_message", "{data}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(field),
            "{data}: {r}"
        );
    }
    // A cursor past every key is simply an empty last page.
    let r = raw
        .call(
            "state::list",
            json!({"scope": "s", "cursor": "\u{10ffff}".repeat(1000), "limit": 1_000_000}),
        )
        .await;
    assert_eq!(r["result"]["items"], json!([]), "{r}");
    assert!(r["result"]["next_cursor"].is_null());
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// TCP sockets of this machine with `port` at either end that still hold a descriptor: any
/// state but LISTEN and TIME_WAIT (a CLOSE-WAIT socket is one the engine never closed).
fn sockets_on_port(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let port_of = |a: &str| {
                a.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            cols.len() > 3
                && (port_of(cols[1]) == Some(port) || port_of(cols[2]) == Some(port))
                && !matches!(cols[3], "0A" | "06")
        })
        .count()
}

/// Once, the writer task of every WebSocket held a sender of its own queue, so it never
/// ended: each closed connection left its socket in CLOSE-WAIT and its close handshake
/// waited 10 s. Any credential could exhaust the engine's descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_connections_release_their_sockets_and_close_at_once() {
    use futures_util::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    Raw::connect(&srv.url()).await.barrier().await;
    let before = open_descriptors();
    let mut close_times = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let (mut ws, _) = tokio_tungstenite::connect_async(srv.url()).await.unwrap();
        let hello = ws.next().await.unwrap().unwrap();
        assert!(hello.to_text().unwrap().contains("workerregistered"));
        let t = std::time::Instant::now();
        ws.close(None).await.unwrap();
        // The engine's close frame, then the end of the stream.
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
        assert!(drained.is_ok(), "the engine answers a close");
        close_times.push(t.elapsed());
    }
    close_times.sort();
    let p95 = close_times[close_times.len() * 95 / 100];
    assert!(
        p95 < Duration::from_millis(100),
        "close handshakes take {p95:?} at p95 (max {:?})",
        close_times.last().unwrap()
    );
    // Every socket the engine held for them is gone, and so are their descriptors (on the
    // embedded backend: on the AWS one the SDK's pool of connections to the emulator grows
    // with the registry writes of 2 000 connections, which is no leak of ours).
    let port = srv.local_addr.port();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sockets = sockets_on_port(port);
        let now = open_descriptors();
        if sockets <= 5 && (common::aws_backend() || now <= before + 5) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sockets} sockets on the engine's port and {now} descriptors open after 2 000 closed connections ({before} before)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Raw::connect(&srv.url()).await.barrier().await;
}

/// Once, 24 peers that sent a request head and then a byte every half second filled a
/// 24-connection engine and locked out the admin. Bodies now have a deadline, and peers
/// without a credential live in a smaller pool that makes room by closing its oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_unauthenticated_bodies_neither_hold_slots_nor_lock_out_the_admin() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.max_connections = 24;
    opts.handshake_timeout_secs = 2;
    let srv = start_with(opts).await;
    let mut slow = Vec::new();
    for _ in 0..24 {
        let mut s = tokio::net::TcpStream::connect(srv.local_addr)
            .await
            .unwrap();
        s.write_all(
            b"POST /api/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
        )
        .await
        .unwrap();
        slow.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let (mut rd, mut wr) = s.into_split();
            let trickle = tokio::spawn(async move {
                for _ in 0..40 {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if wr.write_all(b" ").await.is_err() {
                        break;
                    }
                }
            });
            let mut answer = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(15), rd.read_to_end(&mut answer)).await;
            trickle.abort();
            (
                started.elapsed(),
                String::from_utf8_lossy(&answer).to_string(),
            )
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The admin gets in while they trickle.
    let mut admin = tokio::time::timeout(Duration::from_secs(3), Raw::connect(&srv.url()))
        .await
        .expect("the admin connects while 24 slow bodies trickle");
    admin.barrier().await;
    // Each slow peer is closed: made room for, or answered 408 at the body deadline.
    let mut timed_out = 0;
    for s in slow {
        let (took, answer) = s.await.unwrap();
        assert!(
            took < Duration::from_secs(6),
            "a slow body held its connection for {took:?}"
        );
        if !answer.is_empty() {
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
            assert!(answer.contains("did not arrive within"), "{answer}");
            timed_out += 1;
        }
    }
    assert!(timed_out >= 1, "the ones kept got a 408 at the deadline");
    admin.barrier().await;
}
