//! Prompt caching: tokens and cost of one scripted session of K tool calls, with the cache
//! markers the harness sends and without them (`prompt_cache: false`), per provider. The
//! scripted server bills each request as the upstream's cache would (`simulate_cache`: about a
//! token per four bytes; breakpoints, the 20-block lookback and the 1024-token minimum as
//! Anthropic and Bedrock document them; OpenAI's automatic prefix cache with free writes), and
//! the providers price the usage from the model catalogue, as in production.
//!
//! Run: `cargo bench --bench caching` (`BENCH_K`, default 50). Prints a Markdown table.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use scripted_model::{Cassette, Turn};
use serde_json::{Value, json};

fn turns(k: usize) -> Vec<Turn> {
    let mut turns: Vec<Turn> = (0..k)
        .map(|i| {
            let mut t = call(&format!("k{i}"), "fs::list", json!({}));
            t.usage = Default::default();
            t
        })
        .collect();
    let mut last = text("done");
    last.usage = Default::default();
    turns.push(last);
    turns
}

async fn session(
    s: &Stack,
    sid: &str,
    provider: &str,
    model: &str,
    cache: bool,
    k: usize,
) -> Value {
    s.model.load(Cassette {
        turns: turns(k),
        simulate_cache: true,
        ..Default::default()
    });
    let ctx = s.client.ctx();
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": {"provider": provider, "model": model,
                "max_turns": k + 2, "prompt_cache": cache,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "list the files, again and again"}], "timestamp": 1}]}}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let done = wait_state(&ctx, sid, "stopped").await;
    assert!(done["error"].is_null(), "{done}");
    done["totals"].clone()
}

fn main() {
    let k: usize = std::env::var("BENCH_K")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    // SAFETY: set before any thread reads the environment (the runtime starts below).
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDBENCH");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "bench-secret");
        std::env::set_var("AWS_REGION", "us-east-1");
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let mut cfg = agent_harness::config::Config::load("thick").unwrap();
            cfg.sandbox.workspace = agent_harness::config::Workspace::Shared;
            cfg.providers.bedrock = Some(Default::default());
            cfg.providers.openai = Some(Default::default());
            let s = stack_config(&mut cfg, PERMISSIONS, models_catalog::Catalog::builtin()).await;
            s.client
                .ctx()
                .trigger(
                    "auth::set_token",
                    json!({"provider": "openai", "type": "api_key", "key": "sk-bench"}),
                )
                .await
                .unwrap();
            println!("K = {k} tool calls, one model call each, then the answer ({} model calls)\n", k + 1);
            println!("| provider · model | caching | input tokens | of which read from cache | written to cache | output | cost | cost ratio |");
            println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
            let models = [
                ("anthropic", "claude-sonnet-5-5"),
                ("bedrock", "us.anthropic.claude-haiku-4-5-20251001-v1:0"),
                ("bedrock", "amazon.nova-pro-v1:0"),
                ("openai", "gpt-5.4"),
            ];
            for (i, (provider, model)) in models.iter().enumerate() {
                let off = session(&s, &format!("off{i}"), provider, model, false, k).await;
                let on = session(&s, &format!("on{i}"), provider, model, true, k).await;
                let base = off["cost_usd"].as_f64().unwrap();
                for (label, t) in [("off", &off), ("on", &on)] {
                    let cost = t["cost_usd"].as_f64().unwrap();
                    println!(
                        "| {provider} · {model} | {label} | {} | {} | {} | {} | ${cost:.4} | {:.2} |",
                        t["input_tokens"], t["cache_read_tokens"], t["cache_write_tokens"], t["output_tokens"],
                        cost / base
                    );
                }
            }
        });
}
