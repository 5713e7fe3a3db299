//! The catalog through a real engine: every provider seeded, capability filters, unknown
//! capabilities named, and costs computed from usage and pricing.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{RemoteOptions, connect_client, run_embedded};
use models_catalog::{Catalog, Usage, worker};
use serde_json::json;
use std::sync::Arc;

#[test]
fn builtin_catalog_is_valid_and_covers_every_provider() {
    let c = Catalog::parse(models_catalog::BUILTIN).expect("valid catalog.json");
    for p in ["anthropic", "openai", "kimi", "lmstudio"] {
        assert!(c.models.iter().any(|m| m.provider == p), "{p} has models");
        assert!(c.sources.get(p).is_some(), "{p} has a source");
    }
    let mut ids: Vec<(&str, &str)> = c
        .models
        .iter()
        .map(|m| (m.provider.as_str(), m.id.as_str()))
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), c.models.len(), "no duplicate models");
    let m = c.get("anthropic", "claude-sonnet-5-5").unwrap();
    let u = Usage {
        input: 1_000_000,
        output: 100_000,
        cache_read: 2_000_000,
        cache_write: 0,
    };
    assert!((m.cost_usd(&u) - (2.0 + 1.0 + 0.2)).abs() < 1e-9);
    let local = c.get("lmstudio", "openai/gpt-oss-20b").unwrap();
    assert_eq!(local.cost_usd(&u), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_functions_over_the_bus() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().to_path_buf()))
        .await
        .unwrap();
    let _w = run_embedded(worker(Arc::new(Catalog::builtin())), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    let all = ctx.trigger("models::list", json!({})).await.unwrap();
    let openai = ctx
        .trigger("models::list", json!({"provider": "openai"}))
        .await
        .unwrap();
    assert!(
        openai["models"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["provider"] == "openai")
    );
    assert!(openai["models"].as_array().unwrap().len() < all["models"].as_array().unwrap().len());
    let vision = ctx
        .trigger("models::list", json!({"capability": "vision"}))
        .await
        .unwrap();
    assert!(
        vision["models"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["supports_vision"] == true)
    );
    let m = ctx
        .trigger(
            "models::get",
            json!({"provider": "kimi", "model_id": "kimi-k2.5"}),
        )
        .await
        .unwrap();
    assert_eq!(m["context_window"], 262144);
    assert_eq!(m["pricing"]["output_per_1m"], 3.0);
    assert_eq!(
        ctx.trigger(
            "models::get",
            json!({"provider": "kimi", "model_id": "nope"})
        )
        .await
        .unwrap(),
        json!(null)
    );
    let s = ctx.trigger("models::supports", json!({"provider": "kimi", "model_id": "kimi-k2-0905-preview", "capability": "thinking"})).await.unwrap();
    assert_eq!(s, json!({"supported": false}));
    let s = ctx
        .trigger(
            "models::supports",
            json!({"provider": "openai", "model_id": "gpt-5.4", "capability": "thinking:high"}),
        )
        .await
        .unwrap();
    assert_eq!(s, json!({"supported": true}));
    let e = ctx
        .trigger(
            "models::supports",
            json!({"provider": "openai", "model_id": "gpt-5.4", "capability": "telepathy"}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("telepathy"), "{e}");
    let e = ctx
        .trigger(
            "models::supports",
            json!({"provider": "openai", "model_id": "gpt-9", "capability": "tools"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found");
    let cost = ctx
        .trigger("models::cost", json!({"provider": "openai", "model_id": "gpt-5.4-mini", "model": "x", "usage": {"input": 2000, "output": 1000, "cache_read": 10000}}))
        .await
        .unwrap();
    let expected = (2000.0 * 0.75 + 1000.0 * 4.5 + 10000.0 * 0.075) / 1e6;
    assert!(
        (cost["cost_usd"].as_f64().unwrap() - expected).abs() < 1e-12,
        "{cost}"
    );
}
