//! The before- and after-call hooks (`agent::before_function_call`, first_block_wins;
//! `agent::after_function_call`, field_merge) through `hook-fanout::publish_collect`. Both
//! cost nothing when nobody subscribes: presence is read from the trigger list and cached
//! for 30 s. A failed publish is a deny.

use crate::types::{AFTER_CALL_TOPIC, BEFORE_CALL_TOPIC, Call, denial};
use harness_sdk::Ctx;
use harness_sdk::contracts::hooks::{
    MergeRule, PUBLISH_COLLECT, PublishCollectAnswer, PublishCollectRequest,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const PRESENCE_TTL: Duration = Duration::from_secs(30);
pub const BEFORE_TIMEOUT_MS: u64 = 2_000;
pub const AFTER_TIMEOUT_MS: u64 = 500;

/// Per orchestrator instance: which hook topics have subscribers, and how long each hook
/// may take.
pub struct Hooks {
    presence: Mutex<HashMap<String, (Instant, bool)>>,
    before_timeout_ms: u64,
    after_timeout_ms: u64,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks::new(BEFORE_TIMEOUT_MS, AFTER_TIMEOUT_MS)
    }
}

impl Hooks {
    pub fn new(before_timeout_ms: u64, after_timeout_ms: u64) -> Self {
        Self {
            presence: Mutex::default(),
            before_timeout_ms,
            after_timeout_ms,
        }
    }

    pub async fn present(&self, ctx: &Ctx, topic: &str) -> bool {
        if let Ok(cache) = self.presence.lock()
            && let Some((at, present)) = cache.get(topic)
            && at.elapsed() < PRESENCE_TTL
        {
            return *present;
        }
        let present = match ctx.trigger("engine::triggers::list", json!({})).await {
            Ok(v) => v["triggers"].as_array().into_iter().flatten().any(|t| {
                t["trigger_type"] == "durable:subscriber" && t["config"]["topic"] == topic
            }),
            // Cannot tell: ask (a failing publish then denies, which is the safe side).
            Err(_) => true,
        };
        if let Ok(mut cache) = self.presence.lock() {
            cache.insert(topic.to_string(), (Instant::now(), present));
        }
        present
    }
}

async fn publish(
    ctx: &Ctx,
    topic: &str,
    payload: Value,
    merge_rule: MergeRule,
    timeout_ms: u64,
) -> Result<Value, String> {
    let request = PublishCollectRequest {
        topic: topic.to_string(),
        payload,
        merge_rule,
        timeout_ms: Some(timeout_ms),
        expected_replies: None,
        quiescence_ms: None,
    };
    let out = ctx
        .trigger_timeout(
            PUBLISH_COLLECT,
            json!(request),
            Duration::from_millis(timeout_ms + 2_000),
        )
        .await
        .map_err(|e| e.to_string())?;
    let out: PublishCollectAnswer = harness_sdk::contracts::parse(PUBLISH_COLLECT, out)?;
    if out.publish_failed {
        return Err(format!("a subscriber failed: {}", out.publish["failures"]));
    }
    Ok(out.merged)
}

/// `Some(denial)` when a subscriber blocks the call (or the hook cannot be asked).
pub async fn before_call(ctx: &Ctx, hooks: &Hooks, sid: &str, call: &Call) -> Option<Value> {
    if !hooks.present(ctx, BEFORE_CALL_TOPIC).await {
        return None;
    }
    let payload = json!({"session_id": sid, "function_call_id": call.function_call_id, "function_id": call.function_id, "args": call.args});
    match publish(
        ctx,
        BEFORE_CALL_TOPIC,
        payload,
        MergeRule::FirstBlockWins,
        hooks.before_timeout_ms,
    )
    .await
    {
        Ok(merged) if merged["block"] == true => Some(denial(
            "hook",
            &call.function_id,
            merged["subscriber"].as_str(),
            None,
            &call.args,
            merged["reason"]
                .as_str()
                .unwrap_or("blocked by a before-call hook"),
        )),
        Ok(_) => None,
        Err(e) => Some(denial(
            "hook",
            &call.function_id,
            None,
            None,
            &call.args,
            &format!("the before-call hook could not be asked ({e}); denied to be safe"),
        )),
    }
}

/// The result after the after-call hook: subscribers may rewrite `result` (and `is_error`).
pub async fn after_call(
    ctx: &Ctx,
    hooks: &Hooks,
    sid: &str,
    call: &Call,
    result: Value,
    is_error: bool,
) -> (Value, bool) {
    if !hooks.present(ctx, AFTER_CALL_TOPIC).await {
        return (result, is_error);
    }
    let payload = json!({"session_id": sid, "function_call_id": call.function_call_id, "function_id": call.function_id, "args": call.args, "result": result, "is_error": is_error});
    match publish(
        ctx,
        AFTER_CALL_TOPIC,
        payload,
        MergeRule::FieldMerge,
        hooks.after_timeout_ms,
    )
    .await
    {
        Ok(merged) => {
            let is_error = merged["is_error"].as_bool().unwrap_or(is_error);
            match merged.get("result") {
                Some(r) => (r.clone(), is_error),
                None => (result, is_error),
            }
        }
        // The result may hold what a subscriber would have removed: withhold it.
        Err(e) => (
            denial(
                "hook",
                &call.function_id,
                None,
                None,
                &call.args,
                &format!("the after-call hook could not be asked ({e}); the result is withheld"),
            ),
            true,
        ),
    }
}
