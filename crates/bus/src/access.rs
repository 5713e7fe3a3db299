//! Who may do what on the bus. Every credential carries a role, and every backend (the
//! WebSocket engine, the embedded one, the AWS router) asks the same [`Principal`] the same
//! questions before it registers, calls or subscribes.
//!
//! - **admin**: the engine token (`ENGINE_TOKEN` or the generated one). Everything.
//! - **worker**: registers functions and triggers in the namespaces it is granted, and calls
//!   anything. Replacing a live layer (`policy::check_permissions`) needs the `policy` grant.
//! - **client** (browsers, CLIs, Slack): calls only functions registered as public
//!   (`metadata.public = true`), never an agent tool, registers nothing, and subscribes to
//!   `agent::events` only.
//!
//! The access file (`--access <file>`, YAML) lists the worker and client credentials; it
//! stores SHA-256 hashes of the tokens, never the tokens (`engine-gateway hash-token`).

pub use crate::principal::*;
use crate::protocol::RESERVED_NAMESPACES;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::Path;

/// Hex SHA-256 of a token: what the access file stores.
pub fn hash_token(token: &str) -> String {
    crate::hash::hex(&Sha256::digest(token.as_bytes()))
}

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("cannot read access file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("access file is not valid: {0}")]
    Parse(String),
    #[error("access file, credential `{name}`: {why}")]
    Credential { name: String, why: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessFile {
    #[serde(default)]
    credentials: Vec<CredentialEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialEntry {
    name: String,
    role: Role,
    token_sha256: String,
    #[serde(default)]
    namespaces: Vec<String>,
    /// `all`: a client that sees and decides for every session (an operator); `own` (the
    /// default): only the sessions it started.
    #[serde(default)]
    sessions: Option<SessionsScope>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum SessionsScope {
    Own,
    All,
}

/// The credentials `$connect` accepts: the admin token, the access file's entries, and the
/// session tokens the engine issued at sign-in (shared by every clone).
#[derive(Debug, Clone, Default)]
pub struct Access {
    admin_token: Option<String>,
    /// (SHA-256 of the token, who it is)
    credentials: Vec<([u8; 32], Principal)>,
    issued: std::sync::Arc<crate::sign_in::IssuedTokens>,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Access {
    /// Only the admin token (`None`: nobody is asked for one: tests and in-process use).
    pub fn admin_only(admin_token: Option<String>) -> Self {
        Access {
            admin_token: admin_token.filter(|t| !t.is_empty()),
            credentials: Vec::new(),
            issued: Default::default(),
        }
    }

    /// One-time sign-in codes and the session tokens issued for them.
    pub fn issued(&self) -> &crate::sign_in::IssuedTokens {
        &self.issued
    }

    /// Whether `$connect` asks for a credential at all.
    pub fn required(&self) -> bool {
        self.admin_token.is_some() || !self.credentials.is_empty()
    }

    pub fn credential_count(&self) -> usize {
        self.credentials.len()
    }

    /// Add the credentials of an access file's text.
    pub fn with_file_text(mut self, text: &str) -> Result<Self, AccessError> {
        let file: AccessFile =
            serde_norway::from_str(text).map_err(|e| AccessError::Parse(e.to_string()))?;
        for c in file.credentials {
            let bad = |why: String| AccessError::Credential {
                name: c.name.clone(),
                why,
            };
            if c.name.trim().is_empty() {
                return Err(AccessError::Parse(
                    "a credential has an empty `name`".into(),
                ));
            }
            let hash = parse_hex32(&c.token_sha256).ok_or_else(|| {
                bad(
                    "`token_sha256` must be 64 hex digits (engine-gateway hash-token <token>)"
                        .into(),
                )
            })?;
            if self.credentials.iter().any(|(h, _)| *h == hash) {
                return Err(bad("the same token is listed twice".into()));
            }
            let mut namespaces = Vec::new();
            for ns in &c.namespaces {
                let ns = ns.trim().trim_end_matches("::").to_string();
                if ns.is_empty() || ns.contains("::") || ns.contains('*') {
                    return Err(bad(format!(
                        "namespace `{ns}` must be a single name such as `policy` (no `::`, no wildcard; use the admin token for everything)"
                    )));
                }
                if RESERVED_NAMESPACES
                    .iter()
                    .any(|r| r.trim_end_matches("::") == ns)
                {
                    return Err(bad(format!(
                        "namespace `{ns}` belongs to the engine and cannot be granted"
                    )));
                }
                namespaces.push(ns);
            }
            match c.role {
                Role::Worker if namespaces.is_empty() => {
                    return Err(bad("a worker needs at least one namespace".into()));
                }
                Role::Client | Role::Admin if !namespaces.is_empty() => {
                    return Err(bad(format!(
                        "namespaces are granted to workers only, not to a {}",
                        c.role.as_str()
                    )));
                }
                _ => {}
            }
            if c.sessions.is_some() && c.role != Role::Client {
                return Err(bad(format!(
                    "`sessions` is set for clients only; a {} sees every session",
                    c.role.as_str()
                )));
            }
            self.credentials.push((
                hash,
                Principal {
                    name: c.name,
                    role: c.role,
                    namespaces,
                    sessions_all: c.sessions == Some(SessionsScope::All),
                },
            ));
        }
        Ok(self)
    }

    /// Add the credentials of an access file.
    pub fn with_file(self, path: &Path) -> Result<Self, AccessError> {
        let text = std::fs::read_to_string(path).map_err(|source| AccessError::Read {
            path: path.display().to_string(),
            source,
        })?;
        self.with_file_text(&text)
    }

    /// A presented token → who it is; `None`: refuse the connection. With no credential
    /// configured at all, everyone is admin (in-process and test engines).
    pub fn authenticate(&self, presented: Option<&str>) -> Option<Principal> {
        if !self.required() {
            return Some(Principal::admin());
        }
        let presented = presented?;
        if let Some(p) = self.issued.session(presented) {
            return Some(p);
        }
        self.authenticate_credential(presented)
    }

    /// Like [`Access::authenticate`], but only the engine token and the access file's
    /// credentials count, never a session token the engine issued: what may sign in (a
    /// session token minting another would outlive signing the first out).
    pub fn authenticate_credential(&self, presented: &str) -> Option<Principal> {
        if !self.required() {
            return Some(Principal::admin());
        }
        if let Some(admin) = &self.admin_token
            && constant_time_eq(presented.as_bytes(), admin.as_bytes())
        {
            return Some(Principal::admin());
        }
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.credentials
            .iter()
            .find(|(h, _)| constant_time_eq(h, &digest))
            .map(|(_, p)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> Access {
        let yaml = format!(
            "credentials:\n  - name: tools\n    role: worker\n    token_sha256: {}\n    namespaces: [shell, 'fs::']\n  - name: console\n    role: client\n    token_sha256: {}\n",
            hash_token("w-token"),
            hash_token("c-token")
        );
        Access::admin_only(Some("admin".into()))
            .with_file_text(&yaml)
            .unwrap()
    }

    #[test]
    fn tokens_map_to_roles() {
        let a = access();
        assert_eq!(a.authenticate(Some("admin")).unwrap().role, Role::Admin);
        let w = a.authenticate(Some("w-token")).unwrap();
        assert_eq!(
            (w.role, w.namespaces.clone()),
            (Role::Worker, vec!["shell".into(), "fs".into()])
        );
        assert_eq!(a.authenticate(Some("c-token")).unwrap().role, Role::Client);
        assert!(a.authenticate(Some("nope")).is_none());
        assert!(a.authenticate(None).is_none());
        assert_eq!(
            Access::default().authenticate(None).unwrap().role,
            Role::Admin
        );
    }

    #[test]
    fn grants_and_public_functions() {
        let a = access();
        let w = a.authenticate(Some("w-token")).unwrap();
        w.may_register("function", "shell::exec").unwrap();
        let e = w
            .may_register("function", "policy::check_permissions")
            .unwrap_err();
        assert!(e.message.contains("namespace `policy`"), "{}", e.message);
        assert!(w.may_register("function", "shellfish").is_err());
        let c = a.authenticate(Some("c-token")).unwrap();
        assert!(c.may_register("function", "ui::x").is_err());
        c.may_call("approval::resolve", true).unwrap();
        let e = c.may_call("state::get", false).unwrap_err();
        assert!(
            e.message.contains("`state::get` is not public")
                && e.message.contains("client `console`")
        );
        assert!(
            c.may_call("shell::exec", true)
                .unwrap_err()
                .message
                .contains("agent tool")
        );
        c.may_subscribe("agent::events").unwrap();
        assert!(c.may_subscribe("secrets").is_err());
        w.may_call("shell::exec", false).unwrap();
    }

    #[test]
    fn bad_files_name_the_problem() {
        let bad = |y: &str| Access::default().with_file_text(y).unwrap_err().to_string();
        assert!(
            bad("credentials:\n  - name: x\n    role: worker\n    token_sha256: abc\n")
                .contains("64 hex digits")
        );
        let h = hash_token("t");
        assert!(
            bad(&format!(
                "credentials:\n  - name: x\n    role: worker\n    token_sha256: {h}\n"
            ))
            .contains("at least one namespace")
        );
        assert!(bad(&format!("credentials:\n  - name: x\n    role: worker\n    token_sha256: {h}\n    namespaces: [engine]\n")).contains("belongs to the engine"));
        assert!(bad(&format!("credentials:\n  - name: x\n    role: client\n    token_sha256: {h}\n    namespaces: [ui]\n")).contains("workers only"));
        assert!(bad("credentials:\n  - name: x\n    role: root\n").contains("not valid"));
        assert!(bad("creds: []\n").contains("not valid"));
    }
}
