//! Sessions belong to whoever started them. The owner is recorded once, at
//! `owners/<session_id>` (`{name, role}`), by the first call that starts the session or pushes
//! into it; every worker that serves a session asks the same questions here, with the
//! caller read from the call's baggage (`iii.principal`, which the engine writes for every
//! client call and workers pass on):
//!
//! - [`may_see`]: a client sees only its own sessions; admin, workers and operators
//!   (`sessions: all`) see all. Another's session must answer exactly as an id that never
//!   existed does, so callers turn `false` into their own "not found".
//! - [`claim`]: the first caller to start (or push into) an id owns it; `false` when another
//!   does (refused, the same way).
//! - [`visible`]: the subset of session ids a caller may see, for lists and their totals.
//!
//! A call with no `iii.principal` comes from the harness itself (an in-process worker with no
//! caller behind it) and sees everything.

use ::bus::access::{Acting, acting};
use serde_json::Value;
use std::collections::HashSet;

use crate::{BusError, Ctx};

/// The state scope of the owner records.
pub const SCOPE: &str = "owners";

/// Who the call is made for, when someone is behind it.
pub fn caller(ctx: &Ctx) -> Option<Acting> {
    acting(ctx.trace())
}

/// The recorded owner of `sid` (`{name, role}`), or null.
pub async fn owner(ctx: &Ctx, sid: &str) -> Result<Value, BusError> {
    if sid.is_empty() || sid.contains('/') {
        return Ok(Value::Null);
    }
    ctx.state_get(SCOPE, sid).await
}

/// Whether the caller may see session `sid`.
pub async fn may_see(ctx: &Ctx, sid: &str) -> Result<bool, BusError> {
    match caller(ctx) {
        None => Ok(true),
        Some(a) if a.sees_all() => Ok(true),
        Some(a) => Ok(a.is(&owner(ctx, sid).await?)),
    }
}

/// Record the caller as the owner of `sid` if nobody is yet. `true`: the caller owns it (now
/// or already) or may act on every session; `false`: another owns it.
pub async fn claim(ctx: &Ctx, sid: &str) -> Result<bool, BusError> {
    let me = caller(ctx).unwrap_or_else(|| Acting {
        role: "admin".into(),
        name: "harness".into(),
    });
    let existing = owner(ctx, sid).await?;
    if !existing.is_null() {
        return Ok(me.may_see(&existing));
    }
    match ctx.state_set_if(SCOPE, sid, me.owner_record(), 0).await {
        Ok(_) => Ok(true),
        // Someone claimed it in between: theirs, unless we may see every session.
        Err(BusError::VersionConflict(_)) => Ok(me.may_see(&owner(ctx, sid).await?)),
        Err(e) => Err(e),
    }
}

/// Of `sids`, the ones the caller may see (all of them for those who see every session).
pub async fn visible<'a>(
    ctx: &Ctx,
    sids: impl IntoIterator<Item = &'a str>,
) -> Result<HashSet<String>, BusError> {
    let sids: Vec<&str> = sids.into_iter().collect();
    let me = match caller(ctx) {
        Some(a) if !a.sees_all() => a,
        _ => return Ok(sids.into_iter().map(str::to_owned).collect()),
    };
    let mut mine = HashSet::new();
    for sid in sids {
        if me.is(&owner(ctx, sid).await?) {
            mine.insert(sid.to_string());
        }
    }
    Ok(mine)
}
