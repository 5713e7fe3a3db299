//! Retention: records in scopes that only grow (UI events, approval decisions, Slack replay
//! keys) are deleted once older than their scope's limit, so nothing grows without a bound.
//!
//! A record's age comes from its version: a record is created at the wall clock in
//! microseconds and each update adds 1 (see [`crate::state::next_version`]), so the version
//! says when the record was created, on every backend. A delete is conditional on that
//! version: a record rewritten meanwhile is left alone.

use crate::state::{StateError, StateStore, WriteMeta};
use std::time::Duration;

/// One scope and how long its records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRule {
    pub scope: String,
    pub max_age: Duration,
}

impl RetentionRule {
    pub fn new(scope: &str, max_age: Duration) -> Self {
        Self {
            scope: scope.to_string(),
            max_age,
        }
    }
}

pub const DAY: Duration = Duration::from_secs(24 * 3600);

/// The defaults: `agent::events` items 7 days, approval decisions 7 days, Slack replay keys
/// 10 minutes (Slack refuses requests older than 5).
pub fn default_rules(
    events: Duration,
    approvals: Duration,
    slack_replay: Duration,
) -> Vec<RetentionRule> {
    vec![
        RetentionRule::new(
            &format!("{}agent::events", crate::state::STREAM_SCOPE_PREFIX),
            events,
        ),
        RetentionRule::new("approvals", approvals),
        RetentionRule::new("slack-replay", slack_replay),
    ]
}

/// When a record of `version` was created, in ms since the epoch.
pub fn created_at_ms(version: u64) -> u64 {
    version / 1000
}

/// Delete every record older than its rule allows → how many were deleted. Reads page by
/// page, so a large backlog costs bounded memory.
pub async fn sweep(
    store: &dyn StateStore,
    rules: &[RetentionRule],
    now_ms: u64,
) -> Result<usize, StateError> {
    let mut deleted = 0;
    // Retention deletes are housekeeping: they need no trigger to see them.
    let meta = WriteMeta::default();
    for rule in rules {
        let cutoff = now_ms.saturating_sub(rule.max_age.as_millis() as u64);
        let mut after: Option<String> = None;
        loop {
            let (page, more) = store
                .list_page(&rule.scope, None, after.as_deref(), 500)
                .await?;
            after = page.last().map(|e| e.key.clone());
            for entry in page {
                if created_at_ms(entry.version) >= cutoff {
                    continue;
                }
                match store
                    .delete(&rule.scope, &entry.key, Some(entry.version), &meta)
                    .await
                {
                    Ok(_) => deleted += 1,
                    // Rewritten meanwhile: it is young again.
                    Err(StateError::VersionConflict { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            if !more {
                break;
            }
        }
    }
    Ok(deleted)
}
