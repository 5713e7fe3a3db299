//! Landlock, through its three system calls: the filesystem layer where bubblewrap cannot make
//! namespaces (not installed, or user namespaces are off). The ruleset is built once, when the
//! sandbox is probed, and each command only calls `landlock_restrict_self` on it between fork
//! and exec, which needs no allocation (a crate's builder would allocate there).
//!
//! A command then reaches the working directory and a private temporary directory
//! (read-write), the system directories (read and execute), four device nodes, and nothing
//! else: not the data dir, the rules, `/proc` or the home directory. From ABI 6 on, the
//! command may not signal processes outside its domain nor reach abstract Unix sockets.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;

// Filesystem rights, by the ABI that introduced them.
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_ABI1_ALL: u64 = (1 << 13) - 1;
const FS_REFER: u64 = 1 << 13; // ABI 2
const FS_TRUNCATE: u64 = 1 << 14; // ABI 3
const FS_IOCTL_DEV: u64 = 1 << 15; // ABI 5
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0; // ABI 6
const SCOPE_SIGNAL: u64 = 1 << 1; // ABI 6

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The ABI version this kernel speaks; `None` when Landlock is absent or disabled.
pub fn abi() -> Option<u32> {
    // SAFETY: the version query takes no attribute pointer.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as u32)
}

/// Every filesystem right this ABI knows (all of them are handled, so what is not granted
/// is denied).
fn fs_rights(abi: u32) -> u64 {
    let mut all = FS_ABI1_ALL;
    if abi >= 2 {
        all |= FS_REFER;
    }
    if abi >= 3 {
        all |= FS_TRUNCATE;
    }
    if abi >= 5 {
        all |= FS_IOCTL_DEV;
    }
    all
}

/// The rights that make sense on a file (not a directory) rule.
fn file_rights(abi: u32) -> u64 {
    let mut r = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE;
    if abi >= 3 {
        r |= FS_TRUNCATE;
    }
    if abi >= 5 {
        r |= FS_IOCTL_DEV;
    }
    r
}

/// `landlock_create_ruleset` for `attr`.
fn create(attr: &RulesetAttr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a live struct of the size passed; older kernels accept the larger
    // struct as long as the fields they do not know are zero.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A ready ruleset: apply it with [`Ruleset::restrict_self`] in the child.
#[derive(Debug)]
pub struct Ruleset {
    fd: OwnedFd,
    /// Whether signals and abstract sockets are scoped to the command (ABI 6).
    pub scoped: bool,
    pub abi: u32,
}

/// How much a path may be used.
pub enum Access {
    /// Read, list and execute.
    ReadExecute,
    /// Everything.
    ReadWrite,
    /// Read and write an existing file (device nodes).
    ReadWriteFile,
}

impl Ruleset {
    /// A ruleset that handles every right and grants `paths` theirs. A path that does not
    /// exist is left out (a missing `/lib64`, say); any other failure is an error.
    pub fn new(paths: &[(&Path, Access)]) -> std::io::Result<Ruleset> {
        let abi = abi().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "Landlock is not enabled in this kernel",
            )
        })?;
        let scoped = abi >= 6;
        let fd = create(&RulesetAttr {
            handled_access_fs: fs_rights(abi),
            handled_access_net: 0,
            scoped: if scoped {
                SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
            } else {
                0
            },
        })?;
        let set = Ruleset { fd, scoped, abi };
        for (path, access) in paths {
            set.grant(path, access)?;
        }
        Ok(set)
    }

    /// A ruleset that handles no filesystem right, only the scopes: a command confined by it
    /// may not signal, `ptrace` or read the `/proc` files of processes outside its own
    /// domain. Needs ABI 6.
    pub fn scope_only() -> std::io::Result<Ruleset> {
        let abi = abi().unwrap_or(0);
        if abi < 6 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!("Landlock ABI {abi}, scopes need 6"),
            ));
        }
        let fd = create(&RulesetAttr {
            handled_access_fs: 0,
            handled_access_net: 0,
            scoped: SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
        })?;
        Ok(Ruleset {
            fd,
            scoped: true,
            abi,
        })
    }

    fn grant(&self, path: &Path, access: &Access) -> std::io::Result<()> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
        // SAFETY: a NUL-terminated path; O_PATH opens nothing but a reference.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::NotFound {
                return Ok(());
            }
            return Err(e);
        }
        // SAFETY: just opened, owned here.
        let parent = unsafe { OwnedFd::from_raw_fd(raw) };
        let is_dir = std::fs::metadata(path)?.is_dir();
        let all = fs_rights(self.abi);
        let allowed = match access {
            Access::ReadWrite if is_dir => all,
            Access::ReadExecute if is_dir => FS_EXECUTE | FS_READ_FILE | FS_READ_DIR,
            Access::ReadExecute => FS_EXECUTE | FS_READ_FILE,
            Access::ReadWrite | Access::ReadWriteFile => file_rights(self.abi) & !FS_EXECUTE,
        };
        let rule = PathBeneathAttr {
            allowed_access: allowed,
            parent_fd: parent.as_raw_fd(),
        };
        // SAFETY: `rule` is a live, packed path-beneath attribute.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_PATH_BENEATH,
                &rule as *const PathBeneathAttr,
                0u32,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("landlock rule for {}: {e}", path.display()),
            ));
        }
        Ok(())
    }

    /// Confine the calling thread (and what it executes). `no_new_privs` must be set first.
    /// Only a system call: safe between fork and exec.
    pub fn restrict_self(&self) -> std::io::Result<()> {
        // SAFETY: a plain system call on a descriptor this struct owns.
        let rc =
            unsafe { libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), 0u32) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_grow_with_the_abi() {
        assert_eq!(fs_rights(1), FS_ABI1_ALL);
        assert!(fs_rights(3) & FS_TRUNCATE != 0 && fs_rights(2) & FS_TRUNCATE == 0);
        assert_eq!(
            file_rights(1) & FS_READ_DIR,
            0,
            "no directory rights on a file"
        );
        assert_eq!(
            std::mem::size_of::<PathBeneathAttr>(),
            12,
            "packed as the kernel's"
        );
    }
}
