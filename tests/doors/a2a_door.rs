//! The A2A door with the official a2a-sdk.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_a2a_client_delegates_tasks_and_answers_input_required() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let seen = run_client(
        clients_python(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/doors/a2a_client.py"),
        &http,
        &harness.token,
        &[],
    )
    .await;
    // The public card: a JSON-RPC interface at /a2a, streaming, a bearer scheme, skills.
    let card = &seen["card"];
    assert_eq!(card["url"], format!("{http}/a2a"), "{card}");
    assert_eq!(card["binding"], "JSONRPC");
    assert_eq!(card["streaming"], true);
    assert_eq!(card["schemes"], json!(["bearer"]));
    let skills = card["skills"].as_array().unwrap();
    assert!(
        skills.contains(&json!("fs::list")),
        "the agent's tools: {card}"
    );
    assert!(
        !skills.iter().any(|s| {
            let s = s.as_str().unwrap();
            s.starts_with("engine::") || s == "approval::resolve" || s == "harness::trigger"
        }),
        "nothing kept from the agent is on the public card: {card}"
    );
    // Streamed: the task first, working notes for the call, the answer in chunks, completed.
    let s = &seen["stream"];
    assert_eq!(s["kinds"][0], "task", "{s}");
    assert_eq!(s["context"], "a2a-1");
    assert!(s["task"].as_str().unwrap().ends_with(".a2a-1"), "{s}");
    assert_eq!(s["text"], "Looking.There is nothing here.", "{s}");
    assert!(
        s["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("fs::list: allowed")),
        "{s}"
    );
    assert_eq!(
        s["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED",
        "{s}"
    );
    assert!(
        s["kinds"]
            .as_array()
            .unwrap()
            .contains(&json!("artifact_update"))
    );
    // Not streamed: completed with its answer; GetTask reads it back; the earlier task too.
    assert_eq!(seen["blocking"]["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(seen["blocking"]["text"], "Hello there, friend.");
    assert_eq!(seen["blocking"]["context"], "a2a-1");
    assert_eq!(seen["got"], seen["blocking"]);
    assert_eq!(seen["earlier"]["state"], "TASK_STATE_COMPLETED");
    // Input required: the waiting call named; a text reply is refused; a data part decides.
    let parked = &seen["parked"];
    assert_eq!(
        parked["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_INPUT_REQUIRED",
        "{parked}"
    );
    assert!(
        parked["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("fs::write (w1)")),
        "{parked}"
    );
    assert!(
        seen["text_answer"]
            .as_str()
            .unwrap()
            .contains("waits for a decision"),
        "{seen}"
    );
    let answered = &seen["answered"];
    assert_eq!(answered["task"], parked["task"], "the same task goes on");
    assert_eq!(answered["text"], "Written.", "{answered}");
    assert_eq!(
        answered["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED"
    );
    assert!(
        seen["answer_again"]
            .as_str()
            .unwrap()
            .contains("not waiting for input"),
        "{seen}"
    );
    let written: Vec<_> = files_under(&dir.path().join("work"))
        .into_iter()
        .filter(|p| p.ends_with("door.txt"))
        .collect();
    assert_eq!(written.len(), 1, "the approved write ran once");
    // Cancelled while its call waits: canceled, the call never ran, and it cannot be cancelled twice.
    assert_eq!(
        seen["parked_blocking"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    assert_eq!(seen["cancelled"]["state"], "TASK_STATE_CANCELED", "{seen}");
    assert!(
        seen["cancel_again"]
            .as_str()
            .unwrap()
            .contains("TaskNotCancelable"),
        "{seen}"
    );
    assert!(
        seen["missing"].as_str().unwrap().contains("TaskNotFound"),
        "{seen}"
    );
    assert!(seen["bad_key"].as_str().unwrap().contains("401"), "{seen}");
}
