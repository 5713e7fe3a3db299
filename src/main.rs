//! The composite entry point (`cargo run`): the engine and the workers `harness.yaml` names
//! (default: `./harness.yaml`, else the thick preset: every worker) in one process on the
//! embedded backend, running one agent session in the terminal. Tokens stream as they come;
//! tool calls show as they run; a call that needs approval asks y/n (or `--approve-all` /
//! `--deny-all`); a summary ends it: turns, tool calls, tokens, cost, trace id.
//!
//! Without API keys the model is the scripted model server with the demo cassette (an
//! allowed call, one that needs approval, one the policy denies). With `ANTHROPIC_API_KEY` or
//! `OPENAI_API_KEY` set, the same command talks to the real model; `--provider` picks any of
//! them. Other terminals can watch `agent::events` and resolve approvals over `ws://…` while
//! it runs (`--serve` keeps the engine up afterwards).

use agent_harness::compose::{self, Inputs};
use agent_harness::config::{Config, ProviderName, ScriptedSettings};
use clap::Parser;
use engine_gateway::protocol::Message;
use engine_gateway::server::{self, ServeOptions};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, connect_client};
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::time::Duration;

// glibc's allocator spent about a quarter of the CPU of a turn (arena locking and chunk
// consolidation under many small JSON values); mimalloc is much cheaper for that pattern.
#[global_allocator]
static GLOBAL: agent_harness::alloc::MiMalloc = agent_harness::alloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "harness",
    version,
    about = "Agent harness: engine + workers in one process, one agent session in the terminal"
)]
struct Cli {
    #[command(flatten)]
    serve: ServeOptions,
    /// Which workers run, where, and their settings: `thin`, `thick`, or a file's path.
    /// Default: ./harness.yaml when there is one, else `thick`.
    #[arg(long, env = "HARNESS_CONFIG")]
    config: Option<String>,
    /// What to ask the agent.
    #[arg(
        long,
        default_value = "List the files in the working directory, write a short SUMMARY.md about them, and tell me what you did."
    )]
    task: String,
    /// The model provider (overrides the configuration's `run.provider`).
    #[arg(long, value_enum)]
    provider: Option<ProviderName>,
    /// The model (overrides `run.model`; default: the provider's).
    #[arg(long, env = "HARNESS_MODEL")]
    model: Option<String>,
    /// The directory the agent works in (its tools are confined to it). It may not hold the
    /// data dir or the permissions file, nor lie inside the data dir. Overrides
    /// `sandbox.workdir` (default ./workspace).
    #[arg(long, env = "HARNESS_WORKDIR")]
    workdir: Option<std::path::PathBuf>,
    /// Where each session's agent works: `per_session` (`<workdir>/<session-id>/`; this
    /// terminal's own session keeps <workdir> itself) or `shared` (<workdir> for every
    /// session). Overrides `sandbox.workspace`.
    #[arg(long, env = "HARNESS_WORKSPACE", value_parser = ["per_session", "shared"])]
    workspace: Option<String>,
    /// The permissions file (overrides `policy.permissions`, default iii-permissions.yaml).
    #[arg(long, env = "HARNESS_PERMISSIONS")]
    permissions: Option<std::path::PathBuf>,
    /// Approve every call that needs approval without asking.
    #[arg(long, conflicts_with = "deny_all")]
    approve_all: bool,
    /// Deny every call that needs approval without asking.
    #[arg(long)]
    deny_all: bool,
    /// Keep serving after the session ends (other clients can connect).
    #[arg(long = "serve")]
    keep_serving: bool,
    /// Maximum model turns (overrides `run.max_turns`).
    #[arg(long)]
    max_turns: Option<std::num::NonZeroU64>,
    /// Script the model with this cassette instead of the demo one.
    #[arg(long)]
    cassette: Option<std::path::PathBuf>,
    /// Run the engine and workers only: no terminal session (sessions come over the bus).
    #[arg(long)]
    serve_only: bool,
}

/// The configuration with the command line's overrides.
fn configuration(cli: &Cli) -> anyhow::Result<(Config, String)> {
    let (mut cfg, origin) = match &cli.config {
        Some(c) => (Config::load(c)?, c.clone()),
        None => Config::load_default()?,
    };
    if let Some(w) = &cli.workdir {
        cfg.sandbox.workdir = w.clone();
    }
    match cli.workspace.as_deref() {
        Some("shared") => cfg.sandbox.workspace = agent_harness::config::Workspace::Shared,
        Some("per_session") => cfg.sandbox.workspace = agent_harness::config::Workspace::PerSession,
        _ => {}
    }
    if let Some(p) = &cli.permissions {
        cfg.policy.permissions = p.clone();
    }
    if let Some(n) = cli.max_turns {
        cfg.run.max_turns = n;
    }
    if let Some(m) = &cli.model {
        cfg.run.model = Some(m.clone());
    }
    if let Some(path) = &cli.cassette {
        let s = cfg
            .providers
            .scripted
            .get_or_insert_with(ScriptedSettings::default);
        s.cassette = Some(path.clone());
        cfg.run.provider = agent_harness::config::ProviderChoice::Ours(ProviderName::Scripted);
    }
    if let Some(p) = cli.provider {
        // A provider named on the command line is registered even when the file leaves it out.
        cfg.providers.include(p);
        cfg.run.provider = agent_harness::config::ProviderChoice::Ours(p);
    }
    Ok((cfg, origin))
}

/// The terminal's lines, read by one thread for the whole session (a question abandoned
/// because someone decided elsewhere leaves no reader behind that would swallow a line).
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agent_harness::alloc::purge_freed_pages_at_once();
    let mut cli = Cli::parse();
    server::disable_transparent_huge_pages();
    server::init_logging();
    // An invalid file stops here, before anything starts.
    let (cfg, origin) = match configuration(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("harness: the configuration is not valid: {e:#}");
            std::process::exit(2);
        }
    };
    // Nothing recovered from the data dir is delivered before every worker below is back.
    cli.serve.hold_until_ready = true;
    cli.serve.door_approval_wait_secs = cfg.doors.approval_wait_secs;
    let running = server::start(&cli.serve).await?;
    let engine = running.engine.clone();
    if cfg.workers.tools.embedded() {
        std::fs::create_dir_all(&cfg.sandbox.workdir)?;
        compose::check_workdir(
            &cfg.sandbox.workdir,
            &cli.serve.data_dir,
            &cfg.policy.permissions,
        )?;
    }
    let composition = compose::start(&cfg, &engine, Inputs::default()).await?;
    engine.mark_ready();
    let (provider, model) = (composition.provider.clone(), composition.model.clone());
    let workdir = if cfg.workers.tools.embedded() {
        format!(" · workdir {}", cfg.sandbox.workdir.display())
    } else {
        String::new()
    };
    println!(
        "engine-gateway on {} ({}) · {origin} · model {provider}/{model}{workdir}",
        running.address(),
        running.token_source(),
    );
    for line in &composition.report {
        println!("  {line}");
    }
    // The link carries a one-time code, not the token: it is spent by the first sign-in.
    println!(
        "console: {} (sign in with the token, or once with {})",
        running.console_url(),
        running.console_sign_in_link()
    );
    if cli.serve_only {
        let _ = std::io::stdout().flush();
        tokio::signal::ctrl_c().await?;
        engine.flush_telemetry().await;
        drop((composition, engine));
        running.shutdown().await;
        return Ok(());
    }

    // Watch the session's events like any other client would.
    let client = connect_client("terminal", RemoteOptions::new(&running.url())).await;
    let mut pushes = client
        .pushes()
        .ok_or_else(|| anyhow::anyhow!("no event channel"))?;
    let sid = format!("cli-{}", engine_gateway::trace::random_hex(4));
    // The terminal's own session works in --workdir itself, where its user looks for the
    // agent's files; every session someone else starts gets its own directory.
    if let Some(tools) = &composition.tools {
        tools.share_root_with(&sid);
    }
    client.send_raw(&Message::StreamSubscribe {
        stream_name: "agent::events".into(),
        group_id: Some(sid.clone()),
        batch: false,
    })?;
    // The session's own root span: every call below nests under it, so the trace has no
    // parent a collector never receives.
    let mut session_span = client
        .ctx()
        .with_baggage(ATTR_SESSION_ID, &sid)
        .root_span("harness session", "terminal");
    session_span.set("iii.session.id", &sid);
    let ctx = session_span.ctx().clone();
    let mut payload = composition.run_defaults.clone();
    payload["messages"] = json!([{"role": "user", "content": [{"type": "text", "text": cli.task}], "timestamp": engine_gateway::trace::now_ms()}]);
    // Through the front door when there is one (both presets have it; a composition without
    // the harness worker has only run::start).
    let started = if cfg.workers.harness.present() {
        ctx.trigger(
            "harness::trigger",
            json!({"session_id": sid, "payload": payload}),
        )
        .await?
    } else {
        // run::start is not a client's to call: an embedded worker's context starts it.
        payload["session_id"] = json!(sid);
        let inner = composition
            .workers
            .first()
            .ok_or_else(|| anyhow::anyhow!("no worker runs here to start the session"))?
            .ctx()
            .with_baggage(ATTR_SESSION_ID, &sid);
        let body = inner.trigger("run::start", payload).await?;
        json!({"status_code": if body["started"] == true { 200 } else { 409 }, "body": body})
    };
    if started["status_code"] != 200 {
        anyhow::bail!("the session did not start: {started}");
    }
    println!("you: {}\n", cli.task);
    let mut tool_calls = 0;
    // What the provider reported for each model call of this run (message_complete events).
    let (mut input, mut output, mut cost) = (0u64, 0u64, 0f64);
    // Of the input: read from the provider's prompt cache, and written to it.
    let (mut cache_read, mut cache_write) = (0u64, 0u64);
    // Decided by the person at this terminal (the engine token's holder).
    let decide = |cid: &str, decision: &'static str| {
        let (ctx, call) = (
            ctx.with_baggage(engine_gateway::access::ACTING_BAGGAGE, "admin:terminal"),
            json!({"session_id": sid, "function_call_id": cid, "decision": decision}),
        );
        async move {
            let r = ctx.trigger("approval::resolve", call).await?;
            println!("  {decision}: {r}");
            anyhow::Ok(())
        }
    };
    // Parked calls wait for this terminal's answer one at a time; a decision made elsewhere
    // (the console, Slack, the HTTP API) takes the question away and is said here.
    let mut waiting: std::collections::VecDeque<(String, String)> = Default::default();
    let mut asking: Option<String> = None;
    let mut lines: Option<tokio::sync::mpsc::UnboundedReceiver<String>> = None;
    loop {
        if asking.is_none()
            && let Some((cid, fid)) = waiting.pop_front()
        {
            print!("  allow {fid}? [y/N] ");
            let _ = std::io::stdout().flush();
            lines.get_or_insert_with(stdin_lines);
            asking = Some(cid);
        }
        let msg = tokio::select! {
            m = pushes.recv() => match m {
                Some(m) => m,
                None => break,
            },
            line = async { lines.as_mut()?.recv().await }, if asking.is_some() => {
                let cid = asking.take().unwrap_or_default();
                let yes = matches!(line.as_deref().map(str::trim), Some("y" | "Y" | "yes"));
                decide(&cid, if yes { "allow" } else { "deny" }).await?;
                continue;
            }
        };
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
                let read = u["cache_read"].as_u64().unwrap_or(0);
                let write = u["cache_write"].as_u64().unwrap_or(0);
                input += u["input"].as_u64().unwrap_or(0) + read + write;
                cache_read += read;
                cache_write += write;
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
                    if cli.approve_all || cli.deny_all {
                        decide(&cid, if cli.approve_all { "allow" } else { "deny" }).await?;
                    } else {
                        let fid = data["function_id"].as_str().unwrap_or("?").to_string();
                        waiting.push_back((cid, fid));
                    }
                }
            }
            "approval_applied" => {
                let cid = data["function_call_id"].as_str().unwrap_or("");
                let elsewhere =
                    asking.as_deref() == Some(cid) || waiting.iter().any(|(c, _)| c == cid);
                if elsewhere {
                    if asking.as_deref() == Some(cid) {
                        asking = None;
                        println!();
                    }
                    waiting.retain(|(c, _)| c != cid);
                    let reason = data["reason"].as_str().filter(|r| !r.is_empty());
                    println!(
                        "  decided elsewhere: {} by {}{}",
                        data["decision"].as_str().unwrap_or("?"),
                        data["decided_by"]
                            .as_str()
                            .filter(|b| !b.is_empty())
                            .unwrap_or("someone"),
                        reason.map(|r| format!(" ({r})")).unwrap_or_default()
                    );
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
    let cached = match (cache_read, cache_write) {
        (0, 0) => String::new(),
        (r, w) => format!(" ({r} read from the prompt cache, {w} written to it)"),
    };
    println!(
        "\n— session {sid}: {} · turns {} · tool calls {tool_calls} · tokens {input} in{cached} / {output} out · cost ${cost:.6} · trace {}",
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
    // Telemetry first, while every worker still answers the gauges; then every handle on
    // the engine goes before the shutdown, which waits for the last one.
    session_span.finish(state["state"].as_str().filter(|s| *s == "failed"));
    ctx.bus().flush_telemetry().await;
    engine.flush_telemetry().await;
    drop((composition, client, engine));
    running.shutdown().await;
    Ok(())
}
