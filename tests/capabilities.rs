//! The model catalogue's capabilities, used and not only read: before a model call the
//! orchestrator sends the catalogue's `max_output_tokens`, gives a model without tool use no
//! tools (and tells it so), and gives a model without vision a note in place of each image.
//! A model the catalogue does not know gets today's request.

use crate::common;

use common::*;
use scripted_model::Cassette;
use serde_json::{Value, json};

/// The built-in catalogue with `claude-sonnet-5-5` changed by `edit`.
fn catalogue(edit: impl Fn(&mut Value)) -> models_catalog::Catalog {
    let mut v: Value = serde_json::from_str(models_catalog::BUILTIN).unwrap();
    for m in v["models"].as_array_mut().unwrap() {
        if m["id"] == "claude-sonnet-5-5" {
            edit(m);
        }
    }
    models_catalog::Catalog::parse(&v.to_string()).unwrap()
}

async fn one_request(catalog: models_catalog::Catalog, sid: &str, with_image: bool) -> Value {
    let s = stack_with(PERMISSIONS, catalog).await;
    s.model.load(Cassette {
        turns: vec![text("fine")],
        ..Default::default()
    });
    let mut content = vec![json!({"type": "text", "text": "look"})];
    if with_image {
        content.push(json!({"type": "image", "mime": "image/png", "data": "iVBORw0KGgo="}));
    }
    let ctx = s.client.ctx();
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5",
                "messages": [{"role": "user", "content": content, "timestamp": 1}]}}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    wait_state(&ctx, sid, "stopped").await;
    s.model.requests().last().unwrap()["body"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalogues_limits_and_capabilities_shape_the_request() {
    // A model with tools and vision: its own output limit, the tools, the image.
    let sent = one_request(catalogue(|_| {}), "c1", true).await;
    assert_eq!(
        sent["max_tokens"], 128000,
        "the catalogue's max_output_tokens"
    );
    assert_eq!(sent["tools"][0]["name"], "agent_trigger");
    assert_eq!(sent["messages"][0]["content"][1]["type"], "image");

    // Without tool use: no tools, and the prompt says why; without vision: a note.
    let limited = catalogue(|m| {
        m["supports_tools"] = json!(false);
        m["supports_vision"] = json!(false);
        m["max_output_tokens"] = json!(1234);
    });
    let sent = one_request(limited, "c2", true).await;
    assert_eq!(sent["max_tokens"], 1234);
    assert!(
        sent.get("tools")
            .is_none_or(|t| t.as_array().is_none_or(|a| a.is_empty())),
        "{sent}"
    );
    assert!(
        sent["system"].to_string().contains("cannot call functions"),
        "{}",
        sent["system"]
    );
    let parts = sent["messages"][0]["content"].as_array().unwrap();
    assert!(parts.iter().all(|p| p["type"] != "image"), "{parts:?}");
    assert!(
        parts
            .iter()
            .any(|p| p["text"].as_str().is_some_and(|t| t.contains("cannot see"))),
        "{parts:?}"
    );

    // A model the catalogue does not know: today's request (the provider's default limit).
    let unknown = catalogue(|m| m["id"] = json!("renamed-away"));
    let sent = one_request(unknown, "c3", true).await;
    assert_eq!(sent["max_tokens"], provider_anthropic::DEFAULT_MAX_TOKENS);
    assert_eq!(sent["tools"][0]["name"], "agent_trigger");
    assert_eq!(sent["messages"][0]["content"][1]["type"], "image");
}

/// Prompt caching on every Anthropic request of a multi-turn session: three breakpoints (the
/// system prompt, the last tool, the latest message's last block), at most the API's four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_anthropic_request_of_a_session_marks_its_cache_breakpoints() {
    let s = stack(PERMISSIONS).await;
    s.model.load(Cassette {
        turns: vec![
            call("k1", "fs::list", json!({})),
            call("k2", "fs::list", json!({})),
            text("done"),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "cache1", Some(6)).await;
    wait_state(&ctx, "cache1", "stopped").await;
    let requests = s.model.requests();
    let bodies: Vec<&Value> = requests
        .iter()
        .filter(|r| r["path"] == "/v1/messages")
        .map(|r| &r["body"])
        .collect();
    assert_eq!(bodies.len(), 3, "three model calls");
    for (i, b) in bodies.iter().enumerate() {
        let marks = b.to_string().matches("\"cache_control\"").count();
        assert_eq!(marks, 3, "request {i}: {b}");
        assert_eq!(
            b["system"][0]["cache_control"]["type"], "ephemeral",
            "request {i}"
        );
        let tools = b["tools"].as_array().unwrap();
        assert_eq!(tools.last().unwrap()["cache_control"]["type"], "ephemeral");
        let last = b["messages"].as_array().unwrap().last().unwrap();
        let block = last["content"].as_array().unwrap().last().unwrap();
        assert_eq!(
            block["cache_control"]["type"], "ephemeral",
            "request {i}: {last}"
        );
    }
}

/// A scripted turn without usage: with `simulate_cache`, the server bills it from the request.
fn unbilled(mut t: scripted_model::Turn) -> scripted_model::Turn {
    t.usage = Default::default();
    t
}

fn calls_then_text(n: usize) -> Vec<scripted_model::Turn> {
    let mut turns: Vec<_> = (0..n)
        .map(|i| unbilled(call(&format!("k{i}"), "fs::list", json!({}))))
        .collect();
    turns.push(unbilled(text("done")));
    turns
}

async fn run(ctx: &harness_sdk::Ctx, sid: &str, payload: Value) -> Value {
    let mut payload = payload;
    payload["messages"] = json!([{"role": "user", "content": [{"type": "text", "text": "do the task"}], "timestamp": 1}]);
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": payload}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    wait_state(ctx, sid, "stopped").await
}

/// A thick stack with the Bedrock provider too, pointed at the scripted model's ConverseStream.
async fn stack_with_bedrock() -> Stack {
    // SAFETY: set before the client is built; one test per process (nextest).
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDTEST");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test-secret");
        std::env::set_var("AWS_REGION", "us-east-1");
    }
    let mut cfg = agent_harness::config::Config::load("thick").unwrap();
    cfg.sandbox.workspace = agent_harness::config::Workspace::Shared;
    cfg.providers.bedrock = Some(Default::default());
    stack_config(&mut cfg, PERMISSIONS, models_catalog::Catalog::builtin()).await
}

/// Bedrock gets `cachePoint` blocks where the catalogue says the model caches, on every request
/// of a session (Nova: the system prompt and the latest message; its tools never), none for a
/// model that does not (the scripted server refuses them, as Bedrock does), and none anywhere
/// when the run says `prompt_cache: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_points_follow_the_catalogue_and_the_run() {
    let s = stack_with_bedrock().await;
    let ctx = s.client.ctx();
    let converse = |s: &Stack| -> Vec<Value> {
        s.model
            .requests()
            .into_iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/converse-stream"))
            .map(|r| r["body"].clone())
            .collect()
    };
    let points = |v: &Value| {
        v.as_array().map_or(0, |a| {
            a.iter().filter(|b| b.get("cachePoint").is_some()).count()
        })
    };

    s.model.load(Cassette {
        turns: calls_then_text(2),
        ..Default::default()
    });
    let done = run(
        &ctx,
        "nova",
        json!({"provider": "bedrock", "model": "amazon.nova-pro-v1:0", "max_turns": 6}),
    )
    .await;
    assert!(done["error"].is_null(), "{done}");
    let bodies = converse(&s);
    assert_eq!(bodies.len(), 3, "three model calls");
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(points(&b["system"]), 1, "request {i}: {}", b["system"]);
        assert!(
            b["system"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .get("cachePoint")
                .is_some()
        );
        assert_eq!(points(&b["toolConfig"]["tools"]), 0, "Nova caches no tools");
        let messages = b["messages"].as_array().unwrap();
        let last = &messages.last().unwrap()["content"];
        assert!(
            last.as_array()
                .unwrap()
                .last()
                .unwrap()
                .get("cachePoint")
                .is_some(),
            "request {i}"
        );
        let all: usize = messages.iter().map(|m| points(&m["content"])).sum();
        assert_eq!(
            all, 1,
            "one point in the messages, on the latest: request {i}"
        );
    }

    // Llama on Bedrock: the catalogue says no cache, so no point (one would be refused).
    s.model.load(Cassette {
        turns: calls_then_text(1),
        ..Default::default()
    });
    let done = run(
        &ctx,
        "llama",
        json!({"provider": "bedrock", "model": "meta.llama3-3-70b-instruct-v1:0", "max_turns": 6}),
    )
    .await;
    assert!(done["error"].is_null(), "{done}");
    let bodies = converse(&s)[3..].to_vec();
    assert_eq!(bodies.len(), 2);
    assert!(
        bodies.iter().all(|b| !b.to_string().contains("cachePoint")),
        "{bodies:?}"
    );

    // Claude on Bedrock, told not to cache: none; Claude through Anthropic likewise.
    let before = s.model.requests().len();
    s.model.load(Cassette {
        turns: calls_then_text(1),
        ..Default::default()
    });
    run(&ctx, "off1", json!({"provider": "bedrock", "model": "anthropic.claude-haiku-4-5-20251001-v1:0", "max_turns": 6, "prompt_cache": false})).await;
    s.model.load(Cassette {
        turns: calls_then_text(1),
        ..Default::default()
    });
    run(&ctx, "off2", json!({"provider": "anthropic", "model": "claude-sonnet-5-5", "max_turns": 6, "prompt_cache": false})).await;
    let all = s.model.requests()[before..].to_vec();
    assert_eq!(all.len(), 4, "two sessions of two calls");
    for r in &all {
        let text = r["body"].to_string();
        assert!(
            !text.contains("cachePoint") && !text.contains("cache_control"),
            "{text}"
        );
    }
}

/// What caching saves, billed by the scripted server as Anthropic's cache bills (breakpoints,
/// the 20-block lookback, the 1024-token minimum): the same session with and without markers
/// sends the same input, but the cached one reads most of it from the cache and costs less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_session_reads_most_of_its_input_and_costs_less() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.client.ctx();
    let mut totals = Vec::new();
    for (sid, cache) in [("cached", true), ("uncached", false)] {
        s.model.load(Cassette {
            turns: calls_then_text(6),
            simulate_cache: true,
            ..Default::default()
        });
        let done = run(&ctx, sid, json!({"provider": "anthropic", "model": "claude-sonnet-5-5", "max_turns": 10, "prompt_cache": cache})).await;
        assert!(done["error"].is_null(), "{done}");
        totals.push(done["totals"].clone());
    }
    let (cached, uncached) = (&totals[0], &totals[1]);
    assert_eq!(
        cached["input_tokens"], uncached["input_tokens"],
        "the same input, cached or not: {cached} {uncached}"
    );
    assert_eq!(uncached["cache_read_tokens"], 0);
    assert_eq!(uncached["cache_write_tokens"], 0);
    let input = cached["input_tokens"].as_u64().unwrap();
    let read = cached["cache_read_tokens"].as_u64().unwrap();
    assert!(
        read * 2 > input,
        "most of the input is read from the cache: {cached}"
    );
    assert!(
        cached["cost_usd"].as_f64().unwrap() < uncached["cost_usd"].as_f64().unwrap(),
        "{cached} {uncached}"
    );
}
