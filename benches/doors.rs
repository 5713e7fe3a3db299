//! What a standard door adds to a turn: the same scripted one-call turn (a zero-latency model
//! answering text at once) started and followed to its end through
//! - the HTTP API: `POST /api/sessions/{sid}/turns`, then `GET /api/sessions/{sid}/events`
//!   until `agent_end` (the baseline);
//! - the OpenAI-compatible door, not streaming: `POST /v1/chat/completions` (the answer comes
//!   when the turn has ended);
//! - the same door streaming, until `data: [DONE]`;
//! - the AG-UI door: `POST /ag-ui` until `RUN_FINISHED`;
//! - the MCP door: `tools/call run_agent` (its JSON answer comes when the turn has ended);
//! - the A2A door: `SendMessage` (blocking: the completed task).
//!
//! Each a new session, interleaved round by round, over loopback HTTP/1.1 with keep-alive.
//! Run: `cargo bench --bench doors` (`BENCH_N` turns per way, default 200). Prints p50/p90.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use futures_util::StreamExt;
use scripted_model::Cassette;
use serde_json::json;
use std::time::{Duration, Instant};

async fn read_until(resp: reqwest::Response, needle: &str) {
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    while let Some(chunk) = body.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if seen.contains(needle) {
            return;
        }
    }
    panic!("the stream ended without {needle}: {seen}");
}

fn p(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            engine_gateway::ensure_crypto_provider();
            let s = stack(PERMISSIONS).await;
            s.model.load(Cassette {
                turns: vec![text("Hello there.")],
                repeat_last: true,
                ..Default::default()
            });
            let base = format!("http://{}", s.srv.local_addr);
            let token = s.srv.token.clone();
            let c = reqwest::Client::builder()
                .pool_max_idle_per_host(8)
                .build()
                .unwrap();
            let body = json!({"model": "harness", "messages": [{"role": "user", "content": "say hello"}]});
            let mut api = Vec::new();
            let mut door = Vec::new();
            let mut door_stream = Vec::new();
            let mut live = Vec::new();
            let mut agui = Vec::new();
            let mut mcp = Vec::new();
            let mut a2a = Vec::new();
            // Warm up each way once.
            for round in 0..=n {
                let sid = format!("api-{round}");
                let t = Instant::now();
                let r = c
                    .post(format!("{base}/api/sessions/{sid}/turns"))
                    .bearer_auth(&token)
                    .json(&json!({"message": "say hello"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let ev = c
                    .get(format!("{base}/api/sessions/{sid}/events"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .unwrap();
                read_until(ev, "event: agent_end").await;
                let api_t = t.elapsed();

                // The same, but the event stream opened first (live delivery, as the door
                // follows a turn).
                let sid = format!("live-{round}");
                let t = Instant::now();
                let ev = c
                    .get(format!("{base}/api/sessions/{sid}/events"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .unwrap();
                let r = c
                    .post(format!("{base}/api/sessions/{sid}/turns"))
                    .bearer_auth(&token)
                    .json(&json!({"message": "say hello"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                read_until(ev, "event: agent_end").await;
                let live_t = t.elapsed();

                let t = Instant::now();
                let r = c
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(&token)
                    .header("x-session-id", format!("door-{round}"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let v: serde_json::Value = r.json().await.unwrap();
                assert_eq!(v["choices"][0]["message"]["content"], "Hello there.");
                let door_t = t.elapsed();

                let mut streamed = body.clone();
                streamed["stream"] = json!(true);
                let t = Instant::now();
                let r = c
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(&token)
                    .header("x-session-id", format!("doors-{round}"))
                    .json(&streamed)
                    .send()
                    .await
                    .unwrap();
                read_until(r, "data: [DONE]").await;
                let stream_t = t.elapsed();
                let t = Instant::now();
                let r = c
                    .post(format!("{base}/ag-ui"))
                    .bearer_auth(&token)
                    .json(&json!({"threadId": format!("agui-{round}"), "runId": "r", "messages": [{"id": "1", "role": "user", "content": "say hello"}]}))
                    .send()
                    .await
                    .unwrap();
                read_until(r, "RUN_FINISHED").await;
                let agui_t = t.elapsed();

                let t = Instant::now();
                let r = c
                    .post(format!("{base}/mcp"))
                    .bearer_auth(&token)
                    .header("accept", "application/json")
                    .json(&json!({"jsonrpc": "2.0", "id": round, "method": "tools/call", "params": {"name": "run_agent", "arguments": {"message": "say hello", "session_id": format!("mcp-{round}")}}}))
                    .send()
                    .await
                    .unwrap();
                let v: serde_json::Value = r.json().await.unwrap();
                assert_eq!(v["result"]["structuredContent"]["text"], "Hello there.", "{v}");
                let mcp_t = t.elapsed();

                let t = Instant::now();
                let r = c
                    .post(format!("{base}/a2a"))
                    .bearer_auth(&token)
                    .json(&json!({"jsonrpc": "2.0", "id": round, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_USER", "contextId": format!("a2a-{round}"), "parts": [{"text": "say hello"}]}}}))
                    .send()
                    .await
                    .unwrap();
                let v: serde_json::Value = r.json().await.unwrap();
                assert_eq!(v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{v}");
                let a2a_t = t.elapsed();

                if round > 0 {
                    agui.push(agui_t.as_secs_f64() * 1e3);
                    mcp.push(mcp_t.as_secs_f64() * 1e3);
                    a2a.push(a2a_t.as_secs_f64() * 1e3);
                    api.push(api_t.as_secs_f64() * 1e3);
                    door.push(door_t.as_secs_f64() * 1e3);
                    door_stream.push(stream_t.as_secs_f64() * 1e3);
                    live.push(live_t.as_secs_f64() * 1e3);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let (a50, a90) = (p(&mut api, 0.5), p(&mut api, 0.9));
            println!("{n} one-call turns each, interleaved, a new session each\n");
            println!("| way | p50 | p90 | added at p50 |");
            println!("| --- | ---: | ---: | ---: |");
            println!("| HTTP API: POST turns + SSE events to agent_end (baseline) | {a50:.2} ms | {a90:.2} ms | |");
            for (name, v) in [
                ("HTTP API, the event stream opened first (live delivery)", &mut live),
                ("OpenAI door, not streaming", &mut door),
                ("OpenAI door, streaming to [DONE]", &mut door_stream),
                ("AG-UI door, to RUN_FINISHED", &mut agui),
                ("MCP door, tools/call run_agent", &mut mcp),
                ("A2A door, SendMessage (blocking)", &mut a2a),
            ] {
                let (m, q) = (p(v, 0.5), p(v, 0.9));
                println!("| {name} | {m:.2} ms | {q:.2} ms | {:+.2} ms |", m - a50);
            }
        });
}
