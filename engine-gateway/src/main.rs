use clap::{Parser, Subcommand};
use engine_gateway::server::{self, ServeOptions};

// glibc's allocator spent about a fifth of the engine's CPU under sixteen callers (chunk
// consolidation and unlinking, bench/results/bus.md); mimalloc, as the harness uses.
#[global_allocator]
static GLOBAL: harness_alloc::MiMalloc = harness_alloc::MiMalloc;

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
    Serve(Box<ServeOptions>),
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
    /// Run the deployed shape on this machine: every function of the template as its own
    /// `bootstrap` under the local Runtime API (from `--lambda-dir`), the engine router behind
    /// an emulated API Gateway WebSocket API, the template's event-source mappings and the
    /// Slack webhook's Function URL, on the AWS endpoint of the environment (LocalStack:
    /// `source localstack/env.sh`). Prints the WebSocket URL and the `$connect` token, then
    /// runs until interrupted. `localstack/deployed.sh up` does all of it.
    Deployed {
        #[arg(long, default_value = "infra/template.yaml")]
        template: std::path::PathBuf,
        /// The `cargo lambda build` output directory.
        #[arg(long, default_value = "target/lambda")]
        lambda_dir: std::path::PathBuf,
        #[arg(long, env = "HARNESS_AWS_PREFIX", default_value = "harness-")]
        aws_prefix: String,
        /// Processes per function.
        #[arg(long, default_value_t = 4)]
        max_processes: usize,
        /// A template parameter, `KEY=VALUE` (e.g. `SlackApprovers=U123`); repeatable.
        #[arg(long = "parameter", value_parser = parse_parameter)]
        parameters: Vec<(String, String)>,
    },
    /// Write the template of `harness.yaml`'s `lambda.colocate` layout: each group of workers
    /// one Lambda running the `colocated-lambda` bootstrap (its members' variables, policies
    /// and event sources), the rest as the template has them. Deploy it with `sam deploy
    /// --template-file`, or run it here with `deployed --template` (`HARNESS_CONFIG=…
    /// localstack/deployed.sh up` does both steps).
    Colocate {
        /// The `harness.yaml` whose `lambda` section to follow (the rest is not read).
        #[arg(long)]
        config: std::path::PathBuf,
        #[arg(long, default_value = "infra/template.yaml")]
        template: std::path::PathBuf,
        /// Where to write it (default: standard output).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Start every `bootstrap` under `DIR` (`DIR/<function>/bootstrap`, as `cargo lambda build`
    /// lays them out) under a local Runtime API, invoke each once with `{"describe": true}`,
    /// and print its cold start. Fails when any bootstrap does not start and answer.
    CheckLambdas {
        /// The `cargo lambda build` output directory.
        #[arg(long, default_value = "target/lambda")]
        dir: std::path::PathBuf,
        /// Check only these functions (default: every folder with a bootstrap).
        names: Vec<String>,
        /// How long one bootstrap may take to start and answer.
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
    },
    /// Print the SHA-256 of a token, as the access file (`--access`) stores it. The token is
    /// read from standard input, so it stays out of the shell history.
    HashToken,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    server::init_logging();
    harness_alloc::purge_freed_pages_at_once();
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
        Command::Colocate {
            config,
            template,
            out,
        } => {
            let yaml = engine_gateway::colocate::colocate_files(&template, &config)?;
            match out {
                Some(path) => std::fs::write(&path, yaml)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
                None => print!("{yaml}"),
            }
        }
        Command::CheckLambdas {
            dir,
            names,
            timeout_secs,
        } => check_lambdas(&dir, names, timeout_secs).await?,
        Command::Deployed {
            template,
            lambda_dir,
            aws_prefix,
            max_processes,
            parameters,
        } => {
            let mut opts =
                engine_gateway::deployed::DeployedOptions::new(template, lambda_dir, &aws_prefix);
            opts.max_processes = max_processes;
            opts.parameters = parameters;
            let d = engine_gateway::deployed::up(&opts).await?;
            println!("websocket: {}", d.url);
            println!("token: {}", d.token);
            if let Some(u) = &d.slack_url {
                println!("slack webhook: {u}");
            }
            if let Some(u) = &d.doors_url {
                println!("doors: {u} (/v1/chat/completions, /ag-ui, /mcp, /a2a)");
            }
            println!("management api: {}", d.management_url);
            println!(
                "functions: {}",
                d.functions
                    .iter()
                    .map(|(f, _)| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            d.shutdown();
        }
        Command::HashToken => {
            let mut token = String::new();
            std::io::stdin().read_line(&mut token)?;
            let token = token.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(!token.is_empty(), "no token on standard input");
            println!("{}", engine_gateway::access::hash_token(token));
        }
        Command::Serve(opts) => {
            let running = server::start(&opts).await?;
            tracing::info!(listen = %running.local_addr, data_dir = %opts.data_dir.display(), token = %running.token_source(), "engine-gateway ready");
            // Tests and scripts read this line to learn the bound port (never the token).
            println!(
                "listening on {} ({})",
                running.address(),
                running.token_source()
            );
            tokio::select! {
                r = &mut { running.edge } => { r??; }
                _ = tokio::signal::ctrl_c() => { tracing::info!("shutting down"); }
            }
        }
    }
    Ok(())
}

fn parse_parameter(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}`: expected KEY=VALUE")),
    }
}

async fn check_lambdas(
    dir: &std::path::Path,
    mut names: Vec<String>,
    timeout_secs: u64,
) -> anyhow::Result<()> {
    use engine_gateway::lambda_host::{LambdaSpec, check_start, describe_event};
    if names.is_empty() {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry?;
            if entry.path().join("bootstrap").is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
    }
    anyhow::ensure!(!names.is_empty(), "no bootstrap under {}", dir.display());
    println!(
        "{:<22} {:>14} {:>14}  answer",
        "function", "cold start", "first answer"
    );
    let mut failed = Vec::new();
    for name in &names {
        let mut spec = LambdaSpec::new(name, dir.join(name).join("bootstrap"));
        spec.timeout = std::time::Duration::from_secs(timeout_secs);
        if name == engine_gateway::colocate::BINARY {
            // It serves what its template names; here, every worker it can.
            spec.env.push((
                "HARNESS_COLOCATED_WORKERS".into(),
                engine_gateway::colocate::shareable_binaries().join(","),
            ));
        }
        match check_start(spec, Vec::new(), &describe_event()).await {
            Ok(c) => {
                // A worker lists its functions; the engine router answers that it routes
                // WebSocket and stream events only. Either way the handler loop ran.
                let what = match c.answer["functions"].as_array() {
                    Some(f) => format!("{} functions", f.len()),
                    None => c.answer["error"]["code"]
                        .as_str()
                        .map_or_else(|| c.answer.to_string(), |code| format!("error {code}")),
                };
                println!(
                    "{:<22} {:>11.1} ms {:>11.1} ms  {what}",
                    c.name,
                    c.cold_start.as_secs_f64() * 1e3,
                    c.first_answer.as_secs_f64() * 1e3
                );
            }
            Err(e) => {
                println!("{name:<22} FAILED: {e}");
                failed.push(name.clone());
            }
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "bootstraps that did not start and answer: {}",
        failed.join(", ")
    );
    Ok(())
}
