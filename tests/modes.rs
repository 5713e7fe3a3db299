//! A run's `mode` as the seeds define it, and the skills index its prompt carries: `plan` runs
//! only what the policy allows as a read and denies the rest (nothing parks), `ask` parks every
//! call for approval, an unknown mode is refused with the list of modes; the prompt's skills
//! index covers the run's `system_default_skills`, not every namespace on the bus.

use crate::common;

use common::*;
use scripted_model::{Cassette, ToolCall, Turn};
use serde_json::{Value, json};

/// fs::list is allowed as a read; fs::write is allowed, but not as a read; shell::exec is not
/// listed (it would need approval).
const RULES: &str = "version: 1\nrules:\n  - {function: \"fs::list\", action: allow, read_only: true}\n  - \"fs::write\"\n";

fn three_calls() -> Turn {
    let call = |id: &str, function: &str, payload: Value| ToolCall {
        id: id.into(),
        name: "agent_trigger".into(),
        arguments: json!({"function": function, "payload": payload}),
    };
    Turn {
        tool_calls: vec![
            call("m1", "fs::list", json!({})),
            call("m2", "fs::write", json!({"path": "p.txt", "content": "x"})),
            call("m3", "shell::exec", json!({"command": "echo hi"})),
        ],
        ..Default::default()
    }
}

async fn trigger(ctx: &harness_sdk::Ctx, sid: &str, payload: Value) -> Value {
    let mut payload = payload;
    payload["provider"] = json!("anthropic");
    payload["model"] = json!("claude-sonnet-5-5");
    payload["messages"] =
        json!([{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]);
    ctx.trigger(
        "harness::trigger",
        json!({"session_id": sid, "payload": payload}),
    )
    .await
    .unwrap()
}

fn results(rec: &Value) -> Vec<Value> {
    rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_runs_only_reads_and_ask_parks_every_call() {
    let s = stack(RULES).await;
    std::fs::create_dir_all(&s.work).unwrap();
    let ctx = s.client.ctx();

    // plan: the read runs; the write (allowed, not a read) and the command are denied.
    s.model.load(Cassette {
        turns: vec![three_calls(), text("here is the plan")],
        ..Default::default()
    });
    let r = trigger(&ctx, "plan", json!({"mode": "plan"})).await;
    assert_eq!(r["status_code"], 200, "{r}");
    let view = wait_state(&ctx, "plan", "stopped").await;
    assert!(view["error"].is_null(), "{view}");
    let got = results(&record(&s, "plan").await);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0]["is_error"], false, "the read ran: {}", got[0]);
    for denied in &got[1..] {
        assert_eq!(denied["details"]["status"], "denied", "{denied}");
        assert_eq!(denied["details"]["rule_id"], "mode-plan", "{denied}");
        assert!(
            denied["details"]["reason"]
                .as_str()
                .unwrap()
                .contains("plan mode")
        );
    }
    assert!(!s.work.join("p.txt").exists(), "nothing was written");
    let system = s.model.requests()[0]["body"]["system"].to_string();
    assert!(system.contains("Mode: plan"), "{system}");

    // ask: even the read waits for a person.
    s.model.load(Cassette {
        turns: vec![call("a1", "fs::list", json!({})), text("listed")],
        ..Default::default()
    });
    trigger(&ctx, "ask", json!({"mode": "ask"})).await;
    let view = wait_state(&ctx, "ask", "function_awaiting_approval").await;
    assert_eq!(view["awaiting_approval"][0]["function_id"], "fs::list");
    let ok = ctx
        .trigger(
            "approval::resolve",
            json!({"session_id": "ask", "function_call_id": "a1", "decision": "allow"}),
        )
        .await
        .unwrap();
    assert_eq!(ok, json!({"ok": true}));
    wait_state(&ctx, "ask", "stopped").await;
    let got = results(&record(&s, "ask").await);
    assert_eq!(got[0]["is_error"], false, "{got:?}");

    // agent (the default): the policy alone decides; the read and the write run.
    s.model.load(Cassette {
        turns: vec![
            call("g1", "fs::list", json!({})),
            call("g2", "fs::write", json!({"path": "g.txt", "content": "x"})),
            text("done"),
        ],
        ..Default::default()
    });
    trigger(&ctx, "agent", json!({})).await;
    wait_state(&ctx, "agent", "stopped").await;
    assert!(s.work.join("g.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_mode_is_refused_with_the_list_of_modes() {
    let s = stack(RULES).await;
    let ctx = s.client.ctx();
    for mode in [json!("yolo"), json!("Agent"), json!(""), json!(7)] {
        let mut payload = json!({"mode": mode});
        payload["provider"] = json!("anthropic");
        payload["model"] = json!("claude-sonnet-5-5");
        payload["messages"] =
            json!([{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]);
        let e = ctx
            .trigger(
                "harness::trigger",
                json!({"session_id": "m", "payload": payload}),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("mode"), "{mode}: {e}");
        if mode.is_string() {
            assert!(e.contains("agent, plan, ask"), "names the modes: {e}");
        }
    }
    // Nothing started under the refused id.
    let v = ctx
        .trigger("turn::get_state", json!({"session_id": "m"}))
        .await
        .unwrap();
    assert!(v.is_null() || v["state"].is_null(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skills_index_covers_the_runs_default_skills() {
    let s = stack(RULES).await;
    let ctx = s.client.ctx();
    let system_of = |i: usize| -> String { s.model.requests()[i]["body"]["system"].to_string() };
    s.model.load(Cassette {
        turns: vec![text("a"), text("b"), text("c")],
        ..Default::default()
    });
    // The default: the whole directory's index.
    trigger(&ctx, "k1", json!({})).await;
    wait_state(&ctx, "k1", "stopped").await;
    let all = system_of(0);
    assert!(
        all.contains("- iii://tools:") && all.contains("- iii://session:"),
        "{all}"
    );
    // One namespace asked for: its line only.
    trigger(
        &ctx,
        "k2",
        json!({"system_default_skills": ["iii://tools"]}),
    )
    .await;
    wait_state(&ctx, "k2", "stopped").await;
    let one = system_of(1);
    assert!(one.contains("- iii://tools:"), "{one}");
    assert!(!one.contains("- iii://session:"), "{one}");
    // None: no index at all.
    trigger(&ctx, "k3", json!({"system_default_skills": []})).await;
    wait_state(&ctx, "k3", "stopped").await;
    let none = system_of(2);
    assert!(!none.contains("Skills available"), "{none}");
}

/// `ui::history`, a public function, with hostile requests: each refused by name; an unknown
/// session reads as empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_history_refuses_a_bad_request_by_name() {
    let s = stack(RULES).await;
    let ctx = s.client.ctx();
    for bad in [
        json!({}),
        json!({"session_id": 7}),
        json!({"session_id": "a/b"}),
        json!({"session_id": "x".repeat(300)}),
    ] {
        let e = ctx
            .trigger("ui::history", bad.clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("session_id"), "{bad}: {e}");
    }
    let r = ctx
        .trigger("ui::history", json!({"session_id": "nobody"}))
        .await
        .unwrap();
    assert_eq!(r, json!({"events": [], "truncated": false}));
}
