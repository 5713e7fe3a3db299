//! How `shell::exec` runs a command: in layers of isolation built from what Linux gives a
//! process, each reported at start-up, so it is known what holds on this kernel.
//!
//! | layer | how |
//! | --- | --- |
//! | `clean_env` | the environment is cleared: `PATH`, `HOME` (= the working directory), `LANG` |
//! | `session` | a new session and process group; the whole group is killed on timeout, on cancel, and with the harness (`PR_SET_PDEATHSIG`) |
//! | `rlimits` | CPU time, address space, processes, file size, open files |
//! | `no_new_privs` | no set-uid gains |
//! | `seccomp` | ptrace, mount, namespaces, keyrings, BPF, kexec, modules… answer `EPERM` |
//! | `separate_uid` | when the harness runs as root, commands run as `nobody` (65534) |
//! | `filesystem` | bubblewrap: a new root holding the working directory (read-write) and the system directories (read-only), nothing else |
//! | `network` | bubblewrap: a new network namespace, no interfaces |
//! | `pid` | bubblewrap: a new PID namespace; when its first process dies, everything in it dies |
//!
//! The last three need `bwrap` (bubblewrap) and user namespaces; Lambda has neither. With
//! `sandbox: required` a missing layer makes `shell::exec` refuse, naming the layer; with
//! `best_effort` (the default) the command runs in the layers there are.

use serde::Serialize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How strict the sandbox is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every layer must be active, or `shell::exec` refuses.
    Required,
    /// Use the layers this kernel offers.
    BestEffort,
}

impl Mode {
    /// `required`, `best_effort` / `best-effort`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim() {
            "required" => Some(Mode::Required),
            "best_effort" | "best-effort" | "" => Some(Mode::BestEffort),
            _ => None,
        }
    }
}

/// Resource limits of one command (each process of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub cpu_secs: u64,
    pub address_space_bytes: u64,
    pub processes: u64,
    pub file_size_bytes: u64,
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            cpu_secs: 120,
            address_space_bytes: 2 << 30,
            processes: 256,
            file_size_bytes: 1 << 30,
            open_files: 512,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub mode: Mode,
    pub limits: Limits,
    /// `bwrap` to use; default: found on `PATH`.
    pub bwrap: Option<PathBuf>,
    /// Extra variables every command gets (besides `PATH`, `HOME`, `LANG`).
    pub env: Vec<(String, String)>,
    /// The unprivileged user commands run as when the harness is root. The process limit
    /// counts per user, so commands of one uid share it.
    pub uid: u32,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            mode: Mode::BestEffort,
            limits: Limits::default(),
            bwrap: None,
            env: Vec::new(),
            uid: SANDBOX_UID,
        }
    }
}

impl SandboxConfig {
    /// From `HARNESS_SANDBOX` (`required` | `best_effort`), `HARNESS_BWRAP`, and
    /// `HARNESS_SANDBOX_{CPU_SECS,MEMORY_BYTES,PROCESSES,FILE_SIZE_BYTES,OPEN_FILES}`.
    pub fn from_env() -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut cfg = SandboxConfig::default();
        if let Some(m) = var("HARNESS_SANDBOX") {
            cfg.mode = Mode::parse(&m)
                .ok_or_else(|| format!("HARNESS_SANDBOX=`{m}`: use required or best_effort"))?;
        }
        cfg.bwrap = var("HARNESS_BWRAP").map(PathBuf::from);
        let num = |k: &str, into: &mut u64| -> Result<(), String> {
            if let Some(v) = var(k) {
                *into = v
                    .parse()
                    .map_err(|_| format!("{k}=`{v}` is not a number"))?;
            }
            Ok(())
        };
        num("HARNESS_SANDBOX_CPU_SECS", &mut cfg.limits.cpu_secs)?;
        num(
            "HARNESS_SANDBOX_MEMORY_BYTES",
            &mut cfg.limits.address_space_bytes,
        )?;
        num("HARNESS_SANDBOX_PROCESSES", &mut cfg.limits.processes)?;
        num(
            "HARNESS_SANDBOX_FILE_SIZE_BYTES",
            &mut cfg.limits.file_size_bytes,
        )?;
        num("HARNESS_SANDBOX_OPEN_FILES", &mut cfg.limits.open_files)?;
        let mut uid = u64::from(cfg.uid);
        num("HARNESS_SANDBOX_UID", &mut uid)?;
        cfg.uid = u32::try_from(uid)
            .ok()
            .filter(|u| *u != 0)
            .ok_or_else(|| format!("HARNESS_SANDBOX_UID={uid} must be a non-root uid"))?;
        Ok(cfg)
    }
}

/// Which layers are active.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Layers {
    pub clean_env: bool,
    pub session: bool,
    pub rlimits: bool,
    pub no_new_privs: bool,
    pub seccomp: bool,
    pub separate_uid: bool,
    pub filesystem: bool,
    pub network: bool,
    pub pid: bool,
}

impl Layers {
    /// Names of the layers that are not active.
    pub fn missing(&self) -> Vec<&'static str> {
        let all = [
            ("clean_env", self.clean_env),
            ("session", self.session),
            ("rlimits", self.rlimits),
            ("no_new_privs", self.no_new_privs),
            ("seccomp", self.seccomp),
            ("separate_uid", self.separate_uid),
            ("filesystem", self.filesystem),
            ("network", self.network),
            ("pid", self.pid),
        ];
        all.iter().filter(|(_, on)| !on).map(|(n, _)| *n).collect()
    }
}

/// The default unprivileged user commands run as when the harness is root (`nobody`).
pub const SANDBOX_UID: u32 = 65534;

pub struct Sandbox {
    cfg: SandboxConfig,
    workdir: PathBuf,
    bwrap: Option<PathBuf>,
    layers: Layers,
    /// Why the layers that are missing are missing.
    notes: Vec<String>,
    seccomp: Arc<Vec<crate::seccomp::SockFilter>>,
    as_root: bool,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

impl Sandbox {
    /// Work out which layers hold here: bubblewrap is tried once for real.
    pub fn probe(cfg: SandboxConfig, workdir: &Path) -> Sandbox {
        // SAFETY: geteuid has no preconditions.
        let as_root = unsafe { libc::geteuid() } == 0;
        let mut sb = Sandbox {
            bwrap: None,
            workdir: workdir.to_path_buf(),
            layers: Layers {
                clean_env: true,
                session: true,
                rlimits: true,
                no_new_privs: true,
                seccomp: true,
                separate_uid: as_root,
                ..Layers::default()
            },
            notes: Vec::new(),
            seccomp: Arc::new(crate::seccomp::filter()),
            as_root,
            cfg,
        };
        if !as_root {
            sb.notes.push(
                "separate_uid: the harness does not run as root, so commands run as its own user"
                    .into(),
            );
            // Not a weakness: the layer exists to keep root's powers from commands.
            sb.layers.separate_uid = true;
        }
        let candidate = sb.cfg.bwrap.clone().or_else(|| find_on_path("bwrap"));
        match candidate {
            None => sb.notes.push(
                "filesystem, network, pid: bubblewrap (`bwrap`) is not installed".into(),
            ),
            Some(path) => match sb.try_bwrap(&path) {
                Ok(()) => {
                    sb.bwrap = Some(path);
                    sb.layers.filesystem = true;
                    sb.layers.network = true;
                    sb.layers.pid = true;
                }
                Err(why) => sb.notes.push(format!(
                    "filesystem, network, pid: {} cannot make a sandbox here ({why}); user namespaces may be off, as on Lambda",
                    path.display()
                )),
            },
        }
        sb
    }

    /// Run `true` in a full sandbox once.
    fn try_bwrap(&self, bwrap: &Path) -> Result<(), String> {
        let mut cmd = self.bwrap_command(bwrap, "true", None, false);
        self.apply_process_layers(&mut cmd, None, true);
        let out = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    pub fn layers(&self) -> Layers {
        self.layers
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Who commands and the files written for them belong to (`None`: not root, so the
    /// harness's own user).
    pub fn owner(&self) -> Option<u32> {
        self.as_root.then_some(self.cfg.uid)
    }

    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }

    /// `Err` naming the missing layers when the configuration requires them all.
    pub fn check(&self) -> Result<(), String> {
        let missing = self.layers.missing();
        if self.cfg.mode == Mode::Required && !missing.is_empty() {
            return Err(format!(
                "the sandbox is required but these layers are missing: {} ({})",
                missing.join(", "),
                self.notes.join("; ")
            ));
        }
        Ok(())
    }

    /// The environment a command sees.
    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            ),
            ("HOME".to_string(), self.workdir.display().to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ];
        env.extend(self.cfg.env.iter().cloned());
        env
    }

    fn bwrap_command(
        &self,
        bwrap: &Path,
        command: &str,
        seccomp_fd: Option<i32>,
        network: bool,
    ) -> std::process::Command {
        let mut cmd = std::process::Command::new(bwrap);
        let work = self.workdir.display().to_string();
        cmd.arg("--unshare-all");
        if network {
            // Granted by a policy rule for this call: the host's network, nothing more.
            cmd.arg("--share-net");
        }
        cmd.args([
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
        ]);
        for (k, v) in self.env() {
            cmd.args(["--setenv", &k, &v]);
        }
        // The system, read-only; merged-/usr layouts get their symlinks.
        for dir in ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc"] {
            let p = Path::new(dir);
            match std::fs::read_link(p) {
                Ok(target) => {
                    cmd.args(["--symlink", &target.display().to_string(), dir]);
                }
                Err(_) if p.is_dir() => {
                    cmd.args(["--ro-bind", dir, dir]);
                }
                Err(_) => {}
            }
        }
        // Only the device nodes commands use (a whole `--dev` costs half a millisecond more).
        for dev in ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"] {
            cmd.args(["--dev-bind", dev, dev]);
        }
        for (link, to) in [
            ("/dev/fd", "/proc/self/fd"),
            ("/dev/stdin", "/proc/self/fd/0"),
            ("/dev/stdout", "/proc/self/fd/1"),
            ("/dev/stderr", "/proc/self/fd/2"),
        ] {
            cmd.args(["--symlink", to, link]);
        }
        cmd.args(["--proc", "/proc", "--tmpfs", "/tmp"]);
        cmd.args(["--bind", &work, &work, "--chdir", &work]);
        if let Some(fd) = seccomp_fd {
            cmd.args(["--seccomp", &fd.to_string()]);
        }
        cmd.args(["--", "/bin/sh", "-c", command]);
        cmd
    }

    /// The command for `sh -c command`, every active layer applied. The returned fd (the
    /// seccomp program for bubblewrap) must live until the command has started.
    pub fn command(
        &self,
        command: &str,
        network: bool,
    ) -> std::io::Result<(tokio::process::Command, Option<OwnedFd>)> {
        let (std_cmd, fd) = match &self.bwrap {
            Some(bwrap) => {
                let fd = seccomp_memfd()?;
                let raw = fd.as_raw_fd();
                let mut c = self.bwrap_command(bwrap, command, Some(raw), network);
                self.apply_process_layers(&mut c, Some(raw), true);
                (c, Some(fd))
            }
            None => {
                let mut c = std::process::Command::new("/bin/sh");
                c.arg("-c").arg(command).env_clear().envs(self.env());
                c.current_dir(&self.workdir);
                self.apply_process_layers(&mut c, None, false);
                (c, None)
            }
        };
        Ok((tokio::process::Command::from(std_cmd), fd))
    }

    /// Limits, a new session, death with the harness, no_new_privs, the unprivileged uid and
    /// (without bubblewrap, which loads it itself) the seccomp filter.
    fn apply_process_layers(
        &self,
        cmd: &mut std::process::Command,
        keep_fd: Option<i32>,
        via_bwrap: bool,
    ) {
        use std::os::unix::process::CommandExt;
        if self.as_root {
            // std also drops the supplementary groups when it changes uid as root.
            cmd.uid(self.cfg.uid).gid(self.cfg.uid);
        }
        let limits = self.cfg.limits;
        let filter = (!via_bwrap).then(|| self.seccomp.clone());
        // SAFETY: the closure runs between fork and exec and makes only system calls on
        // memory prepared before the fork (no allocation, no locks).
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
                set(libc::RLIMIT_CPU, limits.cpu_secs)?;
                set(libc::RLIMIT_AS, limits.address_space_bytes)?;
                set(libc::RLIMIT_NPROC, limits.processes)?;
                set(libc::RLIMIT_FSIZE, limits.file_size_bytes)?;
                set(libc::RLIMIT_NOFILE, limits.open_files)?;
                set(libc::RLIMIT_CORE, 0)?;
                if let Some(fd) = keep_fd {
                    // Handed to bubblewrap: not closed at exec.
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                match &filter {
                    Some(prog) => crate::seccomp::install(prog),
                    None => {
                        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    }
                }
            });
        }
    }

    /// Give the working directory to the sandbox user (when root), so commands can write in
    /// it, and files the harness writes there stay writable to them.
    pub fn own(&self, path: &Path) -> std::io::Result<()> {
        if self.as_root {
            std::os::unix::fs::chown(path, Some(self.cfg.uid), Some(self.cfg.uid))?;
        }
        Ok(())
    }
}

/// The seccomp program in an anonymous file, read by `bwrap --seccomp FD`.
fn seccomp_memfd() -> std::io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a static NUL-terminated name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(c"seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(owned);
    file.write_all(&crate::seccomp::filter_bytes())?;
    file.rewind()?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_limits_from_configuration_are_checked() {
        assert_eq!(Mode::parse("required"), Some(Mode::Required));
        assert_eq!(Mode::parse("best-effort"), Some(Mode::BestEffort));
        assert_eq!(Mode::parse("off"), None);
        assert_eq!(Mode::parse("REQUIRED"), None);
        let layers = Layers {
            clean_env: true,
            ..Layers::default()
        };
        assert!(
            layers.missing().contains(&"filesystem") && !layers.missing().contains(&"clean_env")
        );
    }
}
