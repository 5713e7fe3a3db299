//! Wire contracts of the auth worker (SPEC §3 auth-credentials).

use serde::{Deserialize, Serialize};

/// A provider credential, as `auth::get_token` answers it (its `Debug` redacts the secret).
pub use harness_sdk::contracts::auth::Token;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Stored,
    Env,
    None,
}
