use clap::{Parser, Subcommand};
use engine_gateway::server::{self, ServeOptions};

/// The bus of the agent harness: a WebSocket engine that routes function IDs between workers,
/// with durable state, queues, streams, channels and traces.
#[derive(Parser)]
#[command(name = "engine-gateway", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine (embedded durable backend) and its WebSocket edge.
    ///
    /// Environment: every flag has an ENGINE_* variable (shown per flag); RUST_LOG sets the
    /// log filter (default `info`); OTEL_EXPORTER_OTLP_ENDPOINT enables OTLP/HTTP export.
    Serve(ServeOptions),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    server::init_logging();
    match cli.command {
        Command::Serve(opts) => {
            let running = server::start(&opts).await?;
            tracing::info!(listen = %running.local_addr, data_dir = %opts.data_dir.display(), "engine-gateway ready");
            // Tests and scripts read this line to learn the bound port.
            println!("listening on {}", running.url());
            tokio::select! {
                r = &mut { running.edge } => { r??; }
                _ = tokio::signal::ctrl_c() => { tracing::info!("shutting down"); }
            }
        }
    }
    Ok(())
}
