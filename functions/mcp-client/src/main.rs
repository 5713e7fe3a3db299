//! The `mcp` worker as its own process: a remote worker on `ENGINE_URL`, its servers from
//! `HARNESS_MCP_SERVERS` (the `mcp_servers:` list, YAML or JSON) or the `mcp_servers:` of the
//! file `HARNESS_CONFIG`; stdio servers start in `HARNESS_WORKDIR` (default `./workspace`).

use mcp_client::{Mcp, ServerConfig, publish};
use std::sync::Arc;
use std::time::Duration;

fn servers_from_env() -> Result<Vec<ServerConfig>, String> {
    if let Ok(text) = std::env::var("HARNESS_MCP_SERVERS") {
        return serde_norway::from_str(&text).map_err(|e| format!("HARNESS_MCP_SERVERS: {e}"));
    }
    let Ok(path) = std::env::var("HARNESS_CONFIG") else {
        return Err("no servers: set HARNESS_MCP_SERVERS or HARNESS_CONFIG".into());
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    engine_gateway::server::init_logging();
    let servers = servers_from_env()?;
    mcp_client::config::check_all(&servers)?;
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
