//! The tools worker: what lets an agent do real work in one working directory.
//! `fs::read {path, offset?, limit?}`, `fs::list {path?}`, `fs::write {path, content}`
//! (atomic), `shell::exec {command, timeout_ms?}` (in the directory, killed with its process
//! group at the timeout, output capped). Default permissions allow the reads; writes and
//! exec wait for approval.

pub mod beneath;
pub mod landlock;
pub mod namespaces;
mod private_tmp;
pub mod sandbox;
pub mod seccomp;
pub mod spaces;
pub mod waiter;

pub use spaces::{Space, WorkspaceMode};

use bus::builtins::{opt_str, opt_u64, req_str};
use harness_sdk::{ErrorBody, RegisterFunction, Worker};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MAX_READ_BYTES: u64 = 256 * 1024;
pub const MAX_WRITE_BYTES: usize = 8 << 20;
pub const MAX_LIST_ENTRIES: usize = 1000;
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 30_000;
pub const MAX_EXEC_TIMEOUT_MS: u64 = 300_000;

pub struct Tools {
    /// The working directory: the shared space, and the parent of every session's own.
    root: PathBuf,
    cfg: sandbox::SandboxConfig,
    /// The root itself as a space (the terminal's session, `shared` mode, callers that
    /// name no session).
    shared: Arc<Space>,
    /// Where each session works (`sandbox.workspace`).
    mode: WorkspaceMode,
    /// How long a released session's directory is kept before the sweep removes it.
    retention: Duration,
    /// Live session spaces (their sandboxes), bounded.
    spaces: std::sync::Mutex<std::collections::HashMap<String, Arc<Space>>>,
    /// Sessions that work in the root itself whatever the mode (the terminal's).
    shared_sessions: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Commands running now, by session: (command number, process group).
    running: std::sync::Mutex<std::collections::HashMap<String, Vec<(u64, u32)>>>,
    next_command: std::sync::atomic::AtomicU64,
    /// Most bytes one `fs::read` returns (`HARNESS_FS_READ_MAX_BYTES`, default 256 KiB).
    read_cap: u64,
}

fn io(path: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new("io_error", format!("`{path}`: {e}"))
}

/// `HARNESS_FS_READ_MAX_BYTES` (default 256 KiB): a value that is not a positive number
/// stops the worker with an error naming it, instead of being ignored.
fn read_cap_from_env(default: u64) -> std::io::Result<u64> {
    match std::env::var("HARNESS_FS_READ_MAX_BYTES") {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("HARNESS_FS_READ_MAX_BYTES must be a positive number of bytes, not `{v}`"),
            )),
        },
    }
}

impl Tools {
    /// `root` is created if missing and canonicalized; the sandbox comes from the
    /// environment (`HARNESS_SANDBOX`, …, see [`sandbox::SandboxConfig::from_env`]).
    /// As a remote worker or a Lambda: every session in its own directory unless
    /// `HARNESS_WORKSPACE=shared`; a released one kept `HARNESS_WORKSPACE_RETENTION_HOURS`
    /// (default 24; a Lambda's `/tmp` is its instance's own, so 0 clears it at release).
    pub fn new(root: impl Into<PathBuf>) -> std::io::Result<Arc<Self>> {
        let bad = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        let cfg = sandbox::SandboxConfig::from_env().map_err(bad)?;
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let mode = match var("HARNESS_WORKSPACE") {
            None => WorkspaceMode::PerSession,
            Some(v) => WorkspaceMode::parse(v.trim()).ok_or_else(|| {
                bad(format!(
                    "HARNESS_WORKSPACE=`{v}`: use per_session or shared"
                ))
            })?,
        };
        let retention = match var("HARNESS_WORKSPACE_RETENTION_HOURS") {
            None => spaces::DEFAULT_RETENTION,
            Some(v) => Duration::from_secs(
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| {
                        bad(format!(
                            "HARNESS_WORKSPACE_RETENTION_HOURS=`{v}`: a whole number of hours"
                        ))
                    })?
                    .saturating_mul(3600),
            ),
        };
        Self::build(root, cfg, MAX_READ_BYTES, mode, retention)
    }

    pub fn with_sandbox(
        root: impl Into<PathBuf>,
        cfg: sandbox::SandboxConfig,
    ) -> std::io::Result<Arc<Self>> {
        Self::with_settings(root, cfg, MAX_READ_BYTES)
    }

    /// `read_cap`: the most one `fs::read` returns, unless `HARNESS_FS_READ_MAX_BYTES` says
    /// otherwise. Every session works in the root (`shared`); see [`Tools::per_session`].
    pub fn with_settings(
        root: impl Into<PathBuf>,
        cfg: sandbox::SandboxConfig,
        read_cap: u64,
    ) -> std::io::Result<Arc<Self>> {
        Self::build(
            root,
            cfg,
            read_cap,
            WorkspaceMode::Shared,
            spaces::DEFAULT_RETENTION,
        )
    }

    /// Each session in its own directory under `root` (`<root>/<session-id>/`), kept for
    /// `retention` after its run ends.
    pub fn per_session(
        root: impl Into<PathBuf>,
        cfg: sandbox::SandboxConfig,
        read_cap: u64,
        retention: Duration,
    ) -> std::io::Result<Arc<Self>> {
        Self::build(root, cfg, read_cap, WorkspaceMode::PerSession, retention)
    }

    pub fn build(
        root: impl Into<PathBuf>,
        cfg: sandbox::SandboxConfig,
        read_cap: u64,
        mode: WorkspaceMode,
        retention: Duration,
    ) -> std::io::Result<Arc<Self>> {
        let read_cap = read_cap_from_env(read_cap)?;
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        let root = root.canonicalize()?;
        sandbox::Sandbox::own_for(&cfg, &root)?;
        let shared = Space::new(root.clone(), cfg.clone(), true)?;
        let tools = Arc::new(Self {
            root,
            cfg,
            shared,
            mode,
            retention,
            spaces: Default::default(),
            shared_sessions: Default::default(),
            running: Default::default(),
            next_command: Default::default(),
            read_cap,
        });
        tools.sweep();
        // The retention sweep also runs on its own, so a directory is removed on time even
        // when no run ends for a while (stops with the worker).
        if mode == WorkspaceMode::PerSession
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let weak = Arc::downgrade(&tools);
            let every = retention.clamp(Duration::from_secs(60), Duration::from_secs(3600));
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(tools) = weak.upgrade() else { break };
                    let _ = tokio::task::spawn_blocking(move || tools.sweep()).await;
                }
            });
        }
        Ok(tools)
    }

    /// The uid commands run as, when it is not the harness's own.
    pub fn sandbox_owner_uid(&self) -> Option<u32> {
        self.shared.sandbox().owner()
    }

    /// The sandbox's layers, as `shell::sandbox` reports them.
    pub fn sandbox_report(&self) -> Value {
        let sb = self.shared.sandbox();
        json!({
            "mode": match sb.mode() { sandbox::Mode::Required => "required", sandbox::Mode::BestEffort => "best_effort" },
            "isolation": sb.isolation(),
            "layers": sb.layers(),
            "missing": sb.layers().missing(),
            "notes": sb.notes(),
            "usable": sb.check().is_ok(),
            "workdir": self.root.display().to_string(),
            "workspace": match self.mode { WorkspaceMode::PerSession => "per_session", WorkspaceMode::Shared => "shared" },
        })
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// Who files written for the agent belong to (the sandbox user when root).
    fn sandbox_owner(&self) -> Option<u32> {
        self.shared.sandbox().owner()
    }

    pub async fn read(&self, data: &Value) -> Result<Value, ErrorBody> {
        self.read_in(&self.shared, data).await
    }

    pub async fn list(&self, data: &Value) -> Result<Value, ErrorBody> {
        self.list_in(&self.shared, data).await
    }

    pub async fn write(&self, data: &Value) -> Result<Value, ErrorBody> {
        self.write_in(&self.shared, data).await
    }

    pub async fn read_in(&self, space: &Space, data: &Value) -> Result<Value, ErrorBody> {
        let path = req_str(data, "path")?;
        let rel = beneath::relative(space.dir(), &path).map_err(refusal)?;
        let offset = opt_u64(data, "offset")?.unwrap_or(0);
        let limit = opt_u64(data, "limit")?
            .unwrap_or(self.read_cap)
            .min(self.read_cap);
        let root = space.handle().map_err(|e| io(&path, e))?;
        let (rel2, path2) = (rel.clone(), path.clone());
        let (bytes, size, start) =
            tokio::task::spawn_blocking(move || read_window(&root, &rel2, &path2, offset, limit))
                .await
                .map_err(|e| io(&path, e))??;
        let end = start + bytes.len();
        let slice = &bytes[..];
        let content = match std::str::from_utf8(slice) {
            Ok(s) => s.to_string(),
            // A cut may split a character at the end; anything else is binary.
            Err(e) if e.error_len().is_none() => {
                String::from_utf8_lossy(&slice[..e.valid_up_to()]).into_owned()
            }
            Err(_) => return Err(ErrorBody::invalid(format!("`{path}` is not UTF-8 text"))),
        };
        Ok(json!({
            "path": rel.display().to_string(),
            "content": content,
            "size": size,
            "offset": start,
            "truncated": (end as u64) < size,
        }))
    }

    pub async fn list_in(&self, space: &Space, data: &Value) -> Result<Value, ErrorBody> {
        let path = opt_str(data, "path")?.unwrap_or_else(|| ".".into());
        let rel = beneath::relative(space.dir(), &path).map_err(refusal)?;
        let root = space.handle().map_err(|e| io(&path, e))?;
        let (rel2, path2) = (rel.clone(), path.clone());
        let (entries, truncated) =
            tokio::task::spawn_blocking(move || list_dir(&root, &rel2, &path2))
                .await
                .map_err(|e| io(&path, e))??;
        Ok(json!({"path": rel.display().to_string(), "entries": entries, "truncated": truncated}))
    }

    pub async fn write_in(&self, space: &Space, data: &Value) -> Result<Value, ErrorBody> {
        let path = req_str(data, "path")?;
        let content = req_str(data, "content")?;
        let rel = beneath::relative(space.dir(), &path).map_err(refusal)?;
        if content.len() > MAX_WRITE_BYTES {
            return Err(ErrorBody::invalid(format!(
                "`content` is {} bytes; at most {MAX_WRITE_BYTES} are written per call",
                content.len()
            )));
        }
        if rel.as_os_str().is_empty() {
            return Err(ErrorBody::invalid(
                "`path` names the working directory itself",
            ));
        }
        let root = space.handle().map_err(|e| io(&path, e))?;
        let owner = self.sandbox_owner();
        let bytes = content.into_bytes();
        let (rel2, path2) = (rel.clone(), path.clone());
        let written = tokio::task::spawn_blocking(move || {
            write_atomically(&root, &rel2, &path2, &bytes, owner)
        })
        .await
        .map_err(|e| io(&path, e))??;
        Ok(json!({"path": rel.display().to_string(), "bytes_written": written}))
    }

    pub async fn exec(&self, data: &Value) -> Result<Value, ErrorBody> {
        self.exec_in(data, None).await
    }

    /// `shell::exec` in `space`, on behalf of `session`.
    pub async fn exec_in(&self, data: &Value, session: Option<&str>) -> Result<Value, ErrorBody> {
        let space = self.space_for(session)?;
        self.exec_at(&space, data, session).await
    }

    /// Kill every command running for `session` (`run::abort`) → how many.
    pub fn cancel(&self, session: &str) -> usize {
        let groups = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session)
            .unwrap_or_default();
        for (_, pgid) in &groups {
            kill_group(*pgid);
        }
        groups.len()
    }

    /// `shell::exec` in `space` on behalf of `session` (so `shell::cancel` can find it).
    pub async fn exec_at(
        &self,
        space: &Space,
        data: &Value,
        session: Option<&str>,
    ) -> Result<Value, ErrorBody> {
        let command = req_str(data, "command")?;
        if command.trim().is_empty() {
            return Err(ErrorBody::invalid("`command` is empty"));
        }
        let timeout = Duration::from_millis(
            opt_u64(data, "timeout_ms")?
                .unwrap_or(DEFAULT_EXEC_TIMEOUT_MS)
                .min(MAX_EXEC_TIMEOUT_MS),
        );
        let sandbox = space.sandbox();
        sandbox
            .check()
            .map_err(|why| ErrorBody::new("sandbox_unavailable", why))?;
        let started = Instant::now();
        // Set by the orchestrator when a policy rule granted it (callers of shell::exec are
        // workers; clients may not call it at all).
        let network = data["sandbox"]["network"] == true;
        let mut cmd = sandbox
            .command(&command, network)
            .map_err(|e| ErrorBody::new("io_error", format!("cannot prepare the sandbox: {e}")))?;
        let mut child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ErrorBody::new("io_error", format!("cannot start the shell: {e}")))?;
        // Killed with its whole group if this call is dropped (the caller gave up) before it
        // ends; the guard disarms once the command is reaped.
        let mut group = GroupGuard(child.id());
        let _registered = match (session, child.id()) {
            (Some(sid), Some(pgid)) => {
                let n = self
                    .next_command
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(sid.to_string())
                    .or_default()
                    .push((n, pgid));
                Some(Registered {
                    tools: self,
                    session: sid.to_string(),
                    n,
                })
            }
            _ => None,
        };
        let pgid = child.id();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let run = async {
            // When the shell ends, so does everything it left running in its group (no
            // process outlives its call), which also closes the pipes they held.
            let waited = async {
                let status = child.wait().await;
                if let Some(pid) = pgid {
                    kill_group(pid);
                }
                status
            };
            tokio::join!(
                read_capped(stdout.take()),
                read_capped(stderr.take()),
                waited
            )
        };
        let (timed_out, out, err, code) = match tokio::time::timeout(timeout, run).await {
            Ok(((out, out_total), (err, err_total), status)) => {
                let code = status.ok().and_then(|s| s.code());
                (false, (out, out_total), (err, err_total), code)
            }
            Err(_) => {
                // Kill the whole process group: the shell and whatever it started (with the
                // pid layer, everything in its namespace dies with it).
                if let Some(pid) = pgid {
                    kill_group(pid);
                }
                let _ = child.wait().await;
                (true, (Vec::new(), 0), (Vec::new(), 0), None)
            }
        };
        if let Some(pid) = pgid {
            group_gone(pid, Duration::from_secs(5)).await;
        }
        group.0 = None;
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

/// Removes a running command from its session's list when the call ends.
struct Registered<'a> {
    tools: &'a Tools,
    session: String,
    n: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut running = self.tools.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = running.get_mut(&self.session) {
            list.retain(|(n, _)| *n != self.n);
            if list.is_empty() {
                running.remove(&self.session);
            }
        }
    }
}

/// Kills the process group when dropped while armed.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            kill_group(pid);
        }
    }
}

/// A refusal of a path (outside, through a link) or an I/O failure, as the bus says them.
fn refusal(e: beneath::BeneathError) -> ErrorBody {
    if e.refused() {
        ErrorBody::new("forbidden", e.to_string())
    } else {
        ErrorBody::new("io_error", e.to_string())
    }
}

/// Read at most `limit` bytes at `offset` of a regular file beneath `root` → (bytes, file
/// size, start). FIFOs, devices and sockets are refused: reading one could block forever.
fn read_window(
    root: &std::os::fd::OwnedFd,
    rel: &std::path::Path,
    path: &str,
    offset: u64,
    limit: u64,
) -> Result<(Vec<u8>, u64, usize), ErrorBody> {
    use rustix::fs::{Mode, OFlags};
    use std::io::{Read, Seek, SeekFrom};
    // O_NONBLOCK: opening a FIFO must not wait for a writer before we can refuse it.
    let fd = beneath::open(
        root,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
        path,
    )
    .map_err(refusal)?;
    let mut f = std::fs::File::from(fd);
    let meta = f.metadata().map_err(|e| io(path, e))?;
    if !meta.is_file() {
        return Err(io(
            path,
            "not a regular file (directories, FIFOs, devices and sockets are not read)",
        ));
    }
    let size = meta.len();
    let start = offset.min(size);
    f.seek(SeekFrom::Start(start)).map_err(|e| io(path, e))?;
    let mut buf = Vec::with_capacity(limit.min(size - start) as usize);
    f.take(limit)
        .read_to_end(&mut buf)
        .map_err(|e| io(path, e))?;
    Ok((buf, size, start as usize))
}

/// The entries of a directory beneath `root` (at most [`MAX_LIST_ENTRIES`]), each with its
/// kind and size as it is (a link is listed as a link, never followed).
fn list_dir(
    root: &std::os::fd::OwnedFd,
    rel: &std::path::Path,
    path: &str,
) -> Result<(Vec<Value>, bool), ErrorBody> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let fd = beneath::open(
        root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
        path,
    )
    .map_err(refusal)?;
    let dir = rustix::fs::Dir::read_from(&fd).map_err(|e| io(path, std::io::Error::from(e)))?;
    let mut entries = Vec::new();
    let mut truncated = false;
    for entry in dir {
        let entry = entry.map_err(|e| io(path, std::io::Error::from(e)))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        if entries.len() >= MAX_LIST_ENTRIES {
            truncated = true;
            break;
        }
        let Ok(st) = rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => "symlink",
            FileType::Directory => "dir",
            _ => "file",
        };
        entries.push(json!({
            "name": name,
            "path": rel.join(&name).display().to_string(),
            "kind": kind,
            "size": st.st_size,
        }));
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok((entries, truncated))
}

/// Write `bytes` to `rel` beneath `root` atomically: a new temporary file in the same
/// directory (never through a symlink), fsynced, renamed over the name, the directory
/// fsynced → the bytes written. Every step is relative to a directory handle, so a link
/// swapped in meanwhile cannot redirect it.
fn write_atomically(
    root: &std::os::fd::OwnedFd,
    rel: &std::path::Path,
    path: &str,
    bytes: &[u8],
    owner: Option<u32>,
) -> Result<u64, ErrorBody> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Write;
    let (dir, name) = beneath::parent_dir(root, rel, path, owner).map_err(refusal)?;
    let tmp = format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        bus_telemetry::trace::random_hex(4)
    );
    let fd = rustix::fs::openat(
        &dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| io(path, std::io::Error::from(e)))?;
    let mut f = std::fs::File::from(fd);
    let done = (|| -> std::io::Result<()> {
        f.write_all(bytes)?;
        if let Some(uid) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(uid))?;
        }
        f.sync_all()?;
        rustix::fs::renameat(&dir, tmp.as_str(), &dir, name.as_os_str())?;
        rustix::fs::fsync(&dir)?;
        Ok(())
    })();
    if let Err(e) = done {
        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), rustix::fs::AtFlags::empty());
        return Err(io(path, e));
    }
    Ok(bytes.len() as u64)
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

/// Wait (at most `within`) until no process of the group is left, reaped ones included: a
/// killed fork bomb's thousands of processes take a moment to be reaped, and until then they
/// hold the sandbox uid's process limit.
async fn group_gone(pgid: u32, within: Duration) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    let deadline = Instant::now() + within;
    // SAFETY: signal 0 only checks that the group has members.
    while pgid > 1 && unsafe { libc::killpg(pgid, 0) } == 0 && Instant::now() < deadline {
        kill_group(pgid as u32);
        tokio::time::sleep(Duration::from_millis(5)).await;
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

/// The session a call works for: the orchestrator's routing envelope (`session_id`, which it
/// writes over whatever the model put there), else the call's baggage.
fn session_of<'a>(ctx: &'a harness_sdk::Ctx, data: &'a Value) -> Option<&'a str> {
    data["session_id"].as_str().or_else(|| ctx.session_id())
}

/// Register `id` on `w` with a handler given the call's space.
fn space_fn<F, Fut>(w: &mut Worker, tools: &Arc<Tools>, def: RegisterFunction, f: F)
where
    F: Fn(Arc<Tools>, Arc<Space>, Value) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<Value, ErrorBody>> + Send + 'static,
{
    let t = tools.clone();
    w.register_function(def, move |c: harness_sdk::Ctx, d: Value| {
        let (t, f) = (t.clone(), f.clone());
        let space = t.space_for(session_of(&c, &d));
        async move { f(t, space?, d).await }
    });
}

pub fn worker(tools: Arc<Tools>) -> Worker {
    let mut w = Worker::new("tools");
    space_fn(
        &mut w,
        &tools,
        def(
            "fs::read",
            "Read a UTF-8 file in the working directory (at most 256 KiB per call; offset/limit page through larger files).",
            &["path"],
            json!({"path": {"type": "string"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}}),
        ),
        |t, space, d| async move { t.read_in(&space, &d).await },
    );
    space_fn(
        &mut w,
        &tools,
        def(
            "fs::list",
            "List a directory of the working directory (at most 1000 entries).",
            &[],
            json!({"path": {"type": "string"}}),
        ),
        |t, space, d| async move { t.list_in(&space, &d).await },
    );
    space_fn(
        &mut w,
        &tools,
        def(
            "fs::write",
            "Write a UTF-8 file in the working directory (atomically; parent directories are created).",
            &["path", "content"],
            json!({"path": {"type": "string"}, "content": {"type": "string"}}),
        ),
        |t, space, d| async move { t.write_in(&space, &d).await },
    );
    w.register_function(
        def("shell::sandbox", "The isolation layers shell::exec runs in on this machine, and the working directory: {mode, layers, missing, notes, usable, workdir, workspace}.", &[], json!({})),
        {
            let t = tools.clone();
            move |_c, _d: Value| {
                let t = t.clone();
                async move { Ok(t.sandbox_report()) }
            }
        },
    );
    w.register_function(
        def("shell::exec", "Run `sh -c command` in the working directory (timeout_ms default 30 000, at most 300 000; stdout and stderr capped at 64 KiB each).", &["command"], json!({"command": {"type": "string"}, "timeout_ms": {"type": "integer"}})),
        {
            let t = tools.clone();
            move |c: harness_sdk::Ctx, d: Value| {
                let t = t.clone();
                async move {
                    let session = session_of(&c, &d).map(str::to_owned);
                    t.exec_in(&d, session.as_deref()).await
                }
            }
        },
    );
    let t = tools.clone();
    w.register_function(
        def("shell::cancel", "Kill every command running for a session (run::abort calls it): {session_id} → {killed}.", &["session_id"], json!({"session_id": {"type": "string"}}))
        .not_for_the_agent(),
        move |_c, d: Value| {
            let t = t.clone();
            async move {
                let sid = req_str(&d, "session_id")?;
                Ok(json!({"killed": t.cancel(&sid)}))
            }
        },
    );
    let t = tools.clone();
    w.register_function(
        def("shell::provision", "Make a session's working directory and sandbox at the start of its run (a fork's as a copy of its parent's): {session_id, from_session_id?} → {session_id, workspace, copied_files}.", &["session_id"], json!({"session_id": {"type": "string"}, "from_session_id": {"type": "string"}}))
        .not_for_the_agent(),
        move |_c, d: Value| {
            let t = t.clone();
            async move {
                let sid = req_str(&d, "session_id")?;
                let from = opt_str(&d, "from_session_id")?;
                t.provision(&sid, from.as_deref()).await
            }
        },
    );
    w.register_function(
        def("shell::release", "The run of a session ended: kill what is left of its commands, end its sandbox, keep its directory for the retention period: {session_id} → {released, killed}.", &["session_id"], json!({"session_id": {"type": "string"}}))
        .not_for_the_agent(),
        move |_c, d: Value| {
            let t = tools.clone();
            async move {
                let sid = req_str(&d, "session_id")?;
                t.release(&sid)
            }
        },
    );
    w
}
