//! Every command runs under a *waiter*: the child the harness forked forks once more, the
//! grandchild executes the command, and the waiter stays behind only to wait for it and exit
//! as it did. That buys two things:
//!
//! - **Nothing outlives the harness.** The waiter learns of the harness's death (its
//!   parent-death signal, `SIGTERM`, caught) and kills its whole process group, which no
//!   process of the command can leave (seccomp refuses `setsid` and `setpgid`). A parent-death
//!   signal alone would reach only the first process: it is not inherited across fork.
//! - **The command is inside the PID namespace** it entered with `setns`, which applies only
//!   to children.
//!
//! The waiter keeps no descriptor open (the spawner's exec-error pipe among them), so the
//! spawner sees the grandchild's exec as the command's.

/// The signal the waiter gets when the harness dies.
const DEATH_SIGNAL: libc::c_int = libc::SIGTERM;

extern "C" fn kill_own_group(_: libc::c_int) {
    // SAFETY: async-signal-safe system calls only.
    unsafe {
        libc::kill(0, libc::SIGKILL);
        libc::_exit(137);
    }
}

/// Fork the command from its waiter. `harness` is the pid of the process that spawned this
/// child. Returns in the grandchild, which goes on to exec; the waiter never returns.
///
/// # Safety
/// Call only in a single-threaded child (after fork), before exec, after the namespaces
/// and limits that the command must inherit are in place. What must confine the command but
/// not the waiter (its Landlock domain, seccomp) goes after, in the grandchild.
pub unsafe fn fork_waiter(harness: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: system calls only, in a single-threaded child.
    unsafe {
        let waiter = libc::getpid();
        let pid = libc::fork();
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            // The command: dies with its waiter (and so with the harness).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // 0: the waiter is outside the PID namespace this process was born in.
            let parent = libc::getppid();
            if parent != waiter && parent != 0 {
                libc::_exit(137);
            }
            return Ok(());
        }
        // The waiter.
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = kill_own_group as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(DEATH_SIGNAL, &action, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0);
        if libc::getppid() != harness {
            // The harness died before the signal was armed.
            kill_own_group(0);
        }
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
            for fd in 0..4096 {
                libc::close(fd);
            }
        }
        let mut status = 0;
        loop {
            let r = libc::waitpid(pid, &mut status, 0);
            if r == pid {
                break;
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}
