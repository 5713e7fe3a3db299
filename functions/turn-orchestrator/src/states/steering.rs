//! `steering_check`: stop at max_turns; else the steering and follow-up inboxes, then the
//! function results, decide whether the model is called again.

use crate::prelude::*;

pub(crate) async fn steering_check(ctx: &Ctx, rec: &mut Record) -> StepResult<Outcome> {
    let results_pending = !rec.function_results.is_empty();
    rec.function_results.clear();
    if rec.max_turns.is_some_and(|m| rec.turn_count >= m) {
        if results_pending {
            let note = AgentMessage::Custom {
                custom_type: "max_turns".into(),
                content: vec![ContentBlock::Text {
                    text: format!(
                        "max_turns reached ({} turns); the run stops here.",
                        rec.turn_count
                    ),
                }],
                display: Some("max_turns reached".into()),
                details: json!({"max_turns": rec.max_turns}),
                timestamp: now(),
            };
            for m in append_history(ctx, rec, vec![note], "m").await? {
                emit(rec, "message_complete", json!({"message": m}));
            }
        }
        return Ok(Outcome::MaxTurns {
            turns: rec.turn_count,
            results_pending,
        });
    }
    // Steering first, then follow-ups (the inbox worker may not run). Peek, store, then
    // drain exactly what was stored: a crash in between leaves the items in the inbox, and
    // the retry's appends are no-ops (ids from each item's content and position).
    let peeked = match rec.peeked_inbox.take() {
        Some(peeked) => peeked,
        None => peek_inboxes(ctx, &rec.session_id, layout_named(rec)).await,
    };
    if let Some((name, raw)) = peeked {
        let name = name.as_str();
        for (i, item) in raw.iter().enumerate() {
            let message = item
                .as_str()
                .map(harness_sdk::messages::user_text)
                .or_else(|| serde_json::from_value(item.clone()).ok())
                .unwrap_or_else(|| harness_sdk::messages::user_text(&item.to_string()));
            let tag = format!("{name}-{:016x}-", content_hash(i, item));
            append_history(ctx, rec, vec![message], &tag).await?;
        }
        ctx.trigger(
            inbox::DRAIN,
            json!(inbox::DrainRequest {
                name: name.into(),
                session_id: rec.session_id.clone(),
                max: Some(raw.len() as u64),
            }),
        )
        .await?;
        return Ok(Outcome::Steered);
    }
    if results_pending {
        return Ok(Outcome::ResultsPending);
    }
    Ok(Outcome::Idle)
}

/// Whether the session worker named its layout (`harness_sdk::session_layout`): the
/// orchestrator may read the inboxes and carry appends itself.
pub(crate) fn layout_named(rec: &Record) -> bool {
    rec.tree_index
        .as_ref()
        .is_some_and(|seen| seen.layout.as_deref() == Some(harness_sdk::session_layout::LAYOUT))
}

/// The first of the session's inboxes that holds items: read from the session's store where
/// the session worker named its layout (`direct`; no call to it), else (or when that read
/// fails) through `session-inbox::peek`.
pub(crate) async fn peek_inboxes(ctx: &Ctx, sid: &str, direct: bool) -> PeekedInbox {
    if direct {
        match harness_sdk::session_layout::read_first_inbox(ctx, sid, INBOXES).await {
            Ok(first) => return first,
            Err(e) => {
                tracing::warn!(session = %sid, error = %e, "inboxes not read: asking the session worker")
            }
        }
    }
    first_inbox_items(ctx, sid).await
}

/// The inboxes the steering check reads, in order (an append that ends a step peeks them).
pub(crate) const INBOXES: [&str; 2] = ["steering", "followup"];

/// A peek of several [`INBOXES`] → the first that holds items; `None` inside: all are empty;
/// `None` outside: the answer is not one of several inboxes (a worker that reads one only).
pub(crate) fn first_of(answer: inbox::ItemsAnswer) -> Option<PeekedInbox> {
    match answer.name {
        // Only an inbox asked for: the name becomes entry ids and the drain's target.
        Some(Some(name)) if !answer.items.is_empty() => Some(
            INBOXES
                .contains(&name.as_str())
                .then_some((name, answer.items)),
        ),
        Some(_) => Some(None),
        None => None,
    }
}

/// The first inbox, in [`INBOXES`] order, that holds items, with its items: one peek of both
/// (a worker that peeks only the inbox it is named answers without `name`, and the rest are
/// peeked one by one). `None`: all are empty, or the inbox worker does not answer.
async fn first_inbox_items(ctx: &Ctx, sid: &str) -> Option<(String, Vec<Value>)> {
    let peek = |name: &str, names: Option<Vec<String>>| {
        best_effort(
            ctx,
            inbox::PEEK,
            json!(inbox::PeekRequest {
                name: name.into(),
                session_id: sid.to_string(),
                names,
            }),
        )
    };
    let all = INBOXES.iter().map(|n| n.to_string()).collect();
    // An answer that is not a list of items is an empty inbox (the inbox is optional).
    let answer =
        contracts::parse::<inbox::ItemsAnswer>(inbox::PEEK, peek(INBOXES[0], Some(all)).await?)
            .ok()?;
    if answer.name.is_some() {
        return first_of(answer).flatten();
    }
    if !answer.items.is_empty() {
        return Some((INBOXES[0].into(), answer.items));
    }
    for name in &INBOXES[1..] {
        let items = peek(name, None)
            .await
            .and_then(|v| contracts::parse::<inbox::ItemsAnswer>(inbox::PEEK, v).ok())
            .map(|a| a.items)
            .unwrap_or_default();
        if !items.is_empty() {
            return Some((name.to_string(), items));
        }
    }
    None
}

/// FNV-1a of an inbox item and its position: a stable, content-derived entry id part.
pub(crate) fn content_hash(position: usize, item: &Value) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in position
        .to_le_bytes()
        .iter()
        .chain(item.to_string().as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
