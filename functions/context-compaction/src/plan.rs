//! Pure compaction planning: token estimates, thresholds, tail selection, the summary prompt.

use harness_sdk::messages::{AgentMessage, ContentBlock};

/// Tokens kept free for the answer and the system prompt.
pub const RESERVED: u64 = 20_000;
pub const RECENT_MIN: u64 = 2_000;
pub const RECENT_MAX: u64 = 8_000;
/// Model turns always kept verbatim.
pub const KEEP_TURNS: usize = 2;

/// The estimate the whole harness uses: JSON characters / 4.
pub fn estimate<T: serde::Serialize + ?Sized>(v: &T) -> u64 {
    serde_json::to_string(v).map_or(0, |s| s.chars().count() as u64 / 4)
}

/// The context a model turn took, as the model counted it (its usage: what it read, cached or
/// not, plus what it wrote), or `None` when the usage is absent, zero or not numbers.
pub fn reported_context_tokens(usage: &serde_json::Value) -> Option<u64> {
    let total = ["input", "cache_read", "cache_write", "output"]
        .iter()
        .map(|k| usage[*k].as_u64().unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    (total > 0).then_some(total)
}

/// Usable context: the window minus the reserve (at most half the window, so small test
/// windows keep a usable part).
pub fn usable(context_window: u64) -> u64 {
    usable_with(context_window, RESERVED)
}

/// [`usable`] with another reserve.
pub fn usable_with(context_window: u64, reserved: u64) -> u64 {
    context_window.saturating_sub(reserved.min(context_window / 2))
}

pub fn recent_budget(usable: u64) -> u64 {
    (usable / 4).clamp(RECENT_MIN, RECENT_MAX)
}

pub fn is_summary(m: &AgentMessage) -> bool {
    matches!(m, AgentMessage::Custom { custom_type, .. } if custom_type == "compaction_summary")
}

/// Where the kept tail starts: the last `keep_turns` model turns (at least one), extended
/// backwards while the tail is under the recent-token budget. A tail never starts on a
/// function result (it would be cut from its call). `None` when there is no head to summarize.
pub fn select_tail(messages: &[AgentMessage], usable: u64, keep_turns: usize) -> Option<usize> {
    let keep_turns = keep_turns.max(1);
    let head_begin = usize::from(messages.first().is_some_and(is_summary));
    let boundary = |i: usize| !matches!(messages[i], AgentMessage::FunctionResult { .. });
    let assistants: Vec<usize> = (head_begin..messages.len())
        .filter(|&i| matches!(messages[i], AgentMessage::Assistant { .. }))
        .collect();
    if assistants.len() < keep_turns {
        return None;
    }
    let mut start = assistants[assistants.len() - keep_turns];
    // A user message just before the first kept turn belongs to it.
    if start > head_begin && matches!(messages[start - 1], AgentMessage::User { .. }) {
        start -= 1;
    }
    let budget = recent_budget(usable);
    while let Some(prev) = (head_begin..start).rev().find(|&i| boundary(i)) {
        if estimate(&messages[prev..]) > budget {
            break;
        }
        start = prev;
    }
    (start > head_begin).then_some(start)
}

fn render_block(b: &ContentBlock) -> String {
    match b {
        ContentBlock::Text { text } => text.clone(),
        ContentBlock::Thinking { text, .. } => format!("(thinking) {text}"),
        ContentBlock::FunctionCall {
            function_id,
            arguments,
            ..
        } => format!("(calls {function_id} {arguments})"),
        ContentBlock::Image { mime, .. } => format!("[image {mime}]"),
    }
}

const RESULT_CHARS: usize = 2_000;

/// The conversation as plain text for the summarizer (long results cut).
pub fn transcript(messages: &[AgentMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        let (who, blocks) = match m {
            AgentMessage::User { content, .. } => ("user".to_string(), content),
            AgentMessage::Assistant { content, .. } => ("assistant".to_string(), content),
            AgentMessage::FunctionResult {
                function_id,
                is_error,
                content,
                ..
            } => (
                format!(
                    "result of {function_id}{}",
                    if *is_error { " (error)" } else { "" }
                ),
                content,
            ),
            AgentMessage::Custom {
                custom_type,
                content,
                ..
            } => (custom_type.clone(), content),
        };
        let mut text: String = blocks
            .iter()
            .map(render_block)
            .collect::<Vec<_>>()
            .join("\n");
        if matches!(m, AgentMessage::FunctionResult { .. }) && text.chars().count() > RESULT_CHARS {
            text = format!(
                "{}… [cut]",
                text.chars().take(RESULT_CHARS).collect::<String>()
            );
        }
        out.push_str(&format!("[{who}]\n{text}\n\n"));
    }
    out
}

pub const SECTIONS: [&str; 8] = [
    "Goal",
    "Constraints",
    "Progress",
    "Key Decisions",
    "Tool Calls Made",
    "Next Steps",
    "Critical Context",
    "Relevant Files",
];

pub fn system_prompt() -> String {
    format!(
        "You compact the history of a conversation between a user and an AI agent so the agent can continue from your summary alone. Answer with exactly these Markdown sections, in this order: {}. Be specific: keep names, paths, ids, numbers, commands and error messages; say what is done and what is not. Never invent anything.",
        SECTIONS
            .iter()
            .map(|s| format!("## {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub fn user_prompt(previous: Option<&str>, head: &[AgentMessage]) -> String {
    let mut s = String::new();
    if let Some(p) = previous {
        s.push_str("Here is the summary of the conversation before this part. Update it with the new part below (keep what still holds, revise what changed):\n\n");
        s.push_str(p);
        s.push_str("\n\n");
    }
    s.push_str("The conversation to summarize:\n\n");
    s.push_str(&transcript(head));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_sdk::messages::{StopReason, user_text};
    use serde_json::json;

    fn assistant(text: &str) -> AgentMessage {
        AgentMessage::Assistant {
            content: vec![ContentBlock::Text { text: text.into() }],
            stop_reason: StopReason::FunctionCall,
            error_message: None,
            error_kind: None,
            usage: None,
            model: "m".into(),
            provider: "p".into(),
            timestamp: 0,
        }
    }
    fn result(text: &str) -> AgentMessage {
        AgentMessage::FunctionResult {
            function_call_id: "c".into(),
            function_id: "f".into(),
            content: vec![ContentBlock::Text { text: text.into() }],
            details: json!(null),
            is_error: false,
            timestamp: 0,
        }
    }

    #[test]
    fn the_tail_keeps_two_turns_and_never_starts_on_a_result() {
        let big = "x".repeat(40_000);
        let mut ms = vec![user_text("task")];
        for i in 0..5 {
            ms.push(assistant(&format!("turn {i}")));
            ms.push(result(&big));
        }
        // Results are big: the recent budget adds nothing beyond the last two turns.
        let start = select_tail(&ms, 100_000, KEEP_TURNS).unwrap();
        assert_eq!(start, 7);
        assert!(matches!(ms[start], AgentMessage::Assistant { .. }));
        // Small messages: the tail grows back over the recent budget, still on a boundary.
        let small: Vec<AgentMessage> = std::iter::once(user_text("task"))
            .chain((0..30).flat_map(|i| [assistant(&format!("turn {i}")), result("ok")]))
            .collect();
        let start = select_tail(&small, 8_000, KEEP_TURNS).unwrap();
        assert!(start < small.len() - 4);
        assert!(!matches!(small[start], AgentMessage::FunctionResult { .. }));
        // Too short to compact.
        assert_eq!(select_tail(&ms[..3], 100_000, KEEP_TURNS), None);
    }

    #[test]
    fn a_reported_context_counts_every_token_and_ignores_what_is_not_a_count() {
        use serde_json::json;
        assert_eq!(
            reported_context_tokens(
                &json!({"input": 100, "cache_read": 900, "cache_write": 50, "output": 7, "cost_usd": 0.5})
            ),
            Some(1057)
        );
        assert_eq!(reported_context_tokens(&json!({"output": 3})), Some(3));
        for nothing in [
            json!(null),
            json!({}),
            json!({"input": 0, "output": 0}),
            json!({"input": "1000", "output": -5, "cache_read": 1.5}),
            json!([1, 2]),
        ] {
            assert_eq!(reported_context_tokens(&nothing), None, "{nothing}");
        }
        assert_eq!(
            reported_context_tokens(&json!({"input": u64::MAX, "output": 10})),
            Some(u64::MAX)
        );
    }

    #[test]
    fn thresholds() {
        assert_eq!(usable(200_000), 180_000);
        assert_eq!(usable(8_000), 4_000);
        assert_eq!(recent_budget(180_000), 8_000);
        assert_eq!(recent_budget(4_000), 2_000);
        assert!(system_prompt().contains("## Relevant Files"));
    }
}
