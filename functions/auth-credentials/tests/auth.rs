//! The auth worker through a real engine: stored credentials win over the environment,
//! status never shows a secret, tokens are validated, the file is 0600.

use auth_credentials::{Auth, worker};
use engine_gateway::secrets::FileSecrets;
use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{RemoteOptions, connect_client, run_embedded};
use serde_json::json;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_then_env_and_no_secret_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets.json");
    let env: HashMap<String, String> =
        HashMap::from([("OPENAI_API_KEY".into(), "sk-env-openai".into())]);
    let auth = Auth::new(
        Arc::new(FileSecrets::new(secrets.clone())),
        Arc::new(move |k| env.get(k).cloned()),
    );
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().join("data")))
        .await
        .unwrap();
    let _w = run_embedded(worker(auth), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();

    // Environment fallback.
    assert_eq!(
        ctx.trigger("auth::get_token", json!({"provider": "openai"}))
            .await
            .unwrap(),
        json!({"type": "api_key", "key": "sk-env-openai"})
    );
    assert_eq!(
        ctx.trigger("auth::get_token", json!({"provider": "anthropic"}))
            .await
            .unwrap(),
        json!(null)
    );
    assert_eq!(
        ctx.trigger("auth::status", json!({"provider": "openai"}))
            .await
            .unwrap(),
        json!({"provider": "openai", "configured": true, "source": "env"})
    );

    // Stored wins over the environment.
    ctx.trigger(
        "auth::set_token",
        json!({"provider": "openai", "type": "api_key", "key": "sk-stored"}),
    )
    .await
    .unwrap();
    assert_eq!(
        ctx.trigger("auth::get_token", json!({"provider": "openai"}))
            .await
            .unwrap()["key"],
        "sk-stored"
    );
    assert_eq!(
        std::fs::metadata(&secrets).unwrap().permissions().mode() & 0o777,
        0o600
    );
    ctx.trigger("auth::set_token", json!({"provider": "anthropic", "type": "oauth", "access_token": "at-1", "refresh_token": "rt-1", "expires_at": 1}))
        .await
        .unwrap();
    let status = ctx
        .trigger("auth::status", json!({"provider": "anthropic"}))
        .await
        .unwrap();
    assert_eq!(status["source"], "stored");
    assert_eq!(status["expired"], true);

    // No secret in status, the provider list, or the engine's spans.
    let listed = ctx
        .trigger("auth::list_providers", json!({}))
        .await
        .unwrap();
    let everything = format!(
        "{status}{listed}{}",
        ctx.trigger("engine::traces::list", json!({}))
            .await
            .unwrap()
    );
    for secret in ["sk-stored", "sk-env-openai", "at-1", "rt-1"] {
        assert!(
            !everything.contains(secret),
            "`{secret}` leaked: {everything}"
        );
    }
    assert_eq!(listed["providers"].as_array().unwrap().len(), 4);

    // Delete falls back to the environment again.
    let d = ctx
        .trigger("auth::delete_token", json!({"provider": "openai"}))
        .await
        .unwrap();
    assert_eq!(d["deleted"], true);
    assert_eq!(
        ctx.trigger("auth::status", json!({"provider": "openai"}))
            .await
            .unwrap()["source"],
        "env"
    );

    // Bad input names the problem.
    let e = ctx
        .trigger("auth::get_token", json!({"provider": "Open AI"}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("[a-z0-9_-/]"), "{e}");
    for bad in ["/mcp", "mcp/", "mcp//x"] {
        let e = ctx
            .trigger("auth::get_token", json!({"provider": bad}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("doubled"), "{bad}: {e}");
    }
    let e = ctx
        .trigger(
            "auth::set_token",
            json!({"provider": "x", "type": "api_key"}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("key"), "{e}");
    let e = ctx
        .trigger(
            "auth::set_token",
            json!({"provider": "x", "type": "api_key", "key": ""}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let e = ctx.trigger("auth::get_token", json!({})).await.unwrap_err();
    assert!(e.to_string().contains("provider"), "{e}");
}

#[test]
fn debug_output_redacts_tokens() {
    let t = auth_credentials::types::Token::ApiKey {
        key: "sk-secret".into(),
    };
    assert!(!format!("{t:?}").contains("sk-secret"));
    assert_eq!(auth_credentials::env_var_for("kimi"), "MOONSHOT_API_KEY");
    assert_eq!(auth_credentials::env_var_for("my-llm"), "MY_LLM_API_KEY");
}
