//! `SecretStore` on Secrets Manager: one secret per name under the prefix.

use async_trait::async_trait;

use super::{AwsClients, AwsNames, err_code, err_text};
use bus::secrets::{SecretError, SecretStore, validate_name};

pub struct AwsSecrets {
    clients: AwsClients,
    names: AwsNames,
}

impl AwsSecrets {
    pub fn new(clients: AwsClients, names: AwsNames) -> Self {
        Self { clients, names }
    }
}

fn storage(e: impl std::fmt::Display) -> SecretError {
    SecretError::Storage(e.to_string())
}

#[async_trait]
impl SecretStore for AwsSecrets {
    async fn get(&self, name: &str) -> Result<Option<String>, SecretError> {
        validate_name(name)?;
        match self
            .clients
            .secrets
            .get_secret_value()
            .secret_id(self.names.secret_name(name))
            .send()
            .await
        {
            Ok(out) => Ok(out.secret_string().map(str::to_owned)),
            Err(e) if err_code(&e).as_deref() == Some("ResourceNotFoundException") => Ok(None),
            Err(e) => Err(storage(err_text(&e))),
        }
    }

    async fn put(&self, name: &str, value: &str) -> Result<(), SecretError> {
        validate_name(name)?;
        let id = self.names.secret_name(name);
        match self
            .clients
            .secrets
            .put_secret_value()
            .secret_id(&id)
            .secret_string(value)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if err_code(&e).as_deref() == Some("ResourceNotFoundException") => {
                self.clients
                    .secrets
                    .create_secret()
                    .name(&id)
                    .secret_string(value)
                    .send()
                    .await
                    .map_err(|e| storage(err_text(&e)))?;
                Ok(())
            }
            Err(e) => Err(storage(err_text(&e))),
        }
    }

    async fn delete(&self, name: &str) -> Result<bool, SecretError> {
        validate_name(name)?;
        // Emulators acknowledge deleting a missing secret; ask first so the answer is exact.
        if self.get(name).await?.is_none() {
            return Ok(false);
        }
        match self
            .clients
            .secrets
            .delete_secret()
            .secret_id(self.names.secret_name(name))
            .force_delete_without_recovery(true)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if err_code(&e).as_deref() == Some("ResourceNotFoundException") => Ok(false),
            Err(e) => Err(storage(err_text(&e))),
        }
    }

    async fn list(&self) -> Result<Vec<String>, SecretError> {
        let prefix = self.names.secret_name("");
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let mut req = self.clients.secrets.list_secrets();
            if let Some(t) = token.take() {
                req = req.next_token(t);
            }
            let page = req.send().await.map_err(|e| storage(err_text(&e)))?;
            for s in page.secret_list() {
                if let Some(n) = s.name().and_then(|n| n.strip_prefix(&prefix)) {
                    out.push(n.to_string());
                }
            }
            match page.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        out.sort();
        Ok(out)
    }
}
