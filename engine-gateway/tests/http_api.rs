//! The HTTP API and the console's assets on the engine's port, over real HTTP: sign-in,
//! Server-Sent Events that resume with `Last-Event-ID` and miss nothing, the roles of the bus,
//! and hostile requests (no token, bad ids, oversized and malformed bodies, foreign origins,
//! a request head that never ends).

use crate::common;

use common::Raw;
use engine_gateway::access::hash_token;
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn http() -> reqwest::Client {
    engine_gateway::ensure_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn base(srv: &engine_gateway::server::RunningServer) -> String {
    format!("http://{}", srv.local_addr)
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    id: Option<String>,
    event: String,
    data: Value,
}

/// A Server-Sent Events reader over a streaming response.
struct Sse {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

impl Sse {
    async fn open(url: &str, token: &str, last_event_id: Option<&str>) -> Sse {
        let mut req = http().get(url).bearer_auth(token);
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp = req.send().await.expect("the stream opens");
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        Sse {
            body: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event (comments and `retry:` lines skipped), within 10 s.
    async fn next(&mut self) -> Event {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::new(), None);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(v).expect("data is JSON"));
                    }
                }
                if let Some(data) = data {
                    return Event { id, event, data };
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next())
                .await
                .expect("an event within 10 s")
                .expect("the stream stays open")
                .expect("a chunk");
            self.buf
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }
}

fn item(sid: &str, n: u64) -> String {
    format!("{sid}-{n:012}")
}

async fn store_event(raw: &mut Raw, sid: &str, n: u64) {
    let r = raw
        .call(
            "stream::set",
            json!({"stream_name": "agent::events", "group_id": sid, "item_id": item(sid, n), "data": {"type": "turn_state_changed", "n": n}}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
}

#[tokio::test]
async fn events_resume_with_last_event_id_and_miss_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let srv = common::start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    let sid = "sse-1";
    for n in 1..=5 {
        store_event(&mut raw, sid, n).await;
    }
    // Another session's events never show.
    store_event(&mut raw, "other", 1).await;
    let url = format!("{}/api/sessions/{sid}/events", base(&srv));
    let mut seen: Vec<String> = Vec::new();
    let mut sse = Sse::open(&url, &srv.token, None).await;
    for n in 1..=5 {
        let e = sse.next().await;
        assert_eq!(e.id.as_deref(), Some(item(sid, n).as_str()), "{e:?}");
        assert_eq!(e.event, "turn_state_changed");
        assert_eq!(e.data["data"]["n"], n);
        seen.push(e.id.unwrap());
    }
    // Live: stored events get ids, pushed ones (token deltas) none.
    store_event(&mut raw, sid, 6).await;
    let r = raw
        .call(
            "stream::send",
            json!({"stream_name": "agent::events", "group_id": sid, "type": "message_update", "data": {"delta": "tok"}, "latest": true}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    // `latest` is a flag (a Lambda's push queue may merge such an event); anything else is
    // refused by name, and nothing is pushed.
    let r = raw
        .call(
            "stream::send",
            json!({"stream_name": "agent::events", "group_id": sid, "type": "message_update", "data": {"delta": "bad"}, "latest": 1}),
        )
        .await;
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`latest` must be a boolean")),
        "{r}"
    );
    store_event(&mut raw, sid, 7).await;
    let e = sse.next().await;
    assert_eq!(e.id.as_deref(), Some(item(sid, 6).as_str()));
    let push = sse.next().await;
    assert_eq!(
        (push.id.as_deref(), push.event.as_str()),
        (None, "message_update")
    );
    assert_eq!(push.data["data"]["delta"], "tok");
    let e = sse.next().await;
    assert_eq!(e.id.as_deref(), Some(item(sid, 7).as_str()));
    seen.extend([item(sid, 6), item(sid, 7)]);
    // The client goes away; events keep coming; rewriting an event it has seen is no news.
    drop(sse);
    for n in 8..=12 {
        store_event(&mut raw, sid, n).await;
    }
    store_event(&mut raw, sid, 3).await;
    let mut sse = Sse::open(&url, &srv.token, Some(&item(sid, 7))).await;
    for n in 8..=12 {
        let e = sse.next().await;
        assert_eq!(e.id.as_deref(), Some(item(sid, n).as_str()), "{e:?}");
        seen.push(e.id.unwrap());
    }
    // Live after the backlog: each once, in order, none from before the resume point.
    store_event(&mut raw, sid, 13).await;
    store_event(&mut raw, sid, 2).await;
    store_event(&mut raw, sid, 14).await;
    for n in 13..=14 {
        let e = sse.next().await;
        assert_eq!(e.id.as_deref(), Some(item(sid, n).as_str()), "{e:?}");
        seen.push(e.id.unwrap());
    }
    let expected: Vec<String> = (1..=14).map(|n| item(sid, n)).collect();
    assert_eq!(seen, expected, "every event once, in order");
    // `?last_event_id=` does the same for clients that cannot set the header.
    let mut sse = Sse::open(
        &format!("{url}?last_event_id={}", item(sid, 13)),
        &srv.token,
        None,
    )
    .await;
    assert_eq!(sse.next().await.id.as_deref(), Some(item(sid, 14).as_str()));
    srv.shutdown().await;
}

#[tokio::test]
async fn sign_in_issues_session_tokens_of_the_presented_role_and_codes_work_once() {
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.yaml");
    std::fs::write(
        &access,
        format!(
            "credentials:\n  - name: viewer\n    role: client\n    token_sha256: {}\n",
            hash_token("viewer-token")
        ),
    )
    .unwrap();
    let mut opts = common::options(&dir.path().join("data"));
    opts.access_file = Some(access);
    let srv = common::start_with(opts).await;
    let c = http();
    let login = |body: Value| {
        c.post(format!("{}/api/login", base(&srv)))
            .json(&body)
            .send()
    };

    // The admin token → an admin session token, usable on the API and on the bus.
    let r = login(json!({"token": srv.token})).await.unwrap();
    assert_eq!(r.status(), 200);
    let s: Value = r.json().await.unwrap();
    assert_eq!(s["role"], "admin");
    let session = s["session_token"].as_str().unwrap().to_string();
    let who: Value = c
        .get(format!("{}/api/whoami", base(&srv)))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(who, json!({"name": "admin", "role": "admin"}));
    let mut bus = Raw::connect(&format!("ws://{}/?token={session}", srv.local_addr)).await;
    let r = bus.call("engine::workers::list", json!({})).await;
    assert!(r["error"].is_null(), "an admin session calls anything: {r}");

    // A client credential → a client session: public functions only, on the bus too.
    let s: Value = login(json!({"token": "viewer-token"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (s["role"].as_str(), s["name"].as_str()),
        (Some("client"), Some("viewer"))
    );
    let viewer = s["session_token"].as_str().unwrap().to_string();
    let mut bus = Raw::connect(&format!("ws://{}/?token={viewer}", srv.local_addr)).await;
    let r = bus.call("engine::workers::list", json!({})).await;
    assert_eq!(r["error"]["code"], "forbidden", "{r}");
    let r = c
        .get(format!("{}/api/sessions/s1", base(&srv)))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    // turn::get_state is not registered here, so not public: refused as on the bus.
    assert_eq!(r.status(), 403);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not public"),
        "{e}"
    );

    // A one-time code signs in once.
    let code = srv.console_sign_in_link();
    let code = code.split("#code=").nth(1).unwrap().to_string();
    assert_eq!(login(json!({"code": code})).await.unwrap().status(), 200);
    let again = login(json!({"code": code})).await.unwrap();
    assert_eq!(again.status(), 401);
    let e: Value = again.json().await.unwrap();
    assert!(
        e["error"]["message"].as_str().unwrap().contains("used"),
        "{e}"
    );

    // A session token does not sign in: it would mint a token that outlives signing it out.
    let r = login(json!({"token": viewer})).await.unwrap();
    assert_eq!(r.status(), 401, "a console session token mints nothing");

    // Wrong credentials, and bodies that are not a login.
    assert_eq!(login(json!({"token": "nope"})).await.unwrap().status(), 401);
    for bad in [
        json!({}),
        json!({"token": "a", "code": "b"}),
        json!({"tokn": "x"}),
    ] {
        let r = login(bad.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }

    // Signing out revokes the session token, on the API and at $connect.
    let r = c
        .post(format!("{}/api/logout", base(&srv)))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["revoked"], true);
    let r = c
        .get(format!("{}/api/whoami", base(&srv)))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(
        tokio_tungstenite::connect_async(format!("ws://{}/?token={viewer}", srv.local_addr))
            .await
            .is_err(),
        "a revoked session token is refused at $connect"
    );

    // Signing in again and again signs out only one's own oldest sessions, never another
    // user's (once, any credential could sign every console user out).
    for _ in 0..300 {
        assert_eq!(
            login(json!({"token": "viewer-token"}))
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let who = c
        .get(format!("{}/api/whoami", base(&srv)))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap();
    assert_eq!(who.status(), 200, "the admin's console is still signed in");

    srv.shutdown().await;
}

#[tokio::test]
async fn hostile_requests_get_a_clear_error_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.handshake_timeout_secs = 1;
    let srv = common::start_with(opts).await;
    let c = http();
    let b = base(&srv);
    let error = |v: &Value| {
        (
            v["error"]["code"].as_str().unwrap_or("").to_string(),
            v["error"]["message"].as_str().unwrap_or("").to_string(),
        )
    };

    // No token, a wrong one.
    for req in [
        c.get(format!("{b}/api/sessions")),
        c.get(format!("{b}/api/sessions")).bearer_auth("wrong"),
        c.post(format!("{b}/api/sessions/s1/turns"))
            .json(&json!({"message": "hi"})),
        c.get(format!("{b}/api/sessions/s1/events")),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(error(&r.json().await.unwrap()).0, "unauthorized");
    }
    let t = srv.token.clone();
    // Bad ids in the path name what is wrong.
    for path in [
        "/api/sessions/a%20b",
        "/api/sessions/..%2Fetc",
        "/api/sessions/x%00y/abort",
    ] {
        let r = c
            .get(format!("{b}{path}"))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        let r = if path.ends_with("abort") {
            c.post(format!("{b}{path}"))
                .bearer_auth(&t)
                .send()
                .await
                .unwrap()
        } else {
            r
        };
        assert_eq!(r.status(), 400, "{path}");
        assert!(
            error(&r.json().await.unwrap()).1.contains("session id"),
            "{path}"
        );
    }
    let long = "x".repeat(200);
    let r = c
        .post(format!("{b}/api/approvals/s1/{long}"))
        .bearer_auth(&t)
        .json(&json!({"decision": "allow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(error(&r.json().await.unwrap()).1.contains("call id"));
    // Bodies: too large, not JSON, not an object, too deep, the wrong shape.
    let big = json!({"message": "x".repeat(200 * 1024)});
    let r = c
        .post(format!("{b}/api/sessions/s1/turns"))
        .bearer_auth(&t)
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(error(&r.json().await.unwrap()).0, "payload_too_large");
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    for (body, needle) in [
        ("{not json".to_string(), "not valid JSON"),
        ("[1,2]".to_string(), "JSON object"),
        (format!("{{\"payload\": {deep}}}"), "deep"),
        (
            "{\"payload\": 3}".to_string(),
            "`payload` must be an object",
        ),
        ("{\"message\": \"\"}".to_string(), "non-empty"),
        (
            "{\"message\": \"a\", \"payload\": {}}".to_string(),
            "not both",
        ),
        (
            "{\"message\": \"a\", \"message_id\": \"a/b\"}".to_string(),
            "message_id",
        ),
    ] {
        let r = c
            .post(format!("{b}/api/sessions/s1/turns"))
            .bearer_auth(&t)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let (code, message) = error(&r.json().await.unwrap());
        assert_eq!(code, "invalid_message");
        assert!(message.contains(needle), "{body}: {message}");
    }
    for decision in [
        json!({}),
        json!({"decision": "maybe"}),
        json!({"decision": "allow", "reason": 7}),
    ] {
        let r = c
            .post(format!("{b}/api/approvals/s1/c1"))
            .bearer_auth(&t)
            .json(&decision)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{decision}");
    }
    // A resume point from another session, a bad page number.
    let r = c
        .get(format!("{b}/api/sessions/s1/events"))
        .bearer_auth(&t)
        .header("Last-Event-ID", "s2-000000000001")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    for q in ["limit=0x", "limit=201", "offset=-1"] {
        let r = c
            .get(format!("{b}/api/sessions?{q}"))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
    }
    // A page from another origin may not call the API.
    let r = c
        .get(format!("{b}/api/whoami"))
        .bearer_auth(&t)
        .header("Origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .get(format!("{b}/api/whoami"))
        .bearer_auth(&t)
        .header(
            "Origin",
            format!("http://127.0.0.1:{}", srv.local_addr.port()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the engine's own origin may");
    // Unknown routes and methods; a function nobody serves.
    let r = c.get(format!("{b}/api/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(error(&r.json().await.unwrap()).0, "not_found");
    let r = c
        .delete(format!("{b}/api/sessions"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let r = c
        .post(format!("{b}/api/sessions/s1/turns"))
        .bearer_auth(&t)
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 501);
    assert_eq!(error(&r.json().await.unwrap()).0, "function_not_found");

    // A request head that never ends is cut off at the handshake deadline; one that is too
    // long gets an answer, not a hang.
    let mut s = tokio::net::TcpStream::connect(srv.local_addr)
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was closed");
    let mut s = tokio::net::TcpStream::connect(srv.local_addr)
        .await
        .unwrap();
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let _ = s.write_all(huge.as_bytes()).await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "a huge head does not hang the connection");
    let head = String::from_utf8_lossy(&buf);
    assert!(head.is_empty() || head.starts_with("HTTP/1.1 4"), "{head}");

    // The bus still works after all that.
    let mut raw = Raw::connect(&srv.url()).await;
    raw.barrier().await;
    srv.shutdown().await;
}

#[tokio::test]
async fn the_console_and_the_openapi_document_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let srv = common::start(dir.path()).await;
    let c = http();
    let b = base(&srv);
    let r = c.get(format!("{b}/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let html = r.text().await.unwrap();
    assert!(html.contains("/console/app.js") && html.contains("Sign in"));
    for (path, kind) in [
        ("/console/app.js", "javascript"),
        ("/console/app.css", "css"),
    ] {
        let r = c.get(format!("{b}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().contains(kind));
    }
    let doc: Value = c
        .get(format!("{b}/api/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Every documented route answers (with its own error when the call is wrong), none 404s.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let url = format!("{b}{}", path.replace("{sid}", "s1").replace("{cid}", "c1"));
            let req = match method.as_str() {
                "get" => c.get(&url),
                "post" => c.post(&url).json(&json!({})),
                "delete" => c.delete(&url),
                other => panic!("unexpected method {other}"),
            };
            let req = req.bearer_auth(&srv.token);
            let resp = if path.ends_with("/events") {
                // A stream: only its head is read.
                tokio::time::timeout(Duration::from_secs(5), req.send())
                    .await
                    .unwrap()
                    .unwrap()
            } else {
                req.send().await.unwrap()
            };
            let status = resp.status().as_u16();
            let body = if path.ends_with("/events") {
                String::new()
            } else {
                resp.text().await.unwrap()
            };
            // A route documented as refusing a method (GET /mcp: no server stream) says 405.
            let refuses = item[method]["responses"].get("405").is_some();
            assert!(
                (status != 405 || refuses) && !body.contains("no such route"),
                "{method} {path} is documented but not routed ({status} {body})"
            );
        }
    }
    // The same port still upgrades to the bus.
    let mut raw = Raw::connect(&srv.url()).await;
    raw.barrier().await;
    srv.shutdown().await;
}

/// CORS: a chat front end on an allowed origin may call the API with a bearer header (its
/// preflight is answered, its answers name it); any other origin gets no grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_for_allowed_origins_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.allowed_origins = vec!["https://chat.example.com".into()];
    let srv = common::start_with(opts).await;
    let c = http();
    let b = base(&srv);
    let preflight = |origin: &str| {
        c.request(reqwest::Method::OPTIONS, format!("{b}/api/sessions"))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "authorization")
            .send()
    };
    let r = preflight("https://chat.example.com").await.unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://chat.example.com");
    assert!(
        h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("authorization")
    );
    assert!(
        h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    // The call itself, from that origin, carries the grant.
    let r = c
        .get(format!("{b}/api/whoami"))
        .header("origin", "https://chat.example.com")
        .bearer_auth(&srv.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://chat.example.com"
    );
    // Another origin: no grant on the preflight, and its call is refused as before.
    let r = preflight("https://evil.example.com").await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = c
        .get(format!("{b}/api/whoami"))
        .header("origin", "https://evil.example.com")
        .bearer_auth(&srv.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// A request refused before its body is read (a wrong key: 401) still gets its answer when
/// the body arrives after the head: the body is read (bounded) before the answer goes out,
/// so the connection is not reset under the client (the official MCP client saw
/// "disconnected" instead of the 401), and it stays open for the next request. A body past
/// the bound still gets its answer, with `Connection: close`.
#[tokio::test]
async fn a_refused_request_gets_its_answer_whenever_its_body_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let srv = common::start(dir.path()).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
    let mut s = tokio::net::TcpStream::connect(srv.local_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.write_all(body.as_bytes()).await.unwrap();
    let answer = read_response(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("missing or wrong engine token"), "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    // The same connection serves the next request.
    s.write_all(b"GET /api/nope HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let next = read_response(&mut s).await;
    assert!(next.starts_with("HTTP/1.1 404"), "{next}");

    // Past the bound: the answer, then the connection closes.
    let big = 200 * 1024;
    let mut s = tokio::net::TcpStream::connect(srv.local_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /api/sessions/s1/turns HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: {big}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(&vec![b'a'; 64 * 1024]).await;
    let answer = read_response(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    srv.shutdown().await;
}

/// One HTTP/1.1 response from `s` (head and a `Content-Length` body), as text.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte))
            .await
            .expect("an answer within 10 s")
            .expect("the connection was reset");
        assert!(
            n > 0,
            "closed before a whole answer: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&byte[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return text;
            }
        }
    }
}
