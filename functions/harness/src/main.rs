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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (worker, watch) = harness_worker::from_env().await?;
    let served = harness_sdk::serve_main(worker).await;
    drop(watch);
    served
}
