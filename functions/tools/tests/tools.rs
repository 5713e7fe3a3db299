//! The tools worker through a real engine: confinement, atomic writes, paging, exec with exit
//! codes, timeouts that kill the process group, and output caps.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{RemoteOptions, connect_client, run_embedded};
use serde_json::json;
use std::time::{Duration, Instant};
use tools_worker::{MAX_OUTPUT_BYTES, Tools, worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_commands_stay_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let tools = Tools::new(&work).unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().join("data")))
        .await
        .unwrap();
    let _w = run_embedded(worker(tools), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();

    // shell::provision and shell::release refuse hostile session ids and wrong types by
    // name, and make or touch nothing for them.
    for (id, data, says) in [
        (
            "shell::provision",
            json!({"session_id": ".."}),
            "cannot name a working directory",
        ),
        (
            "shell::provision",
            json!({"session_id": "a/b"}),
            "cannot name a working directory",
        ),
        (
            "shell::provision",
            json!({"session_id": "x".repeat(500)}),
            "cannot name a working directory",
        ),
        ("shell::provision", json!({"session_id": 7}), "session_id"),
        ("shell::provision", json!({}), "session_id"),
        (
            "shell::provision",
            json!({"session_id": "ok", "from_session_id": "../../etc"}),
            "cannot name a working directory",
        ),
        (
            "shell::release",
            json!({"session_id": ".released"}),
            "cannot name a working directory",
        ),
        (
            "shell::release",
            json!({"session_id": [1, 2]}),
            "session_id",
        ),
    ] {
        let e = ctx.trigger(id, data.clone()).await.unwrap_err();
        assert!(e.to_string().contains(says), "{id} {data}: {e}");
    }
    let made: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(made.is_empty(), "no directory was made for them: {made:?}");

    let w = ctx
        .trigger(
            "fs::write",
            json!({"path": "notes/a.md", "content": "héllo\nworld\n"}),
        )
        .await
        .unwrap();
    assert_eq!(w, json!({"path": "notes/a.md", "bytes_written": 13}));
    let r = ctx
        .trigger("fs::read", json!({"path": "notes/a.md"}))
        .await
        .unwrap();
    assert_eq!(r["content"], "héllo\nworld\n");
    assert_eq!(r["truncated"], false);
    let page = ctx
        .trigger(
            "fs::read",
            json!({"path": "notes/a.md", "offset": 0, "limit": 2}),
        )
        .await
        .unwrap();
    assert_eq!(
        page["content"], "h",
        "a cut inside a character drops the partial character"
    );
    assert_eq!(page["truncated"], true);
    let l = ctx.trigger("fs::list", json!({})).await.unwrap();
    assert_eq!(
        l["entries"],
        json!([{"name": "notes", "path": "notes", "kind": "dir", "size": l["entries"][0]["size"]}])
    );

    for bad in ["../outside.txt", "/etc/passwd", "notes/../../x"] {
        let e = ctx
            .trigger("fs::read", json!({"path": bad}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "forbidden", "{bad}: {e}");
        let e = ctx
            .trigger("fs::write", json!({"path": bad, "content": "x"}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "forbidden", "{bad}: {e}");
    }
    assert!(!dir.path().join("outside.txt").exists());
    std::fs::write(work.join("bin.dat"), [0xff, 0xfe, 0x00]).unwrap();
    let e = ctx
        .trigger("fs::read", json!({"path": "bin.dat"}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not UTF-8"), "{e}");

    let x = ctx
        .trigger(
            "shell::exec",
            json!({"command": "pwd; echo err >&2; exit 3"}),
        )
        .await
        .unwrap();
    assert_eq!(x["exit_code"], 3);
    assert_eq!(
        x["stdout"].as_str().unwrap().trim(),
        work.canonicalize().unwrap().display().to_string()
    );
    assert_eq!(x["stderr"], "err\n");
    assert_eq!(x["timed_out"], false);

    let t0 = Instant::now();
    let x = ctx
        .trigger(
            "shell::exec",
            json!({"command": "sleep 30 & sleep 30; echo never", "timeout_ms": 300}),
        )
        .await
        .unwrap();
    assert_eq!(x["timed_out"], true);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(!x["stdout"].as_str().unwrap().contains("never"));

    let x = ctx
        .trigger(
            "shell::exec",
            json!({"command": "head -c 200000 /dev/zero | tr '\\0' a"}),
        )
        .await
        .unwrap();
    assert_eq!(x["stdout"].as_str().unwrap().len(), MAX_OUTPUT_BYTES);
    assert_eq!(x["truncated"], true);
    let e = ctx
        .trigger("shell::exec", json!({"command": "  "}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

/// Started without `HARNESS_WORKDIR` (as CI's start check starts the bootstrap, from the
/// repository), the worker works in `./workspace` and leaves the directory it was started
/// from to its owner: as root the sandbox gives its working directory to the sandbox user.
#[test]
fn the_binary_never_takes_the_directory_it_starts_in() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let owner = std::fs::metadata(dir.path()).unwrap().uid();
    // No engine to reach: it sets up its tools, fails to connect, and exits.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tools-worker"))
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .output()
        .unwrap();
    assert!(!out.status.success(), "no Runtime API: it exits");
    assert_eq!(
        std::fs::metadata(dir.path()).unwrap().uid(),
        owner,
        "the start directory keeps its owner"
    );
    assert!(
        dir.path().join("workspace").is_dir(),
        "it works in ./workspace"
    );
}

/// Bad settings stop the worker before it connects, with an error that names the variable,
/// instead of being ignored (or, for the sandbox, run with something else than asked).
#[test]
fn bad_settings_stop_the_worker_and_say_which() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value, says) in [
        (
            "HARNESS_FS_READ_MAX_BYTES",
            "lots",
            "HARNESS_FS_READ_MAX_BYTES must be a positive number of bytes, not `lots`",
        ),
        (
            "HARNESS_FS_READ_MAX_BYTES",
            "0",
            "HARNESS_FS_READ_MAX_BYTES",
        ),
        (
            "HARNESS_SANDBOX_ISOLATION",
            "vm",
            "HARNESS_SANDBOX_ISOLATION=`vm`",
        ),
        ("HARNESS_SANDBOX", "maybe", "HARNESS_SANDBOX=`maybe`"),
        (
            "HARNESS_WORKSPACE",
            "per_sesion",
            "HARNESS_WORKSPACE=`per_sesion`: use per_session or shared",
        ),
        (
            "HARNESS_WORKSPACE_RETENTION_HOURS",
            "soon",
            "HARNESS_WORKSPACE_RETENTION_HOURS=`soon`",
        ),
        ("HARNESS_SANDBOX_CPU_SECS", "-1", "HARNESS_SANDBOX_CPU_SECS"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tools-worker"))
            .env(var, value)
            .env("HARNESS_WORKDIR", dir.path().join("work"))
            .env("ENGINE_URL", "ws://127.0.0.1:9/")
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}={value} must not start");
        assert!(stderr.contains(says), "{var}={value}: {stderr}");
    }
}
