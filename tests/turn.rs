//! Whole turns on the embedded backend (or the AWS backend with `HARNESS_TEST_BACKEND=aws`),
//! with every worker real: the orchestrator on the
//! turn-step FIFO queue, the policy from a permissions file, the approval gate, the tools in a
//! temporary directory, auth, models, and the Anthropic provider streaming from the scripted
//! model server over HTTP.

use crate::common;

use common::*;
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, connect_client};
use scripted_model::{Cassette, ToolCall, Turn};
use serde_json::{Value, json};
use std::time::Duration;

mod carried;
mod hops;
mod pushes;
mod reads;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_denied_and_approved_calls_in_one_run() {
    let s = stack(PERMISSIONS).await;
    std::fs::create_dir_all(&s.work).unwrap();
    std::fs::write(s.work.join("notes.txt"), "hello").unwrap();
    s.model.load(Cassette {
        turns: vec![
            call("c-list", "fs::list", json!({})),
            call("c-deny", "approval::resolve", json!({"session_id": "x", "function_call_id": "y", "decision": "allow", "api_key": "sk-live-123"})),
            call("c-write", "fs::write", json!({"path": "out.txt", "content": "approved write"})),
            text("All done."),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    let r = start(&ctx, "s1", Some(10)).await;
    assert_eq!(
        r,
        json!({"status_code": 200, "body": {"session_id": "s1", "started": true}})
    );

    // The write waits for a human.
    let view = wait_state(&ctx, "s1", "function_awaiting_approval").await;
    assert_eq!(view["awaiting_approval"][0]["function_id"], "fs::write");
    assert!(
        !s.work.join("out.txt").exists(),
        "nothing written before approval"
    );
    let pending = ctx
        .trigger("approval::list_pending", json!({}))
        .await
        .unwrap();
    assert_eq!(pending["pending"][0]["function_call_id"], "c-write");
    // While it waits, the history shows the call (the model's answer is appended with its
    // batch's results, or on its own when the batch parks).
    let parked = record(&s, "s1").await;
    let last = parked["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "assistant", "{last}");
    assert_eq!(last["content"][1]["id"], "c-write", "{last}");
    // A second client approves it.
    let approver = connect_client("approver", RemoteOptions::new(&s.srv.url())).await;
    let bad = approver
        .ctx()
        .trigger(
            "approval::resolve",
            json!({"session_id": "s1", "function_call_id": "nope", "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(bad, json!({"ok": false, "error": "not_pending"}));
    let bad = approver
        .ctx()
        .trigger(
            "approval::resolve",
            json!({"session_id": "s1", "function_call_id": "c-write", "decision": "maybe"}),
        )
        .await
        .unwrap();
    assert_eq!(bad["error"], "invalid_payload");
    let ok = approver.ctx().trigger("approval::resolve", json!({"session_id": "s1", "function_call_id": "c-write", "decision": "allow", "decided_by": "reviewer"})).await.unwrap();
    assert_eq!(ok, json!({"ok": true}));

    let view = wait_state(&ctx, "s1", "stopped").await;
    assert_eq!(view["turn_count"], 4);
    assert_eq!(view["error"], Value::Null);
    assert_eq!(
        std::fs::read_to_string(s.work.join("out.txt")).unwrap(),
        "approved write"
    );

    // The conversation: each call's result, in order, once.
    let rec = record(&s, "s1").await;
    let roles = roles(&rec);
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "function_result",
            "assistant",
            "function_result",
            "assistant",
            "function_result",
            "assistant"
        ],
        "each call before its result"
    );
    let results: Vec<&Value> = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .collect();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["function_call_id"], "c-list");
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(results[0]["details"]["entries"][0]["name"], "notes.txt");
    let denial = &results[1]["details"];
    assert_eq!(denial["status"], "denied");
    assert_eq!(denial["denied_by"], "permissions");
    assert_eq!(
        denial["args_excerpt"]["api_key"], "[redacted]",
        "secrets never reach the denial"
    );
    assert_eq!(results[2]["function_call_id"], "c-write");
    assert_eq!(results[2]["is_error"], false);

    // Events in the SPEC's order.
    let evs = events(&ctx, "s1").await;
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"turn_state_changed"));
    assert_eq!(
        kinds.iter().filter(|k| **k == "message_complete").count(),
        4
    );
    assert_eq!(kinds.iter().filter(|k| **k == "turn_end").count(), 4);
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "function_execution_start")
            .count(),
        3
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "function_execution_end")
            .count(),
        3
    );
    assert_eq!(kinds.iter().filter(|k| **k == "agent_end").count(), 1);
    let pos = |k: &str, nth: usize| {
        kinds
            .iter()
            .enumerate()
            .filter(|(_, x)| **x == k)
            .nth(nth)
            .map(|(i, _)| i)
            .unwrap()
    };
    assert!(pos("message_complete", 0) < pos("function_execution_start", 0));
    assert!(pos("function_execution_start", 0) < pos("function_execution_end", 0));
    assert!(pos("function_execution_end", 0) < pos("turn_end", 0));
    assert!(pos("agent_end", 0) > pos("turn_end", 3));
    assert!(
        evs.iter()
            .filter(|e| e["type"] == "turn_state_changed")
            .all(|e| e["new_value"].get("work").is_none()),
        "views never carry the work list"
    );
    // The UI sees every state pass, steering_check included (it runs inside the step that
    // leads to it, not as a queued step of its own).
    let states: Vec<&str> = evs
        .iter()
        .filter(|e| e["type"] == "turn_state_changed")
        .filter_map(|e| e["new_value"]["state"].as_str())
        .collect();
    assert_eq!(states.first(), Some(&"provisioning"), "{states:?}");
    assert_eq!(states.last(), Some(&"stopped"), "{states:?}");
    assert!(states.contains(&"steering_check"), "{states:?}");
    assert!(
        states
            .windows(2)
            .all(|w| !(w[0] == "function_execute" && w[1] == "assistant_streaming")),
        "a batch's results reach the model through steering_check: {states:?}"
    );

    // One connected trace for the session.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let group = session_group(&ctx, "s1").await;
    assert_eq!(
        group["trace_ids"].as_array().unwrap().len(),
        1,
        "one trace for the run: {group}"
    );
    // A call that ran goes into the history with its result in one write: the record's save
    // carries them (`turn/carried.rs`). The run's trace (up to the park; the approval's
    // wake-up starts its own) holds two appends through the session worker: the user's
    // message, and c-write on its own when it parked.
    let spans = ctx
        .trigger(
            "engine::traces::list",
            json!({"trace_id": group["trace_ids"][0]}),
        )
        .await
        .unwrap();
    let appends = spans["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "session-tree::append_batch" && s["service"] == "engine")
        .count();
    assert_eq!(appends, 2, "history appends of the run up to the park");
    // Between the policy's answer and the call: the record's save with the call's start event
    // (and the batch), not an event write of its own.
    let engine_spans: Vec<&Value> = spans["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["service"] == "engine")
        .collect();
    let start_of = |name: &str| {
        engine_spans
            .iter()
            .filter(|s| s["name"] == name)
            .map(|s| s["start_unix_nanos"].as_u64().unwrap())
            .min()
            .unwrap()
    };
    let (asked, ran) = (start_of("policy::check_permissions"), start_of("fs::list"));
    let writes: Vec<&str> = engine_spans
        .iter()
        .filter(|s| (asked..ran).contains(&s["start_unix_nanos"].as_u64().unwrap()))
        .map(|s| s["name"].as_str().unwrap())
        .filter(|n| n.starts_with("state::") || n.starts_with("stream::"))
        .collect();
    // (Other work of the session's trace may overlap the window: the test's own state polls,
    // the UI's triggers.)
    assert!(
        writes.contains(&"state::transact") && !writes.contains(&"stream::set_many"),
        "the record's save, no event write of its own, before the call ran: {writes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_abort_max_turns_busy_and_stale_steps() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();

    // deny → a DenialEnvelope from the user, and the run goes on.
    s.model.load(Cassette {
        turns: vec![
            call("w1", "fs::write", json!({"path": "a", "content": "x"})),
            text("ok, not writing"),
        ],
        ..Default::default()
    });
    start(&ctx, "deny", None).await;
    wait_state(&ctx, "deny", "function_awaiting_approval").await;
    ctx.trigger("approval::resolve", json!({"session_id": "deny", "function_call_id": "w1", "decision": "deny", "reason": "not today"})).await.unwrap();
    wait_state(&ctx, "deny", "stopped").await;
    let rec = record(&s, "deny").await;
    let result = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "function_result")
        .unwrap();
    assert_eq!(result["details"]["denied_by"], "user");
    assert_eq!(result["details"]["reason"], "not today");
    assert!(!s.work.join("a").exists());

    // aborted → the seeds' meaning: that one call is denied with its reason, and the run
    // goes on to the next model turn (run::abort is how a run stops).
    s.model.load(Cassette {
        turns: vec![
            call("w2", "fs::write", json!({"path": "b", "content": "x"})),
            text("fine, not writing"),
        ],
        ..Default::default()
    });
    start(&ctx, "abort", None).await;
    wait_state(&ctx, "abort", "function_awaiting_approval").await;
    ctx.trigger(
        "approval::resolve",
        json!({"session_id": "abort", "function_call_id": "w2", "decision": "aborted"}),
    )
    .await
    .unwrap();
    let view = wait_state(&ctx, "abort", "stopped").await;
    assert!(view["error"].is_null(), "{view}");
    assert_eq!(view["turn_count"], 2, "the run went on: {view}");
    let rec = record(&s, "abort").await;
    let result = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "function_result")
        .unwrap();
    assert_eq!(result["details"]["denied_by"], "user");
    assert_eq!(result["details"]["reason"], "aborted by the user");
    assert!(!s.work.join("b").exists());

    // max_turns: one turn with a call, then the run stops.
    s.model.load(Cassette {
        turns: vec![call("l1", "fs::list", json!({})), text("never")],
        ..Default::default()
    });
    start(&ctx, "max", Some(1)).await;
    let view = wait_state(&ctx, "max", "stopped").await;
    assert_eq!(view["error"]["kind"], "max_turns");
    assert_eq!(view["turn_count"], 1);

    // Two concurrent starts: one runs, one is busy.
    s.model.load(Cassette {
        turns: vec![call(
            "w3",
            "fs::write",
            json!({"path": "c", "content": "x"}),
        )],
        repeat_last: true,
        ..Default::default()
    });
    let (a, b) = tokio::join!(start(&ctx, "busy", None), start(&ctx, "busy", None));
    let codes = [
        a["status_code"].as_u64().unwrap(),
        b["status_code"].as_u64().unwrap(),
    ];
    assert!(codes.contains(&200) && codes.contains(&409), "{a} {b}");
    let busy = if a["status_code"] == 409 { &a } else { &b };
    assert_eq!(
        busy["body"],
        json!({"session_id": "busy", "started": false, "reason": "session_busy"})
    );

    // A duplicated step for a state the run has left is skipped as stale.
    wait_state(&ctx, "busy", "function_awaiting_approval").await;
    let dup = ctx
        .trigger("turn::provisioning", json!({"session_id": "busy"}))
        .await
        .unwrap();
    assert_eq!(dup, json!({"ok": true, "skipped": true, "reason": "stale"}));
    // run::abort stops a parked run.
    let r = ctx
        .trigger("run::abort", json!({"session_id": "busy"}))
        .await
        .unwrap();
    assert_eq!(
        r,
        json!({"session_id": "busy", "aborted": true, "state": "stopped", "commands_killed": 0})
    );
    let late = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "busy", "function_call_id": "w3", "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(late["error"], "not_pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_failures_end_the_run_clearly() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    for (sid, status, kind) in [
        ("p401", 401, "auth_expired"),
        ("p429", 429, "rate_limited"),
        ("p500", 500, "transient"),
    ] {
        s.model.load(Cassette {
            turns: vec![Turn {
                http_status: Some(status),
                error_message: Some("no".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        start(&ctx, sid, None).await;
        let view = wait_state(&ctx, sid, "stopped").await;
        assert_eq!(view["error"]["kind"], kind, "{sid}: {view}");
        // The stopped event is written just after the record: wait for it, then check order.
        let mut evs = events(&ctx, sid).await;
        for _ in 0..100 {
            if evs
                .iter()
                .any(|e| e["type"] == "turn_state_changed" && e["new_value"]["state"] == "stopped")
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            evs = events(&ctx, sid).await;
        }
        let complete = evs
            .iter()
            .find(|e| e["type"] == "message_complete")
            .unwrap();
        assert_eq!(complete["message"]["stop_reason"], "error");
        let end = evs
            .iter()
            .position(|e| e["type"] == "agent_end")
            .expect("agent_end");
        let stopped = evs
            .iter()
            .position(|e| e["type"] == "turn_state_changed" && e["new_value"]["state"] == "stopped")
            .expect("the stopped state change");
        assert!(end < stopped, "agent_end, then the final state change");
    }
    s.model.load(Cassette {
        turns: vec![Turn {
            text: Some("broken stream".into()),
            malformed: Some("bad_json".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    start(&ctx, "malformed", None).await;
    let view = wait_state(&ctx, "malformed", "stopped").await;
    assert_eq!(view["error"]["kind"], "transient");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_dispatched_once() {
    let s = stack("version: 1\nrules:\n  - \"shell::exec\"\n").await;
    std::fs::create_dir_all(&s.work).unwrap();
    let calls: Vec<ToolCall> = ["c1", "c2", "c3"]
        .iter()
        .map(|id| ToolCall { id: id.to_string(), name: "agent_trigger".into(), arguments: json!({"function": "shell::exec", "payload": {"command": format!("echo {id} >> ran.log; sleep 0.3")}}) })
        .collect();
    s.model.load(Cassette {
        turns: vec![
            Turn {
                tool_calls: calls,
                ..Default::default()
            },
            text("done"),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "once", None).await;
    wait_state(&ctx, "once", "stopped").await;
    let ran = std::fs::read_to_string(s.work.join("ran.log")).unwrap();
    assert_eq!(ran, "c1\nc2\nc3\n");

    // The same through the OpenAI dialect with a stateless cassette.
    let calls: Vec<ToolCall> = ["d1", "d2", "d3", "d4", "d5"]
        .iter()
        .map(|id| ToolCall { id: id.to_string(), name: "agent_trigger".into(), arguments: json!({"function": "shell::exec", "payload": {"command": format!("echo {id} >> ran2.log; sleep 0.4")}}) })
        .collect();
    s.model.load(Cassette {
        turns: vec![
            Turn {
                when: Some("results<1".into()),
                tool_calls: calls,
                text: Some("Running.".into()),
                ..Default::default()
            },
            Turn {
                when: Some("results>=1".into()),
                ..text("done")
            },
        ],
        ..Default::default()
    });
    ctx.trigger("harness::trigger", json!({"session_id": "once2", "payload": {"provider": "scripted", "model": "scripted-demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]}})).await.unwrap();
    wait_state(&ctx, "once2", "stopped").await;
    let ran = std::fs::read_to_string(s.work.join("ran2.log")).unwrap();
    assert_eq!(ran, "d1\nd2\nd3\nd4\nd5\n");
}

/// The batch's last call is held by the step's next save (after the history append, through
/// a session worker that names no layout), not a save of its own: when the step fails
/// between the two (here the append, once), the record after the call is still saved
/// durably, and the redelivered step does not run it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_fails_after_its_last_call_does_not_run_it_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let s = stack("version: 1\nrules:\n  - \"shell::exec\"\n").await;
    std::fs::create_dir_all(&s.work).unwrap();
    s.model.load(Cassette {
        turns: vec![
            call(
                "e1",
                "shell::exec",
                json!({"command": "echo e1 >> ran.log"}),
            ),
            text("done"),
        ],
        ..Default::default()
    });
    // The session tree's append, failing once for the batch's results, else the real one.
    let failures = std::sync::Arc::new(AtomicUsize::new(0));
    let f = failures.clone();
    let _flaky = in_front_of_the_append(
        &s,
        "flaky-session",
        "fails the first append of function results, then appends",
        move |data| {
            let results = data["entries"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["message"]["role"] == "function_result"));
            if results && f.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(engine_gateway::protocol::ErrorBody::new(
                    "storage_error",
                    "the session store is away for a moment",
                ));
            }
            Ok(())
        },
    )
    .await;
    let ctx = s.client.ctx();
    start(&ctx, "after-call", None).await;
    wait_state(&ctx, "after-call", "stopped").await;
    assert!(
        failures.load(Ordering::SeqCst) >= 2,
        "the append failed once, then ran again"
    );
    let ran = std::fs::read_to_string(s.work.join("ran.log")).unwrap();
    assert_eq!(ran, "e1\n", "the call ran once");
    let rec = record(&s, "after-call").await;
    assert_eq!(rec["error"], Value::Null, "{rec}");
    let roles = roles(&rec);
    assert_eq!(roles, ["user", "assistant", "function_result", "assistant"]);
}

/// `session-tree::append_batch` replaced by a worker `name` that hands each payload to
/// `before` (which may change it, or answer an error in the append's place) and then to the
/// real session worker's append, whose answer then names no layout (so the orchestrator
/// appends every batch through it, never in the record's save: `turn/carried.rs`).
async fn in_front_of_the_append(
    s: &Stack,
    name: &str,
    description: &str,
    before: impl Fn(&mut Value) -> Result<(), engine_gateway::protocol::ErrorBody>
    + Send
    + Sync
    + 'static,
) -> harness_sdk::WorkerHandle {
    const APPEND: &str = "session-tree::append_batch";
    unregister(s, APPEND).await;
    let real = session_worker::worker().handler(APPEND).cloned().unwrap();
    let before = std::sync::Arc::new(before);
    let wrapper = harness_sdk::Worker::new(name).function(
        APPEND,
        description,
        move |ctx, mut data: Value| {
            let (real, before) = (real.clone(), before.clone());
            async move {
                before(&mut data)?;
                let mut answer = real(ctx, data).await?;
                // It names no layout: the orchestrator appends every batch through it.
                if let Some(index) = answer.get_mut("index").and_then(Value::as_object_mut) {
                    index.remove("layout");
                }
                Ok(answer)
            }
        },
    );
    harness_sdk::run_embedded(wrapper, &s.srv.engine).unwrap()
}

/// A session worker from before `with_messages` and `peek_inboxes` (it ignores both, as an
/// older or swapped-in one would): the orchestrator reads the history and peeks the inboxes
/// itself, and a session's second run still continues its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_worker_that_ignores_the_newer_append_fields_still_runs_turns() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let s = stack(PERMISSIONS).await;
    s.model.load(Cassette {
        turns: vec![
            call("o1", "fs::list", json!({})),
            text("listed the files"),
            text("second run"),
        ],
        ..Default::default()
    });
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let a = asked.clone();
    let _older = in_front_of_the_append(
        &s,
        "older-session",
        "appends, knowing neither `with_messages` nor `peek_inboxes`",
        move |data| {
            if let Some(o) = data.as_object_mut() {
                let newer =
                    o.remove("with_messages").is_some() | o.remove("peek_inboxes").is_some();
                if newer {
                    a.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(())
        },
    )
    .await;
    let ctx = s.client.ctx();
    for _ in 0..2 {
        start(&ctx, "older", None).await;
        let state = wait_state(&ctx, "older", "stopped").await;
        assert_eq!(state["error"], Value::Null, "{state}");
    }
    assert!(
        asked.load(Ordering::SeqCst) >= 2,
        "the orchestrator asked for the newer fields"
    );
    // The second run's model call carried the first run's conversation.
    let requests = s.model.requests();
    let last = requests.last().unwrap().to_string();
    assert!(last.contains("listed the files"), "{last}");
    let rec = record(&s, "older").await;
    let roles = roles(&rec);
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "function_result",
            "assistant",
            "user",
            "assistant"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_subscribers_get_the_session_events_pushed() {
    let s = stack(PERMISSIONS).await;
    s.model.load(Cassette {
        turns: vec![call("l1", "fs::list", json!({})), text("listed")],
        ..Default::default()
    });
    let browser = connect_client("browser", RemoteOptions::new(&s.srv.url())).await;
    let mut pushes = browser.pushes().unwrap();
    let everything = connect_client("dashboard", RemoteOptions::new(&s.srv.url())).await;
    let mut all_pushes = everything.pushes().unwrap();
    let ctx = s.client.ctx();
    let r = ctx
        .trigger(
            "ui::subscribe",
            json!({"browser_id": browser.worker_id(), "session_id": "ui1"}),
        )
        .await
        .unwrap();
    assert_eq!(r["sessions"], json!(["ui1"]));
    ctx.trigger(
        "ui::subscribe",
        json!({"browser_id": everything.worker_id(), "session_id": null}),
    )
    .await
    .unwrap();
    start(&ctx, "ui1", None).await;
    let mut kinds = Vec::new();
    // The stored events' sequence numbers (item `<session>-<seq>`), as the browser got them.
    let mut seqs = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(10), pushes.recv()).await {
        let engine_gateway::protocol::Message::Push { data } = m else {
            continue;
        };
        let kind = data["event"]["data"]["type"]
            .as_str()
            .unwrap_or("")
            .to_string();
        kinds.push(kind.clone());
        if let Some(seq) = data["item_id"]
            .as_str()
            .and_then(|i| i.strip_prefix("ui1-"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            seqs.push(seq);
        }
        if kind == "agent_end" {
            break;
        }
    }
    assert!(seqs.len() > 3, "{seqs:?}");
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "the session's events reach the browser in the order they were written: {seqs:?} ({kinds:?})"
    );
    assert!(kinds.contains(&"message_update".to_string()), "{kinds:?}");
    assert!(
        kinds.contains(&"function_execution_end".to_string()),
        "{kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("agent_end"));
    let first = tokio::time::timeout(Duration::from_secs(5), all_pushes.recv())
        .await
        .unwrap()
        .unwrap();
    let engine_gateway::protocol::Message::Push { data } = first else {
        panic!("a push")
    };
    assert_eq!(
        data,
        json!({"type": "session_created", "session_id": "ui1"}),
        "all-session subscribers hear of new sessions"
    );
    let r = ctx
        .trigger(
            "ui::unsubscribe",
            json!({"browser_id": browser.worker_id(), "session_id": "ui1"}),
        )
        .await
        .unwrap();
    assert_eq!(r["sessions"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_policy_means_every_call_is_denied_as_gate_unavailable() {
    let s = stack(PERMISSIONS).await;
    // Take the policy away.
    unregister(&s, "policy::check_permissions").await;
    s.model.load(Cassette {
        turns: vec![call("r1", "fs::list", json!({})), text("I could not list.")],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "closed", None).await;
    wait_state(&ctx, "closed", "stopped").await;
    let rec = record(&s, "closed").await;
    let result = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "function_result")
        .unwrap();
    assert_eq!(result["is_error"], true);
    assert_eq!(result["details"]["status"], "denied");
    assert_eq!(
        result["details"]["denied_by"], "gate_unavailable",
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_allows_everything_still_cannot_let_the_agent_act_as_a_human() {
    let s = stack(PERMISSIONS).await;
    // A swapped policy (any worker granted `policy::`) that allows every call.
    let _lax = harness_sdk::run_embedded(
        harness_sdk::Worker::new("lax-policy").function(
            "policy::check_permissions",
            "allows everything",
            |_c, _d: Value| async move { Ok(json!({"decision": "allow", "rule_id": "everything"})) },
        ),
        &s.srv.engine,
    )
    .unwrap();
    // A new worker declares one of its functions for humans only; the other is the agent's.
    let ran_private = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let private_flag = ran_private.clone();
    let _ops = harness_sdk::run_embedded(
        harness_sdk::Worker::new("ops")
            .function(
                "ops::rotate_keys",
                "rotates every key (for operators)",
                move |_c, _d: Value| {
                    let f = private_flag.clone();
                    async move {
                        f.store(true, std::sync::atomic::Ordering::SeqCst);
                        Ok(json!({"rotated": true}))
                    }
                },
            )
            .not_for_the_agent("ops::rotate_keys")
            .function(
                "ops::status",
                "how things are",
                |_c, _d: Value| async move { Ok(json!({"ok": true})) },
            ),
        &s.srv.engine,
    )
    .unwrap();
    let internal = [
        ("a8", "auth::get_token", json!({"provider": "anthropic"})),
        (
            "a9",
            "harness::trigger",
            json!({"session_id": "planted", "payload": {"message": "hi"}}),
        ),
        (
            "a10",
            "budget::exempt",
            json!({"budget_id": "b", "principal_id": "lax", "reason": "me"}),
        ),
        (
            "a11",
            "stream::set",
            json!({"stream_name": "agent::events", "group_id": "x", "item_id": "i", "data": {}}),
        ),
        (
            "a12",
            "session-tree::append",
            json!({"session_id": "other", "entry": {}}),
        ),
        (
            "a13",
            "hook-fanout::publish_collect",
            json!({"topic": "t", "payload": {}, "merge_rule": "field_merge"}),
        ),
        ("a14", "ops::rotate_keys", json!({})),
        (
            "a1",
            "approval::resolve",
            json!({"session_id": "human", "function_call_id": "x", "decision": "allow"}),
        ),
        (
            "a2",
            "policy::check_permissions",
            json!({"function_id": "shell::exec"}),
        ),
        (
            "a3",
            "run::start",
            json!({"session_id": "other", "provider": "anthropic", "model": "claude-sonnet-4-5"}),
        ),
        (
            "a4",
            "auth::set_token",
            json!({"provider": "anthropic", "token": {"type": "api_key", "key": "stolen"}}),
        ),
        (
            "a5",
            "state::set",
            json!({"scope": "agent", "key": "k", "value": 1}),
        ),
        (
            "a6",
            "engine::durable::publish",
            json!({"topic": "t", "data": 1}),
        ),
    ];
    let mut turns: Vec<Turn> = internal
        .iter()
        .map(|(id, f, p)| call(id, f, p.clone()))
        .collect();
    // Ordinary calls the lax policy lets through, to show it is in charge otherwise.
    turns.push(call("a7", "fs::list", json!({})));
    turns.push(call("a15", "ops::status", json!({})));
    turns.push(text("Done."));
    s.model.load(Cassette {
        turns,
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "lax", Some(20)).await;
    wait_state(&ctx, "lax", "stopped").await;
    let rec = record(&s, "lax").await;
    let results: Vec<&Value> = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .collect();
    assert_eq!(results.len(), internal.len() + 2, "{rec}");
    for (_, function_id, _) in &internal {
        let r = results
            .iter()
            .find(|r| r["function_id"] == *function_id)
            .unwrap_or_else(|| panic!("a result for {function_id}"));
        assert_eq!(r["is_error"], true, "{r}");
        assert_eq!(r["details"]["status"], "denied", "{r}");
        assert_eq!(r["details"]["rule_id"], "harness.internal_only", "{r}");
    }
    let listed = results
        .iter()
        .find(|r| r["function_id"] == "fs::list")
        .unwrap();
    assert_eq!(listed["is_error"], false, "{listed}");
    let status = results
        .iter()
        .find(|r| r["function_id"] == "ops::status")
        .unwrap();
    assert_eq!(status["is_error"], false, "{status}");
    // No provider key reached the model, and nothing the model asked for happened.
    assert!(!rec.to_string().contains("sk-"), "{rec}");
    assert!(!ran_private.load(std::sync::atomic::Ordering::SeqCst));
    assert!(
        ctx.trigger("turn::get_state", json!({"session_id": "planted"}))
            .await
            .unwrap()
            .is_null()
    );
    // Nothing the model asked for happened.
    assert!(
        ctx.state_get("approvals", "human/x")
            .await
            .unwrap()
            .is_null()
    );
    assert!(ctx.state_get("agent", "k").await.unwrap().is_null());
    assert!(
        ctx.trigger("turn::get_state", json!({"session_id": "other"}))
            .await
            .unwrap()
            .is_null()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_applies_only_to_the_call_it_was_given_for() {
    let s = stack(PERMISSIONS).await;
    std::fs::create_dir_all(&s.work).unwrap();
    // The model reuses its call id: first a write, then a command under the same id. And two
    // calls of one message with empty and repeated ids must not collide either.
    s.model.load(Cassette {
        turns: vec![
            call(
                "dup",
                "fs::write",
                json!({"path": "a.txt", "content": "approved"}),
            ),
            call(
                "dup",
                "shell::exec",
                json!({"command": "echo replayed > b.txt"}),
            ),
            Turn {
                tool_calls: vec![
                    ToolCall {
                        id: String::new(),
                        name: "agent_trigger".into(),
                        arguments: json!({"function": "fs::list", "payload": {}}),
                    },
                    ToolCall {
                        id: String::new(),
                        name: "agent_trigger".into(),
                        arguments: json!({"function": "fs::read", "payload": {"path": "a.txt"}}),
                    },
                ],
                ..Default::default()
            },
            text("Done."),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "replay", Some(10)).await;
    let view = wait_state(&ctx, "replay", "function_awaiting_approval").await;
    assert_eq!(view["awaiting_approval"][0]["function_id"], "fs::write");
    let ok = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "replay", "function_call_id": "dup", "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(ok, json!({"ok": true}));

    // The command arrives under the same id: it parks and runs nothing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let view = loop {
        let view = ctx
            .trigger("turn::get_state", json!({"session_id": "replay"}))
            .await
            .unwrap();
        if view["state"] == "function_awaiting_approval"
            && view["awaiting_approval"][0]["function_id"] == "shell::exec"
        {
            break view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command never parked: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        view["awaiting_approval"][0]["function_id"], "shell::exec",
        "{view}"
    );
    // The reused id was replaced: the command has an id of its own within the session.
    let second = view["awaiting_approval"][0]["function_call_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(second, "dup", "{view}");
    // A replay of the first decision under the model's id finds nothing parked there.
    let replay = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "replay", "function_call_id": "dup", "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(replay["error"], "not_pending", "{replay}");
    assert_eq!(
        std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
        "approved"
    );
    // The first decision was consumed: it is gone, and nothing ran the command.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !s.work.join("b.txt").exists(),
        "the replayed approval ran nothing"
    );
    let view = ctx
        .trigger("turn::get_state", json!({"session_id": "replay"}))
        .await
        .unwrap();
    assert_eq!(view["state"], "function_awaiting_approval", "{view}");
    // It is decided under its own id.
    let ok = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "replay", "function_call_id": second, "decision": "deny", "reason": "not this one"}),
        )
        .await
        .unwrap();
    assert_eq!(ok, json!({"ok": true}));
    // Decided once: a second decision for the same parked call is refused.
    let again = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "replay", "function_call_id": second, "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(again["error"], "not_pending", "{again}");
    wait_state(&ctx, "replay", "stopped").await;
    assert!(!s.work.join("b.txt").exists());
    let rec = record(&s, "replay").await;
    let results: Vec<&Value> = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .collect();
    assert_eq!(results.len(), 4, "{rec}");
    assert_eq!(results[1]["details"]["denied_by"], "user");
    // The two id-less calls got ids of their own, and the stored call blocks carry the same.
    let (a, b) = (
        results[2]["function_call_id"].as_str().unwrap(),
        results[3]["function_call_id"].as_str().unwrap(),
    );
    assert!(!a.is_empty() && !b.is_empty() && a != b, "{a} {b}");
    assert_eq!(
        results[3]["details"]["content"], "approved",
        "{}",
        results[3]
    );
    let blocks: Vec<String> = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "function_call")
        .map(|c| c["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        blocks.iter().any(|id| id == a) && blocks.iter().any(|id| id == b),
        "{blocks:?}"
    );
}

/// A provider that is not on the bus (yet) is a transient failure of the step: it is retried
/// with backoff, the UI sees `turn_step_retry`, and the run goes on once the provider is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_provider_is_retried_not_the_end_of_the_run() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    let mut pushes = s.client.pushes().expect("pushes");
    s.client
        .send_raw(&engine_gateway::protocol::Message::StreamSubscribe {
            stream_name: "agent::events".into(),
            group_id: Some("late1".into()),
            batch: false,
        })
        .unwrap();
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": "late1", "payload": {"provider": "late", "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]}}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    // Two attempts (at 0 s and 1 s) fail and say so; the run is still streaming, not stopped.
    let mut retries = Vec::new();
    while retries.len() < 2 {
        let msg = tokio::time::timeout(Duration::from_secs(20), pushes.recv())
            .await
            .expect("retry events within 20 s")
            .expect("pushes open");
        if let engine_gateway::protocol::Message::StreamEvent { event, .. } = msg
            && event.data["type"] == "turn_step_retry"
        {
            retries.push(event.data);
        }
    }
    assert!(
        retries[0]["error"]
            .as_str()
            .unwrap()
            .contains("provider::late::stream: function_not_found"),
        "{retries:?}"
    );
    let view = ctx
        .trigger("turn::get_state", json!({"session_id": "late1"}))
        .await
        .unwrap();
    assert_eq!(view["state"], "assistant_streaming", "{view}");
    // The provider arrives; the next retry reaches it and the run ends normally.
    let model = scripted_model::ScriptedModel::new(scripted_model::Cassette {
        turns: vec![text("here now")],
        ..Default::default()
    });
    let base = model.serve().await.unwrap();
    let _late = harness_sdk::run_embedded(
        provider_core::worker(std::sync::Arc::new(provider_openai::OpenAiDialect {
            name: "late".into(),
            base_url: format!("{base}/v1"),
            key_optional: true,
        })),
        &s.srv.engine,
    )
    .unwrap();
    let view = wait_state(&ctx, "late1", "stopped").await;
    assert_eq!(view["error"], Value::Null, "{view}");
}

/// `run::abort` during a long command kills the command (the sandbox's whole process tree),
/// not only the run's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_abort_kills_the_command_in_flight() {
    let s = stack("version: 1\nrules:\n  - \"shell::exec\"\n").await;
    let ctx = s.client.ctx();
    let marker = format!("7{}.25", std::process::id());
    s.model.load(Cassette {
        turns: vec![
            call(
                "c1",
                "shell::exec",
                json!({"command": format!("sleep {marker}"), "timeout_ms": 120_000}),
            ),
            text("never reached"),
        ],
        ..Default::default()
    });
    start(&ctx, "abort-cmd", None).await;
    let alive = |marker: &str| common::process::processes(marker, Some("sleep"), None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while alive(&marker) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = ctx
        .trigger("run::abort", json!({"session_id": "abort-cmd"}))
        .await
        .unwrap();
    assert_eq!(r["aborted"], true, "{r}");
    assert_eq!(r["commands_killed"], 1, "{r}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while alive(&marker) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command outlived run::abort"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let view = wait_state(&ctx, "abort-cmd", "stopped").await;
    assert_eq!(view["error"]["kind"], "aborted", "{view}");
}

/// The network is closed to commands unless the policy rule that allowed the call opens it;
/// the model cannot open it by asking in its arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_policy_rule_opens_the_network_to_a_command() {
    let s = stack(
        "version: 1\nrules:\n  - function: \"shell::exec\"\n    action: allow\n    network: true\n    args:\n      command: {matches: \"^bash -c 'echo granted\"}\n  - \"shell::exec\"\n",
    )
    .await;
    let ctx = s.client.ctx();
    let report = ctx.trigger("shell::sandbox", json!({})).await.unwrap();
    if report["layers"]["network"] != true {
        eprintln!("SKIPPED: the network layer is not active here: {report}");
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let got = seen.clone();
    let acceptor = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            use tokio::io::AsyncReadExt;
            let mut line = String::new();
            let _ = sock.read_to_string(&mut line).await;
            got.lock().unwrap().push(line.trim().to_string());
        }
    });
    let send = |word: &str| format!("bash -c 'echo {word} > /dev/tcp/127.0.0.1/{port}'");
    s.model.load(Cassette {
        turns: vec![
            call("n1", "shell::exec", json!({"command": send("granted")})),
            call(
                "n2",
                "shell::exec",
                json!({"command": send("smuggled"), "sandbox": {"network": true}}),
            ),
            text("done"),
        ],
        ..Default::default()
    });
    start(&ctx, "net1", None).await;
    wait_state(&ctx, "net1", "stopped").await;
    let evs = events(&ctx, "net1").await;
    let results: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "function_execution_end")
        .collect();
    assert_eq!(results.len(), 2, "{evs:?}");
    for _ in 0..40 {
        if !seen.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    acceptor.abort();
    assert_eq!(
        *seen.lock().unwrap(),
        ["granted"],
        "only the granted call connected"
    );
}

/// A lost wake-up is retried: the approval's state trigger fails twice, succeeds the third
/// time, and the parked session resumes exactly once (the engine acknowledges the change
/// only after its handler succeeded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_wake_up_that_fails_twice_still_resumes_the_session_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let s = stack(PERMISSIONS).await;
    s.model.load(Cassette {
        turns: vec![
            call(
                "w1",
                "fs::write",
                json!({"path": "woke.txt", "content": "once"}),
            ),
            text("Done."),
        ],
        ..Default::default()
    });
    // Stands in for the orchestrator's wake-up handler (the trigger calls it by id): it fails
    // twice, then queues the same step the real one would.
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let flaky = harness_sdk::Worker::new("flaky-wake").function(
        "turn::on_approval",
        "fails twice, then wakes the session",
        move |ctx, ev: Value| {
            let c = c.clone();
            async move {
                if ev["event_type"] == "state:deleted" {
                    return Ok(json!({"ignored": true}));
                }
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= 2 {
                    return Err(engine_gateway::protocol::ErrorBody::new(
                        "invocation_error",
                        format!("wake-up failure {n}"),
                    ));
                }
                let sid = ev["key"]
                    .as_str()
                    .unwrap()
                    .split('/')
                    .next()
                    .unwrap()
                    .to_string();
                ctx.enqueue_with(
                    "turn-steps",
                    "turn::function_awaiting_approval",
                    json!({"session_id": sid}),
                    harness_sdk::EnqueueOptions {
                        message_group_id: Some(sid.clone()),
                        deduplication_id: Some(format!("{sid}-flaky-wake")),
                    },
                )
                .await?;
                Ok(json!({"woke": sid}))
            }
        },
    );
    let _flaky = harness_sdk::run_embedded(flaky, &s.srv.engine).unwrap();
    let ctx = s.client.ctx();
    start(&ctx, "wake", None).await;
    wait_state(&ctx, "wake", "function_awaiting_approval").await;
    // Parking saves the record, then queues one `function_awaiting_approval` step of its own,
    // which applies a decision already there. Decided before that step runs (the emulator's
    // queue can take longer than this test's poll), the session would go on without any
    // wake-up, and this test would not test one.
    wait_step_done(&ctx, "wake", "turn::function_awaiting_approval").await;
    let ok = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "wake", "function_call_id": "w1", "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(ok, json!({"ok": true}));
    let view = wait_state(&ctx, "wake", "stopped").await;
    assert_eq!(view["error"], Value::Null, "{view}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two failures, one success, no more"
    );
    assert_eq!(
        std::fs::read_to_string(s.work.join("woke.txt")).unwrap(),
        "once"
    );
    let ends = events(&ctx, "wake")
        .await
        .into_iter()
        .filter(|e| e["type"] == "function_execution_end")
        .count();
    assert_eq!(ends, 1, "the call ran once");
}

/// Fast turns run chained in the step that queued the first of them (`driver::Chain`): a run
/// of twelve quick tool turns takes fewer `assistant_streaming` steps than turns, and every
/// turn still reaches the history. On the AWS backend a turn may outlast the chain's budget,
/// so there only the history is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_turns_run_in_fewer_steps_than_turns() {
    let s = stack("version: 1\nrules:\n  - \"fs::list\"\n").await;
    if let Some(steps) = thirteen_fast_turns(&s, "chained").await {
        assert!(
            (1..14).contains(&steps),
            "provisioning and thirteen model turns in {steps} steps"
        );
    }
}

/// How long a step chains turns is the orchestrator's `chain_budget` (what
/// `HARNESS_CHAIN_BUDGET_MS` sets, the deployed template's 1 s): at zero every turn is a step
/// of its own, within a long budget a fast run is one step (its provisioning's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_budget_decides_how_many_turns_one_step_runs() {
    for (budget, sid, expected) in [
        (Duration::ZERO, "unchained", 14..15),
        (Duration::from_secs(10), "one-step", 1..2),
    ] {
        let s = stack("version: 1\nrules:\n  - \"fs::list\"\n").await;
        // This orchestrator (the last registration wins) chains for `budget`.
        let _orchestrator = harness_sdk::run_embedded(
            turn_orchestrator::worker_with(turn_orchestrator::Settings {
                chain_budget: budget,
                ..Default::default()
            }),
            &s.srv.engine,
        )
        .unwrap();
        if let Some(steps) = thirteen_fast_turns(&s, sid).await {
            assert!(
                expected.contains(&steps),
                "a chain budget of {budget:?}: provisioning and thirteen model turns in {steps} steps"
            );
        }
    }
}

/// A run of thirteen model turns (twelve `fs::list` calls, then text) in session `sid`,
/// checked to its end; the number of steps it took, `provisioning` and `assistant_streaming`
/// (embedded only: the engine's spans count them).
async fn thirteen_fast_turns(s: &Stack, sid: &str) -> Option<usize> {
    std::fs::create_dir_all(&s.work).unwrap();
    let mut turns: Vec<Turn> = (0..12)
        .map(|i| Turn {
            when: Some(format!("results>={i} && results<{}", i + 1)),
            tool_calls: vec![ToolCall {
                id: format!("l{i}"),
                name: "agent_trigger".into(),
                arguments: json!({"function": "fs::list", "payload": {"path": "."}}),
            }],
            ..text(&format!("turn {i}"))
        })
        .collect();
    turns.push(Turn {
        when: Some("results>=12".into()),
        ..text("done")
    });
    s.model.load(Cassette {
        turns,
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, sid, Some(50)).await;
    let view = wait_state(&ctx, sid, "stopped").await;
    assert_eq!(view["error"], Value::Null, "{view}");
    assert_eq!(view["turn_count"], 13, "{view}");
    let history = ctx
        .trigger("session-tree::messages", json!({"session_id": sid}))
        .await
        .unwrap();
    let results = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .count();
    assert_eq!(results, 12, "{history}");
    if engine_gateway::server::aws_test_backend() {
        return None;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let group = session_group(&ctx, sid).await;
    Some(
        engine_span_count(&ctx, &group, "turn::provisioning").await
            + engine_span_count(&ctx, &group, "turn::assistant_streaming").await,
    )
}

/// Wait until the engine has recorded a finished `step` (a turn step's span) of session
/// `sid`: spans are kept when they end.
async fn wait_step_done(ctx: &harness_sdk::Ctx, sid: &str, step: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(group) = find_session_group(ctx, sid).await
            && engine_span_count(ctx, &group, step).await > 0
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no finished {step} step of session {sid}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many spans named `name` the engine recorded in a session group's traces.
async fn engine_span_count(ctx: &harness_sdk::Ctx, group: &Value, name: &str) -> usize {
    let mut count = 0;
    for trace in group["trace_ids"].as_array().unwrap() {
        let spans = ctx
            .trigger("engine::traces::list", json!({"trace_id": trace}))
            .await
            .unwrap();
        count += spans["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"] == name && s["service"] == "engine")
            .count();
    }
    count
}

/// The engine's span group of session `sid` (its trace ids), by `engine::traces::group_by`.
async fn session_group(ctx: &harness_sdk::Ctx, sid: &str) -> Value {
    find_session_group(ctx, sid)
        .await
        .unwrap_or_else(|g| panic!("no spans of session {sid}: {g}"))
}

/// [`session_group`], or the engine's whole answer while it holds no span of the session.
async fn find_session_group(ctx: &harness_sdk::Ctx, sid: &str) -> Result<Value, Value> {
    let g = ctx
        .trigger(
            "engine::traces::group_by",
            json!({"attribute": ATTR_SESSION_ID}),
        )
        .await
        .unwrap();
    g["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["value"] == sid)
        .cloned()
        .ok_or(g)
}

/// A step whose retries run out no longer leaves its run in `assistant_streaming` for ever:
/// the run ends `failed` with the reason, the UI hears `message_complete {stop_reason:
/// "error"}` and `agent_end`, and redriving the dead letter afterwards changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_fails_on_every_retry_ends_the_run_failed() {
    // One retry (1 s) before the step is dead-lettered. This test runs in its own process.
    unsafe { std::env::set_var("HARNESS_STEP_RETRY_SECS", "1") };
    let s = stack(PERMISSIONS).await;
    s.model.load(Cassette {
        turns: vec![text("an answer the session store never takes")],
        ..Default::default()
    });
    const APPEND: &str = "session-tree::append_batch";
    unregister(&s, APPEND).await;
    let broken = harness_sdk::Worker::new("broken-session").function(
        APPEND,
        "always away",
        |_ctx, _data: Value| async move {
            Err(engine_gateway::protocol::ErrorBody::new(
                "storage_error",
                "the session store is away",
            ))
        },
    );
    let _broken = harness_sdk::run_embedded(broken, &s.srv.engine).unwrap();
    let ctx = s.client.ctx();
    start(&ctx, "doomed", None).await;
    let view = wait_state(&ctx, "doomed", "failed").await;
    assert!(
        view["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the session store is away"),
        "{view}"
    );
    let rec = record(&s, "doomed").await;
    assert_eq!(rec["error"]["kind"], "retries_exhausted", "{rec}");
    let evs = events(&ctx, "doomed").await;
    let complete = evs
        .iter()
        .rev()
        .find(|e| e["type"] == "message_complete")
        .expect("a message_complete");
    assert_eq!(complete["message"]["stop_reason"], "error", "{complete}");
    assert_eq!(
        evs.iter().filter(|e| e["type"] == "agent_end").count(),
        1,
        "one agent_end"
    );
    // The message was still dead-lettered (an operator sees it); redriving it does nothing
    // to the failed run.
    wait_until("the step to be dead-lettered", || async {
        ctx.trigger("engine::queue::stats", json!({"queue": "turn-steps"}))
            .await
            .map(|v| v["dead"].as_u64().unwrap_or(0) >= 1)
            .unwrap_or(false)
    })
    .await;
    let r = ctx
        .trigger("engine::queue::redrive", json!({"queue": "turn-steps"}))
        .await
        .unwrap();
    assert!(r["redriven"].as_u64().unwrap() >= 1, "{r}");
    wait_until("the redriven step to be handled", || async {
        ctx.trigger("engine::queue::stats", json!({"queue": "turn-steps"}))
            .await
            .map(|v| v["dead"] == 0 && v["pending"] == 0 && v["in_flight"] == 0)
            .unwrap_or(false)
    })
    .await;
    let again = ctx
        .trigger("turn::get_state", json!({"session_id": "doomed"}))
        .await
        .unwrap();
    assert_eq!(again["state"], "failed", "{again}");
    assert_eq!(
        events(&ctx, "doomed")
            .await
            .iter()
            .filter(|e| e["type"] == "agent_end")
            .count(),
        1,
        "still one agent_end"
    );
}

async fn wait_until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two different records written under one parked call's key each wake the session: the
/// first (bound to another function) decides nothing, the second (the seeds' `{decision,
/// reason}`, no time in it) decides. The wake-up is per record written, not per `decided_at`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_record_under_the_same_key_wakes_the_session_again() {
    let s = stack(PERMISSIONS).await;
    s.model.load(Cassette {
        turns: vec![
            call("w9", "fs::write", json!({"path": "z.txt", "content": "x"})),
            text("not written"),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "twice", None).await;
    wait_state(&ctx, "twice", "function_awaiting_approval").await;
    ctx.state_set(
        "approvals",
        "twice/w9",
        json!({"decision": "allow", "reason": null, "function_id": "shell::exec"}),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let view = ctx
        .trigger("turn::get_state", json!({"session_id": "twice"}))
        .await
        .unwrap();
    assert_eq!(
        view["state"], "function_awaiting_approval",
        "a record bound to another function decides nothing: {view}"
    );
    ctx.state_set(
        "approvals",
        "twice/w9",
        json!({"decision": "deny", "reason": "second thoughts"}),
    )
    .await
    .unwrap();
    wait_state(&ctx, "twice", "stopped").await;
    let rec = record(&s, "twice").await;
    let result = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "function_result")
        .unwrap()
        .clone();
    assert_eq!(result["details"]["reason"], "second thoughts", "{result}");
    assert!(!s.work.join("z.txt").exists());
}
