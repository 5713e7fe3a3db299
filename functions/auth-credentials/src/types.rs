//! Wire contracts of the auth worker (SPEC §3 auth-credentials).

use serde::{Deserialize, Serialize};

/// A provider credential. Serialized with `type` as the tag, as `auth::get_token` answers it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Token {
    ApiKey {
        key: String,
    },
    Oauth {
        access_token: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refresh_token: Option<String>,
        /// Unix milliseconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<u64>,
    },
}

// Never print a secret, even in a debug log.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::ApiKey { .. } => f.write_str("Token::ApiKey { key: <redacted> }"),
            Token::Oauth { expires_at, .. } => write!(
                f,
                "Token::Oauth {{ <redacted>, expires_at: {expires_at:?} }}"
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Stored,
    Env,
    None,
}
