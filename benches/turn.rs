//! Turn benchmark (not a test): harness overhead per tool call and per turn with a
//! zero-latency scripted model, and turns/s with 50 concurrent sessions. The whole stack is
//! real and durable: orchestrator steps on the FIFO queue, every record write committed, the
//! policy asked for every call, the provider streaming SSE over local HTTP.
//! `BENCH_BACKEND=aws` runs it on the AWS backend (LocalStack), `BENCH_K` tool calls per
//! session (default 50), `BENCH_SESSIONS` sequential sessions (default 5), `BENCH_CONCURRENT`
//! concurrent sessions (default 50), `BENCH_ROUNDS` rounds of both, interleaved (default 3;
//! the figures are medians over them), `BENCH_BREAKDOWN=1` prints where one session's time went
//! (with `BENCH_TIMELINE=1`, every span of one tool call in start order; `=provisioning`, of
//! the run's provisioning step),
//! `BENCH_POLL_MS` how often a sequential session asks for its state (default 10; its time
//! ends with its last step's span, not with the poll that saw it), `BENCH_CONCURRENT_POLL_MS`
//! how often each concurrent session asks for its state (default 25),
//! `BENCH_MODEL=in-process` the scripted model called through its router in this process
//! instead of over a loopback socket (the provider still builds the HTTP request and parses
//! the SSE answer), as the peers' fake models answer in process. `BENCH_THREADS` the
//! runtime's worker threads (default 2).

use auth_credentials::Auth;
use engine_gateway::secrets::FileSecrets;
use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{Ctx, RemoteOptions, connect_client, run_embedded};
use scripted_model::{Cassette, ScriptedModel, ToolCall, Turn, TurnUsage};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/support/in_process_model.rs"]
mod in_process_model;
use in_process_model::InProcessModel;

// glibc's allocator spent about a quarter of the CPU of a turn (arena locking and chunk
// consolidation under many small JSON values); mimalloc is much cheaper for that pattern.
#[global_allocator]
static GLOBAL: agent_harness::alloc::MiMalloc = agent_harness::alloc::MiMalloc;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One session's time: from just before its trigger to the end of its last step, as the
/// engine's trace store shows it (the step span ends once the final save is committed). Its
/// end is found by polling the turn's state every `poll_interval`, but that poll's delay is
/// not counted, so the polls can be rare: frequent ones were a `turn::get_state` round trip
/// over the WebSocket every 2 ms, load of the bench's own on the same two cores, and still
/// added half an interval per session. Falls back to the polled time when the spans are gone.
async fn run_session(ctx: &Ctx, sid: &str) -> Duration {
    let started = unix_nanos();
    let polled = run_session_counting_polls(ctx, sid, poll_interval())
        .await
        .0;
    match last_step_end(ctx, &[sid.to_string()]).await {
        // Never later than the poll that saw the session stopped.
        Some(end) if end > started => Duration::from_nanos(end - started).min(polled),
        _ => polled,
    }
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// When the last turn step of these sessions ended (unix nanos), from the engine's spans
/// (the trace store is a ring: the latest steps are the ones it still holds); `None` when it
/// holds none of them.
async fn last_step_end(ctx: &Ctx, sids: &[String]) -> Option<u64> {
    step_ends(ctx, sids).await?.into_values().max()
}

/// When each of these sessions' last turn step ended (unix nanos), for those the span ring
/// still holds.
async fn step_ends(ctx: &Ctx, sids: &[String]) -> Option<std::collections::BTreeMap<String, u64>> {
    let groups = ctx
        .trigger(
            "engine::traces::group_by",
            json!({"attribute": "iii.session.id"}),
        )
        .await
        .ok()?;
    let sessions: std::collections::BTreeSet<&str> = sids.iter().map(String::as_str).collect();
    // A trace may hold several sessions' steps: listed once, each step span names its session.
    let traces: std::collections::BTreeSet<&str> = groups["groups"]
        .as_array()?
        .iter()
        .filter(|g| g["value"].as_str().is_some_and(|v| sessions.contains(v)))
        .flat_map(|g| g["trace_ids"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let mut ends = std::collections::BTreeMap::<String, u64>::new();
    for trace in traces {
        let spans = ctx
            .trigger("engine::traces::list", json!({"trace_id": trace}))
            .await
            .ok()?;
        for s in spans["spans"].as_array().into_iter().flatten() {
            let name = s["name"].as_str().unwrap_or_default();
            let session = s["attributes"]["iii.session.id"]
                .as_str()
                .unwrap_or_default();
            if s["service"] == "engine"
                && sessions.contains(session)
                && name.starts_with("turn::")
                && name != "turn::get_state"
            {
                let end = ends.entry(session.to_string()).or_default();
                *end = (*end).max(s["end_unix_nanos"].as_u64().unwrap_or(0));
            }
        }
    }
    ends.retain(|_, end| *end > 0);
    (!ends.is_empty()).then_some(ends)
}

/// The session's time and how many times it asked for the turn's state, every `poll`.
async fn run_session_counting_polls(ctx: &Ctx, sid: &str, poll: Duration) -> (Duration, u64) {
    // Each session in a trace of its own, as separate users' runs are: the span queries that
    // end a session's time then read its own steps, not every earlier session's.
    let ctx = &Ctx::root(ctx.bus().clone());
    let t0 = Instant::now();
    let mut polls = 0;
    let r = ctx
        .trigger("harness::trigger", json!({"session_id": sid, "payload": {"provider": "scripted", "model": "bench", "max_turns": 10_000,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]}}))
        .await
        .expect("start");
    assert_eq!(r["status_code"], 200, "{r}");
    loop {
        polls += 1;
        let v = ctx
            .trigger("turn::get_state", json!({"session_id": sid}))
            .await
            .expect("state");
        match v["state"].as_str() {
            Some("stopped") => return (t0.elapsed(), polls),
            Some("failed") => panic!("session failed: {v}"),
            // Polling is the bench's own load: gentle on the emulator, whose calls cost
            // milliseconds each.
            _ => tokio::time::sleep(poll).await,
        }
    }
}

/// Where one session's time went: the spans of its trace, summed by name, per tool call.
async fn breakdown(ctx: &Ctx, sid: &str, k: usize) {
    let groups = ctx
        .trigger(
            "engine::traces::group_by",
            json!({"attribute": "iii.session.id"}),
        )
        .await
        .expect("group_by");
    let Some(group) = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["value"] == sid)
    else {
        println!("(no spans for {sid})");
        return;
    };
    let mut by_name: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    let mut all_spans: Vec<serde_json::Value> = Vec::new();
    for trace in group["trace_ids"].as_array().into_iter().flatten() {
        let spans = ctx
            .trigger("engine::traces::list", json!({"trace_id": trace}))
            .await
            .expect("spans");
        all_spans.extend(spans["spans"].as_array().into_iter().flatten().cloned());
        for s in spans["spans"].as_array().into_iter().flatten() {
            let ms = (s["end_unix_nanos"].as_u64().unwrap_or(0)
                - s["start_unix_nanos"].as_u64().unwrap_or(0)) as f64
                / 1e6;
            let name = format!(
                "{} [{}]",
                s["name"].as_str().unwrap_or("?"),
                s["service"].as_str().unwrap_or("?")
            );
            let e = by_name.entry(name).or_default();
            e.0 += ms;
            e.1 += 1;
        }
    }
    let mut rows: Vec<_> = by_name.into_iter().collect();
    rows.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    println!("span | ms per tool call | count per tool call");
    println!("--- | --- | ---");
    for (name, (ms, n)) in rows.iter().take(30) {
        println!(
            "{name} | {:.3} | {:.1}",
            ms / k as f64,
            *n as f64 / k as f64
        );
    }
    if std::env::var("BENCH_TIMELINE").is_ok() {
        timeline(&all_spans);
    }
}

/// `BENCH_TIMELINE=1`: the engine-side spans of one tool call in the middle of the session
/// (from one model call to the next), in start order, with their offsets (µs): the gaps
/// between them are waits.
fn timeline(spans: &[serde_json::Value]) {
    let start = |s: &serde_json::Value| s["start_unix_nanos"].as_u64().unwrap_or(0);
    let mut engine: Vec<&serde_json::Value> =
        spans.iter().filter(|s| s["service"] == "engine").collect();
    engine.sort_by_key(|s| start(s));
    let steps: Vec<usize> = engine
        .iter()
        .enumerate()
        // One model call per turn (a step may run several turns: `driver::Chain`).
        .filter(|(_, s)| {
            s["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("provider::") && n.ends_with("::stream"))
        })
        .map(|(i, _)| i)
        .collect();
    // How far apart consecutive tool calls start, over the whole session.
    let mut gaps: Vec<f64> = steps
        .windows(2)
        .map(|w| (start(engine[w[1]]) - start(engine[w[0]])) as f64 / 1e6)
        .collect();
    if gaps.len() >= 2 {
        gaps.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| gaps[((gaps.len() - 1) as f64 * q) as usize];
        println!(
            "\ntool call to tool call (ms): min {:.2}, p50 {:.2}, p90 {:.2}, max {:.2}, mean {:.2}",
            at(0.0),
            at(0.5),
            at(0.9),
            at(1.0),
            gaps.iter().sum::<f64>() / gaps.len() as f64
        );
    }
    // The tool call picked: `BENCH_TIMELINE=slow` the slowest tenth's fastest, else the middle one.
    let slow = std::env::var("BENCH_TIMELINE").is_ok_and(|v| v == "slow");
    let pick = if slow && steps.len() > 2 {
        let mut by_gap: Vec<usize> = (0..steps.len() - 1).collect();
        by_gap.sort_by_key(|&i| start(engine[steps[i + 1]]) - start(engine[steps[i]]));
        by_gap[(by_gap.len() - 1) * 9 / 10]
    } else {
        steps.len() / 2
    };
    let (Some(&a), Some(&b)) = (steps.get(pick), steps.get(pick + 1)) else {
        return;
    };
    // `BENCH_TIMELINE=provisioning`: the session's provisioning step instead (once per run).
    let (a, b) = match std::env::var("BENCH_TIMELINE").as_deref() {
        Ok("provisioning") => {
            let Some(p) = engine
                .iter()
                .rposition(|s| s["name"] == "turn::provisioning")
            else {
                return;
            };
            let next = steps
                .iter()
                .copied()
                .find(|&i| i > p)
                .unwrap_or(engine.len());
            (p, next)
        }
        _ => (a, b),
    };
    let t0 = start(engine[a]);
    println!("\ntimeline of one tool call (engine spans; offset and duration in µs)");
    for s in &engine[a..b] {
        let dur = s["end_unix_nanos"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(start(s));
        println!(
            "{:>7} {:>6}  {}",
            (start(s) - t0) / 1000,
            dur / 1000,
            s["name"].as_str().unwrap_or("?")
        );
    }
}

/// Pollers run on a clock, not per tool call: their calls are shown per second instead.
const POLLING: [&str; 5] = [
    "DynamoDB Streams.GetRecords",
    "DynamoDB Streams.GetShardIterator",
    "DynamoDB Streams.DescribeStream",
    "DynamoDB Streams.ListStreams",
    "SQS.ReceiveMessage",
];

/// The AWS API calls of one session, per tool call, by operation (counted by the SDK
/// interceptor on every client), less what the bench's own `turn::get_state` polls cost.
async fn api_calls_per_tool_call(ctx: &Ctx, k: usize) {
    use engine_gateway::aws::api_calls;
    let before = api_calls::snapshot();
    let (took, polls) = run_session_counting_polls(ctx, "api-calls", poll_interval()).await;
    let session = api_calls::since(&before);
    let before = api_calls::snapshot();
    let probes = 20;
    for _ in 0..probes {
        ctx.trigger("turn::get_state", json!({"session_id": "api-calls"}))
            .await
            .expect("state");
    }
    let per_poll = api_calls::since(&before);
    println!(
        "\n## AWS API calls per tool call (K = {k}, SDK interceptor, {polls} state polls of the bench taken out)\n"
    );
    println!("operation | calls per tool call");
    println!("--- | ---");
    let (mut critical, mut polling) = (0.0, 0.0);
    let mut pollers = Vec::new();
    for (op, n) in &session {
        if POLLING.contains(&op.as_str()) {
            polling += *n as f64;
            pollers.push(format!("{op} {:.1}/s", *n as f64 / took.as_secs_f64()));
            continue;
        }
        let bench = per_poll.get(op).copied().unwrap_or(0) as f64 * polls as f64 / probes as f64;
        let mine = (*n as f64 - bench).max(0.0) / k as f64;
        critical += mine;
        if mine >= 0.005 {
            println!("{op} | {mine:.2}");
        }
    }
    println!("**all, on the critical path** | **{critical:.2}**");
    println!(
        "pollers, per second of the session ({}) | {:.1}",
        pollers.join(", "),
        polling / took.as_secs_f64()
    );
}

fn poll_interval() -> Duration {
    if std::env::var("BENCH_BACKEND").is_ok_and(|b| b == "aws") {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(env_usize("BENCH_POLL_MS", 10) as u64)
    }
}

/// A bench session's name: `seq-3`, or `seq-1-3` in round 1 when there are several rounds.
fn session_name(kind: &str, round: usize, rounds: usize, i: usize) -> String {
    if rounds == 1 {
        format!("{kind}-{i}")
    } else {
        format!("{kind}-{round}-{i}")
    }
}

/// One run of concurrent sessions: its throughput, and when each session ended (s, sorted).
struct ConcurrentRun {
    tool_calls_per_sec: f64,
    finished: Vec<f64>,
}

/// Start these sessions at once and wait for all; the run's time ends with the last step's
/// span (or the last poll when the spans are gone).
async fn concurrent_run(ctx: &Ctx, sids: &[String], poll: Duration, k: usize) -> ConcurrentRun {
    let started = unix_nanos();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for sid in sids {
        let (ctx, sid) = (ctx.clone(), sid.clone());
        tasks.push(tokio::spawn(async move {
            run_session_counting_polls(&ctx, &sid, poll).await
        }));
    }
    for t in tasks {
        t.await.expect("session");
    }
    let polled = t0.elapsed().as_secs_f64();
    let ends = step_ends(ctx, sids).await.unwrap_or_default();
    let secs = match ends.values().max() {
        Some(&end) if end > started => ((end - started) as f64 / 1e9).min(polled),
        _ => polled,
    };
    // How evenly the sessions went: when the first, the median and the last ended. Once
    // only a few are left the cores idle, so a wide spread lowers the throughput.
    let mut finished: Vec<f64> = ends
        .values()
        .filter(|&&end| end > started)
        .map(|&end| (end - started) as f64 / 1e9)
        .collect();
    finished.sort_by(f64::total_cmp);
    ConcurrentRun {
        tool_calls_per_sec: sids.len() as f64 * k as f64 / secs,
        finished,
    }
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // The allocator as the `harness` binary sets it up.
    agent_harness::alloc::purge_freed_pages_at_once();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_usize("BENCH_THREADS", 2))
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench());
}

async fn bench() {
    server::disable_transparent_huge_pages();
    let k = env_usize("BENCH_K", 50);
    let sessions = env_usize("BENCH_SESSIONS", 5);
    let backend = std::env::var("BENCH_BACKEND").unwrap_or_else(|_| "embedded".into());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = ServeOptions::for_data_dir(dir.path().join("data"));
    if let Ok(n) = std::env::var("BENCH_SPANS") {
        opts.span_capacity = n.parse().expect("BENCH_SPANS: a number of spans");
    }
    if backend == "aws" {
        opts.backend = server::BackendKind::Aws;
        opts.aws.prefix = format!("tb{}-", engine_gateway::trace::random_hex(4));
        opts.aws.create_resources = true;
    }
    let srv = server::start(&opts).await.expect("engine");
    // The model reports its usage, as every provider's API does (a fixed count here: the
    // bench's context stays far below any window either way).
    let usage = TurnUsage {
        input: 2_000,
        output: 30,
        ..Default::default()
    };
    let model = ScriptedModel::new(Cassette {
        turns: vec![
            Turn {
                when: Some(format!("results<{k}")),
                tool_calls: vec![ToolCall {
                    id: "call".into(),
                    name: "agent_trigger".into(),
                    arguments: json!({"function": "demo::echo", "payload": {"n": 1}}),
                }],
                usage: usage.clone(),
                ..Default::default()
            },
            Turn {
                when: Some(format!("results>={k}")),
                text: Some("done".into()),
                usage,
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    let base = model.serve().await.expect("model");
    let in_process_model = std::env::var("BENCH_MODEL").is_ok_and(|m| m == "in-process");
    let perms = dir.path().join("perms.yaml");
    std::fs::write(&perms, "version: 1\nrules:\n  - \"demo::echo\"\n").unwrap();
    let holder = harness_worker::PolicyHolder::new(perms);
    let mut harness = harness_worker::policy_worker(holder);
    harness_worker::add_trigger(&mut harness);
    let auth = Auth::new(
        Arc::new(FileSecrets::new(dir.path().join("secrets.json"))),
        Arc::new(|_| None),
    );
    let e = &srv.engine;
    let _workers = [
        run_embedded(turn_orchestrator::worker(), e).unwrap(),
        run_embedded(harness, e).unwrap(),
        run_embedded(harness_sdk::examples::echo_worker(), e).unwrap(),
        run_embedded(auth_credentials::worker(auth), e).unwrap(),
        // The thick harness, as `cargo run` composes it: history in the session tree, and
        // the budget, hook, directory and compaction workers present.
        run_embedded(session_worker::worker(), e).unwrap(),
        run_embedded(hook_fanout::worker(), e).unwrap(),
        run_embedded(llm_budget::worker(), e).unwrap(),
        run_embedded(directory::worker(), e).unwrap(),
        run_embedded(context_compaction::worker(), e).unwrap(),
        run_embedded(
            models_catalog::worker(Arc::new(models_catalog::Catalog::builtin())),
            e,
        )
        .unwrap(),
        run_embedded(
            {
                let dialect = Arc::new(provider_openai::OpenAiDialect {
                    name: "scripted".into(),
                    base_url: format!("{base}/v1"),
                    key_optional: true,
                });
                if in_process_model {
                    provider_core::worker_with_transport(
                        dialect,
                        Arc::new(InProcessModel(model.router())),
                    )
                } else {
                    provider_core::worker(dialect)
                }
            },
            e,
        )
        .unwrap(),
    ];
    let client = connect_client("bench", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    tokio::time::sleep(Duration::from_millis(300)).await;
    run_session(&ctx, "warmup").await;

    let rounds = env_usize("BENCH_ROUNDS", 3).max(1);
    let concurrent = env_usize("BENCH_CONCURRENT", 50);
    // Each session asks for its state every `poll`, load of the bench's own on the same two
    // cores (at 25 ms, fifty sessions asked more often than they made tool calls), so the run
    // ends with the last step's span, not with the poll that saw it: polls can be rare.
    let poll = Duration::from_millis(env_usize(
        "BENCH_CONCURRENT_POLL_MS",
        if backend == "aws" { 50 } else { 100 },
    ) as u64);
    // Rounds of (sequential sessions, then the concurrent run), interleaved: one concurrent
    // run lasts about a second, so a short stall of the shared machine in it moved the
    // fifty-against-one ratio by a tenth or more. Each round's ratio compares two adjacent
    // phases, and the figures below are medians over the rounds.
    let mut per_call = Vec::new();
    let mut per_turn = Vec::new();
    let mut runs: Vec<ConcurrentRun> = Vec::new();
    let mut round_ratios = Vec::new();
    for round in 0..rounds {
        let mut round_per_call = Vec::new();
        for i in 0..sessions {
            let sid = session_name("seq", round, rounds, i);
            let d = run_session(&ctx, &sid).await.as_secs_f64() * 1000.0;
            round_per_call.push(d / k as f64);
            per_turn.push(d / (k + 1) as f64);
            if std::env::var("BENCH_EACH").is_ok() {
                eprintln!(
                    "round {round} session {i}: {:.2} ms per tool call",
                    d / k as f64
                );
            }
        }
        per_call.extend_from_slice(&round_per_call);
        if concurrent == 0 {
            continue;
        }
        let sids: Vec<String> = (0..concurrent)
            .map(|i| session_name("conc", round, rounds, i))
            .collect();
        let run = concurrent_run(&ctx, &sids, poll, k).await;
        round_ratios.push(run.tool_calls_per_sec * p50(&mut round_per_call) / 1000.0);
        runs.push(run);
    }
    println!(
        "# turn benchmark: {backend} backend, zero-latency scripted model ({}), K = {k} tool calls per session",
        if in_process_model {
            "in process"
        } else {
            "over loopback HTTP"
        }
    );
    println!("metric | value");
    println!("--- | ---");
    println!(
        "harness overhead per tool call, p50 over {} sessions | {:.2} ms",
        per_call.len(),
        p50(&mut per_call)
    );
    println!(
        "harness overhead per model turn, p50 | {:.2} ms",
        p50(&mut per_turn)
    );

    if backend == "aws" {
        api_calls_per_tool_call(&ctx, k).await;
    }

    if std::env::var("BENCH_BREAKDOWN").is_ok() {
        let last = session_name("seq", rounds - 1, rounds, sessions - 1);
        breakdown(&ctx, &last, k).await;
    }

    if runs.is_empty() {
        srv.shutdown().await;
        return;
    }
    // The run with the median throughput stands for the rounds.
    runs.sort_by(|a, b| a.tool_calls_per_sec.total_cmp(&b.tool_calls_per_sec));
    let median = &runs[runs.len() / 2];
    println!(
        "{concurrent} concurrent sessions: turns/s, median of {} rounds | {:.1}",
        runs.len(),
        median.tool_calls_per_sec * (k + 1) as f64 / k as f64
    );
    println!(
        "{concurrent} concurrent sessions: tool calls/s, median of {} rounds | {:.1}",
        runs.len(),
        median.tool_calls_per_sec
    );
    let throughputs: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.0}", r.tool_calls_per_sec))
        .collect();
    println!(
        "{concurrent} concurrent sessions: tool calls/s, each round (sorted) | {}",
        throughputs.join(", ")
    );
    println!(
        "{concurrent} concurrent sessions against one, each round (same round's sequential p50) | {} (median {:.2})",
        round_ratios
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        p50(&mut round_ratios.clone())
    );
    if let (Some(first), Some(last)) = (median.finished.first(), median.finished.last()) {
        println!(
            "{concurrent} concurrent sessions: first, median, last ended (s), median round | {first:.2}, {:.2}, {last:.2} ({} of {concurrent} seen)",
            median.finished[median.finished.len() / 2],
            median.finished.len()
        );
    }
    srv.shutdown().await;
}
