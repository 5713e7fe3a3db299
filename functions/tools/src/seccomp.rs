//! A seccomp filter, written as classic BPF by hand (no C library needed): every system call
//! a command has no business making (tracing other processes, mounting, kernel keyrings, BPF,
//! loading kernels or modules, new namespaces, leaving its process group, io_uring, …)
//! answers `EPERM`; without the network, `socket` answers `EACCES` for every family but
//! `AF_UNIX`; everything else is allowed. A call from a foreign architecture ABI kills the
//! process.
//!
//! `setsid` and `setpgid` are refused so that every process a command starts stays in its
//! group: killing the group on a timeout or a cancel then kills all of it, with or without a
//! PID namespace. io_uring is refused because its operations (sockets among them) bypass
//! this filter.

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockFilter {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// `offsetof(struct seccomp_data, args[0])`, its low 32 bits (little-endian targets).
const OFFSET_ARG0: u32 = 16;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Every `CLONE_NEW*` flag `clone` takes.
const CLONE_NAMESPACES: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

/// What a sandboxed command may never do.
pub fn denied_syscalls() -> Vec<(&'static str, libc::c_long)> {
    let mut v = vec![
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("kcmp", libc::SYS_kcmp),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("fsopen", libc::SYS_fsopen),
        ("fsmount", libc::SYS_fsmount),
        ("fsconfig", libc::SYS_fsconfig),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("reboot", libc::SYS_reboot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("syslog", libc::SYS_syslog),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("chroot", libc::SYS_chroot),
        ("setsid", libc::SYS_setsid),
        ("setpgid", libc::SYS_setpgid),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        ("iopl", libc::SYS_iopl),
        ("ioperm", libc::SYS_ioperm),
        ("uselib", libc::SYS_uselib),
    ]);
    v
}

/// The filter program; `network: false` also refuses every socket but `AF_UNIX`.
pub fn filter(network: bool) -> Vec<SockFilter> {
    let stmt = |code, k| SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| SockFilter { code, jt, jf, k };
    let denied = denied_syscalls();
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
    ];
    // x32 system calls (x86_64 with bit 30 set) go around a filter written for x86_64.
    #[cfg(target_arch = "x86_64")]
    p.extend([
        jump(BPF_JGE_K, 0x4000_0000, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ]);
    if !network {
        // socket(domain, …): AF_UNIX passes, any other family is refused. On a miss the
        // accumulator still holds the call number for the checks below.
        p.extend([
            jump(BPF_JEQ_K, libc::SYS_socket as u32, 0, 4),
            stmt(BPF_LD_W_ABS, OFFSET_ARG0),
            jump(BPF_JEQ_K, libc::AF_UNIX as u32, 0, 1),
            stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
            stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EACCES as u32),
        ]);
    }
    // clone with a namespace flag is refused (unshare's twin); clone3 passes its flags in
    // memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone.
    p.extend([
        jump(BPF_JEQ_K, libc::SYS_clone as u32, 0, 4),
        stmt(BPF_LD_W_ABS, OFFSET_ARG0),
        jump(BPF_JSET_K, CLONE_NAMESPACES, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
        jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
    ]);
    for (_, nr) in &denied {
        // Equal: fall into the EPERM return right after; else skip it.
        p.push(jump(BPF_JEQ_K, *nr as u32, 0, 1));
        p.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    }
    p.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    p
}

/// Install `prog` on the calling thread (no_new_privs first, as the kernel requires of an
/// unprivileged caller). Only system calls: safe between fork and exec.
///
/// # Safety
/// `prog` must stay alive during the call; it is copied by the kernel.
pub unsafe fn install(prog: &[SockFilter]) -> std::io::Result<()> {
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    let fprog = SockFprog {
        len: prog.len() as u16,
        filter: prog.as_ptr(),
    };
    // SAFETY: plain prctl calls; `fprog` points at a live program.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const SockFprog,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_denies_the_listed_calls_and_allows_the_rest() {
        let p = filter(true);
        assert!(p.len() < 200, "a short program: {}", p.len());
        assert_eq!(p.last().unwrap().k, SECCOMP_RET_ALLOW);
        // Every denied call has its comparison, followed by the EPERM return.
        for (name, nr) in denied_syscalls() {
            let i = p
                .iter()
                .position(|i| i.code == BPF_JEQ_K && i.k == nr as u32 && i.jt == 0)
                .unwrap_or_else(|| panic!("{name} is checked"));
            assert_eq!(p[i + 1].k, SECCOMP_RET_ERRNO | libc::EPERM as u32);
        }
        // Without the network, the socket rule comes first and keeps the rest intact.
        let closed = filter(false);
        assert_eq!(closed.len(), p.len() + 5);
        assert!(
            p.iter()
                .any(|i| i.code == BPF_JSET_K && i.k == CLONE_NAMESPACES)
        );
        assert!(
            closed
                .iter()
                .any(|i| i.k == SECCOMP_RET_ERRNO | libc::EACCES as u32)
        );
    }
}
