//! Where each session's agent works. With `sandbox.workspace: per_session` (the default for
//! every session someone else starts) a session has its own directory,
//! `<workdir>/<session-id>/`, with its own sandbox (with bubblewrap, its own namespaces):
//! `fs::*` and `shell::exec` find the session in the orchestrator's call and can name nothing
//! outside it. `shell::provision` makes it at the run's start (a fork's as a copy of its
//! parent's, copy-on-write where the filesystem can); `shell::release` at the run's end kills
//! what is left of its processes and ends its namespaces; the directory is kept for
//! `workspace_retention_hours` and then removed by the sweep. `shared` puts every session in
//! the working directory itself, as the terminal session of `cargo run` always is.

use crate::Tools;
use crate::sandbox::{Sandbox, SandboxConfig};
use harness_sdk::ErrorBody;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a released session's directory is kept by default (24 h).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Most session spaces whose sandboxes are kept live at once; past that, idle ones are let
/// go (their directories stay; the sandbox is made again on their next call).
pub const MAX_LIVE_SPACES: usize = 256;
/// The most a fork copies of its parent's directory.
pub const MAX_COPY_FILES: usize = 100_000;
pub const MAX_COPY_BYTES: u64 = 4 << 30;
/// Where released sessions are marked (a hidden directory of the root, never a session's).
const RELEASED: &str = ".released";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceMode {
    /// `<workdir>/<session-id>/` for each session.
    PerSession,
    /// The working directory itself for every session.
    Shared,
}

impl WorkspaceMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "per_session" => Some(Self::PerSession),
            "shared" => Some(Self::Shared),
            _ => None,
        }
    }
}

/// One working directory with its sandbox.
pub struct Space {
    dir: PathBuf,
    /// A handle of the directory, opened once: every path is resolved beneath it.
    handle: OwnedFd,
    sandbox: bus::prewarm::Prewarmed<Sandbox>,
}

impl Space {
    /// `dir` must exist and be canonical. `announce`: log the sandbox's layers at info (the
    /// root's), warning when one is missing.
    pub fn new(dir: PathBuf, cfg: SandboxConfig, announce: bool) -> std::io::Result<Arc<Space>> {
        let handle = crate::beneath::open_root(&dir)?;
        let workdir = dir.clone();
        // Probed off the caller's path (the probe starts a real sandbox, a few tens of ms):
        // the first call that needs it waits for it.
        let sandbox = bus::prewarm::Prewarmed::new(move || {
            let sandbox = Sandbox::probe(cfg.clone(), &workdir);
            let missing = sandbox.layers().missing();
            // An isolation that was tried and could not be made (bubblewrap under a private
            // directory, say) is said as loudly as a missing layer, even when another one
            // stands in for it.
            let fell_back = sandbox
                .notes()
                .iter()
                .any(|n| n.starts_with("namespaces:") || n.starts_with("landlock:"));
            if announce && (!missing.is_empty() || fell_back) {
                // Loudly: a layer that cannot be applied is a weaker sandbox than configured.
                tracing::warn!(
                    workdir = %workdir.display(),
                    isolation = sandbox.isolation(),
                    missing = %missing.join(", "),
                    why = %sandbox.notes().join("; "),
                    "shell::exec sandbox: an isolation or a layer cannot be applied here"
                );
            } else if announce {
                tracing::info!(
                    workdir = %workdir.display(),
                    mode = ?sandbox.mode(),
                    active = ?sandbox.layers(),
                    notes = %sandbox.notes().join("; "),
                    "shell::exec sandbox"
                );
            }
            sandbox
        });
        Ok(Arc::new(Space {
            dir,
            handle,
            sandbox,
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A handle of the directory (a duplicate of the one kept).
    pub fn handle(&self) -> std::io::Result<OwnedFd> {
        self.handle.try_clone()
    }

    pub fn sandbox(&self) -> &Sandbox {
        self.sandbox.get()
    }
}

/// A session id usable as a directory name: 1 to 128 of letters, digits and `-_.:@`, not
/// starting with a dot (so never `.` or `..`, and never the sweep's own directory).
pub fn valid_session(sid: &str) -> Result<(), ErrorBody> {
    let ok = !sid.is_empty()
        && sid.len() <= 128
        && !sid.starts_with('.')
        && sid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:@".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ErrorBody::invalid(format!(
            "session id `{}` cannot name a working directory (1 to 128 of letters, digits and `-_.:@`, not starting with `.`)",
            sid.chars().take(40).collect::<String>()
        )))
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new("io_error", format!("{what}: {e}"))
}

impl Tools {
    /// Where the workspace mode puts sessions.
    pub fn workspace_mode(&self) -> WorkspaceMode {
        self.mode
    }

    /// `session` works in the working directory itself whatever the mode (the terminal's
    /// own session: the local user finds the agent's files where they expect them).
    pub fn share_root_with(&self, session: &str) {
        self.shared_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.to_string());
    }

    fn shares_root(&self, session: &str) -> bool {
        self.mode == WorkspaceMode::Shared
            || self
                .shared_sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(session)
    }

    /// The space a call works in: the session's own (made if missing), or the root for a
    /// caller that names no session and for shared sessions.
    pub fn space_for(&self, session: Option<&str>) -> Result<Arc<Space>, ErrorBody> {
        let Some(sid) = session else {
            return Ok(self.shared.clone());
        };
        if self.shares_root(sid) {
            return Ok(self.shared.clone());
        }
        valid_session(sid)?;
        if let Some(space) = self.lock_spaces().get(sid).cloned() {
            // Another instance (a Lambda's other process) may have released and cleared it.
            if space.dir().is_dir() {
                return Ok(space);
            }
            self.lock_spaces().remove(sid);
        }
        let dir = self.root.join(sid);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| io("the session's directory", e))?;
                Sandbox::own_for(&self.cfg, &dir).map_err(|e| io("the session's directory", e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("the session's directory", e)),
        }
        // In use again: the sweep must not take it.
        let _ = std::fs::remove_file(self.root.join(RELEASED).join(sid));
        // Opened by handle, not followed through a link planted at its name.
        let meta = std::fs::symlink_metadata(&dir).map_err(|e| io("the session's directory", e))?;
        if !meta.is_dir() {
            return Err(ErrorBody::new(
                "forbidden",
                format!("the working directory of session `{sid}` is not a directory"),
            ));
        }
        let space = Space::new(dir, self.cfg.clone(), false)
            .map_err(|e| io("the session's directory", e))?;
        let mut spaces = self.lock_spaces();
        if spaces.len() >= MAX_LIVE_SPACES {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let idle: Vec<String> = spaces
                .keys()
                .filter(|k| !running.contains_key(*k))
                .take(spaces.len() + 1 - MAX_LIVE_SPACES)
                .cloned()
                .collect();
            for k in idle {
                spaces.remove(&k);
            }
        }
        Ok(spaces.entry(sid.to_string()).or_insert(space).clone())
    }

    fn lock_spaces(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<Space>>> {
        self.spaces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `shell::provision`: make the session's space (a fork's as a copy of `from`'s
    /// directory) → `{session_id, workspace, copied_files}`.
    pub async fn provision(
        &self,
        sid: &str,
        from: Option<&str>,
    ) -> Result<serde_json::Value, ErrorBody> {
        // Both ids are checked before anything is made.
        if let Some(from) = from {
            valid_session(from)?;
        }
        let space = self.space_for(Some(sid))?;
        let mut copied = 0usize;
        if let Some(from) = from.filter(|f| !self.shares_root(sid) && *f != sid) {
            let source = if self.shares_root(from) {
                self.root.clone()
            } else {
                self.root.join(from)
            };
            let target = space.dir().to_path_buf();
            let owner = self.sandbox_owner_uid();
            let empty = std::fs::read_dir(&target)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if empty && source.is_dir() {
                let root = self.root.clone();
                copied =
                    tokio::task::spawn_blocking(move || copy_tree(&source, &target, owner, &root))
                        .await
                        .map_err(|e| io("the copy", e))?
                        .map_err(|e| io("the copy of the parent's directory", e))?;
            }
        }
        Ok(serde_json::json!({
            "session_id": sid,
            "workspace": if self.shares_root(sid) { "shared" } else { "per_session" },
            "workdir": space.dir().display().to_string(),
            "copied_files": copied,
        }))
    }

    /// `shell::release`: the run ended. Its commands are killed, its sandbox (and, with
    /// bubblewrap, its namespaces) ends, and its directory is marked for the sweep.
    pub fn release(&self, sid: &str) -> Result<serde_json::Value, ErrorBody> {
        let killed = self.cancel(sid);
        if self.shares_root(sid) {
            return Ok(serde_json::json!({"session_id": sid, "released": false, "killed": killed}));
        }
        valid_session(sid)?;
        let released = self.lock_spaces().remove(sid).is_some();
        if self.root.join(sid).is_dir() {
            let marks = self.root.join(RELEASED);
            let _ = std::fs::create_dir_all(&marks);
            std::fs::write(marks.join(sid), b"").map_err(|e| io("the release mark", e))?;
        }
        self.sweep();
        Ok(serde_json::json!({"session_id": sid, "released": released, "killed": killed}))
    }

    /// Remove the directories of sessions released longer than the retention ago.
    pub fn sweep(&self) -> usize {
        let marks = self.root.join(RELEASED);
        let Ok(entries) = std::fs::read_dir(&marks) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if valid_session(&name).is_err() {
                continue;
            }
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= self.retention);
            if !old || self.lock_spaces().contains_key(&name) {
                continue;
            }
            let dir = self.root.join(&name);
            if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_dir_all(&dir);
            }
            let _ = std::fs::remove_file(e.path());
            removed += 1;
        }
        removed
    }
}

/// Copy `from` into the empty `to`: directories, files (cloned where the filesystem shares
/// extents, else copied) and links as links; never more than [`MAX_COPY_FILES`] entries and
/// [`MAX_COPY_BYTES`]. `root`: nothing outside it is read (a link is copied, not followed).
fn copy_tree(from: &Path, to: &Path, owner: Option<u32>, root: &Path) -> std::io::Result<usize> {
    let mut count = 0usize;
    let mut bytes = 0u64;
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            let name = entry.file_name();
            if src == root && name == RELEASED {
                continue;
            }
            count += 1;
            if count > MAX_COPY_FILES {
                return Err(std::io::Error::other(format!(
                    "more than {MAX_COPY_FILES} files to copy"
                )));
            }
            let (s, d) = (entry.path(), dst.join(&name));
            let meta = std::fs::symlink_metadata(&s)?;
            if meta.file_type().is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&s)?, &d)?;
                if let Some(uid) = owner {
                    let _ = std::os::unix::fs::lchown(&d, Some(uid), Some(uid));
                }
                continue;
            }
            if meta.is_dir() {
                std::fs::create_dir(&d)?;
                stack.push((s, d.clone()));
            } else if meta.is_file() {
                bytes += meta.len();
                if bytes > MAX_COPY_BYTES {
                    return Err(std::io::Error::other(format!(
                        "more than {MAX_COPY_BYTES} bytes to copy"
                    )));
                }
                clone_or_copy(&s, &d)?;
            } else {
                // FIFOs, sockets, devices: not copied.
                continue;
            }
            if let Some(uid) = owner {
                std::os::unix::fs::chown(&d, Some(uid), Some(uid))?;
            }
        }
    }
    Ok(count)
}

/// A copy that shares the source's extents where the filesystem can (`FICLONE`: btrfs, XFS),
/// else a plain copy. Either way later writes to one never change the other.
fn clone_or_copy(src: &Path, dst: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let from = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)?;
    let mode = from.metadata()?.permissions();
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dst)?;
    // SAFETY: FICLONE takes the source descriptor; both are open files of ours.
    let cloned = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) } == 0;
    if !cloned {
        let mut from = from;
        let mut to = &to;
        std::io::copy(&mut from, &mut to)?;
    }
    to.set_permissions(mode)?;
    Ok(())
}
