//! The AG-UI door with the official @ag-ui/client HttpAgent.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_ag_ui_client_runs_turns_and_answers_interrupts() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/doors/agui");
    assert!(
        std::path::Path::new(client)
            .join("node_modules/@ag-ui/client")
            .exists(),
        "the AG-UI client is not installed: run `npm ci` in tests/doors/agui (scripts/test.sh does)"
    );
    let seen = run_client(
        "node",
        &format!("{client}/client.mjs"),
        &http,
        &harness.token,
        &[("SUPPRESS_TRANSFORMATION_WARNINGS", "true")],
    )
    .await;
    let types = |run: &str| -> Vec<String> {
        seen[run]["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    };
    // Every event of every run is valid against @ag-ui/core's schemas.
    for run in [
        "listed",
        "hello",
        "parked",
        "resumed",
        "parked2",
        "cancelled",
    ] {
        assert_eq!(seen[run]["invalid"], json!([]), "{run}: {seen}");
        assert!(seen[run]["thrown"].is_null(), "{run}: {seen}");
        let t = types(run);
        assert_eq!(
            t.first().map(String::as_str),
            Some("RUN_STARTED"),
            "{run}: {t:?}"
        );
        assert_eq!(
            t.last().map(String::as_str),
            Some("RUN_FINISHED"),
            "{run}: {t:?}"
        );
        assert_eq!(seen[run]["protocolVersion"], "1.0");
    }
    // The listing: thinking as reasoning, the harness's own call with its result, the answer.
    let listed = &seen["listed"];
    assert_eq!(
        listed["thinking"], "The user wants the workspace listed.",
        "{listed}"
    );
    assert_eq!(listed["text"], "Looking.There is nothing here.", "{listed}");
    assert_eq!(listed["calls"][0]["name"], "fs::list", "{listed}");
    assert_eq!(listed["results"][0]["id"], listed["calls"][0]["id"]);
    assert!(types("listed").contains(&"REASONING_START".to_string()));
    assert!(
        listed["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "function_execute"),
        "the turn's states reach the client: {listed}"
    );
    assert_eq!(listed["outcome"]["type"], "success");
    let usage = &listed["usage"][0];
    assert_eq!(usage["inputTokens"], 200 + 50 + 260, "{listed}");
    assert_eq!(usage["cachedInputTokens"], 50, "{listed}");
    assert_eq!(usage["outputTokens"], 15, "{listed}");
    // The second run of the thread continues the session; the client keeps both turns.
    assert_eq!(seen["hello"]["text"], "Hello there, friend.");
    // The parked write ends the run with an interrupt naming the call.
    let parked = &seen["parked"];
    assert_eq!(parked["outcome"]["type"], "interrupt", "{parked}");
    let interrupt = &parked["outcome"]["interrupts"][0];
    assert_eq!(interrupt["toolCallId"], interrupt["id"]);
    assert_eq!(interrupt["reason"], "tool_approval");
    assert_eq!(parked["calls"][0]["name"], "fs::write");
    assert!(
        parked["results"].as_array().unwrap().is_empty(),
        "it did not run yet"
    );
    // The client itself refuses a new run while the interrupt is unanswered.
    assert!(
        seen["unanswered"]["thrown"]
            .as_str()
            .unwrap_or("")
            .contains("pending interrupt"),
        "{}",
        seen["unanswered"]
    );
    // Resumed: the call runs once, the turn ends with its answer.
    let resumed = &seen["resumed"];
    assert_eq!(resumed["results"].as_array().unwrap().len(), 1, "{resumed}");
    assert_eq!(resumed["results"][0]["id"], interrupt["id"]);
    assert_eq!(resumed["text"], "Written.", "{resumed}");
    assert_eq!(resumed["outcome"]["type"], "success");
    let written: Vec<_> = files_under(&dir.path().join("work"))
        .into_iter()
        .filter(|p| p.ends_with("door.txt"))
        .collect();
    assert_eq!(written.len(), 1, "the approved write ran once");
    // The same answer again decides nothing.
    let again = seen["again"]["body"].as_str().unwrap();
    assert_eq!(seen["again"]["status"], 200);
    assert!(
        again.contains("\"RUN_ERROR\"") && again.contains("not_pending"),
        "{again}"
    );
    // Cancelled: the call is denied and never runs.
    let cancelled = &seen["cancelled"];
    let result = cancelled["results"][0]["content"].as_str().unwrap();
    assert!(result.contains("denied"), "{cancelled}");
    assert!(
        result.contains("cancelled from the AG-UI client"),
        "{cancelled}"
    );
    assert_eq!(cancelled["outcome"]["type"], "success");
    // A wrong credential fails the client's run.
    assert!(
        seen["badKey"]["thrown"]
            .as_str()
            .unwrap_or("")
            .contains("401"),
        "{}",
        seen["badKey"]
    );
}
