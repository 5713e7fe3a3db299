//! The composite entry point (`cargo run`): the engine and every worker in one process on the
//! embedded backend, running one agent session in the terminal. Tokens stream as they come;
//! tool calls show as they run; a call that needs approval asks y/n (or `--approve-all` /
//! `--deny-all`); a summary ends it: turns, tool calls, tokens, cost, trace id.
//!
//! Without API keys the model is the scripted model server with the demo cassette (an
//! allowed call, one that needs approval, one the policy denies). With `ANTHROPIC_API_KEY` or
//! `OPENAI_API_KEY` set, the same command talks to the real model. Other terminals can watch
//! `agent::events` and resolve approvals over `ws://…` while it runs (`--serve` keeps the
//! engine up afterwards).

use clap::Parser;
use engine_gateway::protocol::Message;
use engine_gateway::server::{self, ServeOptions};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, WorkerHandle, connect_client, run_embedded};
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

// glibc's allocator spent about a quarter of the CPU of a turn (arena locking and chunk
// consolidation under many small JSON values); mimalloc is much cheaper for that pattern.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "harness",
    version,
    about = "Agent harness: engine + workers in one process, one agent session in the terminal"
)]
struct Cli {
    #[command(flatten)]
    serve: ServeOptions,
    /// What to ask the agent.
    #[arg(
        long,
        default_value = "List the files in the working directory, write a short SUMMARY.md about them, and tell me what you did."
    )]
    task: String,
    /// The directory the agent works in (its tools are confined to it). It may not hold the
    /// data dir or the permissions file, nor lie inside the data dir.
    #[arg(long, env = "HARNESS_WORKDIR", default_value = "./workspace")]
    workdir: std::path::PathBuf,
    /// The permissions file.
    #[arg(
        long,
        env = "HARNESS_PERMISSIONS",
        default_value = "iii-permissions.yaml"
    )]
    permissions: std::path::PathBuf,
    /// Approve every call that needs approval without asking.
    #[arg(long, conflicts_with = "deny_all")]
    approve_all: bool,
    /// Deny every call that needs approval without asking.
    #[arg(long)]
    deny_all: bool,
    /// Keep serving after the session ends (other clients can connect).
    #[arg(long = "serve")]
    keep_serving: bool,
    /// Maximum model turns.
    #[arg(long, default_value_t = 12)]
    max_turns: u32,
    /// Script the model with this cassette instead of the demo one (when no API key is set).
    #[arg(long)]
    cassette: Option<std::path::PathBuf>,
    /// Run the engine and workers only: no terminal session (sessions come over the bus).
    #[arg(long)]
    serve_only: bool,
}

const DEMO_CASSETTE: &str = include_str!("../functions/scripted-model/cassettes/demo.json");

/// Which model to talk to: a real one when a key is set, else the scripted one.
async fn provider(
    engine: &Arc<engine_gateway::Engine>,
    cassette: Option<&std::path::Path>,
) -> anyhow::Result<(String, String, Vec<WorkerHandle>)> {
    let mut handles = Vec::new();
    if std::env::var("ANTHROPIC_API_KEY").is_ok_and(|k| !k.is_empty()) {
        handles.push(
            run_embedded(
                provider_core::worker(Arc::new(provider_anthropic::Anthropic::from_env())),
                engine,
            )
            .map_err(anyhow::Error::msg)?,
        );
        return Ok((
            "anthropic".into(),
            std::env::var("HARNESS_MODEL").unwrap_or_else(|_| "claude-sonnet-5-5".into()),
            handles,
        ));
    }
    if std::env::var("OPENAI_API_KEY").is_ok_and(|k| !k.is_empty()) {
        handles.push(
            run_embedded(
                provider_core::worker(Arc::new(provider_openai::OpenAiDialect::openai())),
                engine,
            )
            .map_err(anyhow::Error::msg)?,
        );
        return Ok((
            "openai".into(),
            std::env::var("HARNESS_MODEL").unwrap_or_else(|_| "gpt-5.4".into()),
            handles,
        ));
    }
    let cassette: scripted_model::Cassette = match cassette {
        Some(path) => scripted_model::Cassette::load(path)?,
        None => serde_json::from_str(DEMO_CASSETTE)?,
    };
    let model = scripted_model::ScriptedModel::new(cassette);
    let base = model.serve().await?;
    let dialect = provider_openai::OpenAiDialect {
        name: "scripted".into(),
        base_url: format!("{base}/v1"),
        key_optional: true,
    };
    handles.push(
        run_embedded(provider_core::worker(Arc::new(dialect)), engine)
            .map_err(anyhow::Error::msg)?,
    );
    Ok(("scripted".into(), "scripted-demo".into(), handles))
}

/// The agent's working directory must not reach the harness's own files: not the data dir
/// (secrets, the token, the database), not the permissions file, in either direction.
fn check_workdir(
    workdir: &std::path::Path,
    data_dir: &std::path::Path,
    permissions: &std::path::Path,
) -> anyhow::Result<()> {
    // Canonical where the path exists; its absolute form otherwise.
    let real = |p: &std::path::Path| {
        p.canonicalize()
            .or_else(|_| std::path::absolute(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let (work, data, perms) = (real(workdir), real(data_dir), real(permissions));
    if data.starts_with(&work) || work.starts_with(&data) {
        anyhow::bail!(
            "the working directory {} and the data dir {} overlap: the agent could read the secrets and the token. Choose a --workdir outside --data-dir",
            work.display(),
            data.display()
        );
    }
    if perms.starts_with(&work) {
        anyhow::bail!(
            "the permissions file {} is inside the working directory {}: the agent could rewrite its own rules. Move it, or choose another --workdir",
            perms.display(),
            work.display()
        );
    }
    Ok(())
}

fn ask(question: &str) -> bool {
    print!("{question} [y/N] ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim(), "y" | "Y" | "yes")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    server::disable_transparent_huge_pages();
    server::init_logging();
    // Nothing recovered from the data dir is delivered before every worker below is back.
    cli.serve.hold_until_ready = true;
    let running = server::start(&cli.serve).await?;
    let engine = running.engine.clone();
    std::fs::create_dir_all(&cli.workdir)?;
    check_workdir(&cli.workdir, &cli.serve.data_dir, &cli.permissions)?;
    let holder = harness_worker::PolicyHolder::new(cli.permissions.clone());
    let _watch = holder.watch(Duration::from_millis(500));
    let mut harness = harness_worker::policy_worker(holder);
    harness_worker::add_trigger(&mut harness);
    harness_worker::add_ui(&mut harness, Arc::new(harness_worker::UiHub::default()));
    let auth = auth_credentials::Auth::new(
        harness_sdk::secrets_from_env().await,
        auth_credentials::Auth::process_env(),
    );
    let mut workers = vec![
        run_embedded(turn_orchestrator::worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(approval_gate::worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(harness, &engine).map_err(anyhow::Error::msg)?,
        run_embedded(
            tools_worker::worker(tools_worker::Tools::new(&cli.workdir)?),
            &engine,
        )
        .map_err(anyhow::Error::msg)?,
        run_embedded(auth_credentials::worker(auth), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(
            models_catalog::worker(Arc::new(models_catalog::Catalog::builtin())),
            &engine,
        )
        .map_err(anyhow::Error::msg)?,
        run_embedded(harness_sdk::examples::echo_worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(session_worker::worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(hook_fanout::worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(llm_budget::worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(directory::worker(), &engine).map_err(anyhow::Error::msg)?,
        run_embedded(context_compaction::worker(), &engine).map_err(anyhow::Error::msg)?,
    ];
    let (provider, model, handles) = provider(&engine, cli.cassette.as_deref()).await?;
    workers.extend(handles);
    engine.mark_ready();
    println!(
        "engine-gateway on {} ({}) · model {provider}/{model} · workdir {}",
        running.address(),
        running.token_source(),
        cli.workdir.display()
    );
    if cli.serve_only {
        let _ = std::io::stdout().flush();
        tokio::signal::ctrl_c().await?;
        drop((workers, engine));
        running.shutdown().await;
        return Ok(());
    }

    // Watch the session's events like any other client would.
    let client = connect_client("terminal", RemoteOptions::new(&running.url())).await;
    let mut pushes = client
        .pushes()
        .ok_or_else(|| anyhow::anyhow!("no event channel"))?;
    let sid = format!("cli-{}", engine_gateway::trace::random_hex(4));
    client.send_raw(&Message::StreamSubscribe {
        stream_name: "agent::events".into(),
        group_id: Some(sid.clone()),
    })?;
    let ctx = client.ctx();
    let started = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": {"provider": provider, "model": model, "max_turns": cli.max_turns,
                "messages": [{"role": "user", "content": [{"type": "text", "text": cli.task}], "timestamp": engine_gateway::trace::now_ms()}]}}),
        )
        .await?;
    if started["status_code"] != 200 {
        anyhow::bail!("the session did not start: {started}");
    }
    println!("you: {}\n", cli.task);
    let mut tool_calls = 0;
    // What the provider reported for each model call of this run (message_complete events).
    let (mut input, mut output, mut cost) = (0u64, 0u64, 0f64);
    while let Some(msg) = pushes.recv().await {
        let Message::StreamEvent { event, .. } = msg else {
            continue;
        };
        let data = event.data;
        match data["type"].as_str().unwrap_or("") {
            "message_update" => match data["llm_event"]["type"].as_str() {
                Some("text_delta") => {
                    print!("{}", data["llm_event"]["delta"].as_str().unwrap_or(""));
                    let _ = std::io::stdout().flush();
                }
                Some("thinking_start") => print!("\x1b[2m(thinking) "),
                Some("thinking_delta") => {
                    print!("{}", data["llm_event"]["delta"].as_str().unwrap_or(""))
                }
                Some("thinking_end") => println!("\x1b[0m"),
                _ => {}
            },
            "message_complete" => {
                println!();
                let u = &data["message"]["usage"];
                input += u["input"].as_u64().unwrap_or(0) + u["cache_read"].as_u64().unwrap_or(0);
                output += u["output"].as_u64().unwrap_or(0);
                cost += u["cost_usd"].as_f64().unwrap_or(0.0);
                if data["message"]["stop_reason"] == "error" {
                    println!(
                        "! model error ({}): {}",
                        data["message"]["error_kind"].as_str().unwrap_or("?"),
                        data["message"]["error_message"].as_str().unwrap_or("")
                    );
                }
            }
            "function_execution_start" => {
                tool_calls += 1;
                let parked = data["awaiting_approval"] == true;
                println!(
                    "→ {} {}{}",
                    data["function_id"].as_str().unwrap_or("?"),
                    data["args"],
                    if parked { "  (needs approval)" } else { "" }
                );
                if parked {
                    let cid = data["function_call_id"].as_str().unwrap_or("").to_string();
                    let decision = if cli.approve_all {
                        "allow"
                    } else if cli.deny_all {
                        "deny"
                    } else {
                        let q = format!("  allow {}?", data["function_id"].as_str().unwrap_or("?"));
                        if tokio::task::spawn_blocking(move || ask(&q))
                            .await
                            .unwrap_or(false)
                        {
                            "allow"
                        } else {
                            "deny"
                        }
                    };
                    let r = ctx
                        .trigger("approval::resolve", json!({"session_id": sid, "function_call_id": cid, "decision": decision, "decided_by": "terminal"}))
                        .await?;
                    println!("  {decision}: {r}");
                }
            }
            "function_execution_end" => {
                let result = &data["result"];
                let shown = if result["status"] == "denied" {
                    format!(
                        "denied by {}: {}",
                        result["denied_by"].as_str().unwrap_or("?"),
                        result["reason"].as_str().unwrap_or("")
                    )
                } else {
                    let s = result.to_string();
                    if s.len() > 160 {
                        format!(
                            "{}…",
                            &s[..s.char_indices().nth(160).map(|(i, _)| i).unwrap_or(s.len())]
                        )
                    } else {
                        s
                    }
                };
                println!(
                    "← {} {}",
                    if data["is_error"] == true {
                        "✗"
                    } else {
                        "✓"
                    },
                    shown
                );
            }
            "agent_end" => break,
            _ => {}
        }
    }
    // agent_end is emitted just before the final save: wait for the terminal state.
    let mut state = Value::Null;
    for _ in 0..100 {
        state = ctx
            .trigger("turn::get_state", json!({"session_id": sid}))
            .await?;
        if matches!(state["state"].as_str(), Some("stopped") | Some("failed")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let traces = ctx
        .trigger(
            "engine::traces::group_by",
            json!({"attribute": ATTR_SESSION_ID}),
        )
        .await?;
    let trace: Value = traces["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|x| x["value"] == sid.as_str()))
        .map(|g| g["trace_ids"][0].clone())
        .unwrap_or(Value::Null);
    println!(
        "\n— session {sid}: {} · turns {} · tool calls {tool_calls} · tokens {input} in / {output} out · cost ${cost:.6} · trace {}",
        state["state"].as_str().unwrap_or("?"),
        state["turn_count"],
        trace.as_str().unwrap_or("?")
    );
    if let Some(e) = state["error"].as_object() {
        println!(
            "  ended by {}: {}",
            e["kind"].as_str().unwrap_or("?"),
            e["message"].as_str().unwrap_or("")
        );
    }
    if cli.keep_serving {
        println!(
            "serving on {} ({}); Ctrl-C stops",
            running.address(),
            running.token_source()
        );
        tokio::signal::ctrl_c().await?;
    }
    // Every handle on the engine goes before the shutdown, which waits for the last one.
    drop((workers, client, engine));
    running.shutdown().await;
    Ok(())
}
