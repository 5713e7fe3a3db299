//! `provider::bedrock::stream|complete`: Amazon Bedrock's Converse / ConverseStream API through
//! `aws-sdk-bedrockruntime`, authenticated by IAM (the SDK's default chain: environment,
//! profile, a Lambda's role; no API key to store), region from the usual settings. The
//! endpoint moves with the SDK's standard `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` (or
//! `AWS_ENDPOINT_URL`): that is how the tests reach the scripted model's ConverseStream.
//!
//! Our messages map to Converse ([`convert`]); the stream's `contentBlockDelta` text, reasoning
//! and tool-input deltas become `message_update` frames, `metadata.usage` (input, output, cache
//! read and write) the usage the worker prices, and `stopReason` the stop reason. Errors are
//! classified by their exception: throttling and unavailability are retryable, a validation
//! error, a denied model or a missing one is not, and says what to do.

pub mod convert;

use async_trait::async_trait;
use aws_sdk_bedrockruntime::types::{
    ContentBlockDelta, ContentBlockStart, ConverseStreamOutput, ReasoningContentBlockDelta,
    StopReason as BedrockStop,
};
use harness_sdk::messages::{AssistantMessageEvent as Ev, ErrorKind, StopReason};
use harness_sdk::{Ctx, Worker};
use provider_core::{Emitter, OpenBlock, Outcome, StreamRequest, Upstream, close_block};
use std::sync::Arc;

pub const NAME: &str = "bedrock";
/// `maxTokens` when the request names none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

pub struct Bedrock {
    client: bus::prewarm::Started<aws_sdk_bedrockruntime::Client>,
}

impl Bedrock {
    /// The client from the standard AWS configuration, built off the start-up path.
    pub fn from_env() -> Self {
        Self::new(None)
    }

    /// [`Bedrock::from_env`] with the runtime endpoint set (`harness.yaml`'s
    /// `providers.bedrock.base_url`); the standard variables still win.
    pub fn new(endpoint_url: Option<String>) -> Self {
        let client = bus::prewarm::start("the Bedrock client", async move {
            bus_telemetry::ensure_crypto_provider();
            // Region from the environment (a Lambda sets AWS_REGION) or the profile, else
            // us-east-1: not the instance metadata service, which off EC2 answers nothing
            // but two warnings at every start of a harness that merely lists Bedrock.
            let region = aws_config::meta::region::RegionProviderChain::first_try(
                aws_config::environment::region::EnvironmentVariableRegionProvider::new(),
            )
            .or_else(aws_config::profile::ProfileFileRegionProvider::new())
            .or_else(aws_config::Region::new("us-east-1"));
            let cfg = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .http_client(bus_aws::https_client())
                .region(region)
                .load()
                .await;
            let mut conf = aws_sdk_bedrockruntime::config::Builder::from(&cfg);
            if let Some(url) = endpoint_url {
                conf = conf.endpoint_url(url);
            }
            aws_sdk_bedrockruntime::Client::from_conf(conf.build())
        });
        Self { client }
    }
}

/// The worker registering `provider::bedrock::stream` and `provider::bedrock::complete`.
pub fn worker() -> Worker {
    provider_core::worker_for(Arc::new(Bedrock::from_env()))
}

/// An exception's code and message → what kind of failure it is, and what to say.
pub fn classify(code: &str, message: &str) -> (ErrorKind, String) {
    let text = format!("{code}: {message}");
    let kind = match code {
        "ThrottlingException" | "ServiceQuotaExceededException" | "TooManyRequestsException" => {
            ErrorKind::RateLimited
        }
        "ServiceUnavailableException"
        | "ModelNotReadyException"
        | "InternalServerException"
        | "ModelTimeoutException"
        | "ModelStreamErrorException" => ErrorKind::Transient,
        "ExpiredTokenException" | "UnrecognizedClientException" | "InvalidSignatureException" => {
            ErrorKind::AuthExpired
        }
        "AccessDeniedException" => {
            return (
                ErrorKind::Permanent,
                format!(
                    "{text} (the credentials may not invoke this model: request access to the model in the Bedrock console, and allow bedrock:InvokeModelWithResponseStream on it)"
                ),
            );
        }
        "ResourceNotFoundException" => {
            return (
                ErrorKind::Permanent,
                format!(
                    "{text} (check the model id or inference profile, and that the model is offered in this region)"
                ),
            );
        }
        "ValidationException"
            if message.contains("too long")
                || message.contains("context window")
                || message.contains("Input is too long") =>
        {
            ErrorKind::ContextOverflow
        }
        _ => ErrorKind::Permanent,
    };
    (kind, text)
}

fn sdk_error<E, R>(e: &aws_sdk_bedrockruntime::error::SdkError<E, R>) -> (ErrorKind, String)
where
    E: aws_sdk_bedrockruntime::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_bedrockruntime::error::{DisplayErrorContext, SdkError};
    match e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            classify(
                err.code().unwrap_or("ServiceError"),
                err.message().unwrap_or("no message"),
            )
        }
        // No answer: a connection refused or cut, a timeout, a frame that did not decode.
        other => (
            ErrorKind::Transient,
            format!("bedrock request failed: {}", DisplayErrorContext(other)),
        ),
    }
}

/// An exception frame in the middle of the stream: its variant names it (the frame's
/// `:exception-type` header, which the SDK reads into the variant, not into `code()`).
fn stream_error(
    e: &aws_sdk_bedrockruntime::error::SdkError<
        aws_sdk_bedrockruntime::types::error::ConverseStreamOutputError,
        aws_smithy_types::event_stream::RawMessage,
    >,
) -> (ErrorKind, String) {
    use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
    use aws_sdk_bedrockruntime::types::error::ConverseStreamOutputError as E;
    let SdkError::ServiceError(se) = e else {
        return sdk_error(e);
    };
    let err = se.err();
    let code = match err {
        E::ThrottlingException(_) => "ThrottlingException",
        E::ServiceUnavailableException(_) => "ServiceUnavailableException",
        E::InternalServerException(_) => "InternalServerException",
        E::ModelStreamErrorException(_) => "ModelStreamErrorException",
        E::ValidationException(_) => "ValidationException",
        other => other.code().unwrap_or("ServiceError"),
    };
    classify(code, err.message().unwrap_or("no message"))
}

fn tokens(n: i32) -> u64 {
    n.max(0) as u64
}

#[async_trait]
impl Upstream for Bedrock {
    fn name(&self) -> &str {
        NAME
    }

    async fn complete(&self, _ctx: &Ctx, req: &StreamRequest, em: &mut Emitter) -> Outcome {
        let client = self
            .client
            .clone()
            .await
            .map_err(|e| (ErrorKind::Transient, e))?;
        let request = convert::request(req);
        let max_tokens = req
            .max_tokens
            .unwrap_or(DEFAULT_MAX_TOKENS)
            .min(i32::MAX as u64) as i32;
        let sent = client
            .converse_stream()
            .model_id(&req.model)
            .set_system(Some(request.system))
            .set_messages(Some(request.messages))
            .set_tool_config(request.tools)
            .inference_config(
                aws_sdk_bedrockruntime::types::InferenceConfiguration::builder()
                    .max_tokens(max_tokens)
                    .build(),
            )
            .send()
            .await;
        let mut output = match sent {
            Ok(o) => o,
            Err(e) => return Err(sdk_error(&e)),
        };
        let mut open = OpenBlock::None;
        let mut stop: Option<StopReason> = None;
        loop {
            let event = match output.stream.recv().await {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => return Err(stream_error(&e)),
            };
            match event {
                ConverseStreamOutput::ContentBlockStart(e) => {
                    close_block(&mut open, em).await?;
                    if let Some(ContentBlockStart::ToolUse(t)) = e.start() {
                        open = OpenBlock::Call;
                        em.builder.start_call(t.tool_use_id(), t.name());
                        em.emit(Ev::FunctioncallStart {
                            partial: em.partial(),
                        })
                        .await;
                    }
                }
                ConverseStreamOutput::ContentBlockDelta(e) => match e.delta() {
                    Some(ContentBlockDelta::Text(t)) => {
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
                            delta: t.clone(),
                            partial: em.partial(),
                        })
                        .await;
                    }
                    // Input outside a started tool use has no call to go to: dropped.
                    Some(ContentBlockDelta::ToolUse(d)) if open == OpenBlock::Call => {
                        em.builder.push_call_args(d.input());
                        em.emit(Ev::FunctioncallDelta {
                            delta: d.input().to_string(),
                            partial: em.partial(),
                        })
                        .await;
                    }
                    Some(ContentBlockDelta::ReasoningContent(r)) => match r {
                        ReasoningContentBlockDelta::Text(t) => {
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
                                delta: t.clone(),
                                partial: em.partial(),
                            })
                            .await;
                        }
                        ReasoningContentBlockDelta::Signature(s) => em.builder.set_signature(s),
                        _ => {}
                    },
                    _ => {}
                },
                ConverseStreamOutput::ContentBlockStop(_) => close_block(&mut open, em).await?,
                ConverseStreamOutput::MessageStop(e) => {
                    close_block(&mut open, em).await?;
                    stop = Some(match e.stop_reason() {
                        BedrockStop::ToolUse => StopReason::FunctionCall,
                        BedrockStop::MaxTokens => StopReason::Length,
                        BedrockStop::ModelContextWindowExceeded => {
                            return Err((
                                ErrorKind::ContextOverflow,
                                "ModelContextWindowExceeded: the conversation is over the model's context window".into(),
                            ));
                        }
                        BedrockStop::MalformedToolUse | BedrockStop::MalformedModelOutput => {
                            return Err((
                                ErrorKind::Transient,
                                format!(
                                    "the model's output was malformed ({})",
                                    e.stop_reason().as_str()
                                ),
                            ));
                        }
                        _ => StopReason::End,
                    });
                }
                ConverseStreamOutput::Metadata(m) => {
                    if let Some(u) = m.usage() {
                        let usage = &mut em.builder.usage;
                        usage.input = tokens(u.input_tokens());
                        usage.output = tokens(u.output_tokens());
                        usage.cache_read = tokens(u.cache_read_input_tokens().unwrap_or(0));
                        usage.cache_write = tokens(u.cache_write_input_tokens().unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
        close_block(&mut open, em).await?;
        stop.ok_or((
            ErrorKind::Transient,
            "the Bedrock stream ended before messageStop".to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exceptions_are_classified_and_say_what_to_do() {
        assert_eq!(
            classify("ThrottlingException", "slow down").0,
            ErrorKind::RateLimited
        );
        assert_eq!(
            classify("ServiceUnavailableException", "x").0,
            ErrorKind::Transient
        );
        assert_eq!(
            classify("ModelNotReadyException", "x").0,
            ErrorKind::Transient
        );
        let (k, m) = classify("AccessDeniedException", "not allowed");
        assert_eq!(k, ErrorKind::Permanent);
        assert!(
            m.contains("request access to the model in the Bedrock console"),
            "{m}"
        );
        let (k, m) = classify("ResourceNotFoundException", "no model");
        assert_eq!(k, ErrorKind::Permanent);
        assert!(m.contains("model id"), "{m}");
        assert_eq!(
            classify("ValidationException", "bad field").0,
            ErrorKind::Permanent
        );
        assert_eq!(
            classify(
                "ValidationException",
                "Input is too long for requested model"
            )
            .0,
            ErrorKind::ContextOverflow
        );
    }
}
