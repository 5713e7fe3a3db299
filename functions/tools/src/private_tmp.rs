//! The private `/tmp` of a Landlock sandbox: `harness-sandbox-<pid>-<n>` under the system's
//! temporary directory, removed when the sandbox goes. A process killed before that (a Lambda
//! process stopped with SIGKILL, a crash) leaves its directories behind, so each new one
//! first removes those of processes that no longer run: they do not pile up, and a later
//! process given the same pid never finds its name taken.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const PREFIX: &str = "harness-sandbox-";

static NEXT: AtomicU64 = AtomicU64::new(0);

pub(crate) struct PrivateTmp(pub(crate) PathBuf);

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl PrivateTmp {
    /// A new directory for this process (mode 0700), after sweeping the dead ones.
    pub(crate) fn create() -> std::io::Result<PrivateTmp> {
        let base = std::env::temp_dir();
        sweep_dead(&base, |pid| Path::new(&format!("/proc/{pid}")).exists());
        let dir = base.join(format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)?;
        let tmp = PrivateTmp(dir);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o700))?;
        Ok(tmp)
    }
}

/// Remove the sandbox directories under `base` whose process (`alive(pid)` false) is gone;
/// → how many. Best effort: one that cannot be removed is left.
pub(crate) fn sweep_dead(base: &Path, alive: impl Fn(u32) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !alive(pid) && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_of_gone_processes_are_swept_and_no_other() {
        let base = tempfile::tempdir().unwrap();
        let me = std::process::id();
        for name in [
            format!("{PREFIX}7-0"),
            format!("{PREFIX}7-1"),
            format!("{PREFIX}8-0"),
            format!("{PREFIX}{me}-0"),
            format!("{PREFIX}x-0"),
            "something-else-7-0".to_string(),
        ] {
            std::fs::create_dir(base.path().join(name)).unwrap();
        }
        std::fs::write(base.path().join(format!("{PREFIX}7-0/file")), "left").unwrap();
        // Process 7 is gone, 8 still runs.
        assert_eq!(sweep_dead(base.path(), |pid| pid == 8), 2);
        let mut left: Vec<String> = std::fs::read_dir(base.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expected = vec![
            format!("{PREFIX}8-0"),
            format!("{PREFIX}{me}-0"),
            format!("{PREFIX}x-0"),
            "something-else-7-0".to_string(),
        ];
        expected.sort();
        assert_eq!(left, expected);
    }
}
