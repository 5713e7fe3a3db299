//! The fallback chain (`run::start`'s `fallback`, `run.fallback` in harness.yaml): a model call
//! that fails before its first token with a retryable error (overloaded, rate limited) goes to
//! the next model in the same step; a refused request (400) or a failure after tokens came
//! does not. Each run is one whole turn through the real workers, both providers streaming
//! from one scripted model server.

use crate::common;

use common::*;
use scripted_model::{Cassette, Turn};
use serde_json::{Value, json};

fn failing(status: u16, message: &str, retry_after: Option<u64>) -> Turn {
    Turn {
        http_status: Some(status),
        error_message: Some(message.into()),
        retry_after,
        ..Default::default()
    }
}

async fn run(s: &Stack, sid: &str, fallback: Value) -> (Value, Vec<Value>) {
    let ctx = s.client.ctx();
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "max_turns": 4,
                "fallback": fallback,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "do the task"}], "timestamp": 1}]}}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let view = wait_state(&ctx, sid, "stopped").await;
    (view, events(&ctx, sid).await)
}

fn assistants(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "message_complete" && e["message"]["role"] == "assistant")
        .map(|e| e["message"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_model_hands_the_step_to_the_next_and_the_answer_is_charged_to_it() {
    let s = stack(PERMISSIONS).await;
    // The fallback's key, stored as an operator does (the stack's environment has Anthropic's).
    s.client
        .ctx()
        .trigger(
            "auth::set_token",
            json!({"provider": "openai", "type": "api_key", "key": "sk-test"}),
        )
        .await
        .unwrap();
    for (sid, first) in [
        ("f529", failing(529, "Overloaded", None)),
        ("f429", failing(429, "rate limited", Some(60))),
    ] {
        s.model.load(Cassette {
            turns: vec![first, call("c1", "fs::list", json!({})), text("done")],
            ..Default::default()
        });
        let (view, events) = run(
            &s,
            sid,
            json!([{"provider": "openai", "model": "gpt-5.4-mini"}]),
        )
        .await;
        assert_eq!(view["error"], Value::Null, "{sid}: {view}");
        let fallbacks: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "model_fallback")
            .collect();
        assert_eq!(fallbacks.len(), 1, "{sid}: one fallback: {events:?}");
        let f = fallbacks[0];
        assert_eq!(
            f["from"],
            json!({"provider": "anthropic", "model": "claude-sonnet-5-5"})
        );
        assert_eq!(
            f["to"],
            json!({"provider": "openai", "model": "gpt-5.4-mini"})
        );
        assert!(!f["reason"].as_str().unwrap().is_empty(), "{f}");
        let answers = assistants(&events);
        // The first answer came from the fallback, priced at its model; the next model call
        // asks the run's own model first again.
        assert_eq!(answers[0]["provider"], "openai", "{sid}: {:?}", answers[0]);
        assert_eq!(answers[0]["model"], "gpt-5.4-mini");
        assert!(answers[0]["usage"]["cost_usd"].as_f64().unwrap() > 0.0);
        assert_eq!(answers[1]["provider"], "anthropic");
        assert_eq!(
            answers.len(),
            2,
            "{sid}: no error message stored: {answers:?}"
        );
        assert_eq!(view["turn_count"], 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_or_a_failure_after_tokens_is_not_handed_on() {
    let s = stack(PERMISSIONS).await;
    let cut = Turn {
        text: Some("partial answer that breaks".into()),
        malformed: Some("stream_error".into()),
        ..Default::default()
    };
    for (sid, first) in [
        ("r400", failing(400, "invalid request: bad field", None)),
        ("rcut", cut),
    ] {
        s.model.load(Cassette {
            turns: vec![first, text("the fallback must not be asked")],
            ..Default::default()
        });
        let (view, events) = run(
            &s,
            sid,
            json!([{"provider": "openai", "model": "gpt-5.4-mini"}]),
        )
        .await;
        assert!(
            !events.iter().any(|e| e["type"] == "model_fallback"),
            "{sid}: {events:?}"
        );
        let answers = assistants(&events);
        assert_eq!(answers.len(), 1, "{sid}");
        assert_eq!(
            answers[0]["stop_reason"], "error",
            "{sid}: {:?}",
            answers[0]
        );
        assert_eq!(answers[0]["provider"], "anthropic");
        assert_eq!(view["turn_count"], 1, "{sid}: {view}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_fallback_list_is_refused_with_the_field() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    for (fallback, field) in [
        (
            json!([{"provider": "Open AI", "model": "m"}]),
            "fallback[0].provider",
        ),
        (
            json!([{"provider": "openai", "model": ""}]),
            "fallback[0].model",
        ),
        (json!([{"provider": "openai"}]), "model"),
        (
            json!(
                (0..5)
                    .map(|_| json!({"provider": "openai", "model": "m"}))
                    .collect::<Vec<_>>()
            ),
            "at most 4",
        ),
    ] {
        let e = ctx
            .trigger(
                "run::start",
                json!({"session_id": "bad", "provider": "anthropic", "model": "m", "fallback": fallback}),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
}
