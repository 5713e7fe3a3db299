//! The MCP server door with the official MCP Python SDK.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_client_runs_the_agent_as_a_tool() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let python = std::env::var("HARNESS_MCP_PYTHON").expect(
        "HARNESS_MCP_PYTHON names the venv with the official MCP Python SDK (scripts/test.sh makes it)",
    );
    let seen = run_client(
        python,
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/doors/mcp_client.py"),
        &http,
        &harness.token,
        &[],
    )
    .await;
    // The SDK tried its newest protocol, fell back to the handshake, and agreed on ours.
    assert_eq!(seen["version"], "2025-11-25", "{seen}");
    assert_eq!(
        seen["tools"],
        json!([
            "get_session",
            "list_pending_approvals",
            "resolve_approval",
            "run_agent"
        ])
    );
    // A turn as a tool: its final text, in the session named, with progress on the way.
    let listed = &seen["listed"];
    assert_eq!(listed["structured"]["session_id"], "mcp-1", "{listed}");
    assert_eq!(listed["structured"]["state"], "answered");
    assert_eq!(
        listed["structured"]["text"],
        "Looking.There is nothing here."
    );
    assert_eq!(listed["is_error"], false);
    let progress: Vec<&str> = listed["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        progress.iter().any(|p| p.starts_with("fs::list: allowed")),
        "{progress:?}"
    );
    assert!(progress.contains(&"fs::list done"), "{progress:?}");
    // No session named: a new one, returned.
    assert!(
        seen["fresh"]["structured"]["session_id"]
            .as_str()
            .unwrap()
            .starts_with("mcp-")
    );
    assert_eq!(seen["fresh"]["structured"]["text"], "Hello there, friend.");
    // Parked: the pending call, listed, decided once; the turn goes on to its answer.
    let parked = &seen["parked"]["structured"];
    assert_eq!(parked["state"], "awaiting_approval", "{parked}");
    assert_eq!(parked["pending"][0]["function_id"], "fs::write");
    assert!(
        seen["pending"]["pending"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["session_id"] == "mcp-2"),
        "{seen}"
    );
    assert_eq!(
        seen["resolved"]["structured"]["state"], "answered",
        "{seen}"
    );
    assert_eq!(seen["resolved"]["structured"]["text"], "Written.");
    assert_eq!(seen["again"]["is_error"], true);
    assert!(
        seen["again"]["text"]
            .as_str()
            .unwrap()
            .contains("not waiting for approval")
    );
    let written: Vec<_> = files_under(&dir.path().join("work"))
        .into_iter()
        .filter(|p| p.ends_with("door.txt"))
        .collect();
    assert_eq!(written.len(), 1, "the approved write ran once");
    assert_eq!(seen["session"]["structured"]["state"], "answered");
    assert_eq!(seen["session"]["structured"]["text"], "Written.");
    assert_eq!(seen["missing"]["is_error"], true);
    // Hostile arguments name what is wrong; an unknown tool is a protocol error.
    for (k, says) in [
        ("bad_type", "`message`"),
        ("bad_name", "`sesion_id`"),
        ("bad_id", "session_id"),
    ] {
        assert_eq!(seen[k]["is_error"], true, "{k}");
        assert!(
            seen[k]["text"].as_str().unwrap().contains(says),
            "{k}: {}",
            seen[k]
        );
    }
    assert!(
        seen["unknown_tool"]
            .as_str()
            .unwrap()
            .contains("no_such_tool"),
        "{seen}"
    );
    // Cancelled: the turn was aborted.
    assert_eq!(seen["cancel"], "cancelled");
    assert_eq!(seen["cancelled_session"]["state"], "aborted", "{seen}");
    // A wrong credential does not connect.
    assert!(
        seen["bad_key"]
            .as_str()
            .unwrap()
            .contains("missing or wrong engine token"),
        "{seen}"
    );
}
