//! The README's run command, end to end: the composite binary starts the engine and every
//! worker on the embedded backend and runs one agent session against the scripted model (no
//! API keys): streamed text, an allowed call, an approval-gated call, a denied call, and the
//! summary with turns, tool calls, tokens, cost and trace id.

use std::process::Command;

fn run(extra: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--workdir")
        .arg(dir.join("work"))
        .arg("--permissions")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/iii-permissions.yaml"))
        .args(extra)
        .env("RUST_LOG", "warn")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("MOONSHOT_API_KEY")
        .env_remove("HARNESS_CONFIG")
        .output()
        .expect("harness binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (
        out.status.success(),
        format!(
            "{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_main_command_runs_a_scripted_session_with_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run(&["--approve-all"], dir.path());
    assert!(ok, "{out}");
    assert!(
        out.contains("Let me look at the working directory."),
        "streamed text: {out}"
    );
    assert!(out.contains("→ fs::list"), "{out}");
    assert!(
        out.contains("(needs approval)") && out.contains("allow: {\"ok\":true}"),
        "{out}"
    );
    assert!(out.contains("denied by permissions"), "{out}");
    assert!(out.contains("turns 4 · tool calls 3"), "{out}");
    // The demo cassette's usage, priced by the catalogue's scripted-demo entry: 3870 input +
    // 2700 cache reads, 197 output → 3870×2 + 197×10 + 2700×0.1 per million = $0.009980.
    assert!(
        out.contains("tokens 6570 in (2700 read from the prompt cache, 0 written to it) / 197 out · cost $0.009980"),
        "the provider's usage and cost add up: {out}"
    );
    assert!(out.contains(": stopped ·"), "{out}");
    // The console's address and a one-time sign-in link (a code, never the token).
    let console = out
        .lines()
        .find(|l| l.starts_with("console: http://127.0.0.1:"))
        .unwrap_or("");
    assert!(
        console.contains("#code="),
        "the banner prints a sign-in link: {out}"
    );
    let token = std::fs::read_to_string(dir.path().join("data/engine.token")).unwrap();
    assert!(
        !out.contains(token.trim()),
        "the token itself is never printed"
    );
    let summary = out
        .lines()
        .find(|l| l.starts_with("— session"))
        .unwrap_or("");
    let trace = summary.rsplit("trace ").next().unwrap_or("").trim();
    assert_eq!(trace.len(), 32, "a trace id: {out}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/SUMMARY.md")).unwrap(),
        "# Summary\nThe harness ran a scripted session.\n"
    );

    // --deny-all: the write never happens.
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run(&["--deny-all"], dir.path());
    assert!(ok, "{out}");
    assert!(
        out.contains("deny: {\"ok\":true}") && out.contains("denied by user"),
        "{out}"
    );
    assert!(!dir.path().join("work/SUMMARY.md").exists());
}

#[test]
fn a_working_directory_that_reaches_the_data_dir_or_the_rules_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let perms = dir.path().join("work").join("iii-permissions.yaml");
    std::fs::create_dir_all(perms.parent().unwrap()).unwrap();
    std::fs::write(&perms, "version: 1\nrules: []\n").unwrap();
    for (workdir, data, permissions, why) in [
        ("data/work", "data", "iii-permissions.yaml", "overlap"),
        ("w", "w/data", "iii-permissions.yaml", "overlap"),
        (
            "work",
            "data",
            "work/iii-permissions.yaml",
            "rewrite its own rules",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_harness"))
            .args(["--listen", "127.0.0.1:0", "--serve-only", "--workdir"])
            .arg(dir.path().join(workdir))
            .arg("--data-dir")
            .arg(dir.path().join(data))
            .arg("--permissions")
            .arg(dir.path().join(permissions))
            .env("RUST_LOG", "warn")
            .output()
            .expect("harness binary runs");
        assert!(!out.status.success(), "{workdir} / {data}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{workdir} / {data}: {err}");
    }
}

#[test]
fn the_thin_preset_talks_but_cannot_act_and_a_named_provider_without_a_key_is_named() {
    // Thin: orchestrator, the scripted provider, credentials and the harness worker (the run
    // goes through harness::trigger). No policy worker, so each call of the demo is denied
    // fail-closed, and the banner says so; the session still ends with the model's answer.
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run(&["--config", "thin"], dir.path());
    assert!(ok, "{out}");
    assert!(
        out.contains("· thin · model scripted/scripted-demo"),
        "{out}"
    );
    assert!(
        out.contains("embedded: turn-orchestrator, providers, auth-credentials, harness"),
        "{out}"
    );
    assert!(out.contains("off: policy, approval-gate, tools"), "{out}");
    assert!(
        out.contains("no policy worker: every tool call is denied (gate_unavailable)"),
        "the stance in the banner: {out}"
    );
    assert_eq!(
        out.matches("denied by gate_unavailable").count(),
        2,
        "{out}"
    );
    assert!(
        out.contains(": stopped ·") && out.contains("tool calls 3"),
        "{out}"
    );
    assert!(!dir.path().join("work/SUMMARY.md").exists());

    // --provider kimi with no key anywhere: registered all the same, and the run ends saying
    // which provider has no credentials.
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run(&["--provider", "kimi", "--approve-all"], dir.path());
    assert!(ok, "{out}");
    assert!(out.contains("model kimi/kimi-k2.5"), "{out}");
    assert!(
        out.contains("ended by auth_missing: no credentials for provider `kimi`"),
        "{out}"
    );
}

#[test]
fn an_invalid_configuration_is_named_with_its_line_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needles) in [
        (
            "workers:\n  turn-orchestrator: embedded\n  tols: embedded\n",
            &["`tols` is not one of ours", "line 3"][..],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\nsandbox:\n  mode: lenient\n",
            &["sandbox.mode", "lenient", "line 4"],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\n  providers: embedded\nproviders:\n  scripted: {}\nrun:\n  provider: openai\n",
            &[
                "run.provider at line 7",
                "`openai` is not among the providers listed (scripted)",
            ],
        ),
    ] {
        let file = dir.path().join("harness.yaml");
        std::fs::write(&file, text).unwrap();
        let data = dir.path().join("data");
        let out = Command::new(env!("CARGO_BIN_EXE_harness"))
            .args(["--listen", "127.0.0.1:0", "--serve-only", "--config"])
            .arg(&file)
            .arg("--data-dir")
            .arg(&data)
            .env("RUST_LOG", "warn")
            .output()
            .expect("harness binary runs");
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("the configuration is not valid"), "{err}");
        for n in needles {
            assert!(err.contains(n), "`{n}` for {text:?}: {err}");
        }
        assert!(!data.exists(), "nothing started: no data dir was made");
    }
    // A file that is not there.
    let out = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--serve-only", "--config", "/nonexistent/harness.yaml"])
        .output()
        .expect("harness binary runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/harness.yaml"));
}

/// The terminal session learns of a decision made elsewhere: while it asks `allow fs::write?`,
/// another client (the console, Slack, the HTTP API) decides; the terminal says who decided
/// and goes on, instead of waiting at the question.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_made_elsewhere_takes_the_terminals_question_away() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--workdir")
        .arg(dir.path().join("work"))
        .arg("--permissions")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/iii-permissions.yaml"))
        .env("RUST_LOG", "warn")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("MOONSHOT_API_KEY")
        .env_remove("HARNESS_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Nobody types: stdin stays open and silent.
    let _stdin = child.stdin.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    let mut next_until = async |needle: &str, seen: &mut String| {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if seen.contains(needle) {
                return;
            }
            let line = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no `{needle}` in: {seen}"))
                .unwrap_or_else(|| panic!("the harness exited before `{needle}`: {seen}"));
            seen.push_str(&line);
            seen.push('\n');
        }
    };
    next_until("(needs approval)", &mut seen).await;
    let first = seen.lines().next().unwrap().to_string();
    let address = first.split_whitespace().nth(2).unwrap().to_string();
    let token = std::fs::read_to_string(dir.path().join("data/engine.token")).unwrap();
    let client = harness_sdk::connect_client(
        "console",
        harness_sdk::RemoteOptions::new(&format!("{address}/?token={}", token.trim())),
    )
    .await;
    let ctx = client.ctx();
    let pending = ctx
        .trigger("approval::list_pending", serde_json::json!({}))
        .await
        .unwrap();
    let call = &pending["pending"][0];
    assert_eq!(call["function_id"], "fs::write", "{pending}");
    let r = ctx
        .trigger(
            "approval::resolve",
            serde_json::json!({"session_id": call["session_id"], "function_call_id": call["function_call_id"], "decision": "allow", "reason": "looks fine"}),
        )
        .await
        .unwrap();
    assert_eq!(r["ok"], true, "{r}");
    next_until("decided elsewhere: allow by", &mut seen).await;
    assert!(seen.contains("(looks fine)"), "{seen}");
    next_until(": stopped ·", &mut seen).await;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{seen}");
    assert!(
        dir.path().join("work/SUMMARY.md").exists(),
        "the write ran: {seen}"
    );
}
