//! What a step leaves running beside the next thing it does: a model call's last token deltas
//! (beside the calls), and a chained turn's save (beside its next model call). Nothing the
//! session's client sees comes out of order for it.

use super::*;
use futures_util::FutureExt;
use harness_sdk::bus::{CallWatch, Watched};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const RULES: &str =
    "version: 1\nrules:\n  - {function: \"probe::read\", action: allow, read_only: true}\n";

/// A run of two turns (a read, then an answer) on an orchestrator whose calls go through
/// `watch` (the last registration wins), with a probe tool that runs `probe` → every event a
/// client subscribed on the engine got, in order (the engine pushes them in the order they
/// were written and sent; `ui::subscribe` goes through a stream trigger, which does not keep
/// that order), until a while after the run's end.
async fn two_turns(watch: CallWatch, probe: impl Fn() + Send + Sync + 'static) -> Vec<Value> {
    let s = stack(RULES).await;
    // Both turns in one step, however long the watch holds a call.
    let chained = turn_orchestrator::Settings {
        chain_budget: Duration::from_secs(10),
        ..Default::default()
    };
    let _orchestrator = harness_sdk::run_embedded_through(
        turn_orchestrator::worker_with(chained),
        &s.srv.engine,
        |inner| Watched::around(inner, watch),
    )
    .unwrap();
    let probe = Arc::new(probe);
    let _probe = harness_sdk::run_embedded(
        harness_sdk::Worker::new("probe").function(
            "probe::read",
            "a read",
            move |_c: harness_sdk::Ctx, _d: Value| {
                let probe = probe.clone();
                async move {
                    probe();
                    Ok(json!({"probed": true}))
                }
            },
        ),
        &s.srv.engine,
    )
    .unwrap();
    s.model.load(Cassette {
        turns: vec![call("p1", "probe::read", json!({})), text("Probed.")],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    let mut pushes = s.client.pushes().expect("pushes");
    s.client
        .send_raw(&engine_gateway::protocol::Message::StreamSubscribe {
            stream_name: "agent::events".into(),
            group_id: Some("beside".into()),
            batch: false,
        })
        .unwrap();
    start(&ctx, "beside", None).await;
    let mut seen = Vec::new();
    let mut wait = Duration::from_secs(20);
    while let Ok(Some(m)) = tokio::time::timeout(wait, pushes.recv()).await {
        let engine_gateway::protocol::Message::StreamEvent { event, .. } = m else {
            continue;
        };
        if event.data["type"] == "agent_end" {
            wait = Duration::from_secs(3);
        }
        seen.push(event.data);
    }
    wait_state(&ctx, "beside", "stopped").await;
    seen
}

/// Every update comes while its turn streams (after the turn entered `assistant_streaming`,
/// before the model's message of that turn is stored), and is a part of that message.
fn assert_updates_within_their_turns(seen: &[Value]) {
    let text_of = |e: &Value| {
        e["message"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let kinds: Vec<String> = seen
        .iter()
        .map(|e| {
            let state = e["new_value"]["state"].as_str().unwrap_or("");
            format!("{} {state}{}", e["type"].as_str().unwrap_or(""), text_of(e))
        })
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
                    "update {i} outside its turn's streaming: {kinds:?}"
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
}

/// The call runs while its turn's last `message_update` is still going out (the step did not
/// wait for it), and the client still gets every update of a turn before that turn's stored
/// `message_complete`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_calls_last_token_pushes_go_out_beside_its_calls_and_before_its_events() {
    // Each update is posted a second late (a post to a WebSocket client across the network);
    // what went out, and when the call ran, in order.
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let posted = log.clone();
    let slow_updates: CallWatch = Arc::new(move |function_id, data| {
        let posted = posted.clone();
        let update = (function_id == "stream::send" && data["type"] == "message_update")
            .then(|| data["data"]["message"]["content"][0]["text"].clone());
        async move {
            if let Some(text) = update {
                tokio::time::sleep(Duration::from_secs(1)).await;
                posted.lock().unwrap().push(format!("update {text}"));
            }
        }
        .boxed()
    });
    let probed = log.clone();
    let seen = two_turns(slow_updates, move || {
        probed.lock().unwrap().push("call".into());
    })
    .await;
    let log = log.lock().unwrap().clone();
    let call = log.iter().position(|l| l == "call").expect("the call ran");
    assert!(
        log[call..]
            .iter()
            .any(|l| l.starts_with("update \"Calling probe::read.")),
        "the call waited for its turn's last update to go out: {log:?}"
    );
    assert_updates_within_their_turns(&seen);
}

/// A chained turn's model call starts while the save after the turn before it is still
/// going (the step did not wait for it), and the client still gets that save's events (the
/// turn's `assistant_streaming`) before the model call's updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_turns_save_goes_beside_its_next_model_call_and_before_its_updates() {
    // Each save of the turn record takes half a second more (a slow transaction); each model
    // call notes how many of those saves had finished when it started.
    let saved = Arc::new(AtomicUsize::new(0));
    let saved_when_called = Arc::new(Mutex::new(Vec::new()));
    let watch: CallWatch = {
        let (saved, noted) = (saved.clone(), saved_when_called.clone());
        Arc::new(move |function_id, data| {
            if function_id.starts_with("provider::") {
                noted.lock().unwrap().push(saved.load(Ordering::SeqCst));
            }
            let record_save =
                function_id == "state::transact" && data.to_string().contains("/turn_state");
            let saved = saved.clone();
            async move {
                if record_save {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    saved.fetch_add(1, Ordering::SeqCst);
                }
            }
            .boxed()
        })
    };
    let seen = two_turns(watch, || {}).await;
    // The first after the provisioning's save (none finished), the second after the first
    // turn's (one finished: the one before it; a save waits for the one left running).
    assert_eq!(
        *saved_when_called.lock().unwrap(),
        [0, 1],
        "how many saves had finished when each model call started"
    );
    assert_updates_within_their_turns(&seen);
}
