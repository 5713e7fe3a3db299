//! One `mcp_servers:` entry of `harness.yaml`, checked before anything starts.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

/// A call's deadline when the entry names none.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// The most of a tool's description that reaches the catalogue (and the model).
pub const DEFAULT_MAX_DESCRIPTION_BYTES: u64 = 8 * 1024;
/// The most of a tool's result that goes on to the model.
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 1024 * 1024;
/// The longest server name: `mcp::<server>::<tool>` must fit the engine's 256 characters.
pub const MAX_SERVER_NAME: usize = 48;
/// What a stdio server is given besides its `env`.
pub const PASSED_VARIABLES: &[&str] = &["PATH", "HOME", "LANG"];

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Its tools register as `mcp::<name>::<tool>`: 1-48 characters of `a-z A-Z 0-9 _ -`.
    pub name: String,
    /// A stdio server: the program and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Only these reach a stdio server, with `PATH`, `HOME` and `LANG`. A value may be
    /// `${secret:<name>}` (read through `auth::get_token`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A stdio server's working directory; default: the agent's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// A streamable HTTP server's endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Sent with every HTTP request; a value may be `${secret:<name>}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// One call's deadline (default 60 s); the call is cancelled on the server after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<NonZeroU64>,
    /// Whether the tools' annotations (`readOnlyHint`…) count for the policy. Default: true
    /// for a stdio server (the user chose the program), false for a `url` server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_annotations: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_description_bytes: Option<NonZeroU64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_result_bytes: Option<NonZeroU64>,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport<'a> {
    Stdio(&'a [String]),
    Http(&'a str),
}

impl ServerConfig {
    pub fn transport(&self) -> Transport<'_> {
        match (&self.command, &self.url) {
            (Some(c), _) => Transport::Stdio(c),
            (None, Some(u)) => Transport::Http(u),
            (None, None) => Transport::Stdio(&[]),
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(
            self.timeout_secs
                .map_or(DEFAULT_TIMEOUT_SECS, NonZeroU64::get),
        )
    }

    pub fn trusts_annotations(&self) -> bool {
        self.trust_annotations
            .unwrap_or(matches!(self.transport(), Transport::Stdio(_)))
    }

    pub fn max_description_bytes(&self) -> usize {
        self.max_description_bytes
            .map_or(DEFAULT_MAX_DESCRIPTION_BYTES, NonZeroU64::get) as usize
    }

    pub fn max_result_bytes(&self) -> usize {
        self.max_result_bytes
            .map_or(DEFAULT_MAX_RESULT_BYTES, NonZeroU64::get) as usize
    }

    /// What serde cannot say. The message names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty()
            || self.name.len() > MAX_SERVER_NAME
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "name: `{}` is not a server name (1-{MAX_SERVER_NAME} characters of a-z A-Z 0-9 _ -)",
                self.name.escape_debug()
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(
                    "give either `command` (a stdio server) or `url` (streamable HTTP), not both"
                        .into(),
                );
            }
            (None, None) => {
                return Err("give `command` (a stdio server) or `url` (streamable HTTP)".into());
            }
            (Some(c), None) => {
                if c.is_empty() || c[0].is_empty() {
                    return Err("command: must name a program".into());
                }
                if c.iter().any(|a| a.contains('\0')) {
                    return Err("command: an argument holds a NUL character".into());
                }
                if !self.headers.is_empty() {
                    return Err("headers: only for a `url` server".into());
                }
            }
            (None, Some(u)) => {
                let parsed = url::Url::parse(u).map_err(|e| format!("url: `{u}`: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("url: `{u}` is not http(s)"));
                }
                if !self.env.is_empty() {
                    return Err("env: only for a stdio (`command`) server".into());
                }
                if self.cwd.is_some() {
                    return Err("cwd: only for a stdio (`command`) server".into());
                }
                for (k, v) in &self.headers {
                    http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                        format!("headers: `{}` is not a header name", k.escape_debug())
                    })?;
                    if v.chars().any(|c| c.is_control()) {
                        return Err(format!("headers.{k}: holds a control character"));
                    }
                }
            }
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(format!("env: `{}` is not a variable", k.escape_debug()));
            }
        }
        for v in self.env.values().chain(self.headers.values()) {
            crate::secrets::references(v)?;
        }
        Ok(())
    }
}

/// Every entry checked, and no name twice → the first problem as `mcp_servers[i].field: …`.
pub fn check_all(servers: &[ServerConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, s) in servers.iter().enumerate() {
        s.check().map_err(|m| format!("mcp_servers[{i}].{m}"))?;
        if !seen.insert(s.name.as_str()) {
            return Err(format!(
                "mcp_servers[{i}].name: `{}` is listed twice",
                s.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> ServerConfig {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn entries_are_checked_and_name_the_field() {
        let ok = parse("name: everything\ncommand: [npx, server]\nenv: {A: b}");
        assert!(ok.check().is_ok());
        assert!(ok.trusts_annotations());
        let http = parse(
            "name: issues\nurl: https://mcp.example.com/mcp\nheaders: {Authorization: 'Bearer ${secret:mcp-issues}'}",
        );
        assert!(http.check().is_ok());
        assert!(!http.trusts_annotations());
        for (yaml, field) in [
            ("name: 'a b'\ncommand: [x]", "name"),
            ("name: a\ncommand: []", "command"),
            ("name: a\ncommand: [x]\nurl: http://h", "either"),
            ("name: a", "give `command`"),
            ("name: a\nurl: ftp://h", "url"),
            ("name: a\nurl: http://h\nenv: {A: b}", "env"),
            (
                "name: a\nurl: http://h\nheaders: {'bad name': x}",
                "headers",
            ),
            ("name: a\ncommand: [x]\nenv: {A: '${secret:}'}", "secret"),
        ] {
            let e = parse(yaml).check().unwrap_err();
            assert!(e.contains(field), "{yaml}: {e}");
        }
        let twice = vec![ok.clone(), ok];
        assert!(check_all(&twice).unwrap_err().contains("listed twice"));
        assert!(serde_norway::from_str::<ServerConfig>("name: a\ncommand: [x]\nbogus: 1").is_err());
    }
}
