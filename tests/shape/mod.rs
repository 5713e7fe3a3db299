//! The deployed shape on LocalStack, for tests and the deployed bench: bring the template up
//! with every function a Lambda bootstrap, serve a cassette from the scripted model, and
//! drive sessions through the emulated WebSocket API.
#![allow(dead_code)]

use engine_gateway::aws::{AwsClients, AwsNames};
use engine_gateway::deployed::{Deployed, DeployedOptions};
use futures_util::{SinkExt, StreamExt};
use scripted_model::{Cassette, ScriptedModel};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub fn template() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("infra/template.yaml")
}

/// The template of `infra/harness.colocated.yaml`'s layout (the turn's own workers in one
/// Lambda), written by `engine-gateway colocate`'s code to a file of its own.
pub fn colocated_template() -> (tempfile::TempDir, PathBuf) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let yaml = engine_gateway::colocate::colocate_files(
        &template(),
        &root.join("infra/harness.colocated.yaml"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("template.yaml");
    std::fs::write(&path, yaml).unwrap();
    (dir, path)
}

/// The tools Lambda works in the template's `HARNESS_WORKDIR`.
pub fn workdir() -> PathBuf {
    let t: Value = serde_norway::from_str(&std::fs::read_to_string(template()).unwrap()).unwrap();
    PathBuf::from(
        t["Resources"]["ToolsFunction"]["Properties"]["Environment"]["Variables"]
            ["HARNESS_WORKDIR"]
            .as_str()
            .unwrap(),
    )
}

/// Where the bootstraps are, or `None` (the test skips, saying why) off the AWS backend or
/// without Lambda builds.
pub fn lambda_dir() -> Option<PathBuf> {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return None;
    }
    let dir = match std::env::var("HARNESS_LAMBDA_DIR") {
        Ok(d) => PathBuf::from(d),
        Err(_) => std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("lambda"),
    };
    if !dir.join("turn-orchestrator/bootstrap").is_file() {
        eprintln!(
            "SKIPPED: no Lambda builds in {} (bash scripts/lambda-builds.sh)",
            dir.display()
        );
        return None;
    }
    Some(dir)
}

/// The client's socket, read as a client that subscribes with `batch` reads it: a
/// `streamevents` message comes out as the `streamevent`s it carries (each marked
/// `"batched": true`), in order; everything else as it came.
pub struct Unbatching {
    inner: Ws,
    unread: std::collections::VecDeque<Message>,
}

impl Unbatching {
    fn new(inner: Ws) -> Self {
        Self {
            inner,
            unread: Default::default(),
        }
    }

    /// The events of a `streamevents` text, or `None` for any other message.
    fn unbatch(text: &str) -> Option<Vec<Message>> {
        let v: Value = serde_json::from_str(text).ok()?;
        if v["type"] != "streamevents" {
            return None;
        }
        let events = v["events"].as_array()?;
        Some(
            events
                .iter()
                .map(|e| {
                    Message::text(
                        json!({"type": "streamevent", "stream_name": v["stream_name"], "group_id": v["group_id"], "item_id": e["item_id"], "event": e["event"], "batched": true})
                            .to_string(),
                    )
                })
                .collect(),
        )
    }
}

impl futures_util::Stream for Unbatching {
    type Item = Result<Message, tokio_tungstenite::tungstenite::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        loop {
            if let Some(m) = self.unread.pop_front() {
                return Poll::Ready(Some(Ok(m)));
            }
            match self.inner.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(Message::Text(t)))) => match Self::unbatch(t.as_str()) {
                    Some(events) => self.unread.extend(events),
                    None => return Poll::Ready(Some(Ok(Message::Text(t)))),
                },
                other => return other,
            }
        }
    }
}

impl futures_util::Sink<Message> for Unbatching {
    type Error = tokio_tungstenite::tungstenite::Error;

    fn poll_ready(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready_unpin(cx)
    }

    fn start_send(mut self: std::pin::Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        self.inner.start_send_unpin(item)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_flush_unpin(cx)
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_close_unpin(cx)
    }
}

/// A running deployed shape and a client connected to it with the generated token.
pub struct Shape {
    pub deployed: Deployed,
    pub clients: AwsClients,
    pub ws: Unbatching,
    /// Everything pushed to the client that was not an answer.
    pub pushed: Vec<Value>,
    pub polls: u32,
    _model: ScriptedModel,
}

/// Serve `cassette`, put `secrets` (as an operator would after deploying), bring the shape up
/// under `prefix` with the template `parameters`, and connect.
pub async fn bring_up(
    dir: PathBuf,
    prefix: &str,
    cassette: Cassette,
    secrets: &[(&str, &str)],
    parameters: &[(&str, &str)],
) -> Shape {
    bring_up_from(template(), dir, prefix, cassette, secrets, parameters).await
}

/// [`bring_up`] from another template (a co-located layout's).
pub async fn bring_up_from(
    template: PathBuf,
    dir: PathBuf,
    prefix: &str,
    cassette: Cassette,
    secrets: &[(&str, &str)],
    parameters: &[(&str, &str)],
) -> Shape {
    use engine_gateway::secrets::SecretStore;
    engine_gateway::ensure_crypto_provider();
    let model = ScriptedModel::default();
    let base = model.serve().await.unwrap();
    model.load(cassette);
    // SAFETY: set before the functions start; nothing else reads the environment yet.
    unsafe {
        std::env::set_var("ANTHROPIC_BASE_URL", &base);
        std::env::set_var("ANTHROPIC_API_KEY", "sk-test");
        // The bedrock provider's SDK: the scripted model's ConverseStream, not LocalStack.
        std::env::set_var("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", &base);
    }
    let clients = AwsClients::from_env().await;
    let names = AwsNames::new(prefix);
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let store = engine_gateway::aws::secrets::AwsSecrets::new(clients.clone(), names);
    for (name, value) in secrets {
        store.put(name, value).await.unwrap();
    }
    let mut opts = DeployedOptions::new(template, dir, prefix);
    opts.max_processes = 2;
    opts.parameters = parameters
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let deployed = engine_gateway::deployed::up(&opts).await.unwrap();
    let (ws, _) =
        tokio_tungstenite::connect_async(format!("{}/?token={}", deployed.url, deployed.token))
            .await
            .unwrap();
    Shape {
        deployed,
        clients,
        ws: Unbatching::new(ws),
        pushed: Vec::new(),
        polls: 0,
        _model: model,
    }
}

impl Shape {
    /// Send an invocation; keep every other message in `pushed` until its result comes.
    pub async fn invoke(&mut self, id: &str, function_id: &str, data: Value) -> Value {
        self.invoke_in(id, function_id, data, None).await
    }

    /// [`Shape::invoke`] from a position in a trace (`traceparent`), as a traced client sends.
    pub async fn invoke_in(
        &mut self,
        id: &str,
        function_id: &str,
        data: Value,
        traceparent: Option<&str>,
    ) -> Value {
        self.ws
            .send(Message::text(
                json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id, "data": data, "traceparent": traceparent}).to_string(),
            ))
            .await
            .unwrap();
        loop {
            let within = Duration::from_secs(120);
            let Some(v) = self
                .next_json(within, || format!("{function_id}: no answer within 120 s"))
                .await
            else {
                continue;
            };
            if v["invocation_id"] == id {
                return v;
            }
            self.pushed.push(v);
        }
    }

    /// Subscribe to the session's events and start it with `task`.
    pub async fn start(&mut self, sid: &str, task: &str) {
        self.start_in(sid, task, None).await;
    }

    /// [`Shape::start`] with the run's provider and model.
    pub async fn start_with(&mut self, sid: &str, task: &str, provider: &str, model: &str) {
        self.start_with_payload(sid, task, json!({"provider": provider, "model": model}))
            .await;
    }

    /// [`Shape::start`] with more of the run's payload (`max_turns`, …) than the defaults.
    pub async fn start_with_payload(&mut self, sid: &str, task: &str, extra: Value) {
        self.start_with_payload_in(sid, task, extra, None).await;
    }

    /// [`Shape::start_with_payload`] from a position in a trace.
    pub async fn start_with_payload_in(
        &mut self,
        sid: &str,
        task: &str,
        extra: Value,
        traceparent: Option<&str>,
    ) {
        self.ws
            .send(Message::text(
                json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": sid, "batch": true})
                    .to_string(),
            ))
            .await
            .unwrap();
        let mut payload = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": task}], "timestamp": 1}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            payload[k] = v.clone();
        }
        let started = self
            .invoke_in(
                "start",
                "harness::trigger",
                json!({"session_id": sid, "payload": payload}),
                traceparent,
            )
            .await;
        assert!(started["error"].is_null(), "{started}");
    }

    /// [`Shape::start`] from a position in a trace.
    pub async fn start_in(&mut self, sid: &str, task: &str, traceparent: Option<&str>) {
        self.ws
            .send(Message::text(
                json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": sid, "batch": true})
                    .to_string(),
            ))
            .await
            .unwrap();
        let started = self
            .invoke_in(
                "start",
                "harness::trigger",
                json!({"session_id": sid, "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": [{"type": "text", "text": task}], "timestamp": 1}]}}),
                traceparent,
            )
            .await;
        assert!(started["error"].is_null(), "{started}");
    }

    /// Poll `turn::get_state` until the session is in one of `wanted` (or failed).
    /// Wait, reading this connection's pushes (kept in `pushed`), for session `sid`'s stored
    /// event of type `event_type` (e.g. `agent_end`): what a UI following the session waits
    /// for, with no call of its own meanwhile.
    pub async fn wait_event(&mut self, sid: &str, event_type: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(v) = self
                .next_json(left, || {
                    format!("no {event_type} event of {sid} within 240 s")
                })
                .await
            else {
                continue;
            };
            let found = v["type"] == "streamevent"
                && v["group_id"] == sid
                && v["event"]["data"]["type"] == event_type;
            self.pushed.push(v.clone());
            if found {
                return v;
            }
        }
    }

    /// The connection's next message as JSON (`None`: a frame that is not text); panics
    /// with `late()` when none comes `within`.
    async fn next_json(
        &mut self,
        within: Duration,
        late: impl FnOnce() -> String,
    ) -> Option<Value> {
        let m = tokio::time::timeout(within, self.ws.next())
            .await
            .unwrap_or_else(|_| panic!("{}", late()))
            .expect("connection open")
            .expect("frame");
        match m {
            Message::Text(t) => Some(serde_json::from_str(&t).expect("the engine sends JSON")),
            _ => None,
        }
    }

    pub async fn wait_state(&mut self, sid: &str, wanted: &[&str]) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        loop {
            self.polls += 1;
            let id = format!("g{}", self.polls);
            let v = self
                .invoke(&id, "turn::get_state", json!({"session_id": sid}))
                .await;
            let s = v["result"]["state"].as_str().unwrap_or("").to_string();
            if wanted.contains(&s.as_str()) || s == "failed" {
                return v["result"].clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never reached {wanted:?}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}
