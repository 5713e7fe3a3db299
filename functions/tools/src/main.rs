//! The tools worker, confined to `HARNESS_WORKDIR` (default: `./workspace`, created if missing).
//! Never the current directory itself: as root the sandbox gives the working directory to its
//! unprivileged user, and the directory it was started from (a repository, say) must stay its
//! owner's.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let root = std::env::var("HARNESS_WORKDIR")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "workspace".into());
    let tools = tools_worker::Tools::new(root)?;
    harness_sdk::serve_main(tools_worker::worker(tools)).await
}
