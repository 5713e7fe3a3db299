//! A model call's last token deltas go out beside the step, not before it: the step runs its
//! calls while they are posted, and still records nothing before they went out.

use super::*;
use futures_util::FutureExt;
use harness_sdk::bus::Watched;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The first call runs while its turn's last `message_update` is still going out (the step
/// did not wait for it), and a UI subscriber still gets every `message_update` of a turn
/// before that turn's stored `message_complete` (nothing the step records overtakes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_calls_last_token_pushes_go_out_beside_its_calls_and_before_its_events() {
    let rules =
        "version: 1\nrules:\n  - {function: \"probe::read\", action: allow, read_only: true}\n";
    let s = stack(rules).await;
    // This orchestrator (the last registration wins) posts each update a second late (a post
    // to a WebSocket client across the network), counting those held back.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let held = in_flight.clone();
    let slow_updates: harness_sdk::bus::CallWatch = Arc::new(move |function_id, data| {
        let held = held.clone();
        let update = function_id == "stream::send" && data["type"] == "message_update";
        async move {
            if update {
                held.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                held.fetch_sub(1, Ordering::SeqCst);
            }
        }
        .boxed()
    });
    let _orchestrator =
        harness_sdk::run_embedded_through(turn_orchestrator::worker(), &s.srv.engine, |inner| {
            Watched::around(inner, slow_updates)
        })
        .unwrap();
    // The probe notes how many updates were still going out when it ran.
    let seen_in_flight = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _probe = {
        let (in_flight, seen) = (in_flight.clone(), seen_in_flight.clone());
        harness_sdk::run_embedded(
            harness_sdk::Worker::new("probe").function(
                "probe::read",
                "a read",
                move |_c: harness_sdk::Ctx, _d: Value| {
                    let (in_flight, seen) = (in_flight.clone(), seen.clone());
                    async move {
                        seen.lock().unwrap().push(in_flight.load(Ordering::SeqCst));
                        Ok(json!({"probed": true}))
                    }
                },
            ),
            &s.srv.engine,
        )
        .unwrap()
    };
    s.model.load(Cassette {
        turns: vec![call("p1", "probe::read", json!({})), text("Probed.")],
        ..Default::default()
    });
    let browser = connect_client("browser", RemoteOptions::new(&s.srv.url())).await;
    let mut pushes = browser.pushes().unwrap();
    let ctx = s.client.ctx();
    ctx.trigger(
        "ui::subscribe",
        json!({"browser_id": browser.worker_id(), "session_id": "beside"}),
    )
    .await
    .unwrap();
    start(&ctx, "beside", None).await;
    // Everything pushed until the run ended, and a while after it (a late update).
    let mut seen = Vec::new();
    let mut wait = Duration::from_secs(20);
    while let Ok(Some(m)) = tokio::time::timeout(wait, pushes.recv()).await {
        let engine_gateway::protocol::Message::Push { data } = m else {
            continue;
        };
        let event = data["event"]["data"].clone();
        if event["type"] == "agent_end" {
            wait = Duration::from_secs(3);
        }
        seen.push(event);
    }
    assert_eq!(
        *seen_in_flight.lock().unwrap(),
        [1],
        "the call ran while its turn's last update was still going out"
    );
    // Every update comes while its turn streams (after the turn entered
    // `assistant_streaming`, before the model's message of that turn is stored), and is a
    // part of that message.
    let text_of = |e: &Value| {
        e["message"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let kinds: Vec<String> = seen
        .iter()
        .map(|e| format!("{} {}", e["type"].as_str().unwrap_or(""), text_of(e)))
        .collect();
    let mut streaming = false;
    let mut updates = 0;
    for (i, e) in seen.iter().enumerate() {
        match e["type"].as_str().unwrap_or("") {
            "turn_state_changed" if e["new_value"]["state"] == "assistant_streaming" => {
                streaming = true;
            }
            "message_complete" if e["message"]["role"] == "assistant" => streaming = false,
            "message_update" => {
                assert!(
                    streaming,
                    "update {i} after its turn's message was stored: {kinds:?}"
                );
                let completed = seen[i..]
                    .iter()
                    .find(|e| {
                        e["type"] == "message_complete" && e["message"]["role"] == "assistant"
                    })
                    .map(text_of)
                    .unwrap_or_default();
                assert!(
                    completed.starts_with(&text_of(e)),
                    "update {i} is not of the message stored next: {kinds:?}"
                );
                updates += 1;
            }
            _ => {}
        }
    }
    assert!(seen.iter().any(|e| e["type"] == "agent_end"), "{kinds:?}");
    assert!(updates >= 2, "an update per turn at least: {kinds:?}");
    wait_state(&ctx, "beside", "stopped").await;
}
