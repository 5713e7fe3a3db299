//! The secrets port (provider credentials): a 0600 JSON file written by atomic rename when
//! embedded, Secrets Manager on AWS.

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("invalid secret name `{0}`: use 1-200 characters of [A-Za-z0-9/_+=.@-]")]
    InvalidName(String),
    #[error("secret storage error: {0}")]
    Storage(String),
}

pub fn validate_name(name: &str) -> Result<(), SecretError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_+=.@-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SecretError::InvalidName(name.to_string()))
    }
}

#[async_trait]
pub trait SecretStore: Send + Sync {
    async fn get(&self, name: &str) -> Result<Option<String>, SecretError>;
    async fn put(&self, name: &str, value: &str) -> Result<(), SecretError>;
    async fn delete(&self, name: &str) -> Result<bool, SecretError>;
    async fn list(&self) -> Result<Vec<String>, SecretError>;
}

/// Secrets in one JSON object in a file only the owner can read.
pub struct FileSecrets {
    path: PathBuf,
    lock: tokio::sync::Mutex<()>,
}

impl FileSecrets {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    fn read_all(&self) -> Result<BTreeMap<String, String>, SecretError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                SecretError::Storage(format!("{} is not valid JSON: {e}", self.path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(SecretError::Storage(e.to_string())),
        }
    }

    fn write_all(&self, all: &BTreeMap<String, String>) -> Result<(), SecretError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let storage = |e: std::io::Error| SecretError::Storage(e.to_string());
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(storage)?;
        }
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            // A symlink planted at the temporary name must not redirect the write.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(storage)?;
        let body =
            serde_json::to_vec_pretty(all).map_err(|e| SecretError::Storage(e.to_string()))?;
        f.write_all(&body).map_err(storage)?;
        f.sync_all().map_err(storage)?;
        std::fs::rename(&tmp, &self.path).map_err(storage)?;
        // The rename is durable only once the directory is.
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(storage)
    }
}

#[async_trait]
impl SecretStore for FileSecrets {
    async fn get(&self, name: &str) -> Result<Option<String>, SecretError> {
        validate_name(name)?;
        let _g = self.lock.lock().await;
        Ok(self.read_all()?.get(name).cloned())
    }
    async fn put(&self, name: &str, value: &str) -> Result<(), SecretError> {
        validate_name(name)?;
        let _g = self.lock.lock().await;
        let mut all = self.read_all()?;
        all.insert(name.to_string(), value.to_string());
        self.write_all(&all)
    }
    async fn delete(&self, name: &str) -> Result<bool, SecretError> {
        validate_name(name)?;
        let _g = self.lock.lock().await;
        let mut all = self.read_all()?;
        let existed = all.remove(name).is_some();
        if existed {
            self.write_all(&all)?;
        }
        Ok(existed)
    }
    async fn list(&self) -> Result<Vec<String>, SecretError> {
        let _g = self.lock.lock().await;
        Ok(self.read_all()?.into_keys().collect())
    }
}

/// A secret store still being built (the AWS clients and their root certificates, off the
/// start-up path: `crate::prewarm`); every call waits for it.
pub struct StartedSecrets(pub crate::prewarm::Started<std::sync::Arc<dyn SecretStore>>);

impl StartedSecrets {
    async fn store(&self) -> Result<std::sync::Arc<dyn SecretStore>, SecretError> {
        self.0.clone().await.map_err(SecretError::Storage)
    }
}

#[async_trait]
impl SecretStore for StartedSecrets {
    async fn get(&self, name: &str) -> Result<Option<String>, SecretError> {
        self.store().await?.get(name).await
    }
    async fn put(&self, name: &str, value: &str) -> Result<(), SecretError> {
        self.store().await?.put(name, value).await
    }
    async fn delete(&self, name: &str) -> Result<bool, SecretError> {
        self.store().await?.delete(name).await
    }
    async fn list(&self) -> Result<Vec<String>, SecretError> {
        self.store().await?.list().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn file_secrets_are_private_and_atomic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.json");
        let s = FileSecrets::new(path.clone());
        assert_eq!(s.get("providers/openai").await.unwrap(), None);
        s.put("providers/openai", "sk-1").await.unwrap();
        s.put("providers/anthropic", "sk-2").await.unwrap();
        assert_eq!(
            s.get("providers/openai").await.unwrap().as_deref(),
            Some("sk-1")
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(s.delete("providers/openai").await.unwrap());
        assert_eq!(
            s.list().await.unwrap(),
            vec!["providers/anthropic".to_string()]
        );
        assert!(matches!(
            s.put("bad name", "x").await,
            Err(SecretError::InvalidName(_))
        ));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp files left behind");
    }
}
