//! Paths the agent gives are resolved inside the working directory or refused: no absolute
//! path outside it, no `..` past its root, no symlink leading out of it.

use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PathError {
    #[error("`{0}` is outside the working directory")]
    Outside(String),
    #[error("`{0}`: {1}")]
    Io(String, String),
}

/// The canonical path for `requested` under `root` (which must itself be canonical). The
/// target need not exist; its nearest existing ancestor must be inside `root`.
pub fn resolve(root: &Path, requested: &str) -> Result<PathBuf, PathError> {
    let outside = || PathError::Outside(requested.to_string());
    let req = Path::new(requested);
    let relative = if req.is_absolute() {
        req.strip_prefix(root).map_err(|_| outside())?.to_path_buf()
    } else {
        req.to_path_buf()
    };
    // Lexical normalisation first: `..` may not climb above the root.
    let mut normal = PathBuf::new();
    for c in relative.components() {
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
    let joined = root.join(&normal);
    // Then follow symlinks of whatever exists and check again.
    let mut existing = joined.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return Err(outside()),
        }
    }
    let mut real = existing
        .canonicalize()
        .map_err(|e| PathError::Io(requested.to_string(), e.to_string()))?;
    if !real.starts_with(root) {
        return Err(outside());
    }
    for name in rest.into_iter().rev() {
        real.push(name);
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        assert_eq!(resolve(&root, "sub/../a.txt").unwrap(), root.join("a.txt"));
        assert_eq!(
            resolve(&root, "new/dir/file").unwrap(),
            root.join("new/dir/file")
        );
        assert!(matches!(
            resolve(&root, "../etc/passwd"),
            Err(PathError::Outside(_))
        ));
        assert!(matches!(
            resolve(&root, "sub/../../x"),
            Err(PathError::Outside(_))
        ));
        assert!(matches!(
            resolve(&root, "/etc/passwd"),
            Err(PathError::Outside(_))
        ));
        assert_eq!(
            resolve(&root, &root.join("sub").display().to_string()).unwrap(),
            root.join("sub")
        );
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        assert!(matches!(
            resolve(&root, "link/passwd"),
            Err(PathError::Outside(_))
        ));
        assert!(matches!(
            resolve(&root, "link/new-file"),
            Err(PathError::Outside(_))
        ));
    }
}
