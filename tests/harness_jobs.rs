//! The harness jobs that make long-running agents practical, end to end with every worker
//! real (embedded backend, or the AWS backend with `HARNESS_TEST_BACKEND=aws`): the session
//! tree (resume, fork), steering through the inbox, budgets stopping a run, hooks from a
//! separate remote worker, compaction of a long session, and skills.

use crate::common;

use common::*;
use harness_sdk::{RemoteOptions, Worker, run_remote};
use scripted_model::{Cassette, Turn, TurnUsage};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn user(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1})
}

async fn start_with(ctx: &harness_sdk::Ctx, sid: &str, message: &str, extra: Value) -> Value {
    let mut payload = json!({"provider": "anthropic", "model": "claude-sonnet-5-5", "max_turns": 20, "messages": [user(message)]});
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            payload[k] = v.clone();
        }
    }
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": payload}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    r
}

async fn history(ctx: &harness_sdk::Ctx, sid: &str) -> Vec<Value> {
    ctx.trigger("session-tree::messages", json!({"session_id": sid}))
        .await
        .unwrap()["messages"]
        .as_array()
        .unwrap()
        .clone()
}

fn text_of(m: &Value) -> String {
    m["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The request bodies the model server received.
fn bodies(model: &scripted_model::ScriptedModel) -> Vec<Value> {
    model
        .requests()
        .into_iter()
        .map(|r| r["body"].clone())
        .collect()
}

/// The messages of the model's last request, as JSON text.
fn last_request_text(model: &scripted_model::ScriptedModel) -> String {
    bodies(model)
        .last()
        .map(|r| r["messages"].to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_session_resumes_and_a_fork_leaves_the_original_intact() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        turns: vec![
            text("first answer"),
            text("second answer"),
            text("fork answer"),
            text("original answer"),
        ],
        ..Default::default()
    });
    start_with(&ctx, "orig", "hello", json!({})).await;
    wait_state(&ctx, "orig", "stopped").await;
    // Resume: a new run continues from the current leaf.
    start_with(&ctx, "orig", "and then?", json!({})).await;
    wait_state(&ctx, "orig", "stopped").await;
    assert!(
        last_request_text(&s.model).contains("first answer"),
        "the resumed run saw the earlier turns"
    );
    let h: Vec<String> = history(&ctx, "orig").await.iter().map(text_of).collect();
    assert_eq!(h, ["hello", "first answer", "and then?", "second answer"]);

    // Fork from the first answer, then run on both branches.
    let ids = ctx
        .trigger("session-tree::messages", json!({"session_id": "orig"}))
        .await
        .unwrap()["entry_ids"]
        .clone();
    let f = ctx
        .trigger(
            "session-tree::fork",
            json!({"source_session_id": "orig", "from_entry_id": ids[1], "new_session_id": "fork"}),
        )
        .await
        .unwrap();
    assert_eq!(f["copied"], 2);
    start_with(&ctx, "fork", "what else could we do?", json!({})).await;
    wait_state(&ctx, "fork", "stopped").await;
    let seen = last_request_text(&s.model);
    assert!(
        seen.contains("first answer") && !seen.contains("second answer"),
        "the fork's model call saw only its branch: {seen}"
    );
    start_with(&ctx, "orig", "finish up", json!({})).await;
    wait_state(&ctx, "orig", "stopped").await;
    assert!(last_request_text(&s.model).contains("second answer"));

    let fork: Vec<String> = history(&ctx, "fork").await.iter().map(text_of).collect();
    assert_eq!(
        fork,
        [
            "hello",
            "first answer",
            "what else could we do?",
            "fork answer"
        ]
    );
    let orig: Vec<String> = history(&ctx, "orig").await.iter().map(text_of).collect();
    assert_eq!(
        orig,
        [
            "hello",
            "first answer",
            "and then?",
            "second answer",
            "finish up",
            "original answer"
        ]
    );
    let html = ctx
        .trigger("session-tree::export_html", json!({"session_id": "fork"}))
        .await
        .unwrap();
    assert!(html["html"].as_str().unwrap().contains("fork answer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steering_message_reaches_the_next_model_call() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        turns: vec![
            call("w1", "fs::write", json!({"path": "a.txt", "content": "x"})),
            text("Done, and hi!"),
        ],
        ..Default::default()
    });
    start_with(&ctx, "steer", "write a file", json!({})).await;
    wait_state(&ctx, "steer", "function_awaiting_approval").await;
    ctx.trigger("session-inbox::push", json!({"name": "steering", "session_id": "steer", "item": "Also say hi when you are done."})).await.unwrap();
    ctx.trigger(
        "approval::resolve",
        json!({"session_id": "steer", "function_call_id": "w1", "decision": "allow"}),
    )
    .await
    .unwrap();
    wait_state(&ctx, "steer", "stopped").await;
    assert!(last_request_text(&s.model).contains("Also say hi when you are done."));
    let h = history(&ctx, "steer").await;
    let roles: Vec<&str> = h.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "function_result", "user", "assistant"]
    );
    let inbox = ctx
        .trigger(
            "session-inbox::peek",
            json!({"name": "steering", "session_id": "steer"}),
        )
        .await
        .unwrap();
    assert_eq!(inbox["items"], json!([]), "taken exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_stops_the_run_and_its_alert_fires_once() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    let alerts = Arc::new(AtomicUsize::new(0));
    let counter = alerts.clone();
    let _alerts = harness_sdk::run_embedded(
        Worker::new("alerts").function(
            "ops::budget_alert",
            "counts alerts",
            move |_c, _d: Value| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"ok": true}))
                }
            },
        ),
        &s.srv.engine,
    )
    .unwrap();
    // Each model turn costs $0.0004 (100 in, 20 out at $2/$10 per million).
    let b = ctx
        .trigger(
            "budget::create",
            json!({"ceiling_usd": 0.001, "period": "day", "workspace_id": "ws-1"}),
        )
        .await
        .unwrap();
    let id = b["budget_id"].as_str().unwrap().to_string();
    ctx.trigger(
        "budget::alert_set",
        json!({"budget_id": id, "threshold_pct": 0.5, "callback_function_id": "ops::budget_alert"}),
    )
    .await
    .unwrap();
    s.model.load(Cassette {
        turns: (0..6)
            .map(|i| call(&format!("c{i}"), "fs::list", json!({})))
            .collect(),
        ..Default::default()
    });
    start_with(
        &ctx,
        "spend",
        "list forever",
        json!({"workspace_id": "ws-1"}),
    )
    .await;
    let st = wait_state(&ctx, "spend", "stopped").await;
    assert_eq!(st["error"]["kind"], "budget_exceeded", "{st}");
    assert!(
        st["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ceiling_exceeded")
    );
    // $0 → $0.0004 → $0.0008 → $0.0012: the fourth check refuses.
    assert_eq!(st["turn_count"], 3);
    assert_eq!(bodies(&s.model).len(), 3);
    let used = ctx
        .trigger("budget::get", json!({"budget_id": id}))
        .await
        .unwrap();
    assert!(
        (used["spent_usd"].as_f64().unwrap() - 0.0012).abs() < 1e-12,
        "{used}"
    );
    assert_eq!(alerts.load(Ordering::SeqCst), 1);
    let evs = events(&ctx, "spend").await;
    assert_eq!(evs.iter().filter(|e| e["type"] == "agent_end").count(), 1);
    assert!(evs.iter().any(
        |e| e["type"] == "message_complete" && e["message"]["custom_type"] == "budget_exceeded"
    ));
}

/// A hook subscriber in its own remote worker: blocks directory listings, redacts passwords.
fn hook_worker() -> Worker {
    let mut w = Worker::new("security-hooks")
        .function(
            "security::before_call",
            "blocks fs::list",
            |_c, data: Value| async move {
                if data["payload"]["function_id"] == "fs::list" {
                    return Ok(json!({"block": true, "reason": "listing is off today"}));
                }
                Ok(json!({"block": false}))
            },
        )
        .function(
            "security::after_call",
            "redacts passwords",
            |_c, data: Value| async move {
                let result = data["payload"]["result"].to_string();
                if !result.contains("hunter2") {
                    return Ok(json!({}));
                }
                let redacted: Value =
                    serde_json::from_str(&result.replace("hunter2", "[redacted]"))
                        .unwrap_or(Value::Null);
                Ok(json!({"result": redacted}))
            },
        );
    hook_fanout::subscribe(
        &mut w,
        "agent::before_function_call",
        "security::before_call",
    );
    hook_fanout::subscribe(&mut w, "agent::after_function_call", "security::after_call");
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_hook_worker_blocks_one_call_and_redacts_another_result() {
    let s = stack(PERMISSIONS).await;
    std::fs::create_dir_all(&s.work).unwrap();
    std::fs::write(s.work.join("secret.txt"), "db password=hunter2\n").unwrap();
    let hooks = run_remote(hook_worker(), RemoteOptions::new(&s.srv.url()));
    hooks.wait_connected(Duration::from_secs(10)).await.unwrap();
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        turns: vec![
            call("r1", "fs::read", json!({"path": "secret.txt"})),
            call("l1", "fs::list", json!({})),
            text("Read one, the other was blocked."),
        ],
        ..Default::default()
    });
    start_with(&ctx, "hooked", "look around", json!({})).await;
    wait_state(&ctx, "hooked", "stopped").await;
    let h = history(&ctx, "hooked").await;
    let results: Vec<&Value> = h
        .iter()
        .filter(|m| m["role"] == "function_result")
        .collect();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["function_id"], "fs::read");
    assert!(
        results[0]["details"]["content"]
            .as_str()
            .unwrap()
            .contains("password=[redacted]"),
        "{}",
        results[0]
    );
    assert_eq!(results[1]["details"]["denied_by"], "hook");
    assert_eq!(results[1]["details"]["reason"], "listing is off today");
    assert_eq!(results[1]["details"]["rule_id"], "security::before_call");
    // The secret is nowhere: not in the history, the events, or what the model was sent.
    assert!(!serde_json::to_string(&h).unwrap().contains("hunter2"));
    assert!(
        !serde_json::to_string(&events(&ctx, "hooked").await)
            .unwrap()
            .contains("hunter2")
    );
    assert!(
        !serde_json::to_string(&bodies(&s.model))
            .unwrap()
            .contains("hunter2")
    );
}

/// The builtin catalog plus `claude-tiny-window`: a 30 000-token window, so that a short
/// session reaches the compaction threshold.
fn tiny_window_catalog() -> models_catalog::Catalog {
    let mut catalog = models_catalog::Catalog::builtin();
    let mut tiny = catalog
        .get("anthropic", "claude-sonnet-5-5")
        .unwrap()
        .clone();
    tiny.id = "claude-tiny-window".into();
    tiny.context_window = 30_000;
    catalog.models.push(tiny);
    catalog
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_session_crosses_a_small_window_is_compacted_and_completes() {
    let s = stack_with(PERMISSIONS, tiny_window_catalog()).await;
    std::fs::create_dir_all(&s.work).unwrap();
    for i in 0..16 {
        std::fs::write(
            s.work.join(format!("f{i}.txt")),
            format!("file-{i}-").repeat(600),
        )
        .unwrap();
    }
    let ctx = s.client.ctx();
    let mut turns: Vec<Turn> = (0..16)
        .map(|i| {
            call(
                &format!("r{i}"),
                "fs::read",
                json!({"path": format!("f{i}.txt")}),
            )
        })
        .collect();
    turns.push(text("All sixteen files read."));
    turns.push(Turn {
        when: Some("system~=You compact the history".into()),
        text: Some("## Goal\nRead every file.\n## Progress\nCOMPACTED-SUMMARY: earlier files read.\n## Next Steps\nRead the rest.".into()),
        usage: TurnUsage { input: 10, output: 10, ..Default::default() },
        ..Default::default()
    });
    s.model.load(Cassette {
        turns,
        ..Default::default()
    });
    start_with(
        &ctx,
        "long",
        "read all the files",
        json!({"model": "claude-tiny-window"}),
    )
    .await;
    let st = wait_state(&ctx, "long", "stopped").await;
    assert!(st["error"].is_null(), "{st}");

    let compactions = ctx
        .trigger("session-tree::compactions", json!({"session_id": "long"}))
        .await
        .unwrap();
    let n = compactions["compactions"].as_array().unwrap().len();
    assert!(
        n >= 2,
        "the session was compacted, then compacted again on top of the summary"
    );
    eprintln!(
        "compactions: {n}; request sizes: {:?}",
        bodies(&s.model)
            .iter()
            .map(|r| r.to_string().len())
            .collect::<Vec<_>>()
    );
    let evs = events(&ctx, "long").await;
    assert_eq!(
        evs.iter()
            .filter(|e| e["type"] == "compaction_done")
            .count(),
        n
    );
    // After compaction the model saw the summary and the kept tail, not the oldest files.
    let reqs = bodies(&s.model);
    let conversation: Vec<&Value> = reqs
        .iter()
        .filter(|r| !r["system"].to_string().contains("You compact the history"))
        .collect();
    let last = conversation.last().unwrap()["messages"].to_string();
    assert!(last.contains("COMPACTED-SUMMARY"), "{last:.400}");
    assert!(!last.contains("file-0-"), "the head was summarized away");
    assert!(last.contains("file-15-"), "the tail was kept");
    // Every model call fit the usable window (30 000 − 15 000 reserved = 15 000 tokens).
    for r in &conversation {
        assert!(
            r.to_string().len() / 4 < 15_000,
            "a request of {} chars",
            r.to_string().len()
        );
    }
    // The session completed correctly.
    let h = history(&ctx, "long").await;
    assert_eq!(text_of(h.last().unwrap()), "All sixteen files read.");
    assert_eq!(st["turn_count"], 17);
    // The summarizer was asked with the section template, and to update the previous summary.
    let summaries: Vec<&Value> = reqs
        .iter()
        .filter(|r| r["system"].to_string().contains("You compact the history"))
        .collect();
    assert_eq!(summaries.len(), n);
    assert!(
        summaries[0]["system"]
            .to_string()
            .contains("## Relevant Files")
    );
    assert!(
        summaries[1]["messages"]
            .to_string()
            .contains("Update it with the new part")
    );
    assert!(
        summaries[1]["messages"]
            .to_string()
            .contains("COMPACTED-SUMMARY")
    );
}

/// The end-of-run check trusts the model's own count of the context when it gave one, and
/// loads the history to estimate it otherwise (a usage of zero, none, or over the window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_run_compaction_check_uses_the_models_count_when_it_gave_one() {
    let s = stack_with(PERMISSIONS, tiny_window_catalog()).await;
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        turns: vec![text("Hello back.")],
        ..Default::default()
    });
    start_with(
        &ctx,
        "counted",
        "hello",
        json!({"model": "claude-tiny-window"}),
    )
    .await;
    wait_state(&ctx, "counted", "stopped").await;
    let turn_end = |usage: Value| {
        json!({"group_id": "counted", "event": {"data": {"function_results": [], "message": {
            "role": "assistant", "content": [{"type": "text", "text": "Hello back."}],
            "stop_reason": "end", "usage": usage, "provider": "anthropic",
            "model": "claude-tiny-window", "timestamp": 1}}}})
    };
    // 30 000 − 15 000 reserved (at most half the window) = 15 000 usable tokens.
    let under = ctx
        .trigger(
            "context-compaction::on_turn_end",
            turn_end(json!({"input": 4_000, "cache_read": 10_000, "output": 500})),
        )
        .await
        .unwrap();
    assert_eq!(
        under,
        json!({"status": "ok", "compacted": false, "session_id": "counted", "tokens": 14_500,
               "usable": 15_000, "counted_by": "model"})
    );
    // Over the window by the model's count, no count, or junk: the history is loaded and
    // estimated (it is small, so there is nothing to compact either way).
    for usage in [
        json!({"input": 15_001}),
        json!({"input": 0, "output": 0}),
        Value::Null,
        json!({"input": "lots"}),
    ] {
        let answer = ctx
            .trigger("context-compaction::on_turn_end", turn_end(usage.clone()))
            .await
            .unwrap();
        assert_eq!(answer["compacted"], false, "{usage}: {answer}");
        assert!(answer.get("counted_by").is_none(), "{usage}: {answer}");
        let estimated = answer["tokens"].as_u64().unwrap();
        assert!(estimated > 0 && estimated < 1_000, "{usage}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_are_generated_from_registrations_and_fetched_before_first_use() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    let skill = ctx
        .trigger(
            "directory::skills::get",
            json!({"id": "iii://session/session-tree::fork"}),
        )
        .await
        .unwrap();
    let body = skill["body"].as_str().unwrap();
    for must in [
        "# session-tree::fork",
        "from_entry_id",
        "entry_not_found",
        "## Errors",
        "agent_trigger",
    ] {
        assert!(body.contains(must), "missing {must} in {body}");
    }
    let list = ctx
        .trigger(
            "directory::skills::list",
            json!({"namespace": "iii://llm-budget"}),
        )
        .await
        .unwrap();
    assert_eq!(list["skills"].as_array().unwrap().len(), 14);
    let e = ctx
        .trigger(
            "directory::skills::get",
            json!({"id": "iii://nobody/nothing"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found");

    s.model.load(Cassette {
        turns: vec![
            call(
                "k1",
                "directory::skills::get",
                json!({"id": "iii://tools/fs::list"}),
            ),
            call("l1", "fs::list", json!({})),
            text("Listed."),
        ],
        ..Default::default()
    });
    start_with(&ctx, "skills", "list the files", json!({})).await;
    wait_state(&ctx, "skills", "stopped").await;
    let h = history(&ctx, "skills").await;
    let results: Vec<&Value> = h
        .iter()
        .filter(|m| m["role"] == "function_result")
        .collect();
    assert_eq!(results[0]["is_error"], false, "{}", results[0]);
    assert!(
        results[0]["details"]["body"]
            .as_str()
            .unwrap()
            .contains("# fs::list")
    );
    assert_eq!(results[1]["is_error"], false);
    // The system prompt carried the skills index; provisioning cached the default namespaces.
    let system = bodies(&s.model)[0]["system"].to_string();
    assert!(system.contains("iii://session:"), "{system:.300}");
    let cached = ctx.state_list("skills", None).await.unwrap();
    assert!(cached["items"].as_array().unwrap().len() > 50);
}

/// The system prompt: each mode's paragraph, the identity preamble and the tools worker's
/// working directory; or the caller's `system_prompt`, verbatim. `system_default_skills` is
/// a `run::start` field with bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_prompt_follows_the_mode_and_names_the_workdir_or_is_the_callers() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    let workdir = s.work.canonicalize().unwrap().display().to_string();
    let system_of_run = |sid: &'static str, extra: Value| {
        let (ctx, model) = (ctx.clone(), &s.model);
        async move {
            model.load(Cassette {
                turns: vec![text("ok")],
                ..Default::default()
            });
            let before = model.requests().len();
            start_with(&ctx, sid, "hello", extra).await;
            wait_state(&ctx, sid, "stopped").await;
            let sent = model.requests();
            assert_eq!(sent.len(), before + 1, "{sid}: one model call");
            scripted_model::system_text(&sent[before]["body"])
        }
    };
    for (sid, mode, paragraph) in [
        (
            "mode-plan",
            Some("plan"),
            turn_orchestrator::prompt::mode_paragraph("plan"),
        ),
        (
            "mode-ask",
            Some("ask"),
            turn_orchestrator::prompt::mode_paragraph("ask"),
        ),
        (
            "mode-agent",
            Some("agent"),
            turn_orchestrator::prompt::mode_paragraph("agent"),
        ),
        (
            "mode-default",
            None,
            turn_orchestrator::prompt::mode_paragraph("agent"),
        ),
    ] {
        let system = system_of_run(sid, json!({ "mode": mode })).await;
        assert!(system.starts_with(paragraph), "{sid}: {system}");
        assert!(
            system.contains(turn_orchestrator::prompt::IDENTITY),
            "{sid}"
        );
        assert!(
            system.contains(&format!("Your working directory is `{workdir}`")),
            "{sid} names the working directory: {system}"
        );
    }
    assert_ne!(
        turn_orchestrator::prompt::mode_paragraph("plan"),
        turn_orchestrator::prompt::mode_paragraph("ask")
    );
    let system = system_of_run(
        "verbatim",
        json!({"system_prompt": "You are a test.", "mode": "plan", "system_default_skills": []}),
    )
    .await;
    assert_eq!(system, "You are a test.");

    for (skills, says) in [
        (json!(vec!["iii://x"; 17]), "at most 16"),
        (json!([""]), "must be 1 to 256 characters"),
        (json!(["a\nb"]), "control characters"),
        (json!("iii://x"), "invalid run::start request"),
    ] {
        let e = ctx
            .trigger(
                "harness::trigger",
                json!({"session_id": "bad-skills", "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [user("x")], "system_default_skills": skills}}),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "invalid_message", "{says}: {e}");
        assert!(
            e.message().contains(says),
            "`{}` should say {says}",
            e.message()
        );
    }
}
