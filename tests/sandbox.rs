//! `shell::exec` in its sandbox, as the agent would call it: nothing past the working
//! directory, no secrets in the environment, no network, bounded resources, and no process
//! outliving its call. Every attempt fails with a clear outcome, and the tools keep working.
//! A layer's test is skipped only when this kernel lacks the layer (it says so). The layer
//! tests run once for each isolation this machine has: the reused namespaces (bubblewrap)
//! and Landlock (what a machine without user namespaces gets).

use crate::common;

use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use tools_worker::Tools;
use tools_worker::sandbox::{Isolation, Mode, SandboxConfig};

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    work: std::path::PathBuf,
    data: std::path::PathBuf,
    tools: Arc<Tools>,
}

fn setup() -> Setup {
    setup_with(Isolation::Auto)
}

/// The isolations to test layers under.
const ISOLATIONS: [Isolation; 2] = [Isolation::Namespaces, Isolation::Landlock];

fn setup_with(isolation: Isolation) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("secrets.json"),
        r#"{"anthropic": "sk-secret-value"}"#,
    )
    .unwrap();
    std::fs::write(root.join("iii-permissions.yaml"), "version: 1\nrules: []\n").unwrap();
    let work = root.join("workspace");
    let tools = Tools::with_sandbox(
        &work,
        SandboxConfig {
            isolation,
            ..SandboxConfig::default()
        },
    )
    .unwrap();
    let work = work.canonicalize().unwrap();
    Setup {
        _dir: dir,
        root: root.canonicalize().unwrap(),
        work,
        data: data.canonicalize().unwrap(),
        tools,
    }
}

async fn exec(t: &Tools, command: &str) -> Value {
    t.exec(&json!({"command": command, "timeout_ms": 10_000}))
        .await
        .unwrap_or_else(|e| panic!("{command}: {e:?}"))
}

fn layer(t: &Tools, name: &str) -> bool {
    let report = t.sandbox_report();
    let on = report["layers"][name] == true;
    if !on {
        eprintln!(
            "SKIPPED: layer `{name}` is not active here ({} isolation): {}",
            report["isolation"], report["notes"]
        );
    }
    on
}

/// Whether this machine has what `isolation` needs: then it must come up, and its tests may
/// not skip.
fn available(isolation: Isolation) -> bool {
    match isolation {
        Isolation::Namespaces => {
            let on_path = std::env::var_os("PATH")
                .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()));
            let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
                .is_ok_and(|n| n.trim().parse::<u64>().is_ok_and(|n| n > 0));
            on_path && userns
        }
        Isolation::Landlock => tools_worker::landlock::abi().is_some(),
        _ => true,
    }
}

/// The isolation that gives the filesystem layer here, or `None` (the test then skips).
fn isolated(s: &Setup, wanted: Isolation) -> Option<&'static str> {
    if !layer(&s.tools, "filesystem") {
        assert!(
            !available(wanted),
            "{wanted:?} is available on this machine but did not come up: {}",
            s.tools.sandbox_report()
        );
        return None;
    }
    let got = s.tools.sandbox_report()["isolation"].clone();
    assert_eq!(
        got,
        match wanted {
            Isolation::Namespaces => "namespaces",
            _ => "landlock",
        },
        "the isolation asked for"
    );
    Some(if wanted == Isolation::Namespaces {
        "namespaces"
    } else {
        "landlock"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_reports_its_layers() {
    let s = setup();
    let r = s.tools.sandbox_report();
    eprintln!("sandbox: {r}");
    for always in [
        "clean_env",
        "session",
        "rlimits",
        "no_new_privs",
        "seccomp",
        "separate_uid",
    ] {
        assert_eq!(r["layers"][always], true, "{always}: {r}");
    }
    assert_eq!(r["usable"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_past_the_working_directory_can_be_read() {
    // SAFETY: set before any sandbox starts; nothing else reads the environment yet.
    unsafe { std::env::set_var("HARNESS_TEST_API_KEY", "sk-must-not-leak") };
    for iso in ISOLATIONS {
        let s = setup_with(iso);
        let Some(kind) = isolated(&s, iso) else {
            continue;
        };
        cannot_read_outside(&s, kind).await;
    }
}

async fn cannot_read_outside(s: &Setup, kind: &str) {
    // Namespaces: the path is not in the sandbox's root. Landlock: it may not be opened.
    let refusal = if kind == "namespaces" {
        "No such file"
    } else {
        "Permission denied"
    };
    for target in [
        "../data/secrets.json".to_string(),
        s.data.join("secrets.json").display().to_string(),
        s.root.join("iii-permissions.yaml").display().to_string(),
        "/root/.aws/credentials".to_string(),
    ] {
        let r = exec(&s.tools, &format!("cat {target}")).await;
        assert_ne!(r["exit_code"], 0, "{target}: {r}");
        assert!(!r["stdout"].as_str().unwrap().contains("sk-secret"), "{r}");
        assert!(
            r["stderr"].as_str().unwrap().contains(refusal),
            "{kind}, {target}: {r}"
        );
    }
    if kind == "landlock" {
        // No /proc at all.
        let r = exec(&s.tools, "cat /proc/1/environ; ls /proc").await;
        assert_ne!(r["exit_code"], 0, "{r}");
        assert!(r["stdout"].as_str().unwrap().is_empty(), "{r}");
        assert!(
            r["stderr"].as_str().unwrap().contains("Permission denied"),
            "{r}"
        );
        return;
    }
    // /proc shows only the sandbox's own processes: pid 1 is the sandbox, not the host, and
    // it holds none of the harness's environment.
    let r = exec(
        &s.tools,
        "cat /proc/1/environ | tr '\\0' '\\n'; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    assert!(!r["stdout"].as_str().unwrap().contains("API_KEY"), "{r}");
    let procs: u32 = r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(procs < 10, "only the sandbox's processes are visible: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_outside_can_be_written_directly_or_through_a_symlink() {
    for iso in ISOLATIONS {
        let s = setup_with(iso);
        let Some(kind) = isolated(&s, iso) else {
            continue;
        };
        cannot_write_outside(&s, kind).await;
    }
}

async fn cannot_write_outside(s: &Setup, kind: &str) {
    let refusal = if kind == "namespaces" {
        "Read-only file system"
    } else {
        "Permission denied"
    };
    let outside = s.data.join("planted");
    let r = exec(&s.tools, &format!("echo x > {}", outside.display())).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let r = exec(
        &s.tools,
        &format!(
            "ln -s {} link && echo x > link/planted; echo x > /usr/planted; echo x > /etc/planted",
            s.data.display()
        ),
    )
    .await;
    assert!(
        r["stderr"].as_str().unwrap().contains(refusal),
        "{kind}: {r}"
    );
    assert!(!outside.exists());
    assert!(!Path::new("/usr/planted").exists() && !Path::new("/etc/planted").exists());
    // fs::write refuses the link (it resolves outside) and never follows one planted at its
    // temporary name.
    let e = s
        .tools
        .write(&json!({"path": "link/planted", "content": "x"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "forbidden", "{e:?}");
    assert!(!outside.exists());
    // Inside, all is well, and the command's files are the agent's to change.
    let r = exec(&s.tools, "echo ok > mine.txt && cat mine.txt && id -u").await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().starts_with("ok"));
    s.tools
        .write(&json!({"path": "theirs.txt", "content": "from fs::write"}))
        .await
        .unwrap();
    let r = exec(&s.tools, "echo more >> theirs.txt && cat theirs.txt").await;
    assert_eq!(
        r["exit_code"], 0,
        "fs::write's files stay writable to commands: {r}"
    );
    assert!(s.work.join("mine.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_holds_no_keys() {
    // SAFETY: this test's process has no other thread reading the environment yet.
    unsafe {
        std::env::set_var("ANTHROPIC_API_KEY", "sk-ant-leak");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "aws-leak");
    }
    let s = setup();
    let r = exec(&s.tools, "env").await;
    let env = r["stdout"].as_str().unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(!env.contains("API_KEY") && !env.contains("AWS_"), "{env}");
    assert!(env.contains(&format!("HOME={}", s.work.display())), "{env}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_by_default() {
    for iso in ISOLATIONS {
        let s = setup_with(iso);
        if isolated(&s, iso).is_none() {
            continue;
        }
        no_network(&s).await;
    }
    // seccomp's socket rule holds with no isolation at all.
    let s = setup_with(Isolation::Process);
    assert_eq!(s.tools.sandbox_report()["isolation"], "process");
    no_network(&s).await;
}

async fn no_network(s: &Setup) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = exec(
        &s.tools,
        &format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
    )
    .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(listener.accept().is_err(), "nothing reached the host port");
    let r = exec(&s.tools, "bash -c 'echo hi > /dev/tcp/1.1.1.1/53'").await;
    assert_ne!(r["exit_code"], 0, "{r}");
    // Nor through UDP, or a raw or netlink socket; a Unix socket pair still works.
    let r = exec(
        &s.tools,
        r#"python3 -c 'import socket
for f, t in [(socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_NETLINK, socket.SOCK_RAW)]:
  try:
    socket.socket(f, t); print("opened", f)
  except OSError as e: print("refused", e.errno)
socket.socketpair(); print("pair")'"#,
    )
    .await;
    let out = r["stdout"].as_str().unwrap();
    assert!(
        !out.contains("opened") && out.matches("refused").count() == 3 && out.contains("pair"),
        "{r}"
    );
}

fn processes_of(uid: u32, marker: &str) -> usize {
    common::process::processes(marker, None, Some(uid))
}

fn sandbox_uid(t: &Tools) -> u32 {
    // SAFETY: geteuid has no preconditions.
    t.sandbox_owner_uid().unwrap_or(unsafe { libc::geteuid() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_are_bounded_and_nothing_outlives_its_call() {
    for (iso, uid) in [
        (Isolation::Namespaces, 64321),
        (Isolation::Landlock, 64322),
        (Isolation::Process, 64323),
    ] {
        bounded(iso, uid).await;
    }
}

async fn bounded(isolation: Isolation, uid: u32) {
    // A uid of its own: the process limit counts per user, and the other tests' commands
    // (run at the same time) must not share this one's fork bomb.
    let dir = tempfile::tempdir().unwrap();
    let cfg = SandboxConfig {
        uid,
        isolation,
        ..SandboxConfig::default()
    };
    let tools = Tools::with_sandbox(dir.path().join("workspace"), cfg).unwrap();
    let s = Setup {
        root: dir.path().to_path_buf(),
        work: dir.path().join("workspace"),
        data: dir.path().join("data"),
        _dir: dir,
        tools,
    };
    // A fork bomb: bounded by the process limit, ended by the timeout, nothing left behind.
    let r = s
        .tools
        .exec(&json!({"command": "b(){ b | b & }; b; sleep 1", "timeout_ms": 3_000}))
        .await
        .unwrap();
    assert!(r["duration_ms"].as_u64().unwrap() < 10_000, "{r}");
    // A background process goes with its command, even when the command ends by itself.
    let marker = format!("5{}.5", std::process::id());
    let r = exec(&s.tools, &format!("sleep {marker} & echo started")).await;
    assert_eq!(
        (&r["exit_code"], &r["stdout"]),
        (&json!(0), &json!("started\n")),
        "{r}"
    );
    assert_eq!(
        processes_of(uid, &marker),
        0,
        "{isolation:?}: nothing outlives its call"
    );
    // A 4 GB allocation fails.
    let r = exec(
        &s.tools,
        "perl -e '$x = \"a\" x (4 * 1024 ** 3); print length $x'",
    )
    .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("Out of memory"),
        "{r}"
    );
    // A command that outlives its timeout, with a child that tries to escape its group.
    let marker = format!("9{}.5", std::process::id());
    let r = s
        .tools
        .exec(&json!({"command": format!("setsid sleep {marker} & sleep {marker}"), "timeout_ms": 500}))
        .await
        .unwrap();
    assert_eq!(r["timed_out"], true, "{r}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // In every isolation: seccomp refuses setsid, so the group kill reaches everything.
    let left = processes_of(sandbox_uid(&s.tools), &marker);
    assert_eq!(left, 0, "no process of the command is left ({isolation:?})");
    // (Only the refusal is checked: the fork bomb's processes may still be being reaped, and
    // they count against the uid's process limit.)
    let r = exec(&s.tools, "setsid true").await;
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("setsid failed: Operation not permitted"),
        "{isolation:?}: {r}"
    );
    // And the tools still work.
    assert_eq!(exec(&s.tools, "echo alive").await["stdout"], "alive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_kills_its_command() {
    let s = setup();
    let t = s.tools.clone();
    let marker = format!("8{}.5", std::process::id());
    let command = format!("sleep {marker}");
    let call = tokio::spawn(async move {
        t.exec(&json!({"command": command, "timeout_ms": 60_000}))
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(processes_of(sandbox_uid(&s.tools), &marker) >= 1, "running");
    call.abort();
    let _ = call.await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        processes_of(sandbox_uid(&s.tools), &marker),
        0,
        "the command died with its call"
    );
}

/// Commands of one working directory share its namespaces (and its uid) but not each other:
/// `kill -9 -1` in one reaches neither another running command nor the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_signal_another_or_the_sandbox() {
    for (iso, uid) in [(Isolation::Namespaces, 64324), (Isolation::Landlock, 64325)] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SandboxConfig {
            uid,
            isolation: iso,
            ..SandboxConfig::default()
        };
        let tools = Tools::with_sandbox(dir.path().join("workspace"), cfg).unwrap();
        if !layer(&tools, "pid") {
            continue;
        }
        let marker = format!("7{}.25", std::process::id());
        let t = tools.clone();
        let command = format!("sleep {marker}");
        let victim = tokio::spawn(async move {
            t.exec(&json!({"command": command, "timeout_ms": 30_000}))
                .await
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while processes_of(uid, &marker) == 0 {
            assert!(std::time::Instant::now() < deadline, "the victim started");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // (kill -1 answers 0 even when every target refused: EPERM is not reported for it.)
        // The pause gives a killed waiter time to take its command with it.
        let r = exec(&tools, "kill -9 -1; sleep 0.5; echo done").await;
        assert_eq!(r["stdout"], "done\n", "{iso:?}: {r}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            processes_of(uid, &marker) >= 1,
            "{iso:?}: the other command lives"
        );
        assert_eq!(exec(&tools, "echo alive").await["stdout"], "alive\n");
        victim.abort();
    }
}

/// The namespaces' holder ending (killed from outside here) costs one restart, not the
/// tools: the next command gets a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sandbox_holder_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let uid = 64326;
    let cfg = SandboxConfig {
        uid,
        isolation: Isolation::Namespaces,
        ..SandboxConfig::default()
    };
    let tools = Tools::with_sandbox(dir.path().join("workspace"), cfg).unwrap();
    if !layer(&tools, "filesystem") {
        return;
    }
    assert_eq!(exec(&tools, "echo one").await["stdout"], "one\n");
    if tools.sandbox_owner_uid().is_none() {
        eprintln!(
            "SKIPPED: not root, so the holder runs as this user and pkill would reach other tests' holders"
        );
        return;
    }
    let holder = tools_worker::namespaces::HOLDER_SCRIPT;
    assert!(
        common::process::processes(holder, None, Some(uid)) >= 1,
        "the holder runs as the sandbox's uid"
    );
    let _ = std::process::Command::new("pkill")
        .args(["-9", "-U", &uid.to_string(), "-f", holder])
        .status();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let r = exec(&tools, "echo two; ls /proc | grep -c '^[0-9]'").await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().starts_with("two\n"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_refuses_what_commands_have_no_business_doing() {
    let s = setup();
    let r = exec(&s.tools, "unshare --user true; echo rc=$?").await;
    let out = format!("{}{}", r["stdout"], r["stderr"]);
    assert!(
        out.contains("rc=1") && out.contains("Operation not permitted"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_mode_refuses_when_a_layer_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SandboxConfig {
        mode: Mode::Required,
        isolation: Isolation::Process,
        ..SandboxConfig::default()
    };
    let tools = Tools::with_sandbox(dir.path(), cfg).unwrap();
    let e = tools
        .exec(&json!({"command": "echo should-not-run > ran"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "sandbox_unavailable");
    assert!(
        e.message.contains("filesystem") && e.message.contains("pid"),
        "{}",
        e.message
    );
    assert!(!dir.path().join("ran").exists(), "it never runs unconfined");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_read_refuses_special_files_and_caps_what_it_reads() {
    let s = setup();
    let fifo = s.work.join("pipe");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let e = s.tools.read(&json!({"path": "pipe"})).await.unwrap_err();
    assert!(e.message.contains("not a regular file"), "{e:?}");
    std::fs::write(s.work.join("big.txt"), "y".repeat(1 << 20)).unwrap();
    let r = s.tools.read(&json!({"path": "big.txt"})).await.unwrap();
    assert_eq!(r["truncated"], true);
    assert_eq!(
        r["content"].as_str().unwrap().len(),
        tools_worker::MAX_READ_BYTES as usize
    );
    assert_eq!(r["size"], 1 << 20);
    let r = s
        .tools
        .read(&json!({"path": "big.txt", "offset": (1 << 20) - 10}))
        .await
        .unwrap();
    assert_eq!(
        (r["content"].as_str().unwrap().len(), &r["truncated"]),
        (10, &json!(false))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_arguments_get_named_errors() {
    let s = setup();
    for (data, field) in [
        (json!({}), "command"),
        (json!({"command": 5}), "command"),
        (json!({"command": "   "}), "empty"),
        (
            json!({"command": "true", "timeout_ms": "soon"}),
            "timeout_ms",
        ),
    ] {
        let e = s.tools.exec(&data).await.unwrap_err();
        assert!(e.message.contains(field), "{data}: {e:?}");
    }
    // A `sandbox` field of any shape only ever opens the network when it is `true`.
    let r = exec(&s.tools, "true").await;
    assert_eq!(r["exit_code"], 0);
    let r = s
        .tools
        .exec(&json!({"command": "true", "sandbox": {"network": "yes", "deep": [[[[1]]]]}}))
        .await
        .unwrap();
    assert_eq!(r["exit_code"], 0);
    assert_eq!(s.tools.cancel("no-such-session"), 0);
    for bad in [json!({"path": 7}), json!({"path": "x", "offset": "far"})] {
        assert!(s.tools.read(&bad).await.is_err(), "{bad}");
    }
    let e = s
        .tools
        .write(&json!({"path": "big", "content": "x".repeat(tools_worker::MAX_WRITE_BYTES + 1)}))
        .await
        .unwrap_err();
    assert!(e.message.contains("at most"), "{e:?}");
}

/// Run as root with the workspace under a private (0700) directory, as a checkout in `/root`
/// is: once, every command failed with `Permission denied` (its user could not walk the path)
/// and Landlock was dropped without a word. Now the workspace is entered by handle, so
/// Landlock holds there; bubblewrap (run as the sandbox user) cannot bind a path its user
/// cannot reach, and says so, and `auto` then falls to Landlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_under_a_private_directory_works_as_root() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: not root, so no other user is involved");
        return;
    }
    for iso in [Isolation::Auto, Isolation::Landlock] {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("home");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let tools = Tools::with_sandbox(
            private.join("checkout").join("workspace"),
            SandboxConfig {
                isolation: iso,
                ..SandboxConfig::default()
            },
        )
        .unwrap();
        let report = tools.sandbox_report();
        if report["layers"]["filesystem"] != true {
            assert!(
                !available(Isolation::Landlock),
                "{iso:?}: Landlock is available here but did not come up under a private directory: {report}"
            );
            eprintln!("SKIPPED: {iso:?}: no filesystem layer here");
        }
        let r = exec(&tools, "echo ok > made.txt && cat made.txt && pwd").await;
        assert_eq!(r["exit_code"], 0, "{iso:?}: {r}");
        assert!(r["stdout"].as_str().unwrap().starts_with("ok"), "{r}");
        assert!(tools.root().join("made.txt").exists());
    }
}

/// Each session works in its own directory: neither `fs::*` nor a command of one session can
/// read or change another's files, a fork starts from a copy its writes never touch, and a
/// released session's directory is swept after the retention period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_has_its_own_directory() {
    for iso in ISOLATIONS {
        let dir = tempfile::tempdir().unwrap();
        let tools = Tools::per_session(
            dir.path().join("workspace"),
            SandboxConfig {
                isolation: iso,
                ..SandboxConfig::default()
            },
            tools_worker::MAX_READ_BYTES,
            std::time::Duration::ZERO,
        )
        .unwrap();
        let root = tools.root().to_path_buf();
        let s1 = tools.space_for(Some("s1")).unwrap();
        let s2 = tools.space_for(Some("s2")).unwrap();
        assert_eq!(s1.dir(), root.join("s1"));
        tools
            .write_in(&s1, &json!({"path": "mine.txt", "content": "one"}))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("s1/mine.txt")).unwrap(),
            "one"
        );
        // fs::* of s2 cannot name s1's files, relatively, absolutely or through a link.
        for path in [
            "../s1/mine.txt".to_string(),
            root.join("s1/mine.txt").display().to_string(),
        ] {
            let e = tools
                .read_in(&s2, &json!({"path": path}))
                .await
                .unwrap_err();
            assert_eq!(e.code, "forbidden", "{path}: {e:?}");
        }
        std::os::unix::fs::symlink(root.join("s1"), root.join("s2/peek")).unwrap();
        let e = tools
            .read_in(&s2, &json!({"path": "peek/mine.txt"}))
            .await
            .unwrap_err();
        assert_eq!(e.code, "forbidden", "{e:?}");
        let e = tools
            .write_in(&s2, &json!({"path": "peek/mine.txt", "content": "two"}))
            .await
            .unwrap_err();
        assert_eq!(e.code, "forbidden", "{e:?}");
        assert_eq!(
            std::fs::read_to_string(root.join("s1/mine.txt")).unwrap(),
            "one"
        );
        // Session ids that would name something else are refused.
        for bad in ["..", ".released", "a/b", ""] {
            assert!(tools.space_for(Some(bad)).is_err(), "{bad}");
        }
        // A command of s2 cannot reach s1's files either (isolation permitting).
        if s2.sandbox().layers().filesystem {
            let r = tools
                .exec_in(
                    &json!({"command": format!("cat {}/s1/mine.txt; echo two > {}/s1/mine.txt; ls ..", root.display(), root.display()), "timeout_ms": 10_000}),
                    Some("s2"),
                )
                .await
                .unwrap();
            assert!(
                !r["stdout"].as_str().unwrap().contains("one"),
                "{iso:?}: {r}"
            );
            assert_eq!(
                std::fs::read_to_string(root.join("s1/mine.txt")).unwrap(),
                "one",
                "{iso:?}: {r}"
            );
        } else {
            eprintln!("SKIPPED: {iso:?} gives no filesystem layer here");
        }
        // A fork starts from a copy; its writes never change its parent's files.
        let forked = tools.provision("s1f", Some("s1")).await.unwrap();
        assert_eq!(forked["copied_files"], 1, "{forked}");
        let f = tools.space_for(Some("s1f")).unwrap();
        tools
            .write_in(&f, &json!({"path": "mine.txt", "content": "forked"}))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("s1/mine.txt")).unwrap(),
            "one"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("s1f/mine.txt")).unwrap(),
            "forked"
        );
        // Released (retention zero here): its directory is swept, the others stay.
        let r = tools.release("s1").unwrap();
        assert_eq!(r["released"], true, "{r}");
        assert!(!root.join("s1").exists(), "swept");
        assert!(root.join("s1f").exists() && root.join("s2").exists());
        // A shared session works in the root itself.
        tools.share_root_with("cli-1");
        assert_eq!(tools.space_for(Some("cli-1")).unwrap().dir(), root);
    }
}
