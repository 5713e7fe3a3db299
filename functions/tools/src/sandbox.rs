//! How `shell::exec` runs a command: in layers of isolation built from what Linux gives a
//! process, each reported at start-up, so it is known what holds on this kernel.
//!
//! | layer | how |
//! | --- | --- |
//! | `clean_env` | the environment is cleared: `PATH`, `HOME` (= the working directory), `LANG` |
//! | `session` | a new session and process group that no process of it may leave (seccomp refuses `setsid`/`setpgid`); the whole group is killed on timeout, on cancel, and with the harness (`PR_SET_PDEATHSIG`) |
//! | `rlimits` | CPU time, address space, processes, file size, open files |
//! | `no_new_privs` | no set-uid gains |
//! | `seccomp` | ptrace, mount, namespaces, keyrings, BPF, kexec, modules, io_uring… answer `EPERM` |
//! | `separate_uid` | when the harness runs as root, commands run as `nobody` (65534) |
//! | `filesystem` | namespaces: a root holding the working directory (read-write) and the system directories (read-only), nothing else; or Landlock: only those paths (and a private temporary directory) may be opened |
//! | `network` | namespaces: a network namespace with no interfaces; and seccomp: `socket` refuses every family but `AF_UNIX` |
//! | `pid` | namespaces: a PID namespace, and Landlock scopes each command's signals and `/proc` reads to itself (ABI 6); or Landlock alone: `/proc` is unreachable and signals are scoped |
//!
//! Which isolation provides the last three is chosen at start-up ([`Isolation`]): the
//! namespaces of one bubblewrap *holder* per working directory, made once and entered by each
//! command (see [`crate::namespaces`]; a fresh bubblewrap per command cost 3–5 ms), else
//! Landlock, else none (Lambda has no user namespaces; its kernel may lack Landlock). With
//! `sandbox: required` a missing layer makes `shell::exec` refuse, naming the layer; with
//! `best_effort` (the default) the command runs in the layers there are.

use crate::landlock::{Access, Ruleset};
use crate::namespaces::{self, Entry, Holder};
use serde::Serialize;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// Which isolation gives the filesystem, network and pid layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// The best this machine offers: namespaces, else Landlock, else none.
    Auto,
    /// Namespaces through bubblewrap only.
    Namespaces,
    /// Landlock only (what a machine without user namespaces gets).
    Landlock,
    /// Neither: the process layers alone.
    Process,
}

impl Isolation {
    /// `auto`, `namespaces`, `landlock`, `process`.
    pub fn parse(s: &str) -> Option<Isolation> {
        match s.trim() {
            "auto" | "" => Some(Isolation::Auto),
            "namespaces" => Some(Isolation::Namespaces),
            "landlock" => Some(Isolation::Landlock),
            "process" => Some(Isolation::Process),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub mode: Mode,
    pub isolation: Isolation,
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
            isolation: Isolation::Auto,
            limits: Limits::default(),
            bwrap: None,
            env: Vec::new(),
            uid: SANDBOX_UID,
        }
    }
}

impl SandboxConfig {
    /// From `HARNESS_SANDBOX` (`required` | `best_effort`), `HARNESS_SANDBOX_ISOLATION`
    /// (`auto` | `namespaces` | `landlock` | `process`), `HARNESS_BWRAP`, and
    /// `HARNESS_SANDBOX_{CPU_SECS,MEMORY_BYTES,PROCESSES,FILE_SIZE_BYTES,OPEN_FILES}`.
    pub fn from_env() -> Result<Self, String> {
        SandboxConfig::default().with_env()
    }

    /// These settings, with each `HARNESS_SANDBOX*` variable that is set taking precedence
    /// (how an operator overrides a configuration file).
    pub fn with_env(self) -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut cfg = self;
        if let Some(m) = var("HARNESS_SANDBOX") {
            cfg.mode = Mode::parse(&m)
                .ok_or_else(|| format!("HARNESS_SANDBOX=`{m}`: use required or best_effort"))?;
        }
        if let Some(i) = var("HARNESS_SANDBOX_ISOLATION") {
            cfg.isolation = Isolation::parse(&i).ok_or_else(|| {
                format!(
                    "HARNESS_SANDBOX_ISOLATION=`{i}`: use auto, namespaces, landlock or process"
                )
            })?;
        }
        if let Some(b) = var("HARNESS_BWRAP") {
            cfg.bwrap = Some(PathBuf::from(b));
        }
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

/// What gives the filesystem, network and pid layers, once chosen.
enum Isolated {
    /// A bubblewrap holder's namespaces, entered by every command.
    Namespaces {
        bwrap: PathBuf,
        holder: Mutex<Option<Holder>>,
        /// Each command's own Landlock domain, so that commands sharing the holder's PID
        /// namespace cannot signal or read each other, nor the holder (ABI 6; else `None`).
        scope: Option<Arc<Ruleset>>,
    },
    Landlock {
        rules: Arc<Ruleset>,
        tmp: PrivateTmp,
    },
    Process,
}

/// A temporary directory of the sandbox's own (Landlock has no private `/tmp` to mount).
use crate::private_tmp::PrivateTmp;

pub struct Sandbox {
    cfg: SandboxConfig,
    workdir: PathBuf,
    /// The working directory for `chdir` after entering the mount namespace.
    workdir_c: Arc<CString>,
    /// A handle of the working directory, opened by the harness: a command enters it by
    /// handle, so its user needs no access to the directories above it (a checkout in
    /// `/root`, mode 0700, say), and bubblewrap binds it by handle for the same reason.
    workdir_fd: Option<Arc<std::os::fd::OwnedFd>>,
    isolated: Isolated,
    layers: Layers,
    /// Why the layers that are missing are missing.
    notes: Vec<String>,
    /// The seccomp programs for a call with the network and for one without.
    seccomp_open: Arc<crate::seccomp::Filters>,
    seccomp_closed: Arc<crate::seccomp::Filters>,
    as_root: bool,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// The system directories a command reads and executes from.
const SYSTEM_DIRS: [&str; 7] = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc"];
/// The only device nodes a command gets.
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

impl Sandbox {
    /// Work out which layers hold here: the isolation is tried once for real.
    pub fn probe(cfg: SandboxConfig, workdir: &Path) -> Sandbox {
        // SAFETY: geteuid has no preconditions.
        let as_root = unsafe { libc::geteuid() } == 0;
        let mut sb = Sandbox {
            workdir: workdir.to_path_buf(),
            workdir_c: Arc::new(CString::new(workdir.as_os_str().as_bytes()).unwrap_or_default()),
            workdir_fd: rustix::fs::open(
                workdir,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()
            .map(Arc::new),
            isolated: Isolated::Process,
            layers: Layers {
                clean_env: true,
                session: true,
                rlimits: true,
                no_new_privs: true,
                seccomp: true,
                separate_uid: as_root,
                // seccomp's socket rule holds everywhere; the namespaces add an empty
                // network namespace on top.
                network: true,
                ..Layers::default()
            },
            notes: Vec::new(),
            seccomp_open: Arc::new(crate::seccomp::filter(true)),
            seccomp_closed: Arc::new(crate::seccomp::filter(false)),
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
        let want = sb.cfg.isolation;
        if matches!(want, Isolation::Auto | Isolation::Namespaces) {
            let candidate = sb.cfg.bwrap.clone().or_else(|| find_on_path("bwrap"));
            match candidate {
                None => sb
                    .notes
                    .push("namespaces: bubblewrap (`bwrap`) is not installed".into()),
                Some(path) => match sb.try_namespaces(&path) {
                    Ok(()) => {}
                    Err(why) => sb.notes.push(format!(
                        "namespaces: {} cannot make a sandbox here ({why}); user namespaces may be off, as on Lambda",
                        path.display()
                    )),
                },
            }
        }
        if matches!(sb.isolated, Isolated::Process)
            && matches!(want, Isolation::Auto | Isolation::Landlock)
            && let Err(why) = sb.try_landlock()
        {
            sb.notes.push(format!("landlock: {why}"));
        }
        if matches!(sb.isolated, Isolated::Process) {
            sb.notes.push(
                "filesystem, pid: no isolation is available (neither namespaces nor Landlock)"
                    .into(),
            );
        }
        sb
    }

    /// Start the holder and run `true` through it; on success the namespaces are in use.
    fn try_namespaces(&mut self, bwrap: &Path) -> Result<(), String> {
        let holder = self.spawn_holder(bwrap)?;
        let scope = match Ruleset::scope_only() {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                self.notes.push(format!(
                    "pid: commands share the holder's PID namespace and Landlock cannot scope them to themselves ({e})"
                ));
                None
            }
        };
        self.isolated = Isolated::Namespaces {
            bwrap: bwrap.to_path_buf(),
            holder: Mutex::new(Some(holder)),
            scope,
        };
        if let Err(why) = self.try_true() {
            self.isolated = Isolated::Process;
            return Err(why);
        }
        self.layers.filesystem = true;
        self.layers.pid = true;
        Ok(())
    }

    fn try_landlock(&mut self) -> Result<(), String> {
        let tmp =
            PrivateTmp::create().map_err(|e| format!("{}: {e}", std::env::temp_dir().display()))?;
        self.own(&tmp.0).map_err(|e| e.to_string())?;
        let mut paths: Vec<(&Path, Access)> = SYSTEM_DIRS
            .iter()
            .map(|d| (Path::new(*d), Access::ReadExecute))
            .collect();
        paths.extend(
            DEVICES
                .iter()
                .map(|d| (Path::new(*d), Access::ReadWriteFile)),
        );
        paths.push((&self.workdir, Access::ReadWrite));
        paths.push((&tmp.0, Access::ReadWrite));
        let rules = Ruleset::new(&paths).map_err(|e| e.to_string())?;
        let scoped = rules.scoped;
        let abi = rules.abi;
        self.isolated = Isolated::Landlock {
            rules: Arc::new(rules),
            tmp,
        };
        if let Err(why) = self.try_true() {
            self.isolated = Isolated::Process;
            return Err(why);
        }
        self.layers.filesystem = true;
        self.layers.pid = scoped;
        self.notes.push(format!(
            "isolation: Landlock ABI {abi} (no namespaces): /proc is unreachable, and Unix sockets on the host's paths are not covered"
        ));
        if !scoped {
            self.notes.push(format!(
                "pid: Landlock ABI {abi} cannot scope signals (6 is needed)"
            ));
        }
        Ok(())
    }

    /// Run `true` through the chosen isolation.
    fn try_true(&self) -> Result<(), String> {
        let out = self
            .std_command("true", false)
            .map_err(|e| e.to_string())?
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`true` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    pub fn layers(&self) -> Layers {
        self.layers
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// What provides the filesystem, network and pid layers.
    pub fn isolation(&self) -> &'static str {
        match self.isolated {
            Isolated::Namespaces { .. } => "namespaces",
            Isolated::Landlock { .. } => "landlock",
            Isolated::Process => "process",
        }
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
        if let Isolated::Landlock { tmp, .. } = &self.isolated {
            env.push(("TMPDIR".to_string(), tmp.0.display().to_string()));
        }
        env.extend(self.cfg.env.iter().cloned());
        env
    }

    /// The holder's bubblewrap command line: the sandbox's root, and `sh` waiting on stdin.
    fn holder_command(&self, bwrap: &Path, info_fd: i32) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(bwrap);
        // bubblewrap's own processes (pid 1 inside) keep the environment they were started
        // with, readable at /proc/1/environ: they get none of the harness's.
        cmd.env_clear();
        let work = self.workdir.display().to_string();
        // Every namespace. Nested ones are refused to commands by seccomp (unshare, clone's
        // namespace flags, clone3).
        cmd.args(["--unshare-all", "--unshare-user"]);
        cmd.args([
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
        ]);
        cmd.args(["--info-fd", &info_fd.to_string()]);
        // The system, read-only; merged-/usr layouts get their symlinks.
        for dir in SYSTEM_DIRS {
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
        for dev in DEVICES {
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
        // Bound by handle: bubblewrap runs as the sandbox user, who may not be able to walk
        // the path to a workspace under a private directory.
        let bind_fd = self
            .workdir_fd
            .as_ref()
            .map(|fd| std::os::fd::AsRawFd::as_raw_fd(&**fd))
            .filter(|_| self.as_root);
        match bind_fd {
            Some(fd) => cmd.args(["--bind-fd", &fd.to_string(), &work]),
            None => cmd.args(["--bind", &work, &work]),
        };
        cmd.args(["--chdir", &work]);
        cmd.args(["--", "/bin/sh", "-c", namespaces::HOLDER_SCRIPT]);
        if self.as_root {
            cmd.uid(self.cfg.uid).gid(self.cfg.uid);
        }
        // SAFETY: system calls only, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Handed to bubblewrap: not closed at exec.
                for fd in [Some(info_fd), bind_fd].into_iter().flatten() {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd
    }

    fn spawn_holder(&self, bwrap: &Path) -> Result<Holder, String> {
        let (read, write) = namespaces::info_pipe().map_err(|e| e.to_string())?;
        let cmd = self.holder_command(bwrap, write.as_raw_fd());
        Holder::start(cmd, read, write)
    }

    /// The live holder's namespaces, starting a new holder if the last one ended.
    fn entry(&self) -> std::io::Result<Option<Arc<Entry>>> {
        let Isolated::Namespaces { bwrap, holder, .. } = &self.isolated else {
            return Ok(None);
        };
        let mut holder = holder.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = holder.as_ref().filter(|h| h.alive()) {
            return Ok(Some(h.entry.clone()));
        }
        let h = self
            .spawn_holder(bwrap)
            .map_err(|why| std::io::Error::other(format!("cannot restart the sandbox: {why}")))?;
        let entry = h.entry.clone();
        *holder = Some(h);
        Ok(Some(entry))
    }

    /// The command for `sh -c command`, every active layer applied.
    pub fn command(
        &self,
        command: &str,
        network: bool,
    ) -> std::io::Result<tokio::process::Command> {
        Ok(tokio::process::Command::from(
            self.std_command(command, network)?,
        ))
    }

    fn std_command(&self, command: &str, network: bool) -> std::io::Result<std::process::Command> {
        let mut c = std::process::Command::new("/bin/sh");
        c.arg("-c").arg(command).env_clear().envs(self.env());
        if self.workdir_fd.is_none() {
            c.current_dir(&self.workdir);
        }
        let (landlock, entry) = match &self.isolated {
            Isolated::Namespaces { scope, .. } => (scope.clone(), self.entry()?),
            Isolated::Landlock { rules, .. } => (Some(rules.clone()), None),
            Isolated::Process => (None, None),
        };
        self.apply_process_layers(&mut c, network, landlock, entry)?;
        Ok(c)
    }

    /// Limits, a new session, death with the harness, the namespaces (entered, then the
    /// working directory again), no_new_privs, the unprivileged uid, the waiter
    /// ([`crate::waiter`]), then, in the command alone, Landlock and seccomp.
    fn apply_process_layers(
        &self,
        cmd: &mut std::process::Command,
        network: bool,
        landlock: Option<Arc<Ruleset>>,
        entry: Option<Arc<Entry>>,
    ) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        // The command's own handle of the ruleset, taken before the fork.
        let mut landlock = landlock.map(|r| r.for_command()).transpose()?;
        if self.as_root {
            // std also drops the supplementary groups when it changes uid as root; it does
            // so before the closure below, so the namespaces are entered as that user.
            cmd.uid(self.cfg.uid).gid(self.cfg.uid);
        }
        let limits = self.cfg.limits;
        let filter = if network {
            self.seccomp_open.clone()
        } else {
            self.seccomp_closed.clone()
        };
        let workdir = self.workdir_c.clone();
        let workdir_fd = self.workdir_fd.clone();
        let harness = std::process::id() as libc::pid_t;
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
                if let Some(entry) = &entry {
                    namespaces::enter(entry, network)?;
                    // Entering the mount namespace moved us to its root.
                    if libc::chdir(workdir.as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if let Some(fd) = &workdir_fd {
                    // By handle, already as the sandbox user: it needs no access to the
                    // directories above the workspace.
                    if libc::fchdir(std::os::fd::AsRawFd::as_raw_fd(&**fd)) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                crate::waiter::fork_waiter(harness)?;
                // Only the command is confined by Landlock and seccomp, not its waiter: in
                // the command's own Landlock domain, `kill -9 -1` cannot reach the waiter
                // (whose death would end the command too).
                if let Some(rules) = landlock.take() {
                    crate::landlock::restrict_self(rules)?;
                }
                crate::seccomp::install(&filter)
            });
        }
        Ok(())
    }

    /// Give the working directory to the sandbox user (when root), so commands can write in
    /// it, and files the harness writes there stay writable to them.
    pub fn own(&self, path: &Path) -> std::io::Result<()> {
        Self::own_for(&self.cfg, path)
    }

    /// [`Sandbox::own`] before the probe: who owns the working directory depends only on the
    /// configuration and on running as root.
    pub fn own_for(cfg: &SandboxConfig, path: &Path) -> std::io::Result<()> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(path, Some(cfg.uid), Some(cfg.uid))?;
        }
        Ok(())
    }
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
        assert_eq!(Isolation::parse("landlock"), Some(Isolation::Landlock));
        assert_eq!(Isolation::parse(""), Some(Isolation::Auto));
        assert_eq!(Isolation::parse("chroot"), None);
        let layers = Layers {
            clean_env: true,
            ..Layers::default()
        };
        assert!(
            layers.missing().contains(&"filesystem") && !layers.missing().contains(&"clean_env")
        );
    }
}
