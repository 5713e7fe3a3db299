//! Where a server's tools are registered: the set changes while the worker runs (a server's
//! `list_changed`, a restart), so each server's tools are one `Worker` of their own
//! (`mcp-<server>`), published again whole when they change. The new set registers before
//! the old one is withdrawn (the newest registration of an ID wins; a withdrawal removes
//! only the IDs it still owns), so a tool that stays is never missing in between, and a
//! removed one is unregistered.

use async_trait::async_trait;
use bus::Engine;
use harness_sdk::worker::FunctionSpec;
use harness_sdk::{RemoteOptions, Worker};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What keeps a published set registered: dropping it withdraws the set.
pub type Published = Box<dyn std::any::Any + Send + Sync>;

#[async_trait]
pub trait Publisher: Send + Sync {
    async fn publish(&self, worker: Worker) -> Result<Published, String>;
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
    async fn publish(&self, worker: Worker) -> Result<Published, String> {
        let engine = self.0.upgrade().ok_or("the engine has stopped")?;
        let handle = harness_sdk::run_embedded(worker, &engine).map_err(|e| e.to_string())?;
        Ok(Box::new(handle))
    }
    fn max_answer_bytes(&self) -> usize {
        usize::MAX
    }
}

/// Over the engine's WebSocket: one connection per server's tool set.
pub struct Remote(pub RemoteOptions);

#[async_trait]
impl Publisher for Remote {
    async fn publish(&self, worker: Worker) -> Result<Published, String> {
        let handle = harness_sdk::run_remote(worker, self.0.clone());
        handle
            .wait_connected(Duration::from_secs(30))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(handle))
    }
    fn max_answer_bytes(&self) -> usize {
        // The engine's message limit, less the invocation result's envelope.
        128 * 1024 - 8 * 1024
    }
}

/// For a Lambda: the tools are gathered into the one worker the Lambda serves, whose
/// functions the deployment registers (`{"describe": true}`). A Lambda keeps no connection to
/// the engine, so what a server lists after that is known only at the next registration.
#[derive(Default)]
pub struct Collect {
    sets: Mutex<BTreeMap<String, Vec<FunctionSpec>>>,
}

impl Collect {
    /// `base` with every collected tool added.
    pub fn worker(&self, mut base: Worker) -> Worker {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        for spec in sets.values().flatten() {
            let handler = spec.handler.clone();
            base.register_function(spec.def.clone(), move |ctx, data| handler(ctx, data));
        }
        base
    }
}

#[async_trait]
impl Publisher for Collect {
    async fn publish(&self, worker: Worker) -> Result<Published, String> {
        self.sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(worker.name.clone(), worker.functions().to_vec());
        Ok(Box::new(()))
    }
    fn max_answer_bytes(&self) -> usize {
        // A Lambda's synchronous answer is at most 6 MB; the router's WebSocket message to a
        // client is 128 KiB.
        128 * 1024 - 8 * 1024
    }
}
