//! The model catalogue's capabilities, used and not only read: before a model call the
//! orchestrator sends the catalogue's `max_output_tokens`, gives a model without tool use no
//! tools (and tells it so), and gives a model without vision a note in place of each image.
//! A model the catalogue does not know gets today's request.

mod common;

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
