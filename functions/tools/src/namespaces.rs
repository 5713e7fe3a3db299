//! Namespaces made once per working directory and entered by every command.
//!
//! Starting bubblewrap per command costs 3–5 ms (a user namespace, a new root, its mounts),
//! most of it the same work each time. Instead one *holder* runs under bubblewrap for the
//! life of the tools worker: its new user, mount, network and PID namespaces hold the
//! sandbox's root (the working directory read-write, the system read-only, a private `/tmp`
//! and `/proc`). A command forks from the harness and, before it executes anything, enters
//! those namespaces with `setns` (user first, which gives it the rights to enter the others),
//! so what it costs is a fork and a few system calls.
//!
//! The holder is `sh` waiting on a pipe only this process writes to: it ends when the tools
//! worker drops it or dies (bubblewrap's `--die-with-parent` too), and then every process in
//! its PID namespace dies with it. If it ends early, the next command starts a new one.

use std::io::{BufRead, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The namespaces of a live holder, as descriptors a command can `setns` into.
#[derive(Debug)]
pub struct Entry {
    /// `None` when the holder shares this process's user namespace (bubblewrap as root).
    pub user: Option<OwnedFd>,
    pub mnt: OwnedFd,
    pub net: OwnedFd,
    pub pid: OwnedFd,
}

/// A running holder.
pub struct Holder {
    pub entry: Arc<Entry>,
    alive: Arc<AtomicBool>,
    /// Its stdin: dropping it ends the holder.
    _keep: std::process::ChildStdin,
}

impl Holder {
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Start `cmd` (a bubblewrap command line whose payload is [`HOLDER_SCRIPT`], with
    /// `--info-fd` naming `info_fd`'s write end) and open its namespaces. `info` is the read
    /// end of the info pipe.
    ///
    /// The holder is started and waited for on a thread of its own: bubblewrap's
    /// `--die-with-parent` fires when the *thread* that started it exits, so it must not be a
    /// pool thread that may retire.
    pub fn start(
        mut cmd: std::process::Command,
        info: OwnedFd,
        info_write: OwnedFd,
    ) -> Result<Holder, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let alive = Arc::new(AtomicBool::new(true));
        let alive_thread = alive.clone();
        std::thread::Builder::new()
            .name("sandbox-holder".into())
            .spawn(move || {
                let spawned = cmd
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn();
                drop(info_write);
                match spawned {
                    Err(e) => {
                        alive_thread.store(false, Ordering::Release);
                        let _ = tx.send(Err(format!("cannot start bubblewrap: {e}")));
                    }
                    Ok(mut child) => {
                        let stdin = child.stdin.take();
                        let stdout = child.stdout.take();
                        let stderr = child.stderr.take();
                        let _ = tx.send(Ok((stdin, stdout, stderr)));
                        let _ = child.wait();
                        alive_thread.store(false, Ordering::Release);
                    }
                }
            })
            .map_err(|e| format!("cannot start the holder's thread: {e}"))?;
        let (stdin, stdout, stderr) = rx
            .recv()
            .map_err(|_| "the holder's thread ended".to_string())??;
        let (Some(stdin), Some(stdout), Some(mut stderr)) = (stdin, stdout, stderr) else {
            return Err("the holder has no pipes".into());
        };
        // It prints one line once its root is ready; anything else (EOF) means bubblewrap
        // failed, and said why on stderr.
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        if line.trim() != "ready" {
            let mut why = String::new();
            let _ = stderr.read_to_string(&mut why);
            return Err(if why.trim().is_empty() {
                "bubblewrap exited before the sandbox was ready".into()
            } else {
                why.trim().to_string()
            });
        }
        let pid = read_child_pid(info)?;
        let entry = open_namespaces(pid)?;
        Ok(Holder {
            entry: Arc::new(entry),
            alive,
            _keep: stdin,
        })
    }
}

/// What the holder runs inside the sandbox: say it is ready, then wait for EOF on stdin.
pub const HOLDER_SCRIPT: &str = "echo ready; read -r _ || true";

/// A pipe whose ends close at exec; the write end is handed to bubblewrap explicitly.
pub fn info_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// bubblewrap's `--info-fd` JSON: `{"child-pid": N, …}`. The sandboxed process inherits the
/// write end, so this reads until the object closes rather than to EOF.
fn read_child_pid(info: OwnedFd) -> Result<i32, String> {
    let mut file = std::fs::File::from(info);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.contains(&b'}') && buf.len() < 64 * 1024 {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("reading bubblewrap's info: {e}")),
        }
    }
    let end = buf
        .iter()
        .position(|b| *b == b'}')
        .map_or(buf.len(), |i| i + 1);
    let v: serde_json::Value = serde_json::from_slice(&buf[..end])
        .map_err(|e| format!("bubblewrap's info is not JSON ({e})"))?;
    v["child-pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("bubblewrap's info names no child pid: {v}"))
}

fn open_ns(pid: i32, name: &str) -> Result<OwnedFd, String> {
    std::fs::File::open(format!("/proc/{pid}/ns/{name}"))
        .map(OwnedFd::from)
        .map_err(|e| format!("cannot open the sandbox's {name} namespace: {e}"))
}

fn same_ns(a: &OwnedFd, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(mine) = std::fs::metadata(b) else {
        return false;
    };
    // SAFETY: fstat into a zeroed struct on a live descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(a.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    st.st_ino == mine.ino() && st.st_dev == mine.dev()
}

fn open_namespaces(pid: i32) -> Result<Entry, String> {
    let user = open_ns(pid, "user")?;
    let user = (!same_ns(&user, Path::new("/proc/self/ns/user"))).then_some(user);
    Ok(Entry {
        user,
        mnt: open_ns(pid, "mnt")?,
        net: open_ns(pid, "net")?,
        pid: open_ns(pid, "pid")?,
    })
}

/// Enter the holder's namespaces. Runs between fork and exec: system calls only.
///
/// # Safety
/// Call only in a single-threaded child (after fork), before exec.
pub unsafe fn enter(entry: &Entry, network: bool) -> std::io::Result<()> {
    let join = |fd: &OwnedFd, kind: libc::c_int| {
        // SAFETY: setns on a live namespace descriptor.
        if unsafe { libc::setns(fd.as_raw_fd(), kind) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    if let Some(user) = &entry.user {
        join(user, libc::CLONE_NEWUSER)?;
    }
    join(&entry.mnt, libc::CLONE_NEWNS)?;
    if !network {
        join(&entry.net, libc::CLONE_NEWNET)?;
    }
    // Children made after this are in the holder's PID namespace (this process is not).
    join(&entry.pid, libc::CLONE_NEWPID)
}
