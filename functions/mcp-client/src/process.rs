//! A stdio server's process, with the tool sandbox's process layers: a cleared environment
//! (only `PATH`, `HOME`, `LANG` and the entry's `env`), its own session and process group,
//! resource limits, no new privileges, and a waiter that kills the whole group when the
//! harness dies, however it dies ([`tools_worker::waiter`]). The network stays open: an
//! MCP server usually needs it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

/// The limits a server runs under. No CPU-time or address-space limit: a server lives as long
/// as the harness, and a JavaScript runtime reserves gigabytes of address space it never uses.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub open_files: u64,
    pub file_size_bytes: u64,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            open_files: 1024,
            file_size_bytes: 1 << 30,
        }
    }
}

pub struct ServerProcess {
    pub child: Child,
    /// The process group (the waiter's pid): every process of the server.
    pub group: i32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
}

impl ServerProcess {
    /// Kill every process of the server.
    pub fn kill(&mut self) {
        if self.group > 0 {
            // SAFETY: a signal to a process group this process made.
            unsafe {
                libc::kill(-self.group, libc::SIGKILL);
            }
        }
        let _ = self.child.start_kill();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The environment a server gets: the three passed variables of this process, then `env`.
pub fn environment(env: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = crate::config::PASSED_VARIABLES
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    for (k, v) in env {
        out.retain(|(o, _)| o != k);
        out.push((k.clone(), v.clone()));
    }
    out
}

pub fn spawn(
    command: &[String],
    env: &[(String, String)],
    cwd: &Path,
    limits: ServerLimits,
) -> std::io::Result<ServerProcess> {
    use std::os::unix::process::CommandExt;
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let harness = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec, system calls only on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let set = |res, v: u64| {
                let lim = libc::rlimit {
                    rlim_cur: v as libc::rlim_t,
                    rlim_max: v as libc::rlim_t,
                };
                if libc::setrlimit(res, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_NOFILE, limits.open_files)?;
            set(libc::RLIMIT_FSIZE, limits.file_size_bytes)?;
            set(libc::RLIMIT_CORE, 0)?;
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            tools_worker::waiter::fork_waiter(harness)
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()?;
    let group = child.id().map_or(0, |p| p as i32);
    Ok(ServerProcess {
        group,
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        child,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_server_sees_only_its_environment_and_its_group_dies_together() {
        // SAFETY: a test process; nothing else reads the variable concurrently.
        unsafe { std::env::set_var("HARNESS_TEST_SECRET_KEY", "sk-should-not-pass") };
        let env = environment(&BTreeMap::from([("ONLY".to_string(), "this".to_string())]));
        let dir = tempfile::tempdir().unwrap();
        let cmd: Vec<String> = ["sh", "-c", "env; sleep 30 & echo $! ; wait"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut p = spawn(&cmd, &env, dir.path(), ServerLimits::default()).unwrap();
        let mut out = vec![0u8; 4096];
        let mut read = 0;
        while !String::from_utf8_lossy(&out[..read])
            .lines()
            .any(|l| l.parse::<u32>().is_ok())
        {
            let n = p
                .stdout
                .as_mut()
                .unwrap()
                .read(&mut out[read..])
                .await
                .unwrap();
            assert!(n > 0);
            read += n;
        }
        let text = String::from_utf8_lossy(&out[..read]).to_string();
        assert!(text.contains("ONLY=this"), "{text}");
        assert!(!text.contains("sk-should-not-pass"), "{text}");
        let sleeper: i32 = text.lines().find_map(|l| l.parse().ok()).unwrap();
        p.kill();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(sleeper, 0) } == 0
            && !std::fs::read_to_string(format!("/proc/{sleeper}/stat"))
                .unwrap_or_default()
                .contains(") Z ");
        assert!(!alive, "the server's own child outlived it");
    }
}
