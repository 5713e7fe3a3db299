//! hook-fanout (SPEC §3): `hook-fanout::publish_collect` calls every subscriber of a topic
//! with `{event_id, topic, payload}`, collects their replies and merges them.
//!
//! A subscriber is a function with a `durable:subscriber` trigger on the topic (see [`subscribe`]), so
//! subscribing is a registration like any other and leaves with its worker. Collection ends
//! at `expected_replies`, after `quiescence_ms` without a new reply once one has come, when
//! every subscriber has answered, or at the deadline, whichever is first. A subscriber that
//! fails (not one that is merely slow) makes `publish_failed: true`, which gating callers
//! treat as a deny.

use bus::builtins::req_str;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, Worker, contracts, def};
use serde_json::{Map, Value, json};
use std::time::{Duration, Instant};

pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
pub const MIN_TIMEOUT_MS: u64 = 50;
pub const DEFAULT_QUIESCENCE_MS: u64 = 200;
/// The engine's trigger type for a topic subscription.
pub const SUBSCRIBER_TRIGGER: &str = "durable:subscriber";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeRule {
    FirstBlockWins,
    FieldMerge,
    PipelineLastWins,
}

impl MergeRule {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "first_block_wins" => Some(Self::FirstBlockWins),
            "field_merge" => Some(Self::FieldMerge),
            "pipeline_last_wins" => Some(Self::PipelineLastWins),
            _ => None,
        }
    }
}

/// Subscribe `function_id` to a hook topic.
pub fn subscribe(worker: &mut Worker, topic: &str, function_id: &str) {
    worker.register_trigger(SUBSCRIBER_TRIGGER, function_id, json!({"topic": topic}));
}

/// The functions subscribed to `topic`, sorted (the pipeline order).
pub async fn subscribers(ctx: &Ctx, topic: &str) -> Result<Vec<String>, BusError> {
    let v = ctx.trigger("engine::triggers::list", json!({})).await?;
    let mut out: Vec<String> = v["triggers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["trigger_type"] == SUBSCRIBER_TRIGGER && t["config"]["topic"] == topic)
        .filter_map(|t| t["function_id"].as_str().map(str::to_owned))
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

fn blocks(reply: &Value) -> bool {
    reply["block"] == true || matches!(reply["decision"].as_str(), Some("block" | "deny"))
}

/// Merge replies (in arrival order; the pipeline's last output for `pipeline_last_wins`).
pub fn merge(rule: MergeRule, replies: &[Value]) -> Value {
    match rule {
        MergeRule::FirstBlockWins => match replies.iter().find(|r| blocks(r)) {
            Some(r) => {
                let mut out = json!({"block": true, "reason": r["reason"].clone()});
                if let Some(s) = r.get("subscriber") {
                    out["subscriber"] = s.clone();
                }
                out
            }
            None => json!({"block": false}),
        },
        MergeRule::FieldMerge => {
            let mut out = Map::new();
            for r in replies {
                if let Some(o) = r.as_object() {
                    for (k, v) in o {
                        if k != "subscriber" {
                            out.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            Value::Object(out)
        }
        MergeRule::PipelineLastWins => replies.last().cloned().unwrap_or(Value::Null),
    }
}

struct Options {
    topic: String,
    payload: Value,
    rule: MergeRule,
    deadline: Instant,
    expected: Option<usize>,
    quiescence: Duration,
}

fn parse(data: &Value) -> Result<Options, ErrorBody> {
    let topic = req_str(data, "topic")?;
    let rule_s = req_str(data, "merge_rule")?;
    let rule = MergeRule::parse(&rule_s).ok_or_else(|| {
        ErrorBody::invalid(format!(
            "`merge_rule` must be first_block_wins, field_merge or pipeline_last_wins, not `{rule_s}`"
        ))
    })?;
    let num = |f: &str| -> Result<Option<u64>, ErrorBody> {
        match data.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ErrorBody::invalid(format!("`{f}` must be a non-negative integer"))),
        }
    };
    let timeout = num("timeout_ms")?
        .unwrap_or(DEFAULT_TIMEOUT_MS)
        .max(MIN_TIMEOUT_MS);
    Ok(Options {
        topic,
        payload: data.get("payload").cloned().unwrap_or(Value::Null),
        rule,
        deadline: Instant::now() + Duration::from_millis(timeout),
        expected: num("expected_replies")?.map(|n| n as usize),
        quiescence: Duration::from_millis(num("quiescence_ms")?.unwrap_or(DEFAULT_QUIESCENCE_MS)),
    })
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

pub async fn publish_collect(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let o = parse(&data)?;
    let event_id = format!("hook-{}", bus_telemetry::trace::random_hex(8));
    let subs = match subscribers(&ctx, &o.topic).await {
        Ok(s) => s,
        Err(e) => {
            return Ok(
                json!({"event_id": event_id, "replies": [], "merged": merge(o.rule, &[]),
                "publish": {"ok": false, "error": e.to_string()}, "publish_failed": true}),
            );
        }
    };
    let started = Instant::now();
    let mut replies: Vec<Value> = Vec::new();
    let mut failures: Vec<Value> = Vec::new();
    let message =
        |payload: &Value| json!({"event_id": event_id, "topic": o.topic, "payload": payload});

    if o.rule == MergeRule::PipelineLastWins {
        // Each subscriber gets the previous one's output.
        let mut current = o.payload.clone();
        for f in &subs {
            let left = remaining(o.deadline);
            if left.is_zero() {
                break;
            }
            match ctx.trigger_timeout(f, message(&current), left).await {
                Ok(reply) => {
                    current = reply.clone();
                    replies.push(json!({"subscriber": f, "reply": reply, "duration_ms": started.elapsed().as_millis() as u64}));
                }
                Err(BusError::Timeout(_)) => break,
                Err(e) => failures.push(json!({"subscriber": f, "error": e.to_string()})),
            }
            if o.expected.is_some_and(|n| replies.len() >= n) {
                break;
            }
        }
    } else {
        let mut pending: FuturesUnordered<_> = subs
            .iter()
            .map(|f| {
                let ctx = ctx.clone();
                let msg = message(&o.payload);
                let f = f.clone();
                let left = remaining(o.deadline);
                async move { (f.clone(), ctx.trigger_timeout(&f, msg, left).await) }
            })
            .collect();
        let expected = o.expected.unwrap_or(subs.len());
        while replies.len() < expected && !pending.is_empty() {
            // Quiet for `quiescence` after a reply: what is still out is not coming in time.
            let wait = if replies.is_empty() {
                remaining(o.deadline)
            } else {
                remaining(o.deadline).min(o.quiescence)
            };
            match tokio::time::timeout(wait, pending.next()).await {
                Ok(Some((f, Ok(reply)))) => replies.push(json!({"subscriber": f, "reply": reply, "duration_ms": started.elapsed().as_millis() as u64})),
                Ok(Some((_, Err(BusError::Timeout(_))))) => {}
                Ok(Some((f, Err(e)))) => failures.push(json!({"subscriber": f, "error": e.to_string()})),
                Ok(None) | Err(_) => break,
            }
        }
    }
    let merged = merge(
        o.rule,
        &replies
            .iter()
            .map(|r| {
                let mut v = r["reply"].clone();
                if o.rule == MergeRule::FirstBlockWins && v.is_object() {
                    v["subscriber"] = r["subscriber"].clone();
                }
                v
            })
            .collect::<Vec<_>>(),
    );
    let failed = !failures.is_empty();
    let mut out = json!({
        "event_id": event_id,
        "replies": replies,
        "merged": merged,
        "publish": {"ok": !failed, "subscribers": subs.len(), "failures": failures},
    });
    if failed {
        out["publish_failed"] = json!(true);
    }
    Ok(out)
}

pub fn worker() -> Worker {
    let mut w = Worker::new("hook-fanout");
    w.register_function(
        def("hook-fanout::publish_collect", "Publish to a hook topic and collect the subscribers' replies, merged.")
        .not_for_the_agent()
            .contract::<contracts::hooks::PublishCollectRequest, contracts::hooks::PublishCollectAnswer>()
            .errors(&[("invalid_message", "missing topic or unknown merge_rule")])
            .notes("Subscribe a function with a `durable:subscriber` trigger `{topic}`. It receives `{event_id, topic, payload}`; to block (first_block_wins) reply `{block: true, reason}`."),
        publish_collect,
    );
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_rules() {
        let replies = [
            json!({"block": false}),
            json!({"block": true, "reason": "no", "subscriber": "h::b"}),
            json!({"decision": "deny", "reason": "later"}),
        ];
        assert_eq!(
            merge(MergeRule::FirstBlockWins, &replies),
            json!({"block": true, "reason": "no", "subscriber": "h::b"})
        );
        assert_eq!(
            merge(MergeRule::FirstBlockWins, &[json!({"x": 1})]),
            json!({"block": false})
        );
        assert_eq!(
            merge(MergeRule::FirstBlockWins, &[]),
            json!({"block": false})
        );
        let fm = merge(
            MergeRule::FieldMerge,
            &[
                json!({"a": 1, "b": 1}),
                json!({"b": 2}),
                json!("not an object"),
            ],
        );
        assert_eq!(fm, json!({"a": 1, "b": 2}));
        assert_eq!(
            merge(MergeRule::PipelineLastWins, &[json!(1), json!(2)]),
            json!(2)
        );
        assert_eq!(merge(MergeRule::PipelineLastWins, &[]), Value::Null);
    }
}
