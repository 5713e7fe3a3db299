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
    /// Run the engine and its WebSocket edge.
    ///
    /// Environment: every flag has a variable (shown per flag); RUST_LOG sets the log filter
    /// (default `info`); OTEL_EXPORTER_OTLP_ENDPOINT enables OTLP/HTTP export; with
    /// `--backend aws`, AWS_ENDPOINT_URL, AWS_REGION and the usual credential variables
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) select the account.
    Serve(ServeOptions),
    /// Create every AWS resource (tables with streams, FIFO queues with DLQs, secrets)
    /// idempotently, from the standard AWS environment, and print what exists.
    Provision {
        #[command(flatten)]
        aws: engine_gateway::server::AwsOptions,
        /// Print the resource manifest for the prefix without contacting AWS.
        #[arg(long)]
        dry_run: bool,
    },
    /// Record what deployed worker Lambdas serve (their functions and state triggers) in the
    /// registry table, so the router and the other Lambdas can reach them. Run after each
    /// deploy; idempotent.
    RegisterLambda {
        #[command(flatten)]
        aws: engine_gateway::server::AwsOptions,
        /// Lambda function names (as deployed, e.g. `harness-turn-orchestrator`).
        #[arg(required = true)]
        function_names: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    server::init_logging();
    match cli.command {
        Command::Provision { aws, dry_run: true } => {
            let names = engine_gateway::aws::AwsNames::new(&aws.prefix);
            let manifest = engine_gateway::aws::resources::manifest(&names);
            println!("{}", serde_json::to_string_pretty(&manifest)?);
        }
        Command::Provision {
            aws,
            dry_run: false,
        } => {
            let clients = engine_gateway::aws::AwsClients::new(aws.endpoint_url.as_deref()).await;
            let names = engine_gateway::aws::AwsNames::new(&aws.prefix);
            let manifest = engine_gateway::aws::resources::ensure_all(&clients, &names).await?;
            println!("{}", serde_json::to_string_pretty(&manifest)?);
        }
        Command::RegisterLambda {
            aws,
            function_names,
        } => {
            let clients = engine_gateway::aws::AwsClients::new(aws.endpoint_url.as_deref()).await;
            let names = engine_gateway::aws::AwsNames::new(&aws.prefix);
            for name in function_names {
                let out =
                    engine_gateway::aws::router::register_lambda(&clients, &names, &name).await?;
                println!("{out}");
            }
        }
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
