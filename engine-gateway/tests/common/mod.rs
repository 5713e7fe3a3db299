#![allow(dead_code)]
//! Helpers for tests that talk to a live engine over a real WebSocket.

use engine_gateway::server::{self, RunningServer, ServeOptions};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for an answer. On the AWS backend every state write is a call to
/// the emulator, which CI's two cores share with a second test process: a PutItem there has
/// taken over 10 s (the SDK retries a busy emulator with backoff).
pub fn wait() -> Duration {
    Duration::from_secs(if aws_backend() { 30 } else { 10 })
}

/// Which backend the suite runs against: `HARNESS_TEST_BACKEND=aws` runs it on the AWS
/// backend (the emulator at `AWS_ENDPOINT_URL`), each test with its own resource prefix.
pub fn aws_backend() -> bool {
    engine_gateway::server::aws_test_backend()
}

pub fn fresh_prefix() -> String {
    format!("t{}-", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Options for a test engine on the selected backend.
pub fn options(dir: &std::path::Path) -> ServeOptions {
    let mut opts = ServeOptions::for_data_dir(dir.to_path_buf());
    if aws_backend() {
        opts.backend = server::BackendKind::Aws;
        opts.aws.prefix = fresh_prefix();
        opts.aws.create_resources = true;
    }
    opts
}

/// Command-line arguments selecting the same backend for an `engine-gateway` process.
pub fn backend_args(dir: &std::path::Path, prefix: &str) -> Vec<String> {
    if aws_backend() {
        vec![
            "--backend".into(),
            "aws".into(),
            "--aws-prefix".into(),
            prefix.into(),
            "--aws-create-resources".into(),
        ]
    } else {
        vec!["--data-dir".into(), dir.display().to_string()]
    }
}

pub async fn start(dir: &std::path::Path) -> RunningServer {
    start_with(options(dir)).await
}

pub async fn start_with(opts: ServeOptions) -> RunningServer {
    server::start(&opts).await.expect("engine starts")
}

/// A raw protocol client: what a worker in any language would do.
pub struct Raw {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    pub worker_id: String,
}

impl Raw {
    pub async fn connect(url: &str) -> Raw {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect");
        let mut raw = Raw {
            ws,
            worker_id: String::new(),
        };
        let hello = raw.recv().await;
        assert_eq!(hello["type"], "workerregistered", "{hello}");
        raw.worker_id = hello["worker_id"].as_str().expect("worker_id").to_string();
        raw
    }

    pub async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::text(v.to_string()))
            .await
            .expect("send");
    }

    pub async fn send_text(&mut self, t: &str) {
        self.ws
            .send(Message::text(t.to_string()))
            .await
            .expect("send");
    }

    /// Next JSON message (panics after `wait()`).
    pub async fn recv(&mut self) -> Value {
        loop {
            let m = tokio::time::timeout(wait(), self.ws.next())
                .await
                .expect("a message within wait()")
                .expect("stream open")
                .expect("frame");
            if let Message::Text(t) = m {
                return serde_json::from_str(t.as_str()).expect("engine sends JSON");
            }
        }
    }

    pub async fn recv_until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = self.recv().await;
            if pred(&v) {
                return v;
            }
        }
    }

    /// Round trip: ping → pong proves everything sent before was processed.
    pub async fn barrier(&mut self) {
        self.send(json!({"type": "ping"})).await;
        self.recv_until(|v| v["type"] == "pong").await;
    }

    pub async fn register(&mut self, id: &str) {
        self.send(json!({"type": "registerfunction", "id": id}))
            .await;
        self.barrier().await;
    }

    pub async fn call_with(&mut self, function_id: &str, data: Value, extra: Value) -> Value {
        let iid = uuid::Uuid::new_v4().to_string();
        let mut msg = json!({"type": "invokefunction", "invocation_id": iid, "function_id": function_id, "data": data});
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                msg[k] = v;
            }
        }
        self.send(msg).await;
        self.recv_until(|v| v["type"] == "invocationresult" && v["invocation_id"] == iid.as_str())
            .await
    }

    pub async fn call(&mut self, function_id: &str, data: Value) -> Value {
        self.call_with(function_id, data, json!({})).await
    }

    /// Answer the next invocation of this worker with `f(data)`; returns the invocation.
    pub async fn serve_one(&mut self, f: impl Fn(&Value) -> Value) -> Value {
        let inv = self.recv_until(|v| v["type"] == "invokefunction").await;
        let result = f(&inv["data"]);
        let iid = inv["invocation_id"].clone();
        self.send(json!({"type": "invocationresult", "invocation_id": iid, "function_id": inv["function_id"], "result": result}))
            .await;
        inv
    }
}

pub async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + wait();
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}
