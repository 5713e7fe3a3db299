//! The worker protocol over a real WebSocket: routing, ownership, timeouts, stopped calls,
//! auth at `$connect`, transport limits, bad input, engine functions.

use crate::common;

use common::{Raw, start, start_with};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_call_round_trip_and_unknown_function() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut worker = Raw::connect(&srv.url()).await;
    worker.register("t::double").await;
    let mut caller = Raw::connect(&srv.url()).await;
    let url = srv.url();
    let call = tokio::spawn(async move {
        let mut c = Raw::connect(&url).await;
        c.call("t::double", json!({"n": 21})).await
    });
    let inv = worker
        .serve_one(|d| json!({"n": d["n"].as_i64().unwrap() * 2}))
        .await;
    assert_eq!(inv["function_id"], "t::double");
    assert!(
        inv["traceparent"]
            .as_str()
            .is_some_and(|t| t.starts_with("00-")),
        "{inv}"
    );
    let answer = call.await.unwrap();
    assert_eq!(answer["result"], json!({"n": 42}));
    assert!(answer.get("error").is_none());

    let missing = caller.call("t::nope", json!({})).await;
    assert_eq!(missing["error"]["code"], "function_not_found");
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("t::nope")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_registration_wins_and_cleanup_is_owner_safe() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut a = Raw::connect(&srv.url()).await;
    a.register("t::f").await;
    let mut b = Raw::connect(&srv.url()).await;
    // Every change of the catalogue moves its version; anything else leaves it.
    let version = srv.engine.catalogue_version();
    b.register("t::f").await; // b now owns t::f
    assert_ne!(srv.engine.catalogue_version(), version);

    // A call goes to b, the newest registrant.
    let url = srv.url();
    let call = tokio::spawn(async move { Raw::connect(&url).await.call("t::f", json!(1)).await });
    b.serve_one(|_| json!("from b")).await;
    assert_eq!(call.await.unwrap()["result"], "from b");

    // a disconnects: it no longer owns t::f, so b's registration survives.
    drop(a);
    let mut c = Raw::connect(&srv.url()).await;
    common::wait_for("a's disconnect", || async {
        let w = srv.engine.list_workers();
        w["workers"].as_array().unwrap().len() == 2
    })
    .await;
    let url = srv.url();
    let call = tokio::spawn(async move { Raw::connect(&url).await.call("t::f", json!(2)).await });
    b.serve_one(|_| json!("still b")).await;
    assert_eq!(call.await.unwrap()["result"], "still b");

    // a foreign unregister is ignored; the owner's works.
    let version = srv.engine.catalogue_version();
    c.send(json!({"type": "unregisterfunction", "id": "t::f"}))
        .await;
    c.barrier().await;
    assert!(srv.engine.has_function("t::f"));
    assert_eq!(srv.engine.catalogue_version(), version);
    b.send(json!({"type": "unregisterfunction", "id": "t::f"}))
        .await;
    b.barrier().await;
    assert!(!srv.engine.has_function("t::f"));
    assert_ne!(srv.engine.catalogue_version(), version);

    // b disconnects: its remaining registrations go away.
    b.register("t::g").await;
    let version = srv.engine.catalogue_version();
    drop(b);
    common::wait_for("b's clean-up", || async {
        !srv.engine.has_function("t::g")
    })
    .await;
    assert_ne!(srv.engine.catalogue_version(), version);
    let r = c.call("t::g", json!({})).await;
    assert_eq!(r["error"]["code"], "function_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_default_and_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.call_timeout_ms = 300;
    let srv = start_with(opts).await;
    let mut silent = Raw::connect(&srv.url()).await;
    silent.register("t::silent").await;
    let mut caller = Raw::connect(&srv.url()).await;
    let t0 = std::time::Instant::now();
    let r = caller.call("t::silent", json!({})).await;
    assert_eq!(r["error"]["code"], "timeout", "{r}");
    assert!(t0.elapsed() >= Duration::from_millis(250));
    let r = caller
        .call_with("t::silent", json!({}), json!({"timeout_ms": 50}))
        .await;
    assert_eq!(r["error"]["code"], "timeout");
    // A late answer after the timeout is dropped quietly; the connection keeps working.
    let inv = silent.recv_until(|v| v["type"] == "invokefunction").await;
    silent
        .send(json!({"type": "invocationresult", "invocation_id": inv["invocation_id"], "function_id": "t::silent", "result": 1}))
        .await;
    silent.barrier().await;
}

/// Relayed calls share one deadline list: a short deadline set behind a long one still
/// fires on time, and an answered call leaves nothing waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_deadline_behind_a_long_one_fires_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut silent = Raw::connect(&srv.url()).await;
    silent.register("t::silent").await;
    let url = srv.url();
    let long = tokio::spawn(async move {
        Raw::connect(&url)
            .await
            .call_with("t::silent", json!({}), json!({"timeout_ms": 1500}))
            .await
    });
    silent.recv_until(|v| v["type"] == "invokefunction").await;
    let mut caller = Raw::connect(&srv.url()).await;
    let t0 = std::time::Instant::now();
    let r = caller
        .call_with("t::silent", json!({}), json!({"timeout_ms": 100}))
        .await;
    assert_eq!(r["error"]["code"], "timeout", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("100 ms"),
        "{r}"
    );
    let short = t0.elapsed();
    assert!(short < Duration::from_millis(1000), "{short:?}");
    let r = long.await.unwrap();
    assert_eq!(r["error"]["code"], "timeout", "{r}");
    assert!(t0.elapsed() >= Duration::from_millis(1300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_fails_in_flight_calls_with_invocation_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut w = Raw::connect(&srv.url()).await;
    w.register("t::hang").await;
    let url = srv.url();
    let call =
        tokio::spawn(async move { Raw::connect(&url).await.call("t::hang", json!({})).await });
    w.recv_until(|v| v["type"] == "invokefunction").await;
    drop(w);
    let r = call.await.unwrap();
    assert_eq!(r["error"]["code"], "invocation_stopped", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_answer_another_workers_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.call_timeout_ms = 500;
    let srv = start_with(opts).await;
    let mut w = Raw::connect(&srv.url()).await;
    w.register("t::mine").await;
    let mut intruder = Raw::connect(&srv.url()).await;
    let url = srv.url();
    let call =
        tokio::spawn(async move { Raw::connect(&url).await.call("t::mine", json!({})).await });
    let inv = w.recv_until(|v| v["type"] == "invokefunction").await;
    intruder
        .send(json!({"type": "invocationresult", "invocation_id": inv["invocation_id"], "function_id": "t::mine", "result": "forged"}))
        .await;
    let r = call.await.unwrap();
    assert_eq!(
        r["error"]["code"], "timeout",
        "the forged answer must not be accepted: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_requires_the_token_when_set() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.token = Some("s3cret".into());
    let srv = start_with(opts).await;
    let status = |e: tokio_tungstenite::tungstenite::Error| match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => r.status().as_u16(),
        other => panic!("expected an HTTP rejection, got {other}"),
    };
    let missing = tokio_tungstenite::connect_async(srv.address())
        .await
        .unwrap_err();
    assert_eq!(status(missing), 401);
    let wrong = tokio_tungstenite::connect_async(format!("{}/?token=nope", srv.address()))
        .await
        .unwrap_err();
    assert_eq!(status(wrong), 401);
    let mut req = srv.address().into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    assert_eq!(
        status(tokio_tungstenite::connect_async(req).await.unwrap_err()),
        401
    );

    let mut ok = Raw::connect(&format!("{}/?token=s3cret", srv.address())).await;
    ok.barrier().await;
    let mut req = srv.address().into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let hello = ws.next().await.unwrap().unwrap();
    assert!(hello.to_text().unwrap().contains("workerregistered"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_message_closes_with_1009_but_fragments_within_limit_pass() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    // 100 KB in 16 KB fragments: under the 128 KB message limit, every frame under 32 KB.
    let mut w = harness_sdk::run_remote(
        harness_sdk::Worker::new("big").function("t::len", "", |_c, d: Value| async move {
            Ok(json!(d["blob"].as_str().map(str::len)))
        }),
        harness_sdk::RemoteOptions::new(&srv.url()),
    );
    w.wait_connected(Duration::from_secs(5)).await.unwrap();
    let blob = "é".repeat(50_000);
    let n = w
        .ctx()
        .trigger("t::len", json!({"blob": blob}))
        .await
        .unwrap();
    assert_eq!(n, json!(100_000));
    w.stop();

    // One 40 KB frame: over the frame limit.
    let mut raw = Raw::connect(&srv.url()).await;
    raw.ws
        .send(Message::text("x".repeat(40 * 1024)))
        .await
        .unwrap();
    expect_close(&mut raw, 1009).await;

    // 150 KB in fragments: over the message limit.
    let mut raw = Raw::connect(&srv.url()).await;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    for i in 0..10 {
        let op = if i == 0 {
            OpCode::Data(Data::Text)
        } else {
            OpCode::Data(Data::Continue)
        };
        let frame = Frame::message(vec![b'a'; 15 * 1024], op, i == 9);
        if raw.ws.send(Message::Frame(frame)).await.is_err() {
            break;
        }
    }
    expect_close(&mut raw, 1009).await;
}

async fn expect_close(raw: &mut Raw, code: u16) {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), raw.ws.next())
            .await
            .expect("close within 5 s")
        {
            Some(Ok(Message::Close(Some(frame)))) => {
                assert_eq!(u16::from(frame.code), code, "{frame:?}");
                return;
            }
            Some(Ok(Message::Close(None))) | None => panic!("closed without code {code}"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => panic!("connection error instead of close {code}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_lifetime_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.idle_timeout_secs = 1;
    let srv = start_with(opts).await;
    let mut raw = Raw::connect(&srv.url()).await;
    expect_close(&mut raw, 1001).await;

    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.max_lifetime_secs = 1;
    let srv = start_with(opts).await;
    let mut raw = Raw::connect(&srv.url()).await;
    // Busy, but still closed at the lifetime bound.
    let keepalive = async {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        _ = expect_close(&mut raw, 1001) => {}
        _ = keepalive => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_named_error_and_the_connection_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    let cases: Vec<(&str, &str)> = vec![
        ("{not json", "malformed JSON"),
        ("[]", "JSON object"),
        (r#"{"no_type":1}"#, "`type`"),
        (r#"{"type":42}"#, "`type` must be a string"),
        (r#"{"type":"teleport"}"#, "teleport"),
        (r#"{"type":"registerfunction"}"#, "`id`"),
        (
            r#"{"type":"registerfunction","id":""}"#,
            "must not be empty",
        ),
        (
            r#"{"type":"registertrigger","id":"x","function_id":"f"}"#,
            "trigger_type",
        ),
        (
            r#"{"type":"workerregistered","worker_id":"me"}"#,
            "sent by the engine",
        ),
        (
            r#"{"type":"streamevents","stream_name":"s","group_id":"g","events":[]}"#,
            "sent by the engine",
        ),
        (
            r#"{"type":"streamsubscribe","stream_name":"s","batch":"yes"}"#,
            "expected a boolean",
        ),
    ];
    for (frame, expected) in cases {
        raw.send_text(frame).await;
        let err = raw.recv().await;
        assert_eq!(err["type"], "error", "{frame} → {err}");
        assert_eq!(err["error"]["code"], "invalid_message", "{frame} → {err}");
        let msg = err["error"]["message"].as_str().unwrap();
        assert!(msg.contains(expected), "{frame} → {msg}");
    }
    // A broken invokefunction with an id is answered on that id.
    raw.send(json!({"type": "invokefunction", "invocation_id": "i-1", "data": {}}))
        .await;
    let r = raw.recv().await;
    assert_eq!(r["type"], "invocationresult");
    assert_eq!(r["invocation_id"], "i-1");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("function_id"),
        "{r}"
    );
    // Unknown trigger type → trigger_type_not_found in the registration result.
    raw.send(json!({"type": "registertrigger", "id": "t1", "trigger_type": "cron", "function_id": "f", "config": {}})).await;
    let r = raw.recv().await;
    assert_eq!(r["type"], "triggerregistrationresult");
    assert_eq!(r["error"]["code"], "trigger_type_not_found");
    // Missing config field names it.
    raw.send(json!({"type": "registertrigger", "id": "t2", "trigger_type": "stream", "function_id": "f", "config": {}})).await;
    let r = raw.recv().await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_name"),
        "{r}"
    );
    // Binary frames that are not UTF-8.
    raw.ws
        .send(Message::binary(vec![0xff, 0xfe, 0x00]))
        .await
        .unwrap();
    let r = raw.recv().await;
    assert_eq!(r["error"]["code"], "invalid_message");
    // Builtin argument errors name the field.
    let r = raw
        .call("state::set", json!({"scope": "s", "value": 1}))
        .await;
    assert!(
        r["error"]["message"].as_str().unwrap().contains("`key`"),
        "{r}"
    );
    let r = raw
        .call("state::set", json!({"scope": 5, "key": "k", "value": 1}))
        .await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must be a string"),
        "{r}"
    );
    raw.barrier().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_functions_list_what_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut w = Raw::connect(&srv.url()).await;
    w.send(json!({"type": "registerfunction", "id": "t::listed", "description": "d", "request_format": {"type": "object"}})).await;
    w.send(json!({"type": "registertrigger", "id": "trig-1", "trigger_type": "state", "function_id": "t::listed", "config": {"scope": "s"}})).await;
    let r = w
        .recv_until(|v| v["type"] == "triggerregistrationresult")
        .await;
    assert!(r.get("error").is_none(), "{r}");
    w.send(json!({"type": "invokefunction", "invocation_id": "a", "function_id": "engine::workers::register", "data": {"name": "lister"}})).await;
    w.recv_until(|v| v["invocation_id"] == "a").await;

    let fns = w.call("engine::functions::list", json!({})).await;
    let entry = fns["result"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function_id"] == "t::listed")
        .cloned()
        .unwrap();
    assert_eq!(entry["description"], "d");
    assert_eq!(entry["worker_id"], w.worker_id.as_str());
    assert!(
        fns["result"]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function_id"] == "state::set")
    );
    let trig = w.call("engine::triggers::list", json!({})).await;
    assert_eq!(trig["result"]["triggers"][0]["id"], "trig-1");
    let workers = w.call("engine::workers::list", json!({})).await;
    let me = workers["result"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["worker_id"] == w.worker_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(me["name"], "lister");
    assert_eq!(me["functions"], json!(["t::listed"]));
    w.send(json!({"type": "unregistertrigger", "id": "trig-1"}))
        .await;
    let trig = w.call("engine::triggers::list", json!({})).await;
    assert_eq!(trig["result"]["triggers"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn void_and_enqueue_actions() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut w = Raw::connect(&srv.url()).await;
    w.register("t::sink").await;
    let mut c = Raw::connect(&srv.url()).await;
    // void with an id: no answer, but the call happens.
    c.send(json!({"type": "invokefunction", "invocation_id": "v1", "function_id": "t::sink", "data": {"k": "void"}, "action": {"type": "void"}})).await;
    let inv = w.serve_one(|_| json!(null)).await;
    assert_eq!(inv["data"]["k"], "void");
    // enqueue: answered at once with a receipt, delivered later.
    let r = c
        .call_with(
            "t::sink",
            json!({"k": "queued"}),
            json!({"action": {"type": "enqueue", "queue": "jobs"}}),
        )
        .await;
    assert!(r["result"]["message_receipt_id"].as_str().is_some(), "{r}");
    let inv = w.serve_one(|_| json!(null)).await;
    assert_eq!(inv["data"]["k"], "queued");
    c.barrier().await;
    // Nothing answered v1.
    c.send(json!({"type": "ping"})).await;
    let next = c.recv().await;
    assert_eq!(next["type"], "pong", "no answer to a void call: {next}");
}

/// `engine::functions::list` over the WebSocket: a page of one names the catalogue's version
/// and the next id; bad page fields answer a clear error before anything is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_pages_name_the_catalogue_and_refuse_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut c = Raw::connect(&srv.url()).await;
    let page = c
        .call(
            "engine::functions::list",
            json!({"formats": false, "limit": 1}),
        )
        .await;
    let page = &page["result"];
    assert_eq!(page["functions"].as_array().unwrap().len(), 1, "{page}");
    assert!(page["next"].is_string(), "{page}");
    assert_eq!(page["catalogue_version"], srv.engine.catalogue_version());
    let deep = (0..100).fold(json!(1), |v, _| json!([v]));
    for bad in [
        json!({"limit": 0}),
        json!({"limit": 5000}),
        json!({"limit": "one"}),
        json!({"formats": "yes"}),
        json!({"after": 3}),
        json!({"prefix": deep}),
    ] {
        let r = c.call("engine::functions::list", bad.clone()).await;
        assert!(r.get("result").is_none_or(Value::is_null), "{bad}: {r}");
        assert!(r["error"]["code"].is_string(), "{bad}: {r}");
    }
}

/// Naming a connection that registers nothing (an event stream, a door following a turn)
/// leaves the catalogue's version alone, so runs keep their cached tool list and skills; a
/// worker with functions being renamed changes it (its skills' ids name it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naming_a_connection_without_functions_leaves_the_catalogue_alone() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let (outbox, _rx) = engine_gateway::engine::Outbox::bounded(1 << 20);
    let follower = srv.engine.connect_remote(
        outbox,
        Some("http:events".into()),
        engine_gateway::access::Principal::admin(),
    );
    let version = srv.engine.catalogue_version();
    assert!(
        srv.engine
            .set_worker_info(&follower, Some("events of s1".into()), json!(null))
    );
    assert_eq!(
        srv.engine.catalogue_version(),
        version,
        "a follower's name is not in the catalogue"
    );
    let mut w = Raw::connect(&srv.url()).await;
    w.register("named::f").await;
    let id = srv.engine.list_functions()["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function_id"] == "named::f")
        .and_then(|f| f["worker_id"].as_str().map(str::to_owned))
        .expect("the owner of named::f");
    let version = srv.engine.catalogue_version();
    assert!(
        srv.engine
            .set_worker_info(&id, Some("renamed".into()), json!(null))
    );
    assert_ne!(
        srv.engine.catalogue_version(),
        version,
        "a worker with functions renamed"
    );
}
