//! The OpenAI Chat Completions dialect: messages (system, user, assistant with `tool_calls`,
//! `tool` results), tools as functions, `stream_options.include_usage`, and the translation of
//! SSE chunks (content, `reasoning_content`, `tool_calls` deltas assembled by index,
//! `finish_reason`, the usage chunk, `[DONE]`). Kimi (Moonshot) and LM Studio speak the same
//! dialect at their own base URLs.

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

pub struct OpenAiDialect {
    pub name: String,
    /// Including the version path, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub key_optional: bool,
}

impl OpenAiDialect {
    pub fn openai() -> Self {
        Self::from_env(
            "openai",
            "OPENAI_BASE_URL",
            "https://api.openai.com/v1",
            false,
        )
    }
    pub fn kimi() -> Self {
        Self::from_env(
            "kimi",
            "MOONSHOT_BASE_URL",
            "https://api.moonshot.ai/v1",
            false,
        )
    }
    pub fn lmstudio() -> Self {
        Self::from_env(
            "lmstudio",
            "LMSTUDIO_BASE_URL",
            "http://127.0.0.1:1234/v1",
            true,
        )
    }
    pub fn from_env(name: &str, var: &str, default: &str, key_optional: bool) -> Self {
        Self {
            name: name.into(),
            base_url: std::env::var(var).unwrap_or_else(|_| default.into()),
            key_optional,
        }
    }
}

// The request body as Chat Completions takes it, borrowed from the request and written
// straight to bytes: building a JSON tree of the whole conversation first cost time that grew
// with it on every model call.

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename = "function")]
struct WireTool<'a> {
    function: WireToolFunction<'a>,
}

#[derive(Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    /// `content` is null when the model only called functions.
    Assistant {
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

/// Plain text, or parts when the message holds an image.
#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(String),
    Parts(Vec<UserPart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum UserPart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Serialize)]
struct ImageUrl {
    url: String,
}

#[derive(Serialize)]
#[serde(tag = "type", rename = "function")]
struct WireCall<'a> {
    id: &'a str,
    function: WireCallFunction<'a>,
}

#[derive(Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    /// The arguments as a JSON string, as the API wants them.
    arguments: String,
}

fn user_content(content: &[ContentBlock]) -> UserContent<'_> {
    let has_image = content
        .iter()
        .any(|c| matches!(c, ContentBlock::Image { .. }));
    if !has_image {
        return UserContent::Text(text_of(content));
    }
    UserContent::Parts(
        content
            .iter()
            .filter_map(|c| match c {
                ContentBlock::Text { text } => Some(UserPart::Text { text }),
                ContentBlock::Image { mime, data } => Some(UserPart::ImageUrl {
                    image_url: ImageUrl {
                        url: format!("data:{mime};base64,{data}"),
                    },
                }),
                _ => None,
            })
            .collect(),
    )
}

fn wire_messages<'a>(system: Option<&'a str>, history: &'a [AgentMessage]) -> Vec<WireMessage<'a>> {
    let mut out = Vec::with_capacity(history.len() + 1);
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        out.push(WireMessage::System { content: s });
    }
    // Tool messages carry text only: the images of a batch's results follow them, in one
    // user message after the batch (a message between tool results would break the turn).
    let mut images: Vec<UserPart<'a>> = Vec::new();
    for m in history {
        if !images.is_empty() && !matches!(m, AgentMessage::FunctionResult { .. }) {
            out.push(WireMessage::User {
                content: UserContent::Parts(std::mem::take(&mut images)),
            });
        }
        out.push(match m {
            AgentMessage::User { content, .. } => WireMessage::User {
                content: user_content(content),
            },
            AgentMessage::Custom { content, .. } => WireMessage::User {
                content: UserContent::Text(text_of(content)),
            },
            AgentMessage::Assistant { content, .. } => {
                let text = text_of(content);
                WireMessage::Assistant {
                    content: (!text.is_empty()).then_some(text),
                    tool_calls: content
                        .iter()
                        .filter_map(|c| match c {
                            ContentBlock::FunctionCall {
                                id,
                                function_id,
                                arguments,
                            } => Some(WireCall {
                                id,
                                function: WireCallFunction {
                                    name: function_id,
                                    // Not `to_string()`: `Display` writes through the
                                    // formatter, several times slower per message.
                                    arguments: serde_json::to_string(arguments).unwrap_or_default(),
                                },
                            }),
                            _ => None,
                        })
                        .collect(),
                }
            }
            AgentMessage::FunctionResult {
                function_call_id,
                content,
                ..
            } => {
                for c in content {
                    if let ContentBlock::Image { mime, data } = c {
                        if images.is_empty() {
                            images.push(UserPart::Text {
                                text: "The images the tool results above returned:",
                            });
                        }
                        images.push(UserPart::ImageUrl {
                            image_url: ImageUrl {
                                url: format!("data:{mime};base64,{data}"),
                            },
                        });
                    }
                }
                WireMessage::Tool {
                    tool_call_id: function_call_id,
                    content: text_of(content),
                }
            }
        });
    }
    if !images.is_empty() {
        out.push(WireMessage::User {
            content: UserContent::Parts(images),
        });
    }
    out
}

/// A usage object → (uncached input, cached input, output). The cached part of the prompt is
/// `prompt_tokens_details.cached_tokens` (OpenAI, LM Studio) or `cached_tokens` (Kimi), and
/// is inside `prompt_tokens` in both: it is priced as a cache read, the rest as input.
pub fn read_usage(u: &Value) -> (u64, u64, u64) {
    let prompt = u["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = u
        .pointer("/prompt_tokens_details/cached_tokens")
        .or_else(|| u.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(prompt);
    let output = u["completion_tokens"].as_u64().unwrap_or(0);
    (prompt - cached, cached, output)
}

#[async_trait]
impl Dialect for OpenAiDialect {
    fn name(&self) -> &str {
        &self.name
    }

    fn credentials_optional(&self) -> bool {
        self.key_optional
    }

    fn request(
        &self,
        client: &reqwest::Client,
        creds: &Credentials,
        req: &StreamRequest,
        stream: bool,
    ) -> reqwest::RequestBuilder {
        let body = ChatBody {
            model: &req.model,
            messages: wire_messages(req.system_prompt.as_deref(), req.messages()),
            stream,
            stream_options: stream.then_some(StreamOptions {
                include_usage: true,
            }),
            max_completion_tokens: req.max_tokens,
            tools: req
                .tools
                .iter()
                .map(|t| WireTool {
                    function: WireToolFunction {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
        };
        let mut rb = client
            .post(format!(
                "{}/chat/completions",
                self.base_url.trim_end_matches('/')
            ))
            .json(&body);
        if let Some(k) = &creds.api_key {
            rb = rb.bearer_auth(k);
        }
        rb
    }

    async fn translate(&self, events: &mut EventStream, em: &mut Emitter) -> Outcome {
        let mut open = OpenBlock::None;
        let mut finish: Option<StopReason> = None;
        let mut call_index: Option<u64> = None;
        while let Some(ev) = events.next().await {
            let ev = ev.map_err(|e| (ErrorKind::Transient, e))?;
            if ev.data.trim() == "[DONE]" {
                close_block(&mut open, em).await?;
                return match finish {
                    Some(f) => Ok(f),
                    None => Err((
                        ErrorKind::Transient,
                        "the stream ended without a finish_reason".into(),
                    )),
                };
            }
            let chunk: Value = serde_json::from_str(&ev.data)
                .map_err(|e| (ErrorKind::Transient, format!("malformed stream chunk: {e}")))?;
            if let Some(err) = chunk.get("error") {
                let msg = err["message"]
                    .as_str()
                    .unwrap_or("upstream error")
                    .to_string();
                return Err((ErrorKind::Transient, msg));
            }
            // OpenAI sends usage on the chunk; Moonshot's stream puts it in the last choice.
            let usage = [chunk.get("usage"), chunk.pointer("/choices/0/usage")]
                .into_iter()
                .flatten()
                .find(|u| u.is_object());
            if let Some(u) = usage {
                let (input, cache_read, output) = read_usage(u);
                em.builder.usage.input = input;
                em.builder.usage.cache_read = cache_read;
                em.builder.usage.output = output;
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            let delta = &choice["delta"];
            if let Some(t) = delta["reasoning_content"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                if open != OpenBlock::Thinking {
                    close_block(&mut open, em).await?;
                    open = OpenBlock::Thinking;
                    em.builder.start_thinking();
                    em.emit(Ev::ThinkingStart {
                        partial: em.partial(),
                    })
                    .await;
                }
                em.builder.push_thinking(t);
                em.emit(Ev::ThinkingDelta {
                    delta: t.to_string(),
                    partial: em.partial(),
                })
                .await;
            }
            if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                if open != OpenBlock::Text {
                    close_block(&mut open, em).await?;
                    open = OpenBlock::Text;
                    em.builder.start_text();
                    em.emit(Ev::TextStart {
                        partial: em.partial(),
                    })
                    .await;
                }
                em.builder.push_text(t);
                em.emit(Ev::TextDelta {
                    delta: t.to_string(),
                    partial: em.partial(),
                })
                .await;
            }
            if let Some(calls) = delta["tool_calls"].as_array() {
                for c in calls {
                    let index = c["index"].as_u64().unwrap_or(0);
                    if call_index != Some(index) {
                        // A new index starts a new call (deltas arrive grouped by index).
                        close_block(&mut open, em).await?;
                        open = OpenBlock::Call;
                        call_index = Some(index);
                        em.builder.start_call(
                            c["id"].as_str().unwrap_or_default(),
                            c["function"]["name"].as_str().unwrap_or_default(),
                        );
                        em.emit(Ev::FunctioncallStart {
                            partial: em.partial(),
                        })
                        .await;
                    }
                    if let Some(a) = c["function"]["arguments"]
                        .as_str()
                        .filter(|a| !a.is_empty())
                    {
                        em.builder.push_call_args(a);
                        em.emit(Ev::FunctioncallDelta {
                            delta: a.to_string(),
                            partial: em.partial(),
                        })
                        .await;
                    }
                }
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(match f {
                    "tool_calls" | "function_call" => StopReason::FunctionCall,
                    "length" => StopReason::Length,
                    _ => StopReason::End,
                });
            }
        }
        Err((
            ErrorKind::Transient,
            "the stream ended before [DONE]".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_sdk::messages::{AgentMessage, ContentBlock};

    #[test]
    fn cached_prompt_tokens_are_read_in_each_dialects_place() {
        // OpenAI and LM Studio: prompt_tokens_details.cached_tokens.
        let openai = serde_json::json!({"prompt_tokens": 1200, "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 1024}});
        assert_eq!(read_usage(&openai), (176, 1024, 7));
        // Kimi (Moonshot): cached_tokens beside prompt_tokens.
        let kimi =
            serde_json::json!({"prompt_tokens": 300, "completion_tokens": 2, "cached_tokens": 256});
        assert_eq!(read_usage(&kimi), (44, 256, 2));
        // Hostile: a cached count over the prompt is cut to it; junk reads as zero.
        let odd =
            serde_json::json!({"prompt_tokens": 10, "cached_tokens": 99, "completion_tokens": "x"});
        assert_eq!(read_usage(&odd), (0, 10, 0));
        assert_eq!(read_usage(&serde_json::json!({})), (0, 0, 0));
    }

    fn result(id: &str, image: bool) -> AgentMessage {
        let mut content = vec![ContentBlock::Text {
            text: format!("result {id}"),
        }];
        if image {
            content.push(ContentBlock::Image {
                mime: "image/png".into(),
                data: "iVBORw0KGgo=".into(),
            });
        }
        AgentMessage::FunctionResult {
            function_call_id: id.into(),
            function_id: "mcp::s::img".into(),
            content,
            details: serde_json::Value::Null,
            is_error: false,
            timestamp: 1,
        }
    }

    #[test]
    fn a_results_images_follow_the_batch_in_one_user_message() {
        let history = vec![result("a", true), result("b", false), result("c", true)];
        let wire = serde_json::to_value(wire_messages(None, &history)).unwrap();
        let roles: Vec<&str> = wire
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        // Tool messages stay together; the images come after them, once.
        assert_eq!(roles, ["tool", "tool", "tool", "user"], "{wire}");
        let parts = wire[3]["content"].as_array().unwrap();
        assert_eq!(parts.len(), 3, "a note and two images: {wire}");
        assert_eq!(
            parts[1]["image_url"]["url"],
            "data:image/png;base64,iVBORw0KGgo="
        );
        assert_eq!(wire[0]["content"], "result a");
    }
}
