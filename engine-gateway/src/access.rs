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

use crate::protocol::{ErrorBody, RESERVED_NAMESPACES, codes};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Worker,
    Client,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Worker => "worker",
            Role::Client => "client",
        }
    }
}

/// Namespaces of the agent's tools: reached through the orchestrator's policy gate, never
/// called by a client directly, whatever their registration says.
pub const AGENT_TOOL_NAMESPACES: &[&str] = &["shell::", "fs::"];

/// The streams a client may subscribe to.
pub const CLIENT_STREAMS: &[&str] = &["agent::events"];

/// The metadata flag that makes a function callable by clients.
pub const PUBLIC_FLAG: &str = "public";

/// The metadata flag (`agent: false`) by which a worker declares a function for humans and
/// the harness only: the orchestrator never dispatches it for the model.
pub const AGENT_FLAG: &str = "agent";

/// Whether a registration's metadata keeps the function from the agent.
pub fn is_not_for_the_agent(metadata: Option<&Value>) -> bool {
    metadata
        .and_then(|m| m.get(AGENT_FLAG))
        .and_then(Value::as_bool)
        == Some(false)
}

/// Whether a registration's metadata marks it public.
pub fn is_public(metadata: Option<&Value>) -> bool {
    metadata
        .and_then(|m| m.get(PUBLIC_FLAG))
        .and_then(Value::as_bool)
        == Some(true)
}

/// An authenticated connection: a name for logs, a role, and (workers) granted namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// Namespaces without the `::` (`policy`, `shell`).
    pub namespaces: Vec<String>,
    /// A client that sees and decides for every session (`sessions: all`: an operator).
    pub sessions_all: bool,
}

/// The baggage entry that says on whose behalf a call is made (`<role>:<name>`, role one of
/// `admin`, `worker`, `operator`, `client`). The engine writes it for every call a client
/// makes (whatever the client sent) and for any call that comes without one; workers pass it
/// on, so a turn's steps act for whoever started the run.
pub const ACTING_BAGGAGE: &str = "iii.principal";

/// Who a call is made for, as read from [`ACTING_BAGGAGE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acting {
    pub role: String,
    pub name: String,
}

impl Acting {
    pub fn parse(value: &str) -> Option<Acting> {
        let (role, name) = value.split_once(':')?;
        matches!(role, "admin" | "worker" | "operator" | "client").then(|| Acting {
            role: role.to_string(),
            name: name.to_string(),
        })
    }

    /// What the baggage carries.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.role, self.name)
    }

    /// Admin, workers and operators see every session; a client only its own.
    pub fn sees_all(&self) -> bool {
        self.role != "client"
    }

    /// Whether this is the owner recorded as `owner` (`{name, role}`).
    pub fn is(&self, owner: &Value) -> bool {
        let role = match owner["role"].as_str() {
            Some("operator") => "client",
            Some(r) => r,
            None => return false,
        };
        let mine = if self.role == "operator" {
            "client"
        } else {
            self.role.as_str()
        };
        owner["name"].as_str() == Some(self.name.as_str()) && role == mine
    }

    /// The owner record a session started by this caller gets.
    pub fn owner_record(&self) -> Value {
        serde_json::json!({"name": self.name, "role": self.role})
    }

    /// Whether this caller may see a session owned by `owner` (`null`: no recorded owner,
    /// which only those who see all may see).
    pub fn may_see(&self, owner: &Value) -> bool {
        self.sees_all() || self.is(owner)
    }
}

/// Who `trace`'s call is made for; `None` when nobody said (an in-process caller of the
/// harness itself, trusted).
pub fn acting(trace: &crate::trace::TraceContext) -> Option<Acting> {
    trace.baggage_get(ACTING_BAGGAGE).and_then(Acting::parse)
}

fn namespace_of(id: &str) -> &str {
    id.split_once("::").map(|(ns, _)| ns).unwrap_or(id)
}

fn forbidden(message: String) -> ErrorBody {
    ErrorBody::new(codes::FORBIDDEN, message)
}

impl Principal {
    pub fn admin() -> Self {
        Principal {
            name: "admin".into(),
            role: Role::Admin,
            namespaces: Vec::new(),
            sessions_all: false,
        }
    }

    /// Who this credential acts as on a call.
    pub fn acting(&self) -> Acting {
        let role = match self.role {
            Role::Client if self.sessions_all => "operator",
            r => r.as_str(),
        };
        Acting {
            role: role.to_string(),
            name: self.name.clone(),
        }
    }

    /// [`Principal::stamp`] on a `baggage` header.
    pub fn stamp_baggage(&self, baggage: Option<&str>) -> Option<String> {
        let mut trace = crate::trace::TraceContext::default();
        if let Some(b) = baggage {
            trace.baggage = crate::telemetry::extract_baggage(b);
        }
        self.stamp(trace).baggage_header()
    }

    /// The trace context a call by this credential goes on with: a client's own identity,
    /// whatever it sent; anyone else's passes on who it acts for, or says itself.
    pub fn stamp(&self, mut trace: crate::trace::TraceContext) -> crate::trace::TraceContext {
        let keep = self.role != Role::Client && acting(&trace).is_some();
        if !keep {
            trace = trace.with_baggage(ACTING_BAGGAGE, &self.acting().encode());
        }
        trace
    }

    fn label(&self) -> String {
        format!("{} `{}`", self.role.as_str(), self.name)
    }

    fn granted(&self, id: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Worker => {
                let ns = namespace_of(id);
                id.contains("::") && self.namespaces.iter().any(|g| g == ns)
            }
            Role::Client => false,
        }
    }

    /// May this credential register (or replace) function `id`? `what` names the kind for
    /// the error (`function`, `trigger`).
    pub fn may_register(&self, what: &str, id: &str) -> Result<(), ErrorBody> {
        if self.granted(id) {
            return Ok(());
        }
        Err(forbidden(match self.role {
            Role::Client => format!(
                "{} may not register {what}s (`{id}`): clients only call public functions",
                self.label()
            ),
            _ => format!(
                "{} is not granted namespace `{}` and may not register {what} `{id}`",
                self.label(),
                namespace_of(id)
            ),
        }))
    }

    /// May this credential call `function_id`, registered public or not?
    pub fn may_call(&self, function_id: &str, public: bool) -> Result<(), ErrorBody> {
        if self.role != Role::Client {
            return Ok(());
        }
        if AGENT_TOOL_NAMESPACES
            .iter()
            .any(|ns| function_id.starts_with(ns))
        {
            return Err(forbidden(format!(
                "`{function_id}` is an agent tool: {} may not call it (tools run through the orchestrator's policy gate)",
                self.label()
            )));
        }
        if public {
            return Ok(());
        }
        Err(forbidden(format!(
            "`{function_id}` is not public: {} may call only functions registered as public",
            self.label()
        )))
    }

    /// May this credential subscribe to `stream_name`?
    pub fn may_subscribe(&self, stream_name: &str) -> Result<(), ErrorBody> {
        if self.role != Role::Client || CLIENT_STREAMS.contains(&stream_name) {
            return Ok(());
        }
        Err(forbidden(format!(
            "{} may subscribe only to {}, not `{stream_name}`",
            self.label(),
            CLIENT_STREAMS.join(", ")
        )))
    }
}

/// Hex SHA-256 of a token: what the access file stores.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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
