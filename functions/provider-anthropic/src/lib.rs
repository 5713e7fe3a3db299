//! The Anthropic Messages API dialect: request shape (system, alternating user/assistant
//! turns, `tool_use` / `tool_result` blocks, tools with `input_schema`) and the translation
//! of its SSE events (`message_start`, `content_block_start|delta|stop` with `text_delta`,
//! `thinking_delta`, `signature_delta`, `input_json_delta`, `message_delta`, `message_stop`,
//! `ping`, `error`) into `AssistantMessageEvent` frames.

use async_trait::async_trait;
use futures_util::StreamExt;
use harness_sdk::messages::{
    AgentMessage, AssistantMessageEvent as Ev, ContentBlock, ErrorKind, StopReason,
};
use provider_core::{
    Credentials, Dialect, Emitter, EventStream, OpenBlock, Outcome, StreamRequest, close_block,
    text_of,
};
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";
pub const DEFAULT_MAX_TOKENS: u64 = 16_384;

pub struct Anthropic {
    pub base_url: String,
}

impl Anthropic {
    /// `ANTHROPIC_BASE_URL` or the public API.
    pub fn from_env() -> Self {
        Self {
            base_url: std::env::var("ANTHROPIC_BASE_URL")
                .unwrap_or_else(|_| DEFAULT_BASE_URL.into()),
        }
    }
}

// The request body as the Messages API takes it, borrowed from the request and written
// straight to bytes: building a JSON tree of the whole conversation first cost time that grew
// with it on every model call.

#[derive(Serialize)]
struct MessagesBody<'a> {
    model: &'a str,
    max_tokens: u64,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<[SystemBlock<'a>; 1]>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

/// Prompt caching: a breakpoint (`cache_control: ephemeral`) after the system prompt, after the
/// tool list and on the conversation's latest message, three of the four the API allows, so
/// each model call of a session reads the prefix the previous one wrote.
#[derive(Debug, Serialize, Clone, Copy)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl { kind: "ephemeral" };

#[derive(Serialize)]
struct SystemBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Marked<'a>>,
}

/// A content block, with the cache breakpoint when it is the conversation's last.
#[derive(Debug, Serialize)]
struct Marked<'a> {
    #[serde(flatten)]
    block: WireBlock<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text {
        text: Cow<'a, str>,
    },
    Image {
        source: ImageSource<'a>,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: ToolResultContent<'a>,
        is_error: bool,
    },
}

/// A tool result's content: its text, or text and images (an MCP tool's picture).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ToolResultContent<'a> {
    Text(String),
    Blocks(Vec<WireBlock<'a>>),
}

fn tool_result_content(content: &[ContentBlock]) -> ToolResultContent<'_> {
    if !content
        .iter()
        .any(|c| matches!(c, ContentBlock::Image { .. }))
    {
        return ToolResultContent::Text(text_of(content));
    }
    ToolResultContent::Blocks(
        content
            .iter()
            .filter(|c| matches!(c, ContentBlock::Text { .. } | ContentBlock::Image { .. }))
            .filter_map(block)
            .collect(),
    )
}

#[derive(Debug, Serialize)]
struct ImageSource<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    data: &'a str,
}

fn block(c: &ContentBlock) -> Option<WireBlock<'_>> {
    Some(match c {
        ContentBlock::Text { text } => WireBlock::Text { text: text.into() },
        ContentBlock::Image { mime, data } => WireBlock::Image {
            source: ImageSource {
                kind: "base64",
                media_type: mime,
                data,
            },
        },
        // Thinking goes back only with its signature (the API rejects unsigned thinking).
        ContentBlock::Thinking {
            text,
            signature: Some(sig),
        } => WireBlock::Thinking {
            thinking: text,
            signature: sig,
        },
        ContentBlock::Thinking {
            signature: None, ..
        } => return None,
        ContentBlock::FunctionCall {
            id,
            function_id,
            arguments,
        } => WireBlock::ToolUse {
            id,
            name: function_id,
            input: arguments,
        },
    })
}

/// Agent messages → Anthropic messages; consecutive same-role turns are merged, as the API
/// requires alternation.
fn messages<'a>(history: &'a [AgentMessage], cache: bool) -> Vec<WireMessage<'a>> {
    let mut out: Vec<WireMessage<'a>> = Vec::with_capacity(history.len());
    let mut push = |role: &'static str, blocks: Vec<WireBlock<'a>>| {
        if blocks.is_empty() {
            return;
        }
        let blocks = blocks.into_iter().map(|block| Marked {
            block,
            cache_control: None,
        });
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => out.push(WireMessage {
                role,
                content: blocks.collect(),
            }),
        }
    };
    for m in history {
        match m {
            AgentMessage::User { content, .. } => {
                push("user", content.iter().filter_map(block).collect())
            }
            AgentMessage::Custom { content, .. } => push(
                "user",
                vec![WireBlock::Text {
                    text: text_of(content).into(),
                }],
            ),
            AgentMessage::Assistant { content, .. } => {
                push("assistant", content.iter().filter_map(block).collect())
            }
            AgentMessage::FunctionResult {
                function_call_id,
                content,
                is_error,
                ..
            } => push(
                "user",
                vec![WireBlock::ToolResult {
                    tool_use_id: function_call_id,
                    content: tool_result_content(content),
                    is_error: *is_error,
                }],
            ),
        }
    }
    // The latest message is the conversation's newest stable prefix: the next call reads it
    // from the cache (a thinking block cannot carry the breakpoint).
    if cache
        && let Some(last) = out.last_mut().and_then(|m| m.content.last_mut())
        && !matches!(last.block, WireBlock::Thinking { .. })
    {
        last.cache_control = Some(EPHEMERAL);
    }
    out
}

fn error_kind(kind: &str) -> ErrorKind {
    match kind {
        "authentication_error" | "permission_error" => ErrorKind::AuthExpired,
        "rate_limit_error" => ErrorKind::RateLimited,
        "overloaded_error" | "api_error" => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

#[async_trait]
impl Dialect for Anthropic {
    fn name(&self) -> &str {
        "anthropic"
    }

    fn request(
        &self,
        client: &reqwest::Client,
        creds: &Credentials,
        req: &StreamRequest,
        stream: bool,
    ) -> reqwest::RequestBuilder {
        // Every Anthropic model takes breakpoints: only an explicit `false` leaves them out.
        let cache = req.prompt_cache != Some(false);
        let mark = |yes: bool| (cache && yes).then_some(EPHEMERAL);
        let body = MessagesBody {
            model: &req.model,
            max_tokens: req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            messages: messages(req.messages(), cache),
            stream,
            system: req
                .system_prompt
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|text| {
                    [SystemBlock {
                        kind: "text",
                        text,
                        cache_control: mark(true),
                    }]
                }),
            tools: req
                .tools
                .iter()
                .enumerate()
                .map(|(i, t)| WireTool {
                    name: &t.name,
                    description: &t.description,
                    input_schema: &t.parameters,
                    cache_control: mark(i + 1 == req.tools.len()),
                })
                .collect(),
        };
        client
            .post(format!(
                "{}/v1/messages",
                self.base_url.trim_end_matches('/')
            ))
            .header("x-api-key", creds.api_key.clone().unwrap_or_default())
            .header("anthropic-version", API_VERSION)
            .json(&body)
    }

    async fn translate(&self, events: &mut EventStream, em: &mut Emitter) -> Outcome {
        let mut open = OpenBlock::None;
        let mut stop: Option<StopReason> = None;
        while let Some(ev) = events.next().await {
            let ev = ev.map_err(|e| (ErrorKind::Transient, e))?;
            let data: Value = serde_json::from_str(&ev.data).map_err(|e| {
                (
                    ErrorKind::Transient,
                    format!("malformed stream event `{}`: {e}", ev.event),
                )
            })?;
            match data["type"].as_str().unwrap_or(ev.event.as_str()) {
                "message_start" => {
                    let u = &data["message"]["usage"];
                    em.builder.usage.input = u["input_tokens"].as_u64().unwrap_or(0);
                    em.builder.usage.cache_read =
                        u["cache_read_input_tokens"].as_u64().unwrap_or(0);
                    em.builder.usage.cache_write =
                        u["cache_creation_input_tokens"].as_u64().unwrap_or(0);
                }
                "content_block_start" => {
                    let b = &data["content_block"];
                    match b["type"].as_str() {
                        Some("text") => {
                            open = OpenBlock::Text;
                            em.builder.start_text();
                            em.emit(Ev::TextStart {
                                partial: em.partial(),
                            })
                            .await;
                        }
                        Some("thinking") | Some("redacted_thinking") => {
                            open = OpenBlock::Thinking;
                            em.builder.start_thinking();
                            em.emit(Ev::ThinkingStart {
                                partial: em.partial(),
                            })
                            .await;
                        }
                        Some("tool_use") => {
                            open = OpenBlock::Call;
                            em.builder.start_call(
                                b["id"].as_str().unwrap_or_default(),
                                b["name"].as_str().unwrap_or_default(),
                            );
                            em.emit(Ev::FunctioncallStart {
                                partial: em.partial(),
                            })
                            .await;
                        }
                        _ => open = OpenBlock::None,
                    }
                }
                "content_block_delta" => {
                    let d = &data["delta"];
                    match d["type"].as_str() {
                        Some("text_delta") => {
                            let t = d["text"].as_str().unwrap_or_default().to_string();
                            em.builder.push_text(&t);
                            em.emit(Ev::TextDelta {
                                delta: t,
                                partial: em.partial(),
                            })
                            .await;
                        }
                        Some("thinking_delta") => {
                            let t = d["thinking"].as_str().unwrap_or_default().to_string();
                            em.builder.push_thinking(&t);
                            em.emit(Ev::ThinkingDelta {
                                delta: t,
                                partial: em.partial(),
                            })
                            .await;
                        }
                        Some("signature_delta") => em
                            .builder
                            .set_signature(d["signature"].as_str().unwrap_or_default()),
                        Some("input_json_delta") => {
                            let t = d["partial_json"].as_str().unwrap_or_default().to_string();
                            em.builder.push_call_args(&t);
                            em.emit(Ev::FunctioncallDelta {
                                delta: t,
                                partial: em.partial(),
                            })
                            .await;
                        }
                        _ => {}
                    }
                }
                "content_block_stop" => close_block(&mut open, em).await?,
                "message_delta" => {
                    if let Some(o) = data["usage"]["output_tokens"].as_u64() {
                        em.builder.usage.output = o;
                    }
                    stop = match data["delta"]["stop_reason"].as_str() {
                        Some("tool_use") => Some(StopReason::FunctionCall),
                        Some("max_tokens") => Some(StopReason::Length),
                        Some(_) => Some(StopReason::End),
                        None => stop,
                    };
                }
                "message_stop" => {
                    return Ok(stop.unwrap_or(if em.builder.has_calls() {
                        StopReason::FunctionCall
                    } else {
                        StopReason::End
                    }));
                }
                "ping" => {}
                "error" => {
                    let kind = data["error"]["type"].as_str().unwrap_or("api_error");
                    let msg = data["error"]["message"]
                        .as_str()
                        .unwrap_or("upstream error");
                    return Err((error_kind(kind), format!("{kind}: {msg}")));
                }
                _ => {}
            }
        }
        Err((
            ErrorKind::Transient,
            "the stream ended before message_stop".into(),
        ))
    }
}
