//! The composite entry point: the engine and the configured workers in one process, on the
//! embedded durable backend. `cargo run` starts it with no cloud at all.

use clap::Parser;
use engine_gateway::server::{self, ServeOptions};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::examples::echo_worker;
use harness_sdk::run_embedded;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "harness",
    version,
    about = "Agent harness: engine + workers in one process (embedded backend)"
)]
struct Cli {
    #[command(flatten)]
    serve: ServeOptions,
    /// Run the demo calls, print what happened, and exit instead of serving.
    #[arg(long)]
    once: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    server::init_logging();
    let running = server::start(&cli.serve).await?;
    let _echo = run_embedded(echo_worker(), &running.engine).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "engine-gateway listening on {} (data dir {})",
        running.url(),
        cli.serve.data_dir.display()
    );

    // A short demonstration through the bus: one call that hops twice, traced end to end.
    let demo = harness_sdk::Ctx::root(harness_sdk::embedded::EmbeddedBus::shared(
        &running.engine,
        "demo",
    ))
    .with_baggage(ATTR_SESSION_ID, "demo-session");
    let greeting = demo
        .trigger("demo::greet", json!({"name": "harness"}))
        .await?;
    let chained = demo.trigger("demo::chain", json!({"hello": "bus"})).await?;
    let traces = demo
        .trigger(
            "engine::traces::group_by",
            json!({"attribute": ATTR_SESSION_ID}),
        )
        .await?;
    println!("demo::greet  → {greeting}");
    println!("demo::chain  → {chained}");
    println!(
        "trace        → {} spans in trace {}",
        traces["groups"][0]["span_count"], traces["groups"][0]["trace_ids"][0]
    );
    if cli.once {
        running.shutdown().await;
        return Ok(());
    }
    println!(
        "workers connect with ENGINE_URL={} ; Ctrl-C stops",
        running.url()
    );
    tokio::signal::ctrl_c().await?;
    running.shutdown().await;
    Ok(())
}
