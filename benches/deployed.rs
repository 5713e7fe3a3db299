//! The deployed shape's cost per tool call (not a test): every function its own Lambda
//! bootstrap under the local Runtime API, on LocalStack, driven through the emulated
//! WebSocket API with a zero-latency scripted model. Prints, per tool call: Lambda
//! invocations by function, AWS API calls by operation (summed from every process's
//! `HARNESS_API_CALLS_DIR` file), and the wall time. Needs `source localstack/env.sh`, a
//! running emulator and the Lambda builds (`bash scripts/lambda-builds.sh`); `BENCH_K` tool
//! calls per session (default 20). Run by `bash bench/aws.sh`.

#[path = "../tests/shape/mod.rs"]
mod shape;

#[path = "../tests/common/otlp.rs"]
mod otlp;

use engine_gateway::aws::api_calls;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The functions' calls: every process but this one, which runs the emulated AWS parts
/// (the event-source mappings, which AWS runs itself).
fn counts(dir: &std::path::Path) -> BTreeMap<String, u64> {
    api_calls::sum_recorded(dir, &[std::process::id()]).expect("the processes' API call files")
}

fn minus(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    a.iter()
        .map(|(k, n)| (k.clone(), n - b.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(dir) = shape::lambda_dir() else {
        return;
    };
    let k: usize = std::env::var("BENCH_K")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let calls_dir = tempfile::tempdir().unwrap();
    // SAFETY: set before any function starts; nothing else reads the environment yet.
    unsafe { std::env::set_var("HARNESS_API_CALLS_DIR", calls_dir.path()) };
    // Which layouts, in turn: `default` (every worker its own Lambda, infra/template.yaml)
    // and `colocated` (infra/harness.colocated.yaml's groups, `engine-gateway colocate`).
    let shapes = std::env::var("BENCH_SHAPES").unwrap_or_else(|_| "default,colocated".into());
    for name in shapes.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (_keep, template) = match name {
            "default" => (None, shape::template()),
            "colocated" => {
                let (d, t) = shape::colocated_template();
                (Some(d), t)
            }
            other => panic!("BENCH_SHAPES: `{other}` is neither default nor colocated"),
        };
        println!("## layout: {name}\n");
        measure(dir.clone(), template, k, calls_dir.path()).await;
    }
}

async fn measure(
    dir: std::path::PathBuf,
    template: std::path::PathBuf,
    k: usize,
    calls_dir: &std::path::Path,
) {
    let cassette = serde_json::from_value(json!({"turns": [
        {"when": format!("results<{k}"), "tool_calls": [{"id": "c", "name": "agent_trigger", "arguments": {"function": "fs::list", "payload": {"path": "."}}}]},
        {"when": format!("results>={k}"), "text": "done"}
    ]}))
    .unwrap();
    let prefix = format!("bd{}-", engine_gateway::trace::random_hex(4));
    // `BENCH_TRACE=1`: every Lambda exports its spans to a collector here, and the bench
    // prints where one tool call's time goes. A diagnosis, not the figures: each invocation
    // then also flushes its spans before it returns.
    let traced = match std::env::var("BENCH_TRACE").as_deref() {
        Ok("1") => Some(otlp::collector().await),
        _ => None,
    };
    let parameters: Vec<(&str, &str)> = traced
        .iter()
        .map(|(url, _)| ("OtlpEndpoint", url.as_str()))
        .collect();
    let mut s = shape::bring_up_from(template, dir, &prefix, cassette, &[], &parameters).await;
    // Every function warm first (cold starts are measured apart).
    s.start("warm", "warm up").await;
    s.wait_state("warm", &["stopped"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let invocations = |s: &shape::Shape| -> BTreeMap<String, u64> {
        s.deployed
            .functions()
            .map(|(id, f)| (id.to_string(), f.invocations()))
            .collect()
    };
    let (calls0, inv0, polls0) = (counts(calls_dir), invocations(&s), s.polls);
    let emulated0 = api_calls::snapshot();
    let root = engine_gateway::trace::TraceContext::new_root();
    let traceparent = traced.as_ref().and_then(|_| root.traceparent());
    let t0 = Instant::now();
    // The template's run defaults stop a run at 12 model turns: this one needs K + 1.
    s.start_with_payload_in(
        "measured",
        "go",
        json!({"max_turns": k + 2}),
        traceparent.as_deref(),
    )
    .await;
    // Followed as a UI follows it, by its events: polling `turn::get_state` meanwhile would
    // keep a second orchestrator instance busy, and each step landing on the other one
    // misses that instance's history cache.
    s.wait_event("measured", "agent_end").await;
    let took = t0.elapsed();
    let state = s.wait_state("measured", &["stopped"]).await;
    assert_eq!(state["state"], "stopped", "{state}");
    assert!(state["error"].is_null(), "{state}");
    assert_eq!(
        state["totals"]["tool_calls"], k,
        "every tool call made: {state}"
    );
    let polls = u64::from(s.polls - polls0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (calls1, inv1) = (counts(calls_dir), invocations(&s));
    let emulated = api_calls::since(&emulated0);
    // What one `turn::get_state` poll of this bench costs, to take the polls out.
    let probes = 20u64;
    for _ in 0..probes {
        s.wait_state("measured", &["stopped"]).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (calls2, inv2) = (counts(calls_dir), invocations(&s));
    let per_poll_calls = minus(&calls2, &calls1);
    let per_poll_inv = minus(&inv2, &inv1);
    let kf = k as f64;

    println!(
        "# the deployed shape: K = {k} tool calls (fs::list) in one session, {polls} state polls of the bench taken out\n"
    );
    println!(
        "wall time per tool call on LocalStack | {:.1} ms\n",
        took.as_secs_f64() * 1000.0 / kf
    );
    let table = |title: &str, delta: BTreeMap<String, u64>, per_poll: &BTreeMap<String, u64>| {
        println!("{title}");
        println!("--- | ---");
        let mut all = 0.0;
        for (name, n) in delta {
            let bench =
                per_poll.get(&name).copied().unwrap_or(0) as f64 * polls as f64 / probes as f64;
            let mine = (n as f64 - bench).max(0.0) / kf;
            all += mine;
            if mine >= 0.005 {
                println!("{name} | {mine:.2}");
            }
        }
        println!("**all** | **{all:.2}**\n");
    };
    table(
        "function | Lambda invocations per tool call",
        minus(&inv1, &inv0),
        &per_poll_inv,
    );
    table(
        "operation | AWS API calls per tool call by the functions",
        minus(&calls1, &calls0),
        &per_poll_calls,
    );
    println!(
        "operation | by the emulated event-source mappings (AWS's own when deployed), per tool call"
    );
    println!("--- | ---");
    for (op, n) in &emulated {
        println!("{op} | {:.2}", *n as f64 / kf);
    }
    // Warm instances (execution environments) per function at the end: a step that lands on
    // another instance than the one before misses that instance's caches.
    println!("\nfunction | instances at the end");
    println!("--- | ---");
    for (id, f) in s.deployed.functions() {
        if f.process_count() > 1 {
            println!("{id} | {}", f.process_count());
        }
    }
    if let Some((_, spans)) = &traced {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let spans: Vec<otlp::Exported> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|sp| sp.trace_id == root.trace_id)
            .cloned()
            .collect();
        where_the_time_goes(&spans, k);
    }
    s.deployed.shutdown();
    remove_run(&s.clients, &prefix).await;
}

/// Delete the run's tables and queues: the emulator keeps them (and their streams) until it
/// stops, and the next layout or run should meet it as this one did. (The larger slowdown
/// was DynamoDB Local's database file, now in memory: `localstack/emu.sh`.)
async fn remove_run(clients: &engine_gateway::aws::AwsClients, prefix: &str) {
    let mut start: Option<String> = None;
    loop {
        let Ok(page) = clients
            .dynamodb
            .list_tables()
            .set_exclusive_start_table_name(start.take())
            .send()
            .await
        else {
            break;
        };
        for table in page.table_names().iter().filter(|t| t.starts_with(prefix)) {
            let _ = clients
                .dynamodb
                .delete_table()
                .table_name(table)
                .send()
                .await;
        }
        match page.last_evaluated_table_name() {
            Some(last) => start = Some(last.to_string()),
            None => break,
        }
    }
    if let Ok(queues) = clients
        .sqs
        .list_queues()
        .queue_name_prefix(prefix)
        .send()
        .await
    {
        for url in queues.queue_urls() {
            let _ = clients.sqs.delete_queue().queue_url(url).send().await;
        }
    }
}

/// From one run's trace: time per tool call by span (summed over the run, nested spans
/// counted in their parents too), and the timeline of one tool call in the middle of the
/// run (from one model call's start to the next's), with the time no span covers.
fn where_the_time_goes(spans: &[otlp::Exported], k: usize) {
    let ms = |ns: u64| ns as f64 / 1e6;
    let label = |sp: &otlp::Exported| match sp.attributes.get("rpc.method") {
        Some(m) => format!("{} {m}", sp.name),
        None => sp.name.clone(),
    };
    let mut by_name: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for sp in spans {
        let e = by_name.entry((sp.service.clone(), label(sp))).or_default();
        e.0 += 1;
        e.1 += sp.end_ns.saturating_sub(sp.start_ns);
    }
    let mut rows: Vec<_> = by_name.into_iter().collect();
    rows.sort_by_key(|(_, (_, ns))| std::cmp::Reverse(*ns));
    let kf = k as f64;
    println!(
        "\n# where the time goes ({} spans in the run's trace)\n",
        spans.len()
    );
    println!("service | span | per tool call | ms per tool call");
    println!("--- | --- | --- | ---");
    for ((service, name), (n, ns)) in rows.iter().take(40) {
        println!(
            "{service} | {name} | {:.2} | {:.1}",
            *n as f64 / kf,
            ms(*ns) / kf
        );
    }
    // `BENCH_TRACE_START=1`: the run's first spans too (what its start costs);
    // `BENCH_TRACE_END=1`: its last ones (what its end costs).
    let (start, end) = (
        std::env::var("BENCH_TRACE_START").is_ok(),
        std::env::var("BENCH_TRACE_END").is_ok(),
    );
    if start || end {
        let mut all: Vec<&otlp::Exported> = spans.iter().collect();
        all.sort_by_key(|sp| sp.start_ns);
        let t0 = all.first().map(|sp| sp.start_ns).unwrap_or(0);
        let skip = match end {
            true => all.len().saturating_sub(60),
            false => 0,
        };
        let take = match start {
            true => 80,
            false => 60,
        };
        for sp in all.iter().skip(skip).take(take) {
            println!(
                "{:>7.1} {:>6.1} {} [{}]",
                ms(sp.start_ns - t0),
                ms(sp.end_ns.saturating_sub(sp.start_ns)),
                label(sp),
                sp.service
            );
        }
    }
    let mut chats: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|sp| {
            sp.attributes
                .get("gen_ai.operation.name")
                .map(String::as_str)
                == Some("chat")
        })
        .collect();
    chats.sort_by_key(|sp| sp.start_ns);
    if chats.len() < 3 {
        println!("\n(fewer than 3 model calls traced: no timeline)");
        return;
    }
    // The time between model calls, each: the chained tool calls and the queued ones.
    let gaps: Vec<String> = chats
        .windows(2)
        .map(|w| format!("{:.0}", ms(w[1].start_ns - w[0].start_ns)))
        .collect();
    println!("\nms from one model call to the next: {}", gaps.join(" "));
    // How long each model call waits before the provider's handler starts, and after it ends.
    let providers: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|sp| sp.name.starts_with("provider::") && sp.name.ends_with("::stream"))
        .collect();
    let waits: Vec<String> = chats
        .iter()
        .filter_map(|c| {
            let p = providers
                .iter()
                .filter(|p| p.start_ns >= c.start_ns && p.start_ns < c.end_ns)
                .min_by_key(|p| p.start_ns)?;
            Some(format!(
                "{:.0}+{:.0}",
                ms(p.start_ns - c.start_ns),
                ms(c.end_ns.saturating_sub(p.end_ns))
            ))
        })
        .collect();
    println!(
        "ms of each model call before the provider's handler starts + after it ends: {}",
        waits.join(" ")
    );
    // `BENCH_TRACE_AT=n`: the timeline from model call n (default: the middle one).
    let i = std::env::var("BENCH_TRACE_AT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|i| i + 1 < chats.len())
        .unwrap_or(chats.len() / 2);
    let (from, to) = (chats[i].start_ns, chats[i + 1].start_ns);
    let by_id: BTreeMap<&str, &otlp::Exported> =
        spans.iter().map(|sp| (sp.span_id.as_str(), sp)).collect();
    let depth = |sp: &otlp::Exported| {
        let mut d = 0;
        let mut at = sp;
        while let Some(p) = by_id.get(at.parent_span_id.as_str())
            && d < 64
        {
            d += 1;
            at = p;
        }
        d
    };
    let mut window: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|sp| sp.start_ns >= from && sp.start_ns < to)
        .collect();
    window.sort_by_key(|sp| sp.start_ns);
    // The time inside the window that no span covers: waits between hops (a queue, a poll).
    let mut covered = 0u64;
    let mut reach = from;
    for sp in &window {
        let (a, b) = (sp.start_ns.max(reach), sp.end_ns.min(to));
        if b > a {
            covered += b - a;
            reach = b;
        }
    }
    println!(
        "\n# one tool call's timeline (model call {i} to {}): {:.1} ms, {:.1} ms of it in no span\n",
        i + 1,
        ms(to - from),
        ms((to - from).saturating_sub(covered))
    );
    println!("```");
    for sp in window {
        println!(
            "{:>7.1} {:>6.1}  {}{} [{}]",
            ms(sp.start_ns - from),
            ms(sp.end_ns.saturating_sub(sp.start_ns)),
            "  ".repeat(depth(sp).min(12)),
            label(sp),
            sp.service
        );
    }
    println!("```");
}
