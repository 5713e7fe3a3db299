//! `scripted-model-server --cassette FILE [--listen ADDR]`: the scripted model over HTTP.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "scripted-model-server",
    about = "Anthropic Messages and OpenAI Chat Completions SSE, scripted by a cassette"
)]
struct Cli {
    /// The cassette (JSON): `{"turns": [...], "repeat_last"?, "require_api_key"?}`.
    #[arg(long)]
    cassette: std::path::PathBuf,
    #[arg(long, default_value = "127.0.0.1:49180")]
    listen: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let model = scripted_model::ScriptedModel::new(scripted_model::Cassette::load(&cli.cassette)?);
    let listener = tokio::net::TcpListener::bind(&cli.listen).await?;
    println!("scripted model on http://{}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
        let _ = s.set_nodelay(true);
    });
    axum::serve(listener, model.router()).await?;
    Ok(())
}
