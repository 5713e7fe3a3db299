//! The tools worker: what lets an agent do real work in one working directory.
//! `fs::read {path, offset?, limit?}`, `fs::list {path?}`, `fs::write {path, content}`
//! (atomic), `shell::exec {command, timeout_ms?}` (in the directory, killed with its process
//! group at the timeout, output capped). Default permissions allow the reads; writes and
//! exec wait for approval.

pub mod confine;

use engine_gateway::builtins::{opt_str, opt_u64, req_str};
use harness_sdk::{ErrorBody, RegisterFunction, Worker};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MAX_READ_BYTES: u64 = 256 * 1024;
pub const MAX_LIST_ENTRIES: usize = 1000;
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 30_000;
pub const MAX_EXEC_TIMEOUT_MS: u64 = 300_000;

pub struct Tools {
    root: PathBuf,
}

fn io(path: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new("io_error", format!("`{path}`: {e}"))
}

impl Tools {
    /// `root` is created if missing and canonicalized.
    pub fn new(root: impl Into<PathBuf>) -> std::io::Result<Arc<Self>> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(Arc::new(Self {
            root: root.canonicalize()?,
        }))
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    fn resolve(&self, p: &str) -> Result<PathBuf, ErrorBody> {
        confine::resolve(&self.root, p).map_err(|e| ErrorBody::new("forbidden", e.to_string()))
    }

    fn rel(&self, p: &std::path::Path) -> String {
        p.strip_prefix(&self.root)
            .map(|r| r.display().to_string())
            .unwrap_or_default()
    }

    pub async fn read(&self, data: &Value) -> Result<Value, ErrorBody> {
        let path = req_str(data, "path")?;
        let full = self.resolve(&path)?;
        let offset = opt_u64(data, "offset")?.unwrap_or(0);
        let limit = opt_u64(data, "limit")?
            .unwrap_or(MAX_READ_BYTES)
            .min(MAX_READ_BYTES);
        let bytes = tokio::fs::read(&full).await.map_err(|e| io(&path, e))?;
        let size = bytes.len() as u64;
        let start = offset.min(size) as usize;
        let end = (offset.saturating_add(limit)).min(size) as usize;
        let slice = &bytes[start..end];
        let content = match std::str::from_utf8(slice) {
            Ok(s) => s.to_string(),
            // A cut may split a character at the end; anything else is binary.
            Err(e) if e.error_len().is_none() => {
                String::from_utf8_lossy(&slice[..e.valid_up_to()]).into_owned()
            }
            Err(_) => return Err(ErrorBody::invalid(format!("`{path}` is not UTF-8 text"))),
        };
        Ok(json!({
            "path": self.rel(&full),
            "content": content,
            "size": size,
            "offset": start,
            "truncated": (end as u64) < size,
        }))
    }

    pub async fn list(&self, data: &Value) -> Result<Value, ErrorBody> {
        let path = opt_str(data, "path")?.unwrap_or_else(|| ".".into());
        let full = self.resolve(&path)?;
        let mut rd = tokio::fs::read_dir(&full).await.map_err(|e| io(&path, e))?;
        let mut entries = Vec::new();
        let mut truncated = false;
        while let Some(e) = rd.next_entry().await.map_err(|e| io(&path, e))? {
            if entries.len() >= MAX_LIST_ENTRIES {
                truncated = true;
                break;
            }
            let meta = tokio::fs::symlink_metadata(e.path())
                .await
                .map_err(|er| io(&path, er))?;
            let kind = if meta.is_symlink() {
                "symlink"
            } else if meta.is_dir() {
                "dir"
            } else {
                "file"
            };
            entries.push(json!({
                "name": e.file_name().to_string_lossy(),
                "path": self.rel(&e.path()),
                "kind": kind,
                "size": meta.len(),
            }));
        }
        entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(json!({"path": self.rel(&full), "entries": entries, "truncated": truncated}))
    }

    pub async fn write(&self, data: &Value) -> Result<Value, ErrorBody> {
        let path = req_str(data, "path")?;
        let content = req_str(data, "content")?;
        let full = self.resolve(&path)?;
        if full == self.root {
            return Err(ErrorBody::invalid(
                "`path` names the working directory itself",
            ));
        }
        if let Some(parent) = full.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io(&path, e))?;
        }
        // Atomic: a reader sees the old file or the new one, never half of it.
        let tmp = full.with_file_name(format!(
            ".{}.tmp-{}",
            full.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        tokio::fs::write(&tmp, content.as_bytes())
            .await
            .map_err(|e| io(&path, e))?;
        tokio::fs::rename(&tmp, &full)
            .await
            .map_err(|e| io(&path, e))?;
        Ok(json!({"path": self.rel(&full), "bytes_written": content.len()}))
    }

    pub async fn exec(&self, data: &Value) -> Result<Value, ErrorBody> {
        let command = req_str(data, "command")?;
        if command.trim().is_empty() {
            return Err(ErrorBody::invalid("`command` is empty"));
        }
        let timeout = Duration::from_millis(
            opt_u64(data, "timeout_ms")?
                .unwrap_or(DEFAULT_EXEC_TIMEOUT_MS)
                .min(MAX_EXEC_TIMEOUT_MS),
        );
        let started = Instant::now();
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(&self.root)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ErrorBody::new("io_error", format!("cannot start the shell: {e}")))?;
        let pgid = child.id();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let run = async {
            let (out, err, status) = tokio::join!(
                read_capped(stdout.take()),
                read_capped(stderr.take()),
                child.wait()
            );
            (out, err, status)
        };
        let (timed_out, out, err, code) = match tokio::time::timeout(timeout, run).await {
            Ok(((out, out_total), (err, err_total), status)) => {
                let code = status.ok().and_then(|s| s.code());
                (false, (out, out_total), (err, err_total), code)
            }
            Err(_) => {
                // Kill the whole process group: the shell and whatever it started.
                if let Some(pid) = pgid {
                    kill_group(pid);
                }
                (true, (Vec::new(), 0), (Vec::new(), 0), None)
            }
        };
        let truncated = out.1 > MAX_OUTPUT_BYTES || err.1 > MAX_OUTPUT_BYTES;
        Ok(json!({
            "exit_code": code,
            "stdout": String::from_utf8_lossy(&out.0),
            "stderr": String::from_utf8_lossy(&err.0),
            "truncated": truncated,
            "timed_out": timed_out,
            "duration_ms": started.elapsed().as_millis() as u64,
        }))
    }
}

/// SIGKILL the process group the shell leads (it was started with `process_group(0)`, so
/// its group id is its pid). Never signals group 0 or 1 (the caller's group / everything).
fn kill_group(pgid: u32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid > 1 {
        // SAFETY: killpg only sends a signal; the id names the shell's own process group.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

/// Read a pipe to its end, keeping at most `MAX_OUTPUT_BYTES`; returns what was kept and the
/// total length seen.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>) -> (Vec<u8>, usize) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut total = 0usize;
    if let Some(mut p) = pipe {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = p.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            total += n;
            let room = MAX_OUTPUT_BYTES.saturating_sub(buf.len());
            buf.extend_from_slice(&chunk[..n.min(room)]);
        }
    }
    (buf, total)
}

fn def(id: &str, description: &str, required: &[&str], props: Value) -> RegisterFunction {
    let mut d = RegisterFunction::new(id);
    d.description = Some(description.to_string());
    d.request_format = Some(json!({"type": "object", "required": required, "properties": props}));
    d
}

pub fn worker(tools: Arc<Tools>) -> Worker {
    let mut w = Worker::new("tools");
    let t = tools.clone();
    w.register_function(
        def("fs::read", "Read a UTF-8 file in the working directory (at most 256 KiB per call; offset/limit page through larger files).", &["path"], json!({"path": {"type": "string"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}})),
        move |_c, d: Value| {
            let t = t.clone();
            async move { t.read(&d).await }
        },
    );
    let t = tools.clone();
    w.register_function(
        def(
            "fs::list",
            "List a directory of the working directory (at most 1000 entries).",
            &[],
            json!({"path": {"type": "string"}}),
        ),
        move |_c, d: Value| {
            let t = t.clone();
            async move { t.list(&d).await }
        },
    );
    let t = tools.clone();
    w.register_function(
        def("fs::write", "Write a UTF-8 file in the working directory (atomically; parent directories are created).", &["path", "content"], json!({"path": {"type": "string"}, "content": {"type": "string"}})),
        move |_c, d: Value| {
            let t = t.clone();
            async move { t.write(&d).await }
        },
    );
    w.register_function(
        def("shell::exec", "Run `sh -c command` in the working directory (timeout_ms default 30 000, at most 300 000; stdout and stderr capped at 64 KiB each).", &["command"], json!({"command": {"type": "string"}, "timeout_ms": {"type": "integer"}})),
        move |_c, d: Value| {
            let t = tools.clone();
            async move { t.exec(&d).await }
        },
    );
    w
}
