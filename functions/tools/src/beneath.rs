//! Files opened relative to a directory handle of the session's root, component by
//! component, never through a symlink: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where
//! the kernel has it (5.6+), else a walk of `openat(O_NOFOLLOW)` one component at a time. A
//! symlink swapped in while a call runs cannot move a read or a write outside the root: the
//! kernel resolves every component against the handle, not against a path checked earlier.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::path::{Component, Path, PathBuf};

/// Why a path was refused or could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("`{0}` is outside the working directory")]
    Outside(String),
    #[error("`{0}` goes through a symlink; paths are resolved without following links")]
    Symlink(String),
    #[error("`{0}`: {1}")]
    Io(String, std::io::Error),
}

impl BeneathError {
    /// Refusals (outside, symlink) as opposed to plain I/O failures.
    pub fn refused(&self) -> bool {
        !matches!(self, BeneathError::Io(..))
    }
}

/// `requested` (relative, or absolute under `root`) as a normal relative path: no `..` above
/// the root, no absolute path elsewhere. Empty for the root itself.
pub fn relative(root: &Path, requested: &str) -> Result<PathBuf, BeneathError> {
    let outside = || BeneathError::Outside(requested.to_string());
    let req = Path::new(requested);
    let rel = if req.is_absolute() {
        req.strip_prefix(root).map_err(|_| outside())?
    } else {
        req
    };
    let mut normal = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => normal.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if !normal.pop() {
                    return Err(outside());
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(outside()),
        }
    }
    Ok(normal)
}

fn io_err(requested: &str, e: Errno) -> BeneathError {
    match e {
        // A symlink on the way (RESOLVE_NO_SYMLINKS, or O_NOFOLLOW on a link).
        Errno::LOOP => BeneathError::Symlink(requested.to_string()),
        // RESOLVE_BENEATH refused an escape.
        Errno::XDEV => BeneathError::Outside(requested.to_string()),
        e => BeneathError::Io(requested.to_string(), e.into()),
    }
}

/// Open the root itself as a directory handle.
pub fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Open `rel` (from [`relative`]) beneath `root` with `flags`, following no symlink.
pub fn open<Fd: AsFd>(
    root: Fd,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
    requested: &str,
) -> Result<OwnedFd, BeneathError> {
    let target: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let once = || {
        rustix::fs::openat2(
            root.as_fd(),
            target,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
    };
    // Some kernels answer EAGAIN when a rename raced the lookup: try once more.
    let first = match once() {
        Err(Errno::AGAIN) => once(),
        r => r,
    };
    match first {
        Err(Errno::NOSYS) => walk(root, rel, flags, mode, requested),
        // `O_NOFOLLOW | O_DIRECTORY` on a link answers "not a directory": say it is a link.
        Err(Errno::NOTDIR) if flags.contains(OFlags::DIRECTORY) && is_link(&root, target) => {
            Err(BeneathError::Symlink(requested.to_string()))
        }
        r => r.map_err(|e| io_err(requested, e)),
    }
}

/// Whether `rel` beneath `root` is itself a symlink (for naming a refusal, not for access).
fn is_link<Fd: AsFd>(root: &Fd, rel: &Path) -> bool {
    rustix::fs::statat(root.as_fd(), rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
    })
}

/// The same without `openat2`: one component at a time, each opened `O_NOFOLLOW`.
fn walk<Fd: AsFd>(
    root: Fd,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
    requested: &str,
) -> Result<OwnedFd, BeneathError> {
    let parts: Vec<_> = rel.components().collect();
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat(root.as_fd(), ".", dir_flags, Mode::empty())
        .map_err(|e| io_err(requested, e))?;
    let Some((last, middle)) = parts.split_last() else {
        return rustix::fs::openat(
            root.as_fd(),
            ".",
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            mode,
        )
        .map_err(|e| io_err(requested, e));
    };
    for part in middle {
        dir = rustix::fs::openat(&dir, part.as_os_str(), dir_flags, Mode::empty())
            .map_err(|e| io_err(requested, e))?;
    }
    rustix::fs::openat(
        &dir,
        last.as_os_str(),
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        mode,
    )
    .map_err(|e| io_err(requested, e))
}

/// Open the directory that holds `rel`, creating missing directories on the way (each made
/// and entered beneath the root, never through a link) → (its handle, the file name).
pub fn parent_dir<Fd: AsFd>(
    root: Fd,
    rel: &Path,
    requested: &str,
    owner: Option<u32>,
) -> Result<(OwnedFd, std::ffi::OsString), BeneathError> {
    let name = rel
        .file_name()
        .ok_or_else(|| BeneathError::Outside(requested.to_string()))?
        .to_os_string();
    let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY;
    let mut dir = open(
        root.as_fd(),
        Path::new(""),
        dir_flags,
        Mode::empty(),
        requested,
    )?;
    if let Some(parent) = rel.parent() {
        for part in parent.components() {
            let part = part.as_os_str();
            match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    if let Some(uid) = owner {
                        let uid = rustix::fs::Uid::from_raw(uid);
                        let gid = rustix::fs::Gid::from_raw(uid.as_raw());
                        let _ = rustix::fs::chownat(
                            &dir,
                            part,
                            Some(uid),
                            Some(gid),
                            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                        );
                    }
                }
                Err(Errno::EXIST) => {}
                Err(e) => return Err(io_err(requested, e)),
            }
            dir = open(&dir, Path::new(part), dir_flags, Mode::empty(), requested)?;
        }
    }
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_beneath_the_root_and_links_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("inner")).unwrap();
        let fd = open_root(&root).unwrap();
        let rel = |p: &str| relative(&root, p);
        assert!(matches!(rel("../x"), Err(BeneathError::Outside(_))));
        assert!(matches!(rel("sub/../../x"), Err(BeneathError::Outside(_))));
        assert!(matches!(rel("/etc/passwd"), Err(BeneathError::Outside(_))));
        assert_eq!(rel("sub/./f").unwrap(), PathBuf::from("sub/f"));
        let read =
            |p: &str| open(&fd, &rel(p).unwrap(), OFlags::RDONLY, Mode::empty(), p).map(|_| ());
        read("sub/f").unwrap();
        assert!(matches!(read("link/passwd"), Err(BeneathError::Symlink(_))));
        assert!(matches!(read("inner/f"), Err(BeneathError::Symlink(_))));
        assert!(matches!(read("link"), Err(BeneathError::Symlink(_))));
        // The walk without openat2 refuses the same.
        let walked = |p: &str| walk(&fd, &rel(p).unwrap(), OFlags::RDONLY, Mode::empty(), p);
        walked("sub/f").unwrap();
        assert!(walked("link/passwd").is_err());
        assert!(walked("inner/f").is_err());
        // Parents are made beneath the root; a link on the way is refused.
        let (d, name) = parent_dir(&fd, &rel("a/b/c.txt").unwrap(), "a/b/c.txt", None).unwrap();
        assert_eq!(name, "c.txt");
        drop(d);
        assert!(root.join("a/b").is_dir());
        assert!(parent_dir(&fd, &rel("link/x").unwrap(), "link/x", None).is_err());
        assert!(!Path::new("/etc/x").exists());
    }
}
