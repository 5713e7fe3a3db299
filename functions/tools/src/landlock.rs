//! Landlock, through the `landlock` crate its maintainers keep: the filesystem layer where
//! bubblewrap cannot make namespaces (not installed, or user namespaces are off). The
//! ruleset is built once, when the sandbox is probed; each command gets a duplicate of its
//! descriptor before the fork and only calls `landlock_restrict_self` with it between fork
//! and exec (no allocation there: the crate's `restrict_self` makes two system calls).
//!
//! A command then reaches the working directory and a private temporary directory
//! (read-write), the system directories (read and execute), four device nodes, and nothing
//! else: not the data dir, the rules, `/proc` or the home directory. From ABI 6 on, the
//! command may not signal processes outside its domain nor reach abstract Unix sockets.

use landlock::{
    ABI, Access as _, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope,
};
use std::path::Path;

/// The ABI version this kernel speaks; `None` when Landlock is absent or disabled. (The
/// crate adapts to the kernel without saying which ABI it found; the report names it.)
pub fn abi() -> Option<u32> {
    // SAFETY: the version query takes no attribute pointer.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    (v > 0).then_some(v as u32)
}

fn err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// A ready ruleset: apply it with [`Ruleset::restrict_self`] in the child.
pub struct Ruleset {
    created: RulesetCreated,
    /// Whether signals and abstract sockets are scoped to the command (ABI 6).
    pub scoped: bool,
    pub abi: u32,
}

impl std::fmt::Debug for Ruleset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Ruleset {{ abi: {}, scoped: {} }}",
            self.abi, self.scoped
        )
    }
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

/// The rights `access` grants on a directory or a file, for this ABI.
pub fn rights(abi: ABI, access: &Access, is_dir: bool) -> BitFlags<AccessFs> {
    match access {
        Access::ReadWrite if is_dir => AccessFs::from_all(abi),
        Access::ReadExecute if is_dir => AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir,
        Access::ReadExecute => AccessFs::Execute | AccessFs::ReadFile,
        Access::ReadWrite | Access::ReadWriteFile => {
            AccessFs::from_file(abi) & !BitFlags::from(AccessFs::Execute)
        }
    }
}

fn kernel_abi() -> std::io::Result<(u32, ABI)> {
    let n = abi().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "Landlock is not enabled in this kernel",
        )
    })?;
    Ok((n, ABI::from(n as i32)))
}

impl Ruleset {
    /// A ruleset that handles every right this kernel knows and grants `paths` theirs. A
    /// path that does not exist is left out (a missing `/lib64`, say); any other failure is
    /// an error. Everything handled must be enforced (the crate's hard requirement).
    pub fn new(paths: &[(&Path, Access)]) -> std::io::Result<Ruleset> {
        let (n, abi) = kernel_abi()?;
        let scoped = n >= 6;
        let mut ruleset = landlock::Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .map_err(err)?;
        if scoped {
            ruleset = ruleset
                .scope(Scope::AbstractUnixSocket | Scope::Signal)
                .map_err(err)?;
        }
        let mut created = ruleset.create().map_err(err)?;
        for (path, access) in paths {
            let fd = match PathFd::new(path) {
                Ok(fd) => fd,
                Err(_) if !path.exists() => continue,
                Err(e) => return Err(err(e)),
            };
            let is_dir = std::fs::metadata(path)?.is_dir();
            created = created
                .add_rule(PathBeneath::new(fd, rights(abi, access, is_dir)))
                .map_err(|e| err(format!("landlock rule for {}: {e}", path.display())))?;
        }
        Ok(Ruleset {
            created,
            scoped,
            abi: n,
        })
    }

    /// A ruleset that handles no filesystem right, only the scopes: a command confined by it
    /// may not signal, `ptrace` or read the `/proc` files of processes outside its own
    /// domain. Needs ABI 6.
    pub fn scope_only() -> std::io::Result<Ruleset> {
        let n = abi().unwrap_or(0);
        if n < 6 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!("Landlock ABI {n}, scopes need 6"),
            ));
        }
        let created = landlock::Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(err)?
            .create()
            .map_err(err)?;
        Ok(Ruleset {
            created,
            scoped: true,
            abi: n,
        })
    }

    /// A handle for one command, taken before the fork (a duplicated descriptor).
    pub fn for_command(&self) -> std::io::Result<RulesetCreated> {
        self.created.try_clone()
    }
}

/// Confine the calling thread (and what it executes) with `ruleset`. Only system calls: safe
/// between fork and exec.
pub fn restrict_self(ruleset: RulesetCreated) -> std::io::Result<()> {
    match ruleset.restrict_self() {
        Ok(_) => Ok(()),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_grow_with_the_abi() {
        let all3 = rights(ABI::V3, &Access::ReadWrite, true);
        let all2 = rights(ABI::V2, &Access::ReadWrite, true);
        assert!(all3.contains(AccessFs::Truncate) && !all2.contains(AccessFs::Truncate));
        let file = rights(ABI::V5, &Access::ReadWriteFile, false);
        assert!(
            !file.contains(AccessFs::ReadDir) && !file.contains(AccessFs::Execute),
            "no directory rights, no execution on a file: {file:?}"
        );
        assert!(file.contains(AccessFs::WriteFile) && file.contains(AccessFs::IoctlDev));
    }
}
