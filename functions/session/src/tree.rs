//! Pure tree logic: the current leaf, the path to it, the model context of a path (with
//! compaction applied), fork copies, and the HTML export. No I/O.

use crate::types::{Entry, EntryBody};
use harness_sdk::messages::{AgentMessage, ContentBlock};
use serde_json::json;
use std::collections::{HashMap, HashSet};

#[derive(Debug, PartialEq)]
pub enum TreeError {
    EntryNotFound(String),
    /// A parent chain that loops or points outside the session.
    Broken(String),
}

/// The current leaf: the newest entry (highest `seq`) that is nobody's parent.
pub fn leaf(entries: &[Entry]) -> Option<&Entry> {
    let parents: HashSet<&str> = entries
        .iter()
        .filter_map(|e| e.parent_id.as_deref())
        .collect();
    entries
        .iter()
        .filter(|e| !parents.contains(e.id.as_str()))
        .max_by(|a, b| (a.seq, a.timestamp).cmp(&(b.seq, b.timestamp)))
}

/// The entries from the root to `leaf_id`, in that order.
pub fn path<'a>(entries: &'a [Entry], leaf_id: &str) -> Result<Vec<&'a Entry>, TreeError> {
    let by_id: HashMap<&str, &Entry> = entries.iter().map(|e| (e.id.as_str(), e)).collect();
    let mut out = Vec::new();
    let mut cursor = Some(leaf_id);
    let mut first = true;
    while let Some(id) = cursor {
        let Some(entry) = by_id.get(id) else {
            return Err(if first {
                TreeError::EntryNotFound(id.to_string())
            } else {
                TreeError::Broken(format!("entry `{id}` is a parent but does not exist"))
            });
        };
        first = false;
        out.push(*entry);
        if out.len() > entries.len() {
            return Err(TreeError::Broken(format!(
                "the parent chain of `{leaf_id}` loops"
            )));
        }
        cursor = entry.parent_id.as_deref();
    }
    out.reverse();
    Ok(out)
}

fn text_block(text: String) -> Vec<ContentBlock> {
    vec![ContentBlock::Text { text }]
}

/// The message an entry contributes to the context (compaction entries contribute through
/// [`context`], not here).
pub fn entry_message(e: &Entry) -> Option<AgentMessage> {
    match &e.body {
        EntryBody::Message { message } => Some(message.clone()),
        EntryBody::CustomMessage {
            custom_type,
            content,
            display,
            details,
        } => Some(AgentMessage::Custom {
            custom_type: custom_type.clone(),
            content: content.clone(),
            display: display.clone(),
            details: details.clone(),
            timestamp: e.timestamp,
        }),
        EntryBody::BranchSummary { summary, .. } => Some(AgentMessage::Custom {
            custom_type: "branch_summary".into(),
            content: text_block(format!(
                "Summary of the earlier conversation this branch was forked from:\n{summary}"
            )),
            display: Some("branch summary".into()),
            details: json!({"entry_id": e.id}),
            timestamp: e.timestamp,
        }),
        EntryBody::Compaction { .. } => None,
    }
}

/// The model context of a path: with a compaction on it, the latest compaction's summary,
/// then the kept tail (from `tail_start_id` up to the compaction), then what came after.
/// Returns `(entry_id, message)` pairs.
pub fn context(path: &[&Entry]) -> Vec<(String, AgentMessage)> {
    let last_compaction = path
        .iter()
        .rposition(|e| matches!(e.body, EntryBody::Compaction { .. }));
    let Some(c) = last_compaction else {
        return path
            .iter()
            .filter_map(|e| entry_message(e).map(|m| (e.id.clone(), m)))
            .collect();
    };
    let EntryBody::Compaction {
        summary,
        tail_start_id,
        tokens_before,
        ..
    } = &path[c].body
    else {
        unreachable!("rposition matched a compaction")
    };
    let mut out = vec![(
        path[c].id.clone(),
        AgentMessage::Custom {
            custom_type: "compaction_summary".into(),
            content: text_block(format!(
                "The conversation so far was compacted. Summary of the earlier part:\n\n{summary}"
            )),
            display: Some("compaction summary".into()),
            details: json!({"entry_id": path[c].id, "tokens_before": tokens_before}),
            timestamp: path[c].timestamp,
        },
    )];
    let tail_start = tail_start_id
        .as_deref()
        .and_then(|t| path[..c].iter().position(|e| e.id == t))
        .unwrap_or(c);
    for e in path[tail_start..c].iter().chain(path[c + 1..].iter()) {
        if let Some(m) = entry_message(e) {
            out.push((e.id.clone(), m));
        }
    }
    out
}

/// Plain text of a message, for digests and the HTML export.
pub fn message_text(m: &AgentMessage) -> String {
    let blocks = match m {
        AgentMessage::User { content, .. }
        | AgentMessage::Assistant { content, .. }
        | AgentMessage::FunctionResult { content, .. }
        | AgentMessage::Custom { content, .. } => content,
    };
    let mut out = Vec::new();
    for b in blocks {
        match b {
            ContentBlock::Text { text } => out.push(text.clone()),
            ContentBlock::Thinking { text, .. } => out.push(format!("(thinking) {text}")),
            ContentBlock::FunctionCall {
                function_id,
                arguments,
                ..
            } => out.push(format!("→ {function_id} {arguments}")),
            ContentBlock::Image { mime, .. } => out.push(format!("[image {mime}]")),
        }
    }
    if let AgentMessage::Assistant {
        error_message: Some(e),
        ..
    } = m
    {
        out.push(format!("(error) {e}"));
    }
    out.join("\n")
}

pub fn role(m: &AgentMessage) -> &'static str {
    match m {
        AgentMessage::User { .. } => "user",
        AgentMessage::Assistant { .. } => "assistant",
        AgentMessage::FunctionResult { .. } => "function_result",
        AgentMessage::Custom { .. } => "custom",
    }
}

/// A short digest of entries a fork leaves out (no model call: the fork must be cheap and
/// deterministic; a compaction can later summarize properly).
pub fn digest(entries: &[&Entry]) -> String {
    let mut lines = Vec::new();
    for e in entries {
        let line = match entry_message(e) {
            Some(m) => {
                let text = message_text(&m).replace('\n', " ");
                let short: String = text.chars().take(160).collect();
                format!("- {}: {short}", role(&m))
            }
            None => match &e.body {
                EntryBody::Compaction { summary, .. } => {
                    format!("- (earlier summary) {}", summary.replace('\n', " "))
                }
                _ => continue,
            },
        };
        lines.push(line);
    }
    lines.join("\n")
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A readable, self-contained page of one branch (root → leaf).
pub fn export_html(session_id: &str, path: &[&Entry]) -> String {
    let mut body = String::new();
    for e in path {
        let (class, title, text) = match &e.body {
            EntryBody::Compaction {
                summary,
                tokens_before,
                ..
            } => (
                "compaction",
                format!("compaction ({tokens_before} tokens before)"),
                summary.clone(),
            ),
            EntryBody::BranchSummary { summary, .. } => {
                ("summary", "branch summary".to_string(), summary.clone())
            }
            _ => match entry_message(e) {
                Some(m) => {
                    let title = match &m {
                        AgentMessage::FunctionResult {
                            function_id,
                            is_error,
                            ..
                        } => format!(
                            "result of {function_id}{}",
                            if *is_error { " (error)" } else { "" }
                        ),
                        AgentMessage::Custom { custom_type, .. } => custom_type.clone(),
                        other => role(other).to_string(),
                    };
                    (role(&m), title, message_text(&m))
                }
                None => continue,
            },
        };
        body.push_str(&format!(
            "<section class=\"{class}\" id=\"{id}\"><h2>{title}</h2><pre>{text}</pre></section>\n",
            id = escape(&e.id),
            title = escape(&title),
            text = escape(&text),
        ));
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Session {sid}</title>\n<style>body{{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem}}section{{border-left:4px solid #ccc;margin:1rem 0;padding:.25rem 1rem}}.user{{border-color:#36c}}.assistant{{border-color:#2a2}}.function_result{{border-color:#999}}.compaction,.summary{{border-color:#c80;background:#fff8e8}}pre{{white-space:pre-wrap;font-family:inherit}}h2{{font-size:.9rem;color:#555;margin:.25rem 0}}</style></head>\n<body><h1>Session {sid}</h1>\n{body}</body></html>\n",
        sid = escape(session_id),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_sdk::messages::user_text;

    fn msg(id: &str, parent: Option<&str>, seq: u64, text: &str) -> Entry {
        Entry {
            id: id.into(),
            parent_id: parent.map(str::to_owned),
            timestamp: 1,
            seq,
            body: EntryBody::Message {
                message: user_text(text),
            },
        }
    }

    fn texts(ctx: &[(String, AgentMessage)]) -> Vec<String> {
        ctx.iter().map(|(_, m)| message_text(m)).collect()
    }

    #[test]
    fn the_leaf_is_the_newest_childless_entry_and_branches_keep_both_paths() {
        let entries = vec![
            msg("a", None, 1, "a"),
            msg("b", Some("a"), 2, "b"),
            msg("c", Some("b"), 3, "c"),
            // A branch from `a`, newer than `c`.
            msg("d", Some("a"), 4, "d"),
        ];
        assert_eq!(leaf(&entries).unwrap().id, "d");
        let ids = |p: Vec<&Entry>| p.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(path(&entries, "d").unwrap()), ["a", "d"]);
        assert_eq!(ids(path(&entries, "c").unwrap()), ["a", "b", "c"]);
        assert_eq!(
            path(&entries, "zz").unwrap_err(),
            TreeError::EntryNotFound("zz".into())
        );
    }

    #[test]
    fn a_loop_or_a_missing_parent_is_reported_not_followed() {
        let entries = vec![msg("a", Some("b"), 1, "a"), msg("b", Some("a"), 2, "b")];
        assert!(matches!(path(&entries, "a"), Err(TreeError::Broken(_))));
        let entries = vec![msg("a", Some("gone"), 1, "a")];
        assert!(matches!(path(&entries, "a"), Err(TreeError::Broken(_))));
    }

    #[test]
    fn context_after_compaction_is_summary_then_tail_then_newer_entries() {
        let mut entries = vec![
            msg("1", None, 1, "one"),
            msg("2", Some("1"), 2, "two"),
            msg("3", Some("2"), 3, "three"),
        ];
        entries.push(Entry {
            id: "c".into(),
            parent_id: Some("3".into()),
            timestamp: 1,
            seq: 4,
            body: EntryBody::Compaction {
                summary: "S".into(),
                tail_start_id: Some("3".into()),
                tokens_before: 100,
                details: serde_json::Value::Null,
            },
        });
        entries.push(msg("4", Some("c"), 5, "four"));
        let p = path(&entries, "4").unwrap();
        let ctx = context(&p);
        let t = texts(&ctx);
        assert_eq!(t.len(), 3);
        assert!(t[0].contains("S"), "{t:?}");
        assert_eq!(&t[1..], ["three", "four"]);
    }

    #[test]
    fn html_is_escaped() {
        let entries = vec![msg("a", None, 1, "<script>x</script> & co")];
        let p = path(&entries, "a").unwrap();
        let html = export_html("s<1>", &p);
        assert!(html.contains("&lt;script&gt;x&lt;/script&gt; &amp; co"));
        assert!(html.contains("Session s&lt;1&gt;"));
        assert!(!html.contains("<script>"));
    }
}
