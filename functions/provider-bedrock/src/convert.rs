//! Our messages → a Converse request: system blocks; user and assistant turns (consecutive
//! turns of one role merged, as Converse wants them alternating); `toolUse` for function calls
//! and `toolResult` (with `status: error` for a failed call) for their results; images; the
//! agent's tools as `toolConfig`; reasoning passed back with its signature; prompt caching as
//! `cachePoint` blocks after the system prompt, the tools (Claude) and the latest message.

use aws_sdk_bedrockruntime::types::{
    CachePointBlock, CachePointType, ContentBlock, ConversationRole, ImageBlock, ImageFormat,
    ImageSource, Message, ReasoningContentBlock, ReasoningTextBlock, SystemContentBlock, Tool,
    ToolConfiguration, ToolInputSchema, ToolResultBlock, ToolResultContentBlock, ToolResultStatus,
    ToolSpecification, ToolUseBlock,
};
use aws_smithy_types::{Blob, Document, Number};
use base64::Engine;
use harness_sdk::messages::{AgentMessage, ContentBlock as Ours};
use provider_core::{StreamRequest, text_of};
use serde_json::Value;
use std::collections::HashMap;

pub struct Request {
    pub system: Vec<SystemContentBlock>,
    pub messages: Vec<Message>,
    pub tools: Option<ToolConfiguration>,
}

/// JSON → the SDK's document (tool schemas and inputs).
pub fn document(v: &Value) -> Document {
    match v {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Number::PosInt(u),
            (_, Some(i), _) => Number::NegInt(i),
            (_, _, f) => Number::Float(f.unwrap_or(0.0)),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(a) => Document::Array(a.iter().map(document).collect()),
        Value::Object(o) => Document::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), document(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn image(mime: &str, data: &str) -> Option<ImageBlock> {
    let format = match mime {
        "image/png" => ImageFormat::Png,
        "image/jpeg" | "image/jpg" => ImageFormat::Jpeg,
        "image/gif" => ImageFormat::Gif,
        "image/webp" => ImageFormat::Webp,
        _ => return None,
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    ImageBlock::builder()
        .format(format)
        .source(ImageSource::Bytes(Blob::new(bytes)))
        .build()
        .ok()
}

/// An image Converse cannot take (its type, or data that is not base64) goes as a note.
fn image_or_note(mime: &str, data: &str) -> ContentBlock {
    match image(mime, data) {
        Some(i) => ContentBlock::Image(i),
        None => ContentBlock::Text(format!(
            "[an image ({mime}) Bedrock cannot take: only png, jpeg, gif and webp, base64]"
        )),
    }
}

fn user_blocks(content: &[Ours]) -> Vec<ContentBlock> {
    content
        .iter()
        .filter_map(|c| match c {
            Ours::Text { text } if !text.is_empty() => Some(ContentBlock::Text(text.clone())),
            Ours::Image { mime, data } => Some(image_or_note(mime, data)),
            _ => None,
        })
        .collect()
}

fn assistant_blocks(content: &[Ours]) -> Vec<ContentBlock> {
    content
        .iter()
        .filter_map(|c| match c {
            Ours::Text { text } if !text.is_empty() => Some(ContentBlock::Text(text.clone())),
            // Reasoning goes back only with its signature, as the model gave it.
            Ours::Thinking {
                text,
                signature: Some(sig),
            } => ReasoningTextBlock::builder()
                .text(text)
                .signature(sig)
                .build()
                .ok()
                .map(|r| ContentBlock::ReasoningContent(ReasoningContentBlock::ReasoningText(r))),
            Ours::FunctionCall {
                id,
                function_id,
                arguments,
            } => ToolUseBlock::builder()
                .tool_use_id(id)
                .name(function_id)
                .input(document(arguments))
                .build()
                .ok()
                .map(ContentBlock::ToolUse),
            _ => None,
        })
        .collect()
}

fn tool_result(function_call_id: &str, content: &[Ours], is_error: bool) -> Option<ContentBlock> {
    let mut blocks = vec![ToolResultContentBlock::Text(text_of(content))];
    for c in content {
        if let Ours::Image { mime, data } = c {
            match image(mime, data) {
                Some(i) => blocks.push(ToolResultContentBlock::Image(i)),
                None => blocks.push(ToolResultContentBlock::Text(format!(
                    "[an image ({mime}) Bedrock cannot take]"
                ))),
            }
        }
    }
    let mut b = ToolResultBlock::builder()
        .tool_use_id(function_call_id)
        .set_content(Some(blocks));
    if is_error {
        b = b.status(ToolResultStatus::Error);
    }
    b.build().ok().map(ContentBlock::ToolResult)
}

/// The model families Bedrock takes cache points from (Claude and Nova); it refuses a request
/// with one for any other model, so only these are marked when the caller does not say.
pub fn takes_cache_points(model: &str) -> bool {
    model.contains("anthropic.claude") || model.contains("amazon.nova")
}

/// Whether the tool list can carry a cache point (Claude's; Nova caches system and messages).
fn caches_tools(model: &str) -> bool {
    model.contains("anthropic.")
}

fn cache_point() -> Option<CachePointBlock> {
    CachePointBlock::builder()
        .r#type(CachePointType::Default)
        .build()
        .ok()
}

pub fn request(req: &StreamRequest) -> Request {
    let cache = req
        .prompt_cache
        .unwrap_or_else(|| takes_cache_points(&req.model));
    let mut system: Vec<SystemContentBlock> = req
        .system_prompt
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| SystemContentBlock::Text(s.clone()))
        .collect();
    if cache && !system.is_empty() {
        system.extend(cache_point().map(SystemContentBlock::CachePoint));
    }
    let mut turns: Vec<(ConversationRole, Vec<ContentBlock>)> = Vec::new();
    for m in req.messages() {
        let (role, blocks) = match m {
            AgentMessage::User { content, .. } => (ConversationRole::User, user_blocks(content)),
            AgentMessage::Custom { content, .. } => (
                ConversationRole::User,
                vec![ContentBlock::Text(text_of(content))],
            ),
            AgentMessage::Assistant { content, .. } => {
                (ConversationRole::Assistant, assistant_blocks(content))
            }
            AgentMessage::FunctionResult {
                function_call_id,
                content,
                is_error,
                ..
            } => (
                ConversationRole::User,
                tool_result(function_call_id, content, *is_error)
                    .into_iter()
                    .collect(),
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    // The latest message is the newest stable prefix: the next call reads it from the cache.
    if cache && let Some((_, last)) = turns.last_mut() {
        last.extend(cache_point().map(ContentBlock::CachePoint));
    }
    let messages = turns
        .into_iter()
        .filter_map(|(role, content)| {
            Message::builder()
                .role(role)
                .set_content(Some(content))
                .build()
                .ok()
        })
        .collect();
    let mut tools: Vec<Tool> = req
        .tools
        .iter()
        .filter_map(|t| {
            let schema = match &t.parameters {
                Value::Object(_) => t.parameters.clone(),
                _ => serde_json::json!({"type": "object"}),
            };
            ToolSpecification::builder()
                .name(&t.name)
                .description(&t.description)
                .input_schema(ToolInputSchema::Json(document(&schema)))
                .build()
                .ok()
                .map(Tool::ToolSpec)
        })
        .collect();
    if cache && caches_tools(&req.model) && !tools.is_empty() {
        tools.extend(cache_point().map(Tool::CachePoint));
    }
    let tools = match tools.is_empty() {
        true => None,
        false => ToolConfiguration::builder()
            .set_tools(Some(tools))
            .build()
            .ok(),
    };
    Request {
        system,
        messages,
        tools,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_map_to_alternating_converse_turns() {
        let req: StreamRequest = serde_json::from_value(json!({
            "model": "meta.llama-x",
            "system_prompt": "be brief",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "mime": "image/png", "data": "iVBORw0KGgo="}], "timestamp": 1},
                {"role": "assistant", "content": [{"type": "text", "text": "calling"}, {"type": "function_call", "id": "c1", "function_id": "agent_trigger", "arguments": {"function": "fs::list", "payload": {"n": -1, "f": 1.5}}}], "stop_reason": "function_call", "model": "m", "provider": "bedrock", "timestamp": 2},
                {"role": "function_result", "function_call_id": "c1", "function_id": "fs::list", "content": [{"type": "text", "text": "nope"}], "details": null, "is_error": true, "timestamp": 3},
                {"role": "user", "content": [{"type": "text", "text": "and?"}], "timestamp": 4}
            ],
            "tools": [{"name": "agent_trigger", "description": "call", "parameters": {"type": "object"}}]
        }))
        .unwrap();
        let r = request(&req);
        // An unknown family: no cache point (Bedrock would refuse it).
        assert_eq!(r.system.len(), 1);
        // user, assistant, then the result and the next user message merged into one turn.
        assert_eq!(r.messages.len(), 3);
        assert_eq!(r.messages[0].role(), &ConversationRole::User);
        assert!(matches!(r.messages[0].content()[1], ContentBlock::Image(_)));
        let ContentBlock::ToolUse(u) = &r.messages[1].content()[1] else {
            panic!("{:?}", r.messages[1])
        };
        assert_eq!(u.tool_use_id(), "c1");
        let ContentBlock::ToolResult(t) = &r.messages[2].content()[0] else {
            panic!()
        };
        assert_eq!(t.status(), Some(&ToolResultStatus::Error));
        assert_eq!(r.messages[2].content().len(), 2);
        assert!(r.tools.is_some());
        assert_eq!(
            document(&json!({"a": [1, -2, 2.5, "s", null, true]})),
            Document::Object(HashMap::from([(
                "a".to_string(),
                Document::Array(vec![
                    Document::Number(Number::PosInt(1)),
                    Document::Number(Number::NegInt(-2)),
                    Document::Number(Number::Float(2.5)),
                    Document::String("s".into()),
                    Document::Null,
                    Document::Bool(true),
                ])
            )]))
        );
    }

    fn cache_points(r: &Request) -> (usize, usize, usize) {
        let system = r
            .system
            .iter()
            .filter(|b| matches!(b, SystemContentBlock::CachePoint(_)))
            .count();
        let tools = r.tools.as_ref().map_or(0, |t| {
            t.tools()
                .iter()
                .filter(|b| matches!(b, Tool::CachePoint(_)))
                .count()
        });
        let messages = r
            .messages
            .iter()
            .flat_map(|m| m.content())
            .filter(|b| matches!(b, ContentBlock::CachePoint(_)))
            .count();
        (system, tools, messages)
    }

    fn cache_request(model: &str, prompt_cache: Option<bool>) -> Request {
        let mut v = json!({
            "model": model,
            "system_prompt": "be brief",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1},
                {"role": "assistant", "content": [{"type": "text", "text": "yes"}], "stop_reason": "end", "model": "m", "provider": "bedrock", "timestamp": 2},
                {"role": "user", "content": [{"type": "text", "text": "and?"}], "timestamp": 3}
            ],
            "tools": [{"name": "a", "description": "a", "parameters": {"type": "object"}},
                      {"name": "b", "description": "b", "parameters": {"type": "object"}}]
        });
        if let Some(c) = prompt_cache {
            v["prompt_cache"] = json!(c);
        }
        request(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn cache_points_go_where_the_model_takes_them() {
        // Claude: after the system prompt, the tools and the latest message, the last blocks.
        let r = cache_request("us.anthropic.claude-haiku-4-5-20251001-v1:0", None);
        assert_eq!(cache_points(&r), (1, 1, 1));
        assert!(matches!(
            r.system.last(),
            Some(SystemContentBlock::CachePoint(_))
        ));
        assert!(matches!(
            r.tools.as_ref().unwrap().tools().last(),
            Some(Tool::CachePoint(_))
        ));
        let last = r.messages.last().unwrap().content();
        assert!(matches!(last.last(), Some(ContentBlock::CachePoint(_))));
        assert!(
            r.messages[0]
                .content()
                .iter()
                .all(|b| !matches!(b, ContentBlock::CachePoint(_)))
        );
        // Nova: system and messages, never the tools.
        assert_eq!(
            cache_points(&cache_request("amazon.nova-pro-v1:0", None)),
            (1, 0, 1)
        );
        // Llama: none unless asked; none when told not to, whatever the family.
        assert_eq!(
            cache_points(&cache_request("meta.llama3-3-70b-instruct-v1:0", None)),
            (0, 0, 0)
        );
        assert_eq!(
            cache_points(&cache_request("anthropic.claude-x", Some(false))),
            (0, 0, 0)
        );
        // An inference-profile ARN the catalogue says caches: marked as told.
        assert_eq!(
            cache_points(&cache_request(
                "arn:aws:bedrock:us-east-1:1:application-inference-profile/p",
                Some(true)
            )),
            (1, 0, 1)
        );
    }
}
