//! The `mcp` worker: every tool of every configured MCP server becomes a function ID
//! `mcp::<server>::<tool>` on the bus, so the policy, approvals, hooks, budgets, traces and
//! the console treat it like any other function.
//!
//! - Servers are listed in `harness.yaml` (`mcp_servers:`, [`config::ServerConfig`]): stdio
//!   (`command`, started with a cleared environment and the sandbox's process layers,
//!   [`process`]) or streamable HTTP (`url`, `headers`). Secrets come from the vault
//!   (`${secret:<name>}`, [`secrets`]).
//! - The client is the official Rust MCP SDK (`rmcp`): initialize (protocol 2025-11-25,
//!   2025-06-18 accepted), `tools/list` with every page, `tools/call`,
//!   `notifications/tools/list_changed`, `notifications/cancelled`.
//! - Tool names map to IDs by one reversible rule ([`names`]); descriptions, schemas and
//!   results are bounded ([`convert`]).
//! - The worker itself registers `mcp::servers` (each server's state, tools and last error)
//!   and `mcp::cancel {session_id}` (run::abort cancels that session's calls); both are not
//!   for the agent.

pub mod config;
pub mod convert;
pub mod names;
pub mod process;
pub mod publish;
pub mod secrets;
pub mod server;

pub use config::ServerConfig;
pub use publish::Publisher;
pub use server::{InFlight, Server, Status};

use harness_sdk::{DefExt, Worker, def};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The running servers. Dropping it stops them (and kills every stdio server's processes).
pub struct Mcp {
    pub servers: Vec<Arc<Server>>,
    inflight: Arc<InFlight>,
    stop: CancellationToken,
}

impl Drop for Mcp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Mcp {
    /// Start every server (in the background; see [`Mcp::wait_listed`]). `workdir` is a
    /// stdio server's default working directory.
    pub fn start(
        configs: Vec<ServerConfig>,
        workdir: PathBuf,
        publisher: Arc<dyn Publisher>,
        secrets: secrets::SecretSource,
    ) -> Arc<Mcp> {
        let inflight = Arc::new(InFlight::default());
        let stop = CancellationToken::new();
        let servers: Vec<Arc<Server>> = configs
            .into_iter()
            .map(|cfg| {
                Server::new(
                    cfg,
                    workdir.clone(),
                    publisher.clone(),
                    secrets.clone(),
                    inflight.clone(),
                )
            })
            .collect();
        for s in &servers {
            tokio::spawn(s.clone().run(stop.clone()));
        }
        Arc::new(Mcp {
            servers,
            inflight,
            stop,
        })
    }

    /// Wait (up to `wait` in all) until every server listed its tools → the names of those
    /// that did not, with their last error.
    pub async fn wait_listed(&self, wait: Duration) -> Vec<(String, String)> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut missing = Vec::new();
        for s in &self.servers {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !s.wait_listed(left).await {
                let st = s.status();
                missing.push((
                    st.name,
                    st.error.unwrap_or_else(|| "still starting".to_string()),
                ));
            }
        }
        missing
    }

    pub fn statuses(&self) -> Vec<Status> {
        self.servers.iter().map(|s| s.status()).collect()
    }

    pub fn cancel(&self, session: &str) -> usize {
        self.inflight.cancel(session)
    }
}

/// The worker's own functions: `mcp::servers` and `mcp::cancel`.
pub fn worker(mcp: Arc<Mcp>) -> Worker {
    let (m1, m2) = (mcp.clone(), mcp);
    Worker::new("mcp")
        .function(
            "mcp::servers",
            "The configured MCP servers: {} → {servers: [{name, transport, state: starting|ready|unavailable, tools, refused, error?, restarts, protocol_version?}]}.",
            move |_ctx, _data| {
                let m = m1.clone();
                async move { Ok(json!({"servers": m.statuses()})) }
            },
        )
        .not_for_the_agent("mcp::servers")
        .typed_function(
            def(
                "mcp::cancel",
                "Cancel every MCP call in flight for a session (run::abort calls it); each is cancelled on its server: {session_id} → {cancelled}.",
            )
            .request(json!({"type": "object", "required": ["session_id"], "properties": {"session_id": {"type": "string"}}})),
            move |_ctx, req: CancelRequest| {
                let m = m2.clone();
                async move { Ok(json!({"cancelled": m.cancel(&req.session_id)})) }
            },
        )
        .not_for_the_agent("mcp::cancel")
}

#[derive(serde::Deserialize)]
struct CancelRequest {
    session_id: String,
}
