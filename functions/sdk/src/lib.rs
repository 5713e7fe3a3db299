//! harness-sdk: what every worker uses. A [`Worker`] is a named set of functions and
//! triggers; handlers get a [`Ctx`] to call other functions, use state, queues, streams and
//! channels. The same worker runs three ways: [`run_embedded`] (in process with the engine),
//! [`run_remote`] (over the engine's WebSocket, `ENGINE_URL`), and [`run_lambda`] (AWS Lambda).

pub mod aws_bus;
pub mod bus;
pub mod channel;
pub mod colocated;
pub mod contracts;
pub mod ctx;
pub mod embedded;
pub mod error;
pub mod examples;
pub mod lambda;
pub mod messages;
pub mod owners;
mod parts;
mod pushes;
pub mod remote;
pub mod session_layout;
pub mod span;
pub mod worker;

pub use ::bus::channels::{ChannelFrame, ChannelRef};
pub use ::bus::protocol::{ErrorBody, RegisterFunction};
pub use bus::{Bus, EnqueueOptions};
pub use channel::{ChannelReader, ChannelWriter};
pub use ctx::{Ctx, Write, fields};
pub use embedded::{run_embedded, run_embedded_through};
pub use error::BusError;
pub use lambda::{HttpHandler, handle_event, run_lambda, run_lambda_with, under_lambda_runtime};
pub use remote::{RemoteOptions, connect_client, run_remote};
pub use worker::{DefExt, FnResult, Worker, def};

use std::sync::Arc;

/// The secret store this process should use: Secrets Manager when `ENGINE_BACKEND=aws`
/// (names under `HARNESS_AWS_PREFIX`), else the 0600 file `HARNESS_SECRETS_FILE`
/// (default `./.harness-data/secrets.json`).
pub async fn secrets_from_env() -> Arc<dyn ::bus::secrets::SecretStore> {
    if std::env::var("ENGINE_BACKEND").is_ok_and(|b| b == "aws") {
        // Built off the start-up path (::bus::prewarm); the first call waits for it.
        let store = ::bus::prewarm::start("Secrets Manager", async {
            let prefix = std::env::var("HARNESS_AWS_PREFIX").unwrap_or_else(|_| "harness-".into());
            let clients = bus_aws::AwsClients::from_env().await;
            Arc::new(bus_aws::secrets::AwsSecrets::new(
                clients,
                bus_aws::AwsNames::new(&prefix),
            )) as Arc<dyn ::bus::secrets::SecretStore>
        });
        Arc::new(::bus::secrets::StartedSecrets(store))
    } else {
        let path = std::env::var("HARNESS_SECRETS_FILE")
            .unwrap_or_else(|_| "./.harness-data/secrets.json".into());
        Arc::new(::bus::secrets::FileSecrets::new(path.into()))
    }
}

/// A running worker: its bus (to make calls from outside a handler) and a way to stop it.
pub struct WorkerHandle {
    worker_id: String,
    bus: Arc<dyn Bus>,
    stop: Option<Box<dyn FnOnce() + Send + Sync>>,
    remote: Option<Arc<remote::RemoteBus>>,
}

impl WorkerHandle {
    fn new(worker_id: String, bus: Arc<dyn Bus>, stop: Box<dyn FnOnce() + Send + Sync>) -> Self {
        Self {
            worker_id,
            bus,
            stop: Some(stop),
            remote: None,
        }
    }

    pub fn bus(&self) -> Arc<dyn Bus> {
        self.bus.clone()
    }

    /// A context for calls made outside any handler (starts a new trace).
    pub fn ctx(&self) -> Ctx {
        Ctx::root(self.bus.clone())
    }

    /// The engine's id for this worker (remote: the current connection's).
    pub fn worker_id(&self) -> String {
        match &self.remote {
            Some(r) => r.worker_id().unwrap_or_default(),
            None => self.worker_id.clone(),
        }
    }

    /// Unregister everything (embedded) or close the connection (remote).
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop();
        }
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `main` of a worker binary: a Lambda `bootstrap` under a Runtime API, otherwise a
/// remote worker on `ENGINE_URL` until Ctrl-C.
pub async fn serve_main(worker: Worker) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    bus_telemetry::logging::init_logging();
    if under_lambda_runtime() || std::env::args().nth(1).as_deref() == Some("lambda") {
        return run_lambda(worker).await;
    }
    let opts = RemoteOptions::from_env();
    let name = worker.name.clone();
    let handle = run_remote(worker, opts.clone());
    handle
        .wait_connected(std::time::Duration::from_secs(30))
        .await?;
    tracing::info!(worker = %name, url = %opts.url, "worker connected");
    tokio::signal::ctrl_c().await?;
    // Nothing recorded is lost at exit: the periodic export may not have come.
    handle.bus().flush_pushes().await;
    handle.bus().flush_telemetry().await;
    Ok(())
}
