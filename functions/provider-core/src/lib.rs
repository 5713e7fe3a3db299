//! What every provider worker shares. A provider implements [`Dialect`] (request shape and
//! stream translation for one upstream API); this crate does the rest of
//! `provider::<name>::stream` and `provider::<name>::complete`: credentials through
//! `auth::get_token` (reused for at most [`TOKEN_TTL`], never past an OAuth token's expiry,
//! asked again at once when the upstream answers 401/403; none: `auth_missing`, naming the
//! provider), the HTTP call with `retry-after` honoured for 429s (bounded), HTTP status
//! → `error_kind` (401/403 auth_expired, 429 rate_limited, 400 context → context_overflow,
//! 5xx/timeouts transient, other 4xx permanent), the channel emitter that always closes the
//! writer, and the completion's cost from the model's pricing (read from `models::get`,
//! reused for a minute: [`PRICE_TTL`]).

use async_trait::async_trait;
use bus::builtins::req_str;
use futures_util::StreamExt;
use harness_sdk::messages::{
    AgentMessage, AssistantBuilder, AssistantMessageEvent, ErrorKind, StopReason, ToolSpec,
};
use harness_sdk::{ChannelRef, ChannelWriter, Ctx, DefExt, ErrorBody, RegisterFunction, Worker};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A 429 is retried after its `retry-after` when that is at most this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
pub const MAX_RATE_LIMIT_RETRIES: u32 = 2;
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct StreamRequest {
    /// The channel's writer end (`engine::channels::create`); `stream` only.
    #[serde(default)]
    #[schemars(with = "Option<Value>")]
    pub writer_ref: Option<ChannelRef>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    pub model: String,
    /// The conversation as sent in the payload; private so a dialect reads
    /// [`StreamRequest::messages`], which also sees one attached in process.
    #[serde(default)]
    messages: Vec<AgentMessage>,
    /// The conversation an in-process caller attached (not serialized).
    #[serde(skip)]
    #[schemars(skip)]
    attached_messages: Option<Arc<Vec<AgentMessage>>>,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Budgets to charge the completion's cost to (`budget::record`), before `done`.
    #[serde(default)]
    pub budget_ids: Vec<String>,
    /// Prompt caching: `true` marks the stable prefix for the upstream's cache (the
    /// orchestrator says so when the catalogue's `supports_cache` does), `false` sends no
    /// marker (`run.prompt_cache: false`), absent leaves it to the provider (Anthropic marks;
    /// Bedrock marks only the model families it knows to take cache points, as it refuses
    /// them elsewhere; the OpenAI dialects cache by themselves and send nothing).
    #[serde(default)]
    pub prompt_cache: Option<bool>,
}

impl StreamRequest {
    /// The conversation: the attached one when the caller attached it, else the payload's.
    pub fn messages(&self) -> &[AgentMessage] {
        self.attached_messages.as_deref().unwrap_or(&self.messages)
    }
}

/// `provider::<name>::stream`'s answer (the message itself goes on the channel).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct StreamAnswer {
    pub ok: bool,
    pub stop_reason: Option<harness_sdk::messages::StopReason>,
}

/// The outcome of one upstream call, as a provider sees it.
pub type Outcome = Result<StopReason, (ErrorKind, String)>;

/// Where stream events go: the channel (stream) or nowhere (complete), with the message
/// being built either way.
pub struct Emitter {
    writer: Option<ChannelWriter>,
    pub builder: AssistantBuilder,
    writer_failed: bool,
}

impl Emitter {
    pub fn new(writer: Option<ChannelWriter>, provider: &str, model: &str) -> Self {
        Self {
            writer,
            builder: AssistantBuilder::new(provider, model),
            writer_failed: false,
        }
    }

    pub async fn emit(&mut self, ev: AssistantMessageEvent) {
        if let (Some(w), false) = (self.writer.as_mut(), self.writer_failed) {
            let text = serde_json::to_string(&ev).unwrap_or_default();
            if let Err(e) = w.send_text(text).await {
                // The reader went away: keep building the message, stop writing.
                tracing::warn!(error = %e, "provider channel closed early");
                self.writer_failed = true;
            }
        }
    }

    pub fn partial(&self) -> AgentMessage {
        self.builder.partial()
    }

    async fn close(self) {
        if let Some(w) = self.writer {
            let _ = w.close().await;
        }
    }
}

/// The content block a provider's stream has open: every dialect closes one the same way.
#[derive(Debug, PartialEq, Clone, Copy)]
pub enum OpenBlock {
    None,
    Text,
    Thinking,
    Call,
}

/// End the open block (`text_end`, `thinking_end`, or the call's arguments parsed and
/// `functioncall_end`) and leave none open.
pub async fn close_block(
    open: &mut OpenBlock,
    em: &mut Emitter,
) -> Result<(), (ErrorKind, String)> {
    use harness_sdk::messages::AssistantMessageEvent as Ev;
    match *open {
        OpenBlock::Text => {
            em.emit(Ev::TextEnd {
                partial: em.partial(),
            })
            .await
        }
        OpenBlock::Thinking => {
            em.emit(Ev::ThinkingEnd {
                partial: em.partial(),
            })
            .await
        }
        OpenBlock::Call => {
            em.builder
                .end_call()
                .map_err(|e| (ErrorKind::Transient, e))?;
            em.emit(Ev::FunctioncallEnd {
                partial: em.partial(),
            })
            .await;
        }
        OpenBlock::None => {}
    }
    *open = OpenBlock::None;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct Credentials {
    pub api_key: Option<String>,
}

/// One upstream API.
#[async_trait]
pub trait Dialect: Send + Sync {
    /// The provider name (`anthropic`, `openai`, …).
    fn name(&self) -> &str;
    /// Build the HTTP request for `req` (streaming when `stream`).
    fn request(
        &self,
        client: &reqwest::Client,
        creds: &Credentials,
        req: &StreamRequest,
        stream: bool,
    ) -> reqwest::RequestBuilder;
    /// Translate the upstream SSE stream into events; return how the message ended.
    async fn translate(&self, events: &mut EventStream, em: &mut Emitter) -> Outcome;
    /// Whether calls without credentials are allowed (local servers).
    fn credentials_optional(&self) -> bool {
        false
    }
}

/// Where a completion comes from, whatever its wire: an HTTP API with SSE (a [`Dialect`]), or
/// an SDK's own stream (Bedrock's ConverseStream). It emits the message's events on `em` and
/// says how the message ended; the worker around it does the rest (start, usage and cost,
/// budgets, stop, done or error, closing the channel), the same for every provider.
#[async_trait]
pub trait Upstream: Send + Sync {
    /// The provider name (`anthropic`, `bedrock`, …).
    fn name(&self) -> &str;
    async fn complete(&self, ctx: &Ctx, req: &StreamRequest, em: &mut Emitter) -> Outcome;
}

/// How long a provider process reuses the credential `auth::get_token` gave it. It was asked
/// for on every model call: an invocation of the credentials Lambda and a Secrets Manager
/// read per call in the deployed shape. A key stored anew reaches the providers within this
/// time, or at once where the upstream refuses the old one (401/403: asked again, once).
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// An OAuth token is not reused this close to its `expires_at`.
const EXPIRY_MARGIN_MS: u64 = 30_000;

/// A [`Dialect`] over HTTP: credentials from `auth::get_token`, the request, its SSE answer.
struct HttpUpstream {
    dialect: Arc<dyn Dialect>,
    route: Route,
    /// The credential and until when it is reused (one provider per upstream: one slot).
    token: std::sync::Mutex<Option<(Instant, Credentials)>>,
}

impl HttpUpstream {
    fn new(dialect: Arc<dyn Dialect>, route: Route) -> Self {
        Self {
            dialect,
            route,
            token: std::sync::Mutex::new(None),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Credentials)>> {
        self.token.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reused credential while it is fresh → (it, whether it came from the cache).
    async fn credentials(&self, ctx: &Ctx) -> Result<(Credentials, bool), (ErrorKind, String)> {
        if let Some((until, creds)) = self.slot().as_ref()
            && Instant::now() < *until
        {
            return Ok((creds.clone(), true));
        }
        let (creds, expires_at) = credentials(ctx, self.dialect.as_ref()).await?;
        let mut ttl = TOKEN_TTL;
        if let Some(at) = expires_at {
            let now = bus_telemetry::trace::now_ms();
            ttl = ttl.min(Duration::from_millis(
                at.saturating_sub(now).saturating_sub(EXPIRY_MARGIN_MS),
            ));
        }
        *self.slot() = (!ttl.is_zero()).then(|| (Instant::now() + ttl, creds.clone()));
        Ok((creds, false))
    }
}

#[async_trait]
impl Upstream for HttpUpstream {
    fn name(&self) -> &str {
        self.dialect.name()
    }

    async fn complete(&self, ctx: &Ctx, req: &StreamRequest, em: &mut Emitter) -> Outcome {
        let dialect = self.dialect.as_ref();
        let (creds, reused) = self.credentials(ctx).await?;
        let resp = match send(dialect, &self.route, &creds, req, true).await {
            // The reused credential was refused (rotated, revoked): ask again, once.
            Err((ErrorKind::AuthExpired, _)) if reused => {
                *self.slot() = None;
                let (creds, _) = self.credentials(ctx).await?;
                send(dialect, &self.route, &creds, req, true).await?
            }
            r => r?,
        };
        let stream = resp.bytes_stream().map(|r| r.map_err(|e| e.to_string()));
        let mut events: EventStream = Box::pin(
            eventsource_stream::EventStream::new(stream)
                .map(|r| r.map_err(|e| format!("malformed SSE: {e}"))),
        );
        dialect.translate(&mut events, em).await
    }
}

pub type EventStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<eventsource_stream::Event, String>> + Send>,
>;

/// HTTP status (and body) → error kind.
pub fn classify(status: u16, body: &str) -> ErrorKind {
    let lower = body.to_ascii_lowercase();
    match status {
        401 | 403 => ErrorKind::AuthExpired,
        429 => ErrorKind::RateLimited,
        400 | 413
            if lower.contains("context_length_exceeded")
                || lower.contains("context length")
                || lower.contains("context window")
                || lower.contains("prompt is too long")
                || lower.contains("too many tokens") =>
        {
            ErrorKind::ContextOverflow
        }
        s if s >= 500 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get("retry-after")?.to_str().ok()?;
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Asks `auth::get_token` → the credential and, for an OAuth token, its `expires_at`.
async fn credentials(
    ctx: &Ctx,
    dialect: &dyn Dialect,
) -> Result<(Credentials, Option<u64>), (ErrorKind, String)> {
    use harness_sdk::contracts::auth;
    let token = ctx
        .trigger(
            auth::GET_TOKEN,
            json!(auth::GetTokenRequest {
                provider: dialect.name().to_string()
            }),
        )
        .await
        .map_err(|e| (ErrorKind::Transient, format!("auth::get_token failed: {e}")))?;
    let token: auth::GetTokenAnswer = harness_sdk::contracts::parse(auth::GET_TOKEN, token)
        .map_err(|e| (ErrorKind::Transient, e))?;
    let key = token.as_ref().map(|t| t.secret().to_string());
    let expires_at = match &token {
        Some(auth::Token::Oauth { expires_at, .. }) => *expires_at,
        _ => None,
    };
    if key.is_none() && !dialect.credentials_optional() {
        return Err((
            ErrorKind::AuthMissing,
            format!(
                "no credentials for provider `{}`: store a key with auth::set_token {{provider: \"{}\"}} or set its API key variable",
                dialect.name(),
                dialect.name()
            ),
        ));
    }
    Ok((Credentials { api_key: key }, expires_at))
}

/// Where a provider's HTTP requests go: the network by default (`reqwest`), or a model
/// served in the same process (a benchmark's zero-latency model, which should cost no
/// sockets). Either way the dialect builds the same request and reads the same SSE answer.
#[async_trait]
pub trait Transport: Send + Sync {
    async fn execute(&self, request: reqwest::Request) -> Result<reqwest::Response, String>;
}

/// How `send` reaches the model.
#[derive(Clone)]
enum Route {
    Network(bus::prewarm::Prewarmed<reqwest::Client>),
    /// The client only builds requests (building one per request loaded the root
    /// certificates each time).
    InProcess(Arc<dyn Transport>, reqwest::Client),
}

/// Send the request, honouring `retry-after` on 429 (bounded); the successful response.
async fn send(
    dialect: &dyn Dialect,
    route: &Route,
    creds: &Credentials,
    req: &StreamRequest,
    stream: bool,
) -> Result<reqwest::Response, (ErrorKind, String)> {
    let mut attempt = 0;
    let failed = |e: String| {
        (
            ErrorKind::Transient,
            format!("{} request failed: {e}", dialect.name()),
        )
    };
    loop {
        let resp = match route {
            Route::Network(client) => {
                let client = client.get();
                dialect
                    .request(client, creds, req, stream)
                    .timeout(REQUEST_TIMEOUT)
                    .send()
                    .await
                    .map_err(|e| failed(e.to_string()))?
            }
            Route::InProcess(transport, builder) => {
                let request = dialect
                    .request(builder, creds, req, stream)
                    .build()
                    .map_err(|e| failed(e.to_string()))?;
                transport.execute(request).await.map_err(failed)?
            }
        };
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            return Ok(resp);
        }
        let wait = retry_after(resp.headers());
        let body = resp.text().await.unwrap_or_default();
        let kind = classify(status, &body);
        let message = upstream_message(&body).unwrap_or_else(|| body.chars().take(500).collect());
        if kind == ErrorKind::RateLimited
            && attempt < MAX_RATE_LIMIT_RETRIES
            && let Some(w) = wait.filter(|w| *w <= MAX_RETRY_AFTER)
        {
            attempt += 1;
            tracing::info!(
                provider = dialect.name(),
                wait_ms = w.as_millis() as u64,
                "rate limited; retrying after retry-after"
            );
            tokio::time::sleep(w).await;
            continue;
        }
        return Err((kind, format!("HTTP {status}: {message}")));
    }
}

fn upstream_message(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    v.pointer("/error/message")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// How long a model's pricing read from `models::get` is reused.
pub const PRICE_TTL: Duration = Duration::from_secs(60);
/// Most models whose pricing a provider keeps (a caller names the model: without a bound,
/// calls naming ever new models would grow the cache).
const PRICES_MAX: usize = 256;

/// A model's catalog entry as the catalog answered it (`None`: it does not know the model).
type Priced = Option<Arc<models_catalog::Model>>;

/// Pricing by model, read from `models::get` at most once per [`PRICE_TTL`]: a model call
/// does not pay a catalog round trip (a hop to another worker, a Lambda invocation when
/// deployed) for a price that rarely changes. Answers are kept, "not in the catalog"
/// included; a catalog that could not be asked, or answered something unreadable, is asked
/// again on the next call.
#[derive(Default)]
struct Prices {
    by_model: std::sync::Mutex<std::collections::HashMap<String, (Instant, Priced)>>,
}

impl Prices {
    fn fresh(&self, model: &str) -> Option<Priced> {
        let by_model = self.by_model.lock().unwrap_or_else(|p| p.into_inner());
        by_model
            .get(model)
            .filter(|(at, _)| at.elapsed() < PRICE_TTL)
            .map(|(_, m)| m.clone())
    }

    fn keep(&self, model: &str, found: Priced) {
        let mut by_model = self.by_model.lock().unwrap_or_else(|p| p.into_inner());
        if by_model.len() >= PRICES_MAX && !by_model.contains_key(model) {
            by_model.retain(|_, (at, _)| at.elapsed() < PRICE_TTL);
            if by_model.len() >= PRICES_MAX {
                by_model.clear();
            }
        }
        by_model.insert(model.to_string(), (Instant::now(), found));
    }

    /// The model's catalog entry (`None` when the catalog does not know it or cannot be
    /// asked).
    async fn get(&self, ctx: &Ctx, provider: &str, model: &str) -> Priced {
        if let Some(known) = self.fresh(model) {
            return known;
        }
        let answer = ctx
            .trigger(
                "models::get",
                json!({"provider": provider, "model_id": model}),
            )
            .await
            .ok()?;
        let found: Priced = serde_json::from_value::<Option<models_catalog::Model>>(answer)
            .ok()?
            .map(Arc::new);
        self.keep(model, found.clone());
        found
    }
}

/// Price the usage with the model's pricing from `models::get` (0 when unknown).
async fn cost(ctx: &Ctx, prices: &Prices, provider: &str, em: &mut Emitter) {
    let Some(model) = prices.get(ctx, provider, &em.builder.model).await else {
        return;
    };
    let u = &em.builder.usage;
    em.builder.usage.cost_usd = model.cost_usd(&models_catalog::Usage {
        input: u.input,
        output: u.output,
        cache_read: u.cache_read,
        cache_write: u.cache_write,
    });
}

/// Charge the cost to each budget before the final message is announced, so the caller's
/// next `budget::check` sees it. Best effort: a missing budget worker does not fail a turn.
async fn record_spend(ctx: &Ctx, budget_ids: &[String], cost_usd: f64) {
    if cost_usd <= 0.0 {
        return;
    }
    for id in budget_ids {
        if let Err(e) = ctx
            .trigger_timeout(
                "budget::record",
                json!({"budget_id": id, "cost_usd": cost_usd}),
                Duration::from_secs(5),
            )
            .await
        {
            tracing::warn!(budget = %id, error = %e, "completion cost not recorded");
        }
    }
}

/// The whole call: credentials, request, translation, usage/stop/done or error; the writer
/// is always closed. Returns the final message.
async fn run(
    ctx: &Ctx,
    upstream: &dyn Upstream,
    prices: &Prices,
    req: &StreamRequest,
    writer: Option<ChannelWriter>,
) -> AgentMessage {
    let mut em = Emitter::new(writer, upstream.name(), &req.model);
    em.emit(AssistantMessageEvent::Start {
        partial: em.partial(),
    })
    .await;
    let outcome: Outcome = upstream.complete(ctx, req, &mut em).await;
    let message = match outcome {
        Ok(stop) => {
            cost(ctx, prices, upstream.name(), &mut em).await;
            record_spend(ctx, &req.budget_ids, em.builder.usage.cost_usd).await;
            em.emit(AssistantMessageEvent::Usage {
                usage: em.builder.usage.clone(),
            })
            .await;
            em.emit(AssistantMessageEvent::Stop {
                stop_reason: stop,
                error_message: None,
                error_kind: None,
            })
            .await;
            let message = em.builder.message(stop, None);
            em.emit(AssistantMessageEvent::Done {
                message: message.clone(),
            })
            .await;
            message
        }
        Err((kind, msg)) => {
            em.emit(AssistantMessageEvent::Stop {
                stop_reason: StopReason::Error,
                error_message: Some(msg.clone()),
                error_kind: Some(kind),
            })
            .await;
            let message = em.builder.message(StopReason::Error, Some((kind, msg)));
            em.emit(AssistantMessageEvent::Error {
                error: message.clone(),
            })
            .await;
            message
        }
    };
    em.close().await;
    message
}

fn parse_request(ctx: &Ctx, data: Value) -> Result<StreamRequest, ErrorBody> {
    req_str(&data, "model")?;
    // The error names the field that is wrong (`messages[3].content`, not only "invalid type").
    let mut req: StreamRequest = harness_sdk::contracts::parse("invalid provider request", data)
        .map_err(ErrorBody::invalid)?;
    req.attached_messages = ctx.attachment::<Vec<AgentMessage>>();
    Ok(req)
}

/// `provider::<name>::stream` and `provider::<name>::complete` for a dialect.
pub fn worker(dialect: Arc<dyn Dialect>) -> Worker {
    bus_telemetry::ensure_crypto_provider();
    // Built off the start-up path (its root certificates): `bus::prewarm`.
    let client = bus::prewarm::Prewarmed::new(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default()
    });
    worker_for(Arc::new(HttpUpstream::new(dialect, Route::Network(client))))
}

/// [`worker`] whose requests go to `transport` instead of the network.
pub fn worker_with_transport(dialect: Arc<dyn Dialect>, transport: Arc<dyn Transport>) -> Worker {
    bus_telemetry::ensure_crypto_provider();
    worker_for(Arc::new(HttpUpstream::new(
        dialect,
        Route::InProcess(
            transport,
            reqwest::Client::builder().build().unwrap_or_default(),
        ),
    )))
}

/// `provider::<name>::stream` and `provider::<name>::complete` for any [`Upstream`].
pub fn worker_for(upstream: Arc<dyn Upstream>) -> Worker {
    let name = upstream.name().to_string();
    let mut w = Worker::new(&format!("provider-{name}"));
    let mut stream_def = RegisterFunction::new(format!("provider::{name}::stream"))
        .not_for_the_agent()
        .contract::<StreamRequest, StreamAnswer>();
    stream_def.description = Some(format!(
        "Stream a completion from {name}: AssistantMessageEvent frames on the writer channel, which is always closed."
    ));
    let prices = Arc::new(Prices::default());
    let (u, p) = (upstream.clone(), prices.clone());
    let stream_id = stream_def.id.clone();
    w.register_function(stream_def, move |ctx, data: Value| {
        let (u, p) = (u.clone(), p.clone());
        async move {
            let req = parse_request(&ctx, data)?;
            let writer_ref = req
                .writer_ref
                .clone()
                .ok_or_else(|| ErrorBody::invalid("missing required field `writer_ref`"))?;
            let writer = ctx.open_writer(&writer_ref).await?;
            let message = run(&ctx, u.as_ref(), &p, &req, Some(writer)).await;
            let stop_reason = match &message {
                AgentMessage::Assistant { stop_reason, .. } => Some(*stop_reason),
                _ => None,
            };
            Ok(json!(StreamAnswer {
                ok: true,
                stop_reason
            }))
        }
    });
    w.accept_attachments(&stream_id);
    let mut complete_def = RegisterFunction::new(format!("provider::{name}::complete"))
        .not_for_the_agent()
        .contract::<StreamRequest, AgentMessage>();
    complete_def.description = Some(format!(
        "A completion from {name}, answered as the final assistant message."
    ));
    let complete_id = complete_def.id.clone();
    w.register_function(complete_def, move |ctx, data: Value| {
        let (u, p) = (upstream.clone(), prices.clone());
        async move {
            let req = parse_request(&ctx, data)?;
            let message = run(&ctx, u.as_ref(), &p, &req, None).await;
            Ok(serde_json::to_value(message).unwrap_or(Value::Null))
        }
    });
    w.accept_attachments(&complete_id);
    w
}

/// The text of a message's content, for APIs that take plain text.
pub fn text_of(content: &[harness_sdk::messages::ContentBlock]) -> String {
    content
        .iter()
        .filter_map(|c| match c {
            harness_sdk::messages::ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_error_kinds() {
        assert_eq!(classify(401, ""), ErrorKind::AuthExpired);
        assert_eq!(classify(403, ""), ErrorKind::AuthExpired);
        assert_eq!(classify(429, ""), ErrorKind::RateLimited);
        assert_eq!(
            classify(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
            ErrorKind::ContextOverflow
        );
        assert_eq!(
            classify(400, "prompt is too long: 250000 tokens > 200000 maximum"),
            ErrorKind::ContextOverflow
        );
        assert_eq!(classify(400, "bad field"), ErrorKind::Permanent);
        assert_eq!(classify(500, ""), ErrorKind::Transient);
        assert_eq!(classify(529, ""), ErrorKind::Transient);
    }
}
