//! The harness worker: `policy::check_permissions`, `harness::trigger` and the UI plane.
//! Lambda `bootstrap` under a Runtime API, otherwise a remote worker on `ENGINE_URL`.
//!
//! The rules come from, in order:
//! - `HARNESS_PERMISSIONS_SECRET` (as deployed: the template names `harness/permissions`): the
//!   YAML in that secret, read again at most every `HARNESS_PERMISSIONS_REFRESH_SECS` (30);
//!   while it is missing or empty (`{}`), the shipped rules;
//! - `HARNESS_PERMISSIONS`, or `./iii-permissions.yaml` when it exists: that file, reloaded
//!   when it changes;
//! - otherwise the shipped `iii-permissions.yaml`, compiled in.
//!
//! `HARNESS_RUN_DEFAULTS` (a JSON object, as `harness.yaml`'s `run`: `provider`, `model`,
//! `max_turns`, …) fills what a `harness::trigger` payload leaves out, so a client that sends
//! only a message (the web console, a chat front end) starts a run in the deployed shape too.

use std::sync::Arc;
use std::time::Duration;

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut watch = None;
    let holder = if let Some(secret) = var("HARNESS_PERMISSIONS_SECRET") {
        let refresh = match var("HARNESS_PERMISSIONS_REFRESH_SECS") {
            None => harness_worker::DEFAULT_SECRET_REFRESH,
            Some(v) => Duration::from_secs(v.parse().map_err(|_| {
                format!("HARNESS_PERMISSIONS_REFRESH_SECS=`{v}` is not a number of seconds")
            })?),
        };
        let prefix = var("HARNESS_AWS_PREFIX").unwrap_or_else(|| "harness-".into());
        let store = bus_aws::secrets::AwsSecrets::new(
            bus_aws::AwsClients::from_env().await,
            bus_aws::AwsNames::new(&prefix),
        );
        harness_worker::PolicyHolder::from_secret(Arc::new(store), &secret, refresh)
    } else {
        let path = var("HARNESS_PERMISSIONS").or_else(|| {
            std::path::Path::new("iii-permissions.yaml")
                .exists()
                .then(|| "iii-permissions.yaml".into())
        });
        match path {
            Some(path) => {
                let h = harness_worker::PolicyHolder::new(path.into());
                watch = Some(h.watch(Duration::from_millis(500)));
                h
            }
            None => harness_worker::PolicyHolder::shipped(),
        }
    };
    let mut worker = harness_worker::policy_worker(holder);
    let defaults = match var("HARNESS_RUN_DEFAULTS") {
        None => serde_json::Value::Null,
        Some(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            Ok(_) => return Err("HARNESS_RUN_DEFAULTS must be a JSON object such as {\"provider\":\"anthropic\",\"model\":\"claude-sonnet-5-5\"}".into()),
            Err(e) => return Err(format!("HARNESS_RUN_DEFAULTS is not valid JSON: {e}").into()),
        },
    };
    harness_worker::add_trigger_with(&mut worker, defaults);
    harness_worker::add_ui(&mut worker, Arc::new(harness_worker::UiHub::default()));
    let served = harness_sdk::serve_main(worker).await;
    drop(watch);
    served
}
