//! The harness worker: `policy::check_permissions` from `HARNESS_PERMISSIONS`
//! (default `./iii-permissions.yaml`), reloaded when the file changes. Lambda `bootstrap`
//! under a Runtime API, otherwise a remote worker on `ENGINE_URL`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path =
        std::env::var("HARNESS_PERMISSIONS").unwrap_or_else(|_| "iii-permissions.yaml".into());
    let holder = harness_worker::PolicyHolder::new(path.into());
    let _watch = holder.watch(std::time::Duration::from_millis(500));
    let mut worker = harness_worker::policy_worker(holder);
    harness_worker::add_trigger(&mut worker);
    harness_worker::add_ui(
        &mut worker,
        std::sync::Arc::new(harness_worker::UiHub::default()),
    );
    harness_sdk::serve_main(worker).await
}
