//! The real `harness` binary as a child process (`--serve-only`, the scripted provider
//! reading a cassette), for kill -9 and credential tests.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub struct Harness {
    pub child: Child,
    /// `ws://host:port`, without a token.
    pub address: String,
    /// The admin token the engine generated into its data dir.
    pub token: String,
}

impl Harness {
    /// The admin URL (token in the query; the SDK moves it into a header).
    pub fn url(&self) -> String {
        format!("{}/?token={}", self.address, self.token)
    }

    pub fn url_with(&self, token: &str) -> String {
        format!("{}/?token={token}", self.address)
    }

    /// SIGKILL, and reap.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `harness --serve-only` on `dir/data`, with `dir/work`, `dir/perms.yaml` and
/// `dir/cassette.json`, plus `extra` arguments; returns once it printed its ready line.
pub fn spawn_harness(dir: &Path, extra: &[&str]) -> Harness {
    spawn_harness_env(dir, extra, &[])
}

/// [`spawn_harness`] with extra environment variables.
pub fn spawn_harness_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Harness {
    let mut child = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--serve-only", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--workdir")
        .arg(dir.join("work"))
        .arg("--permissions")
        .arg(dir.join("perms.yaml"))
        .arg("--cassette")
        .arg(dir.join("cassette.json"))
        .args(extra)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .env_remove("ENGINE_TOKEN")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("harness");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let address = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("url in the ready line: {line:?}"))
        .to_string();
    // No token given: the engine generated one into its data dir (0600) and says where.
    let token_file = dir.join("data").join("engine.token");
    assert!(line.contains(&token_file.display().to_string()), "{line}");
    let token = std::fs::read_to_string(&token_file)
        .expect("the generated token")
        .trim()
        .to_string();
    assert!(!line.contains(&token), "the banner never shows the token");
    // Keep reading so the process never writes into a closed pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    Harness {
        child,
        address,
        token,
    }
}

pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Live processes whose command line holds `marker`, optionally only those whose command
/// line starts with `program` and those of one `uid`.
pub fn processes(marker: &str, program: Option<&str>, uid: Option<u32>) -> usize {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| uid.is_none_or(|u| e.metadata().is_ok_and(|m| m.uid() == u)))
        .filter(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains(marker) && program.is_none_or(|p| cmd.starts_with(p))
        })
        .count()
}

/// Poll `turn::get_state` until the session is `stopped` or `failed` → its view; panics with
/// `what` and the last view after `within`.
pub async fn wait_finished(
    ctx: &harness_sdk::Ctx,
    sid: &str,
    within: std::time::Duration,
    what: &str,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let v = ctx
            .trigger("turn::get_state", serde_json::json!({"session_id": sid}))
            .await
            .unwrap();
        if v["state"] == "stopped" || v["state"] == "failed" {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The Python with the pinned clients nobody here wrote (iii-sdk, openai): scripts/test.sh
/// makes the venv and exports `HARNESS_CLIENTS_PYTHON`.
pub fn clients_python() -> String {
    let p = std::env::var("HARNESS_CLIENTS_PYTHON").unwrap_or_else(|_| {
        panic!("HARNESS_CLIENTS_PYTHON is not set: run scripts/test.sh (it makes a venv with the pinned iii-sdk and openai)")
    });
    assert!(
        std::path::Path::new(&p).exists(),
        "HARNESS_CLIENTS_PYTHON={p} does not exist"
    );
    p
}

/// Every file under `dir`, at any depth (a missing directory holds none).
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Run a client nobody here wrote against `http` with `token` (`program script http token`):
/// it prints what it saw as one JSON object.
pub async fn run_client(
    program: impl AsRef<std::ffi::OsStr>,
    script: &str,
    http: &str,
    token: &str,
    env: &[(&str, &str)],
) -> serde_json::Value {
    let out = tokio::process::Command::new(program)
        .arg(script)
        .arg(http)
        .arg(token)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}
