//! The seccomp filter, built with `seccompiler` (the rust-vmm crate Firecracker uses): every
//! system call a command has no business making (tracing other processes, mounting, kernel
//! keyrings, BPF, loading kernels or modules, new namespaces, leaving its process group,
//! io_uring, …) answers `EPERM`; without the network, `socket` answers `EACCES` for every
//! family but `AF_UNIX`; `clone3` answers `ENOSYS` (its flags are in memory a filter cannot
//! read, so the C library falls back to `clone`, whose namespace flags are refused);
//! everything else is allowed. A call from a foreign architecture kills the process, and on
//! x86_64 the x32 numbers of every refused call are refused too.
//!
//! `setsid` and `setpgid` are refused so that every process a command starts stays in its
//! group: killing the group on a timeout or a cancel then kills all of it, with or without a
//! PID namespace. io_uring is refused because its operations (sockets among them) bypass
//! this filter.
//!
//! One filter per answer (`seccompiler` gives a filter one match action); each call matches
//! in at most one of them, so their order does not matter.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// The programs to install, in order.
#[derive(Debug, Clone)]
pub struct Filters {
    programs: Vec<BpfProgram>,
}

impl Filters {
    pub fn programs(&self) -> &[BpfProgram] {
        &self.programs
    }
}

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

/// The call numbers a rule covers: the call, and on x86_64 its x32 twin (bit 30 set), which
/// a filter keyed by number would otherwise let through.
fn numbers(nr: libc::c_long) -> Vec<i64> {
    #[cfg(target_arch = "x86_64")]
    return vec![nr, nr | 0x4000_0000];
    #[cfg(not(target_arch = "x86_64"))]
    return vec![nr];
}

fn program(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> BpfProgram {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        ARCH,
    )
    .unwrap_or_else(|e| unreachable!("the sandbox's seccomp rules are well formed: {e}"));
    BpfProgram::try_from(filter)
        .unwrap_or_else(|e| unreachable!("the sandbox's seccomp rules compile: {e}"))
}

/// The filters; `network: false` also refuses every socket but `AF_UNIX`.
pub fn filter(network: bool) -> Filters {
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied_syscalls() {
        for n in numbers(nr) {
            denied.insert(n, Vec::new());
        }
    }
    // clone with any namespace flag (rules are alternatives: one per flag).
    let clone_rules: Vec<SeccompRule> = (0..32)
        .map(|bit| 1u64 << bit)
        .filter(|flag| u64::from(CLONE_NAMESPACES) & flag != 0)
        .map(|flag| {
            SeccompRule::new(vec![
                SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(flag),
                    flag,
                )
                .unwrap_or_else(|e| unreachable!("a one-argument condition: {e}")),
            ])
            .unwrap_or_else(|e| unreachable!("a one-condition rule: {e}"))
        })
        .collect();
    for n in numbers(libc::SYS_clone) {
        denied.insert(n, clone_rules.clone());
    }
    let mut programs = vec![program(denied, libc::EPERM)];
    let mut no_clone3 = BTreeMap::new();
    for n in numbers(libc::SYS_clone3) {
        no_clone3.insert(n, Vec::new());
    }
    programs.push(program(no_clone3, libc::ENOSYS));
    if !network {
        let not_unix = SeccompRule::new(vec![
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )
            .unwrap_or_else(|e| unreachable!("a one-argument condition: {e}")),
        ])
        .unwrap_or_else(|e| unreachable!("a one-condition rule: {e}"));
        let mut sockets = BTreeMap::new();
        for n in numbers(libc::SYS_socket) {
            sockets.insert(n, vec![not_unix.clone()]);
        }
        programs.push(program(sockets, libc::EACCES));
    }
    Filters { programs }
}

/// Install `filters` on the calling thread (`seccompiler` sets no_new_privs first, as the
/// kernel requires of an unprivileged caller). Only system calls: safe between fork and exec.
///
/// # Safety
/// Called between fork and exec: `filters` was built before the fork and is only read.
pub unsafe fn install(filters: &Filters) -> std::io::Result<()> {
    for p in &filters.programs {
        seccompiler::apply_filter(p).map_err(|e| match e {
            seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
            _ => std::io::Error::other("seccomp filter refused"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build_for_both_network_settings() {
        let open = filter(true);
        let closed = filter(false);
        assert_eq!(open.programs().len(), 2, "EPERM and ENOSYS");
        assert_eq!(closed.programs().len(), 3, "and the socket rule");
        for p in open.programs().iter().chain(closed.programs()) {
            assert!(!p.is_empty() && p.len() < 4096, "{}", p.len());
        }
        // Every refused call is in the EPERM program (its number appears as a comparison).
        let eperm = &open.programs()[0];
        for (name, nr) in denied_syscalls() {
            assert!(eperm.iter().any(|i| i.k == nr as u32), "{name} is checked");
        }
    }
}
