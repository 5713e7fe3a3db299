//! `cargo run`'s demo, traced: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the whole session is
//! one trace at the collector (OTLP protobuf, through the OpenTelemetry SDK's exporter), every
//! span's parent is in it (the terminal's own `harness session` span is its one root), spans
//! come from every worker that took part, each model call is a `chat` span whose GenAI
//! attributes carry what the scripted model reported, each dispatched tool call an
//! `execute_tool` span, and nothing is lost at exit (the process ends right after the
//! summary; the flush at shutdown exports the rest). The metrics arrive too: tokens, cost, the
//! model calls' durations and times to first token, tool calls by outcome, turn steps, queues.

use crate::otlp;

use std::collections::BTreeSet;

/// Run `cargo run`'s demo (`--approve-all`) exporting to `collector`, with more arguments and
/// variables; the process has ended when this returns.
async fn run_demo(
    collector: &str,
    dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_harness"));
    cmd.args(["--listen", "127.0.0.1:0", "--approve-all", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--workdir")
        .arg(dir.join("work"))
        .arg("--permissions")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/iii-permissions.yaml"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector);
    for k in [
        "OTEL_SERVICE_NAME",
        "OTEL_SDK_DISABLED",
        "OTEL_METRIC_EXPORT_INTERVAL",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "HARNESS_CONFIG",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("the harness runs");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_session_is_one_trace_with_genai_attributes() {
    let (url, got) = otlp::collector().await;
    let dir = tempfile::tempdir().unwrap();
    let out = run_demo(&url, dir.path(), &[], &[]).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("— session"))
        .unwrap_or("");
    let trace = summary
        .rsplit("trace ")
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    assert_eq!(trace.len(), 32, "{stdout}");
    // Everything was exported before the process ended: no waiting here.
    let spans: Vec<otlp::Exported> = got
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == trace)
        .cloned()
        .collect();
    assert!(
        spans.len() > 20,
        "{} spans of the session's trace",
        spans.len()
    );
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "no span exported twice");
    // One root: the terminal's own session span, exported too; every parent is a span of
    // the trace (Jaeger shows no "missing parent").
    let roots: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root: {roots:?}");
    assert_eq!(roots[0].name, "harness session");
    let orphans: BTreeSet<&str> = spans
        .iter()
        .map(|s| s.parent_span_id.as_str())
        .filter(|p| !p.is_empty() && !ids.contains(p))
        .collect();
    assert!(orphans.is_empty(), "parents outside the trace: {orphans:?}");
    let services: BTreeSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
    for worker in [
        "engine",
        "harness",
        "turn-orchestrator",
        "tools",
        "approval-gate",
        "session",
    ] {
        assert!(
            services.contains(worker),
            "{worker} took part: {services:?}"
        );
    }
    assert!(
        services.iter().any(|s| s.starts_with("provider")),
        "a provider: {services:?}"
    );

    // The demo cassette's four model calls, as GenAI chat spans (client kind = 3).
    let mut chats: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|s| {
            s.attributes
                .get("gen_ai.operation.name")
                .map(String::as_str)
                == Some("chat")
        })
        .collect();
    chats.sort_by_key(|s| s.attributes.get("gen_ai.usage.output_tokens").cloned());
    assert_eq!(chats.len(), 4, "{chats:#?}");
    for c in &chats {
        assert_eq!(c.name, "chat scripted-demo");
        assert_eq!(c.kind, 3, "a client span");
        assert_eq!(c.attributes["gen_ai.provider.name"], "scripted");
        assert_eq!(c.attributes["gen_ai.request.model"], "scripted-demo");
        assert!(c.attributes.contains_key("gen_ai.response.model"));
        assert_eq!(c.types["gen_ai.usage.input_tokens"], "int");
        assert_eq!(c.types["gen_ai.response.finish_reasons"], "array");
        assert!(
            !c.attributes.contains_key("gen_ai.input.messages"),
            "content is off by default"
        );
    }
    // (input incl. cache reads, output, finish reason) per call, from demo.json.
    let usage: BTreeSet<(String, String, String)> = chats
        .iter()
        .map(|c| {
            (
                c.attributes["gen_ai.usage.input_tokens"].clone(),
                c.attributes["gen_ai.usage.output_tokens"].clone(),
                c.attributes["gen_ai.response.finish_reasons"].clone(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String, String)> = [
        ("820", "64", r#"["function_call"]"#),
        ("1740", "58", r#"["function_call"]"#),
        ("1910", "40", r#"["function_call"]"#),
        ("2100", "35", r#"["end"]"#),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(usage, expected);
    let cache_reads: Vec<&str> = chats
        .iter()
        .map(|c| c.attributes["gen_ai.usage.cache_read.input_tokens"].as_str())
        .collect();
    assert!(
        cache_reads.contains(&"800") && cache_reads.contains(&"1000"),
        "{cache_reads:?}"
    );

    // The dispatched tool calls (the denied one never runs) as execute_tool spans, each the
    // parent of the tool's own span.
    let tools: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|s| {
            s.attributes
                .get("gen_ai.operation.name")
                .map(String::as_str)
                == Some("execute_tool")
        })
        .collect();
    let names: BTreeSet<&str> = tools
        .iter()
        .map(|t| t.attributes["gen_ai.tool.name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["fs::list", "fs::write"]),
        "{tools:#?}"
    );
    for t in &tools {
        assert!(!t.attributes["gen_ai.tool.call.id"].is_empty());
        assert!(
            spans
                .iter()
                .any(|s| s.parent_span_id == t.span_id && s.service == "engine"),
            "the call under {} is routed by the engine",
            t.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_session_exports_metrics_at_exit() {
    let (url, _spans, metrics) = otlp::collector_with_metrics().await;
    let dir = tempfile::tempdir().unwrap();
    run_demo(&url, dir.path(), &[], &[]).await;
    // The periodic export is a minute away: what arrived was flushed at exit.
    let last = metrics
        .lock()
        .unwrap()
        .last()
        .cloned()
        .expect("a metrics export at exit");
    let sum = |name: &str, pick: &dyn Fn(&otlp::Point) -> bool| -> (f64, u64) {
        last.iter()
            .filter(|p| p.name == name && pick(p))
            .fold((0.0, 0), |(v, c), p| (v + p.value, c + p.count))
    };
    let attr = |k: &'static str, v: &'static str| {
        move |p: &otlp::Point| p.attributes.get(k).map(String::as_str) == Some(v)
    };
    // demo.json: 820 + 1740 + 1910 + 2100 input tokens (cache reads included), 197 output.
    assert_eq!(
        sum(
            "gen_ai.client.token.usage",
            &attr("gen_ai.token.type", "input")
        ),
        (6570.0, 4)
    );
    assert_eq!(
        sum(
            "gen_ai.client.token.usage",
            &attr("gen_ai.token.type", "output")
        ),
        (197.0, 4)
    );
    let (cost, _) = sum("harness.cost", &|_| true);
    assert!((cost - 0.009980).abs() < 1e-9, "cost {cost}");
    assert_eq!(sum("gen_ai.client.operation.duration", &|_| true).1, 4);
    assert_eq!(sum("harness.model.time_to_first_token", &|_| true).1, 4);
    let tool = |name: &'static str, outcome: &'static str| {
        sum("gen_ai.execute_tool.duration", &move |p: &otlp::Point| {
            p.attributes["gen_ai.tool.name"] == name && p.attributes["harness.outcome"] == outcome
        })
        .1
    };
    assert_eq!(tool("fs::list", "ok"), 1);
    assert_eq!(tool("fs::write", "ok"), 1);
    assert_eq!(tool("approval::resolve", "denied"), 1, "{last:#?}");
    assert!(sum("harness.turn.steps", &attr("harness.outcome", "ok")).0 >= 4.0);
    assert!(
        last.iter()
            .any(|p| p.name == "harness.queue.depth"
                && p.attributes["harness.queue"] == "turn-steps"),
        "queue gauges: {last:#?}"
    );
    assert!(last.iter().any(|p| p.name == "harness.approvals.waiting"));
}

/// With `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` the model calls carry their
/// input and output messages and the tool calls their arguments and results, redacted: a
/// secret the model put in a call's arguments never reaches the collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_content_is_opt_in_and_redacted() {
    let (url, got) = otlp::collector().await;
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("cassette.json");
    std::fs::write(
        &cassette,
        serde_json::json!({"turns": [
            {"text": "Listing.", "tool_calls": [{"id": "c1", "name": "agent_trigger", "arguments": {"function": "fs::list", "payload": {"path": "", "api_key": "sk-live-9f8e7d6c5b4a"}}}], "usage": {"input": 10, "output": 5}},
            {"text": "Listed.", "usage": {"input": 20, "output": 3}}
        ]})
        .to_string(),
    )
    .unwrap();
    run_demo(
        &url,
        dir.path(),
        &["--cassette".as_ref(), cassette.as_os_str()],
        &[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")],
    )
    .await;
    let spans = got.lock().unwrap().clone();
    let everything = format!("{spans:?}");
    assert!(
        !everything.contains("sk-live-9f8e7d6c5b4a"),
        "the secret was exported"
    );
    let chats: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|s| {
            s.attributes
                .get("gen_ai.operation.name")
                .map(String::as_str)
                == Some("chat")
        })
        .collect();
    assert_eq!(chats.len(), 2);
    let second = chats
        .iter()
        .find(|c| c.attributes["gen_ai.usage.input_tokens"] == "20")
        .unwrap();
    let input = &second.attributes["gen_ai.input.messages"];
    assert!(
        input.contains("Listing.") && input.contains("[redacted]"),
        "{input}"
    );
    assert!(second.attributes["gen_ai.output.messages"].contains("Listed."));
    let tool = spans
        .iter()
        .find(|s| s.attributes.get("gen_ai.tool.name").map(String::as_str) == Some("fs::list"))
        .unwrap();
    assert!(tool.attributes["gen_ai.tool.call.arguments"].contains("[redacted]"));
    assert!(tool.attributes.contains_key("gen_ai.tool.call.result"));
}
