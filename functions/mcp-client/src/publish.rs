//! Where a server's tools are registered: the set changes while the worker runs (a server's
//! `list_changed`, a restart), so each server's tools are one `Worker` of their own
//! (`mcp-<server>`), published again whole when they change. The new set registers before
//! the old one is withdrawn (the newest registration of an ID wins; a withdrawal removes
//! only the IDs it still owns), so a tool that stays is never missing in between, and a
//! removed one is unregistered.

use async_trait::async_trait;
use engine_gateway::Engine;
use harness_sdk::{RemoteOptions, Worker, WorkerHandle};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[async_trait]
pub trait Publisher: Send + Sync {
    async fn publish(&self, worker: Worker) -> Result<WorkerHandle, String>;
    /// The largest answer a tool may give through this publisher's transport.
    fn max_answer_bytes(&self) -> usize;
}

/// In this process, on the engine.
pub struct Embedded(pub Weak<Engine>);

impl Embedded {
    pub fn new(engine: &Arc<Engine>) -> Self {
        Self(Arc::downgrade(engine))
    }
}

#[async_trait]
impl Publisher for Embedded {
    async fn publish(&self, worker: Worker) -> Result<WorkerHandle, String> {
        let engine = self.0.upgrade().ok_or("the engine has stopped")?;
        harness_sdk::run_embedded(worker, &engine).map_err(|e| e.to_string())
    }
    fn max_answer_bytes(&self) -> usize {
        usize::MAX
    }
}

/// Over the engine's WebSocket: one connection per server's tool set.
pub struct Remote(pub RemoteOptions);

#[async_trait]
impl Publisher for Remote {
    async fn publish(&self, worker: Worker) -> Result<WorkerHandle, String> {
        let handle = harness_sdk::run_remote(worker, self.0.clone());
        handle
            .wait_connected(Duration::from_secs(30))
            .await
            .map_err(|e| e.to_string())?;
        Ok(handle)
    }
    fn max_answer_bytes(&self) -> usize {
        // The engine's message limit, less the invocation result's envelope.
        128 * 1024 - 8 * 1024
    }
}
