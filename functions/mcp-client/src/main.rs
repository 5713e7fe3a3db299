//! The `mcp` worker as its own process: a remote worker on `ENGINE_URL`, or a Lambda under a
//! Runtime API. Its servers come from `HARNESS_MCP_SERVERS` (the `mcp_servers:` list, YAML or
//! JSON; the template's `McpServers` parameter) or the `mcp_servers:` of the file
//! `HARNESS_CONFIG`; stdio servers start in `HARNESS_WORKDIR` (default `./workspace`).
//!
//! As a Lambda it serves `url` servers only (a Lambda keeps no process between invocations): a
//! stdio server stops it at start, saying so. Their tools are listed during the cold start and
//! described for the deployment's registration; each warm instance keeps its connections.

use mcp_client::{Mcp, ServerConfig, publish};
use std::sync::Arc;
use std::time::Duration;

fn servers_from_env() -> Result<Vec<ServerConfig>, String> {
    if let Ok(text) = std::env::var("HARNESS_MCP_SERVERS")
        && !text.trim().is_empty()
    {
        return serde_norway::from_str(&text).map_err(|e| format!("HARNESS_MCP_SERVERS: {e}"));
    }
    let Ok(path) = std::env::var("HARNESS_CONFIG") else {
        // Nothing listed: the worker serves mcp::servers (empty) and mcp::cancel, and says so.
        tracing::warn!("no MCP servers configured (HARNESS_MCP_SERVERS or HARNESS_CONFIG)");
        return Ok(Vec::new());
    };
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        mcp_servers: Vec<ServerConfig>,
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // Only this section is read: the rest of the file is the harness's.
    let doc: serde_norway::Value =
        serde_norway::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let section = serde_norway::to_string(&serde_norway::Value::Mapping(
        [(
            serde_norway::Value::from("mcp_servers"),
            doc.get("mcp_servers").cloned().unwrap_or_default(),
        )]
        .into_iter()
        .collect(),
    ))
    .map_err(|e| e.to_string())?;
    let file: File = serde_norway::from_str(&section).map_err(|e| format!("{path}: {e}"))?;
    Ok(file.mcp_servers)
}

/// How long a cold start waits for its servers' tools (a Lambda's init phase has 10 s).
const LAMBDA_LIST_WAIT: Duration = Duration::from_secs(8);

async fn lambda(
    servers: Vec<ServerConfig>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Some(s) = servers
        .iter()
        .find(|s| matches!(s.transport(), mcp_client::config::Transport::Stdio(_)))
    {
        return Err(format!(
            "MCP server `{}` is a stdio server: a Lambda keeps no process between invocations, so the mcp Lambda serves `url` (streamable HTTP) servers only; run the worker embedded or remote for stdio servers",
            s.name
        )
        .into());
    }
    // The vault is reached as every Lambda reaches other functions: the engine's WebSocket
    // when `ENGINE_URL` is set, else the registry and Lambda Invoke.
    let (bus, _client): (Arc<dyn harness_sdk::Bus>, _) = match std::env::var("ENGINE_URL") {
        Ok(url) if !url.is_empty() => {
            let opts = harness_sdk::RemoteOptions::new(&url)
                .with_token(std::env::var("ENGINE_TOKEN").ok());
            let c = harness_sdk::connect_client("mcp-vault", opts).await;
            (c.bus(), Some(c))
        }
        _ => (
            Arc::new(harness_sdk::aws_bus::AwsBus::from_env().await),
            None,
        ),
    };
    let collect = Arc::new(publish::Collect::default());
    let workdir = std::env::var("HARNESS_WORKDIR").unwrap_or_else(|_| "/tmp".into());
    let mcp = Mcp::start(
        servers,
        workdir.into(),
        collect.clone(),
        mcp_client::secrets::from_vault(harness_sdk::Ctx::root(bus)),
    );
    for (name, why) in mcp.wait_listed(LAMBDA_LIST_WAIT).await {
        tracing::warn!(server = %name, %why, "MCP server not listed at cold start; its tools are not served by this instance");
    }
    let worker = collect.worker(mcp_client::worker(mcp.clone()));
    harness_sdk::run_lambda(worker).await?;
    drop(mcp);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    bus_telemetry::logging::init_logging();
    let servers = servers_from_env()?;
    mcp_client::config::check_all(&servers)?;
    if harness_sdk::under_lambda_runtime() || std::env::args().nth(1).as_deref() == Some("lambda") {
        return lambda(servers).await;
    }
    let opts = harness_sdk::RemoteOptions::from_env();
    let workdir = std::env::var("HARNESS_WORKDIR").unwrap_or_else(|_| "./workspace".into());
    let control = harness_sdk::connect_client("mcp-secrets", opts.clone()).await;
    let secrets = mcp_client::secrets::from_vault(control.ctx());
    let mcp = Mcp::start(
        servers,
        workdir.into(),
        Arc::new(publish::Remote(opts.clone())),
        secrets,
    );
    for (name, why) in mcp.wait_listed(Duration::from_secs(30)).await {
        tracing::warn!(server = %name, %why, "MCP server not listed yet");
    }
    let handle = harness_sdk::run_remote(mcp_client::worker(mcp.clone()), opts);
    handle.wait_connected(Duration::from_secs(30)).await?;
    tracing::info!("mcp worker connected");
    tokio::signal::ctrl_c().await?;
    drop(mcp);
    Ok(())
}
