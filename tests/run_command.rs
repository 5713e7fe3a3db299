//! The README's run command, end to end: the composite binary starts the engine on the
//! embedded backend with the example worker, makes a traced two-hop call, and exits cleanly.

use std::process::Command;

#[test]
fn harness_once_runs_the_demo_on_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--once", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("harness binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(r#"demo::greet  → {"greeting":"Hello, harness!"}"#),
        "{stdout}"
    );
    assert!(stdout.contains(r#""via":"demo::chain""#), "{stdout}");
    assert!(
        stdout.contains("6 spans in trace"),
        "one trace holds both calls' spans: {stdout}"
    );
    assert!(
        dir.path().join("engine.redb").exists(),
        "state lives in the data dir"
    );
}
