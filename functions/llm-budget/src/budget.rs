//! The budget record and its pure decisions (rollover, record, check, forecast). Money is
//! kept in integer nano-dollars so concurrent records sum exactly.

use crate::period::{DAY_MS, Period, month_ms, window};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub const EXEMPTION_MS: u64 = DAY_MS;
/// Closed windows kept in the record itself (all are also archived under their own keys).
pub const RECENT_WINDOWS: usize = 12;

pub fn to_nanos(usd: f64) -> u64 {
    (usd * 1e9).round().max(0.0) as u64
}
pub fn to_usd(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
    pub spent_nanos: u64,
    pub records: u64,
}

impl Window {
    pub fn new(period: Period, now: u64) -> Self {
        let (start_ms, end_ms) = window(period, now);
        Self {
            start_ms,
            end_ms,
            spent_nanos: 0,
            records: 0,
        }
    }
    pub fn view(&self) -> Value {
        json!({"start_ms": self.start_ms, "end_ms": self.end_ms, "spent_usd": to_usd(self.spent_nanos), "records": self.records})
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub alert_id: String,
    pub threshold_pct: f64,
    pub callback_function_id: String,
    #[serde(default)]
    pub callback_payload: Value,
    /// The window in which it last fired (once per period).
    #[serde(default)]
    pub fired_window_start: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exemption {
    pub reason: String,
    pub until_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub budget_id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    pub ceiling_nanos: u64,
    pub period: Period,
    pub enforced: bool,
    pub paused: bool,
    pub created_at_ms: u64,
    pub window: Window,
    #[serde(default)]
    pub recent_windows: Vec<Window>,
    #[serde(default)]
    pub alerts: Vec<Alert>,
    #[serde(default)]
    pub exemptions: BTreeMap<String, Exemption>,
}

/// What a `check` decided.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOutcome {
    pub allowed: bool,
    pub remaining_nanos: u64,
    pub reason: Option<&'static str>,
}

impl Budget {
    pub fn remaining_nanos(&self) -> u64 {
        self.ceiling_nanos.saturating_sub(self.window.spent_nanos)
    }

    /// Close the current window if `now` is past it → the closed window (to archive).
    pub fn rollover(&mut self, now: u64) -> Option<Window> {
        if now < self.window.end_ms {
            return None;
        }
        let closed = std::mem::replace(&mut self.window, Window::new(self.period, now));
        self.recent_windows.push(closed.clone());
        if self.recent_windows.len() > RECENT_WINDOWS {
            self.recent_windows.remove(0);
        }
        self.exemptions.retain(|_, e| e.until_ms > now);
        Some(closed)
    }

    /// Add spend → the alerts that cross their threshold for the first time this window
    /// (already marked fired in `self`).
    pub fn record(&mut self, nanos: u64) -> Vec<Alert> {
        self.window.spent_nanos = self.window.spent_nanos.saturating_add(nanos);
        self.window.records += 1;
        let spent = self.window.spent_nanos as f64;
        let ceiling = self.ceiling_nanos as f64;
        let start = self.window.start_ms;
        let mut fired = Vec::new();
        for a in &mut self.alerts {
            if a.fired_window_start != Some(start) && spent >= a.threshold_pct * ceiling {
                a.fired_window_start = Some(start);
                fired.push(a.clone());
            }
        }
        fired
    }

    pub fn check(&self, estimated_nanos: u64, principal: Option<&str>, now: u64) -> CheckOutcome {
        let remaining = self.remaining_nanos();
        let outcome = |allowed, reason| CheckOutcome {
            allowed,
            remaining_nanos: remaining,
            reason,
        };
        if self.paused {
            return outcome(false, Some("paused"));
        }
        if !self.enforced {
            return outcome(true, Some("not_enforced"));
        }
        if let Some(p) = principal
            && self.exemptions.get(p).is_some_and(|e| e.until_ms > now)
        {
            return outcome(true, Some("exempt"));
        }
        let after = self.window.spent_nanos.saturating_add(estimated_nanos);
        if self.window.spent_nanos >= self.ceiling_nanos || after > self.ceiling_nanos {
            return outcome(false, Some("ceiling_exceeded"));
        }
        outcome(true, None)
    }

    /// Spend rate so far this window, extrapolated.
    pub fn forecast(&self, now: u64) -> Value {
        let elapsed = now.saturating_sub(self.window.start_ms).max(60_000) as f64;
        let rate = self.window.spent_nanos as f64 / elapsed; // nanos per ms
        let period_len = (self.window.end_ms - self.window.start_ms) as f64;
        let projected_period = rate * period_len;
        let days_until_breach = if self.window.spent_nanos >= self.ceiling_nanos {
            json!(0.0)
        } else if rate <= 0.0 {
            Value::Null
        } else {
            json!(((self.ceiling_nanos - self.window.spent_nanos) as f64 / rate) / DAY_MS as f64)
        };
        json!({
            "budget_id": self.budget_id,
            "projected_month_usd": to_usd((rate * month_ms(now) as f64) as u64),
            "projected_period_usd": to_usd(projected_period as u64),
            "on_track": projected_period <= self.ceiling_nanos as f64,
            "days_until_breach": days_until_breach,
        })
    }

    /// Does this budget govern a run of `workspace_id`/`agent_id`? Every scoping field the
    /// budget sets must match, and it must set at least one.
    pub fn applies_to(&self, workspace_id: Option<&str>, agent_id: Option<&str>) -> bool {
        let ws = self.workspace_id.as_deref();
        let ag = self.agent_id.as_deref();
        (ws.is_some() || ag.is_some())
            && ws.is_none_or(|w| Some(w) == workspace_id)
            && ag.is_none_or(|a| Some(a) == agent_id)
    }

    pub fn view(&self) -> Value {
        json!({
            "budget_id": self.budget_id,
            "name": self.name,
            "workspace_id": self.workspace_id,
            "agent_id": self.agent_id,
            "ceiling_usd": to_usd(self.ceiling_nanos),
            "period": self.period,
            "enforced": self.enforced,
            "paused": self.paused,
            "created_at_ms": self.created_at_ms,
            "spent_usd": to_usd(self.window.spent_nanos),
            "remaining_usd": to_usd(self.remaining_nanos()),
            "window": self.window.view(),
            "alerts": self.alerts,
            "exemptions": self.exemptions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(now: u64) -> Budget {
        Budget {
            budget_id: "b".into(),
            name: None,
            workspace_id: Some("ws".into()),
            agent_id: None,
            ceiling_nanos: to_nanos(1.0),
            period: Period::Day,
            enforced: true,
            paused: false,
            created_at_ms: now,
            window: Window::new(Period::Day, now),
            recent_windows: Vec::new(),
            alerts: vec![Alert {
                alert_id: "a".into(),
                threshold_pct: 0.5,
                callback_function_id: "cb::x".into(),
                callback_payload: Value::Null,
                fired_window_start: None,
            }],
            exemptions: BTreeMap::new(),
        }
    }

    #[test]
    fn an_alert_fires_once_per_window_and_again_after_rollover() {
        let t = 10 * DAY_MS + 1000;
        let mut b = budget(t);
        assert!(b.record(to_nanos(0.4)).is_empty());
        assert_eq!(b.record(to_nanos(0.2)).len(), 1);
        assert!(b.record(to_nanos(0.2)).is_empty());
        let closed = b.rollover(11 * DAY_MS + 5).unwrap();
        assert_eq!(closed.spent_nanos, to_nanos(0.8));
        assert_eq!(b.window.spent_nanos, 0);
        assert_eq!(b.record(to_nanos(0.6)).len(), 1);
        assert!(b.rollover(11 * DAY_MS + 6).is_none());
    }

    #[test]
    fn check_reasons() {
        let t = 10 * DAY_MS;
        let mut b = budget(t);
        assert!(b.check(0, None, t).allowed);
        assert_eq!(
            b.check(to_nanos(2.0), None, t).reason,
            Some("ceiling_exceeded")
        );
        b.record(to_nanos(1.0));
        assert_eq!(b.check(0, None, t).reason, Some("ceiling_exceeded"));
        b.exemptions.insert(
            "agent-1".into(),
            Exemption {
                reason: "demo".into(),
                until_ms: t + EXEMPTION_MS,
            },
        );
        assert_eq!(b.check(0, Some("agent-1"), t).reason, Some("exempt"));
        assert_eq!(
            b.check(0, Some("agent-1"), t + EXEMPTION_MS).reason,
            Some("ceiling_exceeded")
        );
        b.enforced = false;
        assert_eq!(b.check(0, None, t).reason, Some("not_enforced"));
        b.paused = true;
        assert_eq!(b.check(0, None, t).reason, Some("paused"));
        assert!(!b.check(0, None, t).allowed);
    }

    #[test]
    fn nanos_sum_exactly() {
        let mut b = budget(0);
        for _ in 0..1000 {
            b.record(to_nanos(0.001));
        }
        assert_eq!(to_usd(b.window.spent_nanos), 1.0);
    }

    #[test]
    fn scoping() {
        let b = budget(0);
        assert!(b.applies_to(Some("ws"), Some("any")));
        assert!(!b.applies_to(Some("other"), None));
        let mut g = budget(0);
        g.workspace_id = None;
        assert!(
            !g.applies_to(Some("ws"), None),
            "an unscoped budget is only used by id"
        );
    }
}
