//! Tokens the engine issues itself: one-time sign-in codes (the link `cargo run` prints) and
//! the session tokens a browser gets for them or for a credential it presented.
//!
//! A session token stands for the credential that was presented, with the same role (a client
//! credential gives a client session; the admin token an admin one), so the console is held to
//! the bus's rules like any other connection. Both kinds live in memory only (a restart signs
//! everyone out), are bounded in number, expire, and are stored as SHA-256 digests.

use crate::principal::Principal;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most session tokens alive at once for one credential; its oldest goes first. Counted per
/// credential, so signing in again and again signs out only oneself, never another user.
/// (The credentials are the engine token and the access file's, so the total is bounded.)
pub const MAX_SESSIONS_PER_CREDENTIAL: usize = 32;
/// Most unused one-time codes at once.
pub const MAX_CODES: usize = 16;
/// How long a session token is good for.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time code is good for.
pub const CODE_TTL: Duration = Duration::from_secs(15 * 60);

struct Issued {
    principal: Principal,
    expires: Instant,
    issued: Instant,
}

#[derive(Default)]
struct Tables {
    sessions: HashMap<[u8; 32], Issued>,
    codes: HashMap<[u8; 32], Issued>,
}

/// What a session token is: who, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionGrant {
    pub token: String,
    pub principal: Principal,
    pub expires_in: Duration,
}

#[derive(Default)]
pub struct IssuedTokens {
    tables: Mutex<Tables>,
}

impl std::fmt::Debug for IssuedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, c) = self
            .tables
            .lock()
            .map(|t| (t.sessions.len(), t.codes.len()))
            .unwrap_or((0, 0));
        write!(f, "IssuedTokens {{ sessions: {s}, codes: {c} }}")
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Drop what expired, then the oldest entries that `counts` until there is room for one
/// more of them.
fn make_room(
    table: &mut HashMap<[u8; 32], Issued>,
    max: usize,
    now: Instant,
    counts: impl Fn(&Issued) -> bool,
) {
    table.retain(|_, i| i.expires > now);
    while table.values().filter(|i| counts(i)).count() >= max {
        let Some(oldest) = table
            .iter()
            .filter(|(_, i)| counts(i))
            .min_by_key(|(_, i)| i.issued)
            .map(|(k, _)| *k)
        else {
            break;
        };
        table.remove(&oldest);
    }
}

/// The same credential: name and role.
fn same_credential(a: &Principal, b: &Principal) -> bool {
    a.name == b.name && a.role == b.role
}

impl IssuedTokens {
    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new one-time code that signs in as `principal` once, within [`CODE_TTL`].
    pub fn issue_code(&self, principal: Principal) -> String {
        let code = bus_telemetry::trace::random_hex(16);
        let now = Instant::now();
        let mut t = self.tables();
        make_room(&mut t.codes, MAX_CODES, now, |_| true);
        t.codes.insert(
            digest(&code),
            Issued {
                principal,
                expires: now + CODE_TTL,
                issued: now,
            },
        );
        code
    }

    /// Use up a one-time code: who it signs in as, or `None` (unknown, used or expired).
    pub fn redeem_code(&self, code: &str) -> Option<Principal> {
        let now = Instant::now();
        let issued = self.tables().codes.remove(&digest(code))?;
        (issued.expires > now).then_some(issued.principal)
    }

    /// A new session token for `principal`.
    pub fn issue_session(&self, principal: Principal) -> SessionGrant {
        let token = format!("cs_{}", bus_telemetry::trace::random_hex(32));
        let now = Instant::now();
        let mut t = self.tables();
        make_room(&mut t.sessions, MAX_SESSIONS_PER_CREDENTIAL, now, |i| {
            same_credential(&i.principal, &principal)
        });
        t.sessions.insert(
            digest(&token),
            Issued {
                principal: principal.clone(),
                expires: now + SESSION_TTL,
                issued: now,
            },
        );
        SessionGrant {
            token,
            principal,
            expires_in: SESSION_TTL,
        }
    }

    /// Who a session token stands for, while it is valid.
    pub fn session(&self, token: &str) -> Option<Principal> {
        if !token.starts_with("cs_") {
            return None;
        }
        let now = Instant::now();
        let t = self.tables();
        t.sessions
            .get(&digest(token))
            .filter(|i| i.expires > now)
            .map(|i| i.principal.clone())
    }

    /// Sign a session token out.
    pub fn revoke_session(&self, token: &str) -> bool {
        self.tables().sessions.remove(&digest(token)).is_some()
    }

    pub fn session_count(&self) -> usize {
        let now = Instant::now();
        self.tables()
            .sessions
            .values()
            .filter(|i| i.expires > now)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::principal::Role;

    fn client() -> Principal {
        Principal {
            name: "viewer".into(),
            role: Role::Client,
            namespaces: vec![],
            sessions_all: false,
        }
    }

    #[test]
    fn a_code_signs_in_once() {
        let t = IssuedTokens::default();
        let code = t.issue_code(Principal::admin());
        assert_eq!(t.redeem_code(&code), Some(Principal::admin()));
        assert_eq!(t.redeem_code(&code), None, "used up");
        assert_eq!(t.redeem_code("not-a-code"), None);
    }

    #[test]
    fn a_session_keeps_the_role_it_was_issued_for_and_can_be_revoked() {
        let t = IssuedTokens::default();
        let s = t.issue_session(client());
        assert_eq!(t.session(&s.token).unwrap().role, Role::Client);
        assert!(t.session("cs_0000").is_none());
        assert!(t.session("admin").is_none(), "only issued tokens");
        assert!(t.revoke_session(&s.token));
        assert!(t.session(&s.token).is_none());
    }

    #[test]
    fn tables_are_bounded_per_credential() {
        let t = IssuedTokens::default();
        let admin = t.issue_session(Principal::admin());
        let first = t.issue_session(client());
        for _ in 0..MAX_SESSIONS_PER_CREDENTIAL + 300 {
            t.issue_session(client());
        }
        assert_eq!(t.session_count(), MAX_SESSIONS_PER_CREDENTIAL + 1);
        assert!(
            t.session(&first.token).is_none(),
            "its own oldest went first"
        );
        assert_eq!(
            t.session(&admin.token),
            Some(Principal::admin()),
            "another credential's sign-in is untouched"
        );
        let first_code = t.issue_code(client());
        for _ in 0..MAX_CODES {
            t.issue_code(client());
        }
        assert!(t.redeem_code(&first_code).is_none());
    }
}
