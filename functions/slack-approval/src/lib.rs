//! slack-approval (SPEC §3): approve or deny parked tool calls from Slack.
//!
//! - **Webhook** ([`handle_webhook`]): slash commands `/approve <call> [reason]` and
//!   `/deny <call> [reason]`, and the Approve/Deny buttons of a posted message. Every request
//!   is verified first (Slack's `v0` signature, at most 5 minutes old, each signature once);
//!   then `approval::resolve` on behalf of the Slack user (who decided). Slack wants an answer
//!   within 3 seconds: the resolve gets [`ACK_BUDGET`], and a slower one is acknowledged and
//!   finished in the background, its outcome posted to the request's `response_url`.
//!   `<call>` is `<session_id>/<function_call_id>`, or a bare call id when it is unique.
//! - **Announcer** (`slack::on_parked`, a state trigger on the turn records): each newly
//!   parked call is posted once to the configured channel with Approve/Deny buttons
//!   (`chat.postMessage` at `SLACK_API_BASE`).
//!
//! The same handler runs behind a Lambda Function URL (see `main.rs`) and in the local HTTP
//! server [`serve`].

pub mod signature;

use bus::secrets::SecretStore;
use harness_sdk::contracts::approval::{ListPendingAnswer, ListPendingRequest, PendingCall};
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, Worker, def};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long the webhook waits for `approval::resolve` before acknowledging.
pub const ACK_BUDGET: Duration = Duration::from_millis(2_000);
pub const REPLAY_SCOPE: &str = "slack-replay";
pub const POSTED_SCOPE: &str = "slack-posted";
pub const SIGNING_SECRET: &str = "slack/signing_secret";
pub const BOT_TOKEN: &str = "slack/bot_token";

/// Reads an environment variable (a closure, so tests need not touch the process env).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where the worker finds Slack.
#[derive(Clone)]
pub struct SlackConfig {
    /// Secrets `slack/signing_secret` and `slack/bot_token` (env fallback:
    /// `SLACK_SIGNING_SECRET`, `SLACK_BOT_TOKEN`).
    pub secrets: Arc<dyn SecretStore>,
    pub env: EnvLookup,
    /// `https://slack.com/api` unless `SLACK_API_BASE` says otherwise.
    pub api_base: String,
    /// Where parked calls are announced (`SLACK_CHANNEL`); none: not announced.
    pub channel: Option<String>,
    /// Who may decide: Slack user ids (`SLACK_APPROVERS`, comma-separated) and channels whose
    /// members may (`SLACK_APPROVER_CHANNELS`). A valid signature only proves the request came
    /// from the workspace; anyone else's request decides nothing. Both empty: nobody may.
    pub approvers: Vec<String>,
    pub approver_channels: Vec<String>,
    /// Built off the start-up path (its root certificates): `bus::prewarm`.
    pub http: bus::prewarm::Prewarmed<reqwest::Client>,
}

impl SlackConfig {
    pub fn from_env(secrets: Arc<dyn SecretStore>) -> Self {
        bus_telemetry::ensure_crypto_provider();
        Self {
            secrets,
            env: Arc::new(|k| std::env::var(k).ok().filter(|v| !v.is_empty())),
            api_base: std::env::var("SLACK_API_BASE")
                .unwrap_or_else(|_| "https://slack.com/api".into()),
            channel: std::env::var("SLACK_CHANNEL")
                .ok()
                .filter(|c| !c.is_empty()),
            approvers: list_env("SLACK_APPROVERS"),
            approver_channels: list_env("SLACK_APPROVER_CHANNELS"),
            http: bus::prewarm::Prewarmed::new(|| {
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap_or_default()
            }),
        }
    }

    /// Why `d` may not decide, if it may not.
    fn refusal(&self, d: &Decision) -> Option<String> {
        if self.approvers.is_empty() && self.approver_channels.is_empty() {
            return Some(
                "No approvers are configured for this harness (SLACK_APPROVERS or SLACK_APPROVER_CHANNELS), so nothing can be decided from Slack."
                    .into(),
            );
        }
        let by_user = self.approvers.contains(&d.user_id);
        let by_channel = d
            .channel_id
            .as_ref()
            .is_some_and(|c| self.approver_channels.iter().any(|a| a == c));
        (!by_user && !by_channel).then(|| {
            format!(
                "<@{}> is not an approver for this harness: nothing was decided.",
                d.user_id
            )
        })
    }

    /// A secret's value, or `None` while it is unset. A placeholder (the template's `{}`, a
    /// word like `changeme`) counts as unset, and so does a signing secret shorter than
    /// Slack's (32 characters): anyone who knows the placeholder could sign with it.
    async fn secret(&self, name: &str, env: &str) -> Option<String> {
        let stored = match self.secrets.get(name).await {
            Ok(Some(v)) => Some(v),
            _ => None,
        };
        stored
            .filter(|v| is_set(name, v))
            .or_else(|| (self.env)(env).filter(|v| is_set(name, v)))
    }
}

/// The shortest signing secret Slack issues (32 hex characters).
pub const MIN_SIGNING_SECRET_CHARS: usize = 32;

/// Whether a secret's value is a real one, not a placeholder left by provisioning.
pub fn is_set(name: &str, value: &str) -> bool {
    let v = value.trim();
    let placeholder = v.is_empty()
        || v.starts_with('{')
        || v.starts_with('[')
        || [
            "changeme",
            "change-me",
            "placeholder",
            "todo",
            "none",
            "null",
            "unset",
            "xxx",
        ]
        .iter()
        .any(|p| v.eq_ignore_ascii_case(p));
    if placeholder {
        return false;
    }
    name != SIGNING_SECRET || v.chars().count() >= MIN_SIGNING_SECRET_CHARS
}

/// An HTTP answer (status and JSON body).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

fn reply(status: u16, body: Value) -> Reply {
    Reply { status, body }
}

fn ephemeral(text: &str) -> Value {
    json!({"response_type": "ephemeral", "text": text})
}

/// Form fields of an `application/x-www-form-urlencoded` body.
fn form(body: &[u8]) -> HashMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

/// What a verified request asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub call: String,
    pub decision: &'static str,
    pub reason: String,
    pub user_id: String,
    pub user_name: String,
    pub response_url: Option<String>,
    pub interactive: bool,
    /// The channel the command or button came from, when Slack says.
    pub channel_id: Option<String>,
}

fn list_env(name: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Read the decision out of a slash command or a button press.
pub fn parse_decision(body: &[u8]) -> Result<Decision, String> {
    let f = form(body);
    if let Some(payload) = f.get("payload") {
        let p: Value = serde_json::from_str(payload)
            .map_err(|e| format!("unreadable interactive payload: {e}"))?;
        let action = p["actions"]
            .get(0)
            .ok_or("the interactive payload has no action")?;
        let decision = match action["action_id"].as_str() {
            Some("approve") => "allow",
            Some("deny") => "deny",
            other => return Err(format!("unknown action `{}`", other.unwrap_or(""))),
        };
        return Ok(Decision {
            call: action["value"].as_str().unwrap_or("").to_string(),
            decision,
            reason: format!(
                "{} in Slack",
                if decision == "allow" {
                    "approved"
                } else {
                    "denied"
                }
            ),
            user_id: p["user"]["id"].as_str().unwrap_or("").to_string(),
            user_name: p["user"]["username"]
                .as_str()
                .or(p["user"]["name"].as_str())
                .unwrap_or("")
                .to_string(),
            response_url: p["response_url"].as_str().map(str::to_owned),
            interactive: true,
            channel_id: p["channel"]["id"]
                .as_str()
                .or(p["container"]["channel_id"].as_str())
                .map(str::to_owned),
        });
    }
    let command = f.get("command").map(String::as_str).unwrap_or("");
    let decision = match command {
        "/approve" => "allow",
        "/deny" => "deny",
        other => return Err(format!("unknown command `{other}` (use /approve or /deny)")),
    };
    let text = f.get("text").map(|t| t.trim()).unwrap_or("");
    let (call, reason) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    if call.is_empty() {
        return Err(format!("usage: {command} <session_id>/<call_id> [reason]"));
    }
    Ok(Decision {
        call: call.to_string(),
        decision,
        reason: reason.trim().to_string(),
        user_id: f.get("user_id").cloned().unwrap_or_default(),
        user_name: f.get("user_name").cloned().unwrap_or_default(),
        response_url: f.get("response_url").cloned(),
        interactive: false,
        channel_id: f.get("channel_id").cloned().filter(|c| !c.is_empty()),
    })
}

/// `<sid>/<cid>`, or a bare call id looked up among the parked calls.
async fn locate(ctx: &Ctx, call: &str) -> Result<(String, String), String> {
    if let Some((sid, cid)) = call.split_once('/') {
        return Ok((sid.to_string(), cid.to_string()));
    }
    let pending = ctx
        .trigger(
            "approval::list_pending",
            json!(ListPendingRequest { session_id: None }),
        )
        .await
        .map_err(|e| format!("cannot list parked calls: {e}"))?;
    let pending: ListPendingAnswer =
        harness_sdk::contracts::parse("approval::list_pending", pending)?;
    let matches: Vec<&PendingCall> = pending
        .pending
        .iter()
        .filter(|p| p.function_call_id == call)
        .collect();
    match matches.as_slice() {
        [one] => Ok((one.session_id.clone(), call.to_string())),
        [] => Err(format!("no parked call `{call}`")),
        _ => Err(format!(
            "`{call}` is parked in several sessions: use <session_id>/{call}"
        )),
    }
}

async fn resolve(ctx: &Ctx, d: &Decision) -> String {
    let (sid, cid) = match locate(ctx, &d.call).await {
        Ok(x) => x,
        Err(e) => return e,
    };
    let who = if d.user_name.is_empty() {
        d.user_id.clone()
    } else {
        format!("{} ({})", d.user_id, d.user_name)
    };
    // Decided by the verified Slack user, an approver for every session (an operator).
    let out = ctx
        .with_baggage(
            bus::access::ACTING_BAGGAGE,
            &format!("operator:slack:{who}"),
        )
        .trigger(
            "approval::resolve",
            json!({"session_id": sid, "function_call_id": cid, "decision": d.decision, "reason": d.reason}),
        )
        .await;
    match out {
        Ok(v) if v["ok"] == true => format!(
            "{} `{cid}` of session `{sid}` (by <@{}>).",
            if d.decision == "allow" {
                "Approved"
            } else {
                "Denied"
            },
            d.user_id
        ),
        Ok(v) if v["error"] == "not_pending" => format!(
            "`{cid}` of session `{sid}` is not waiting for a decision (already decided, or the run ended)."
        ),
        Ok(v) => format!(
            "Could not decide `{cid}`: {}",
            v["message"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap_or("unknown error")
        ),
        Err(e) => format!("Could not decide `{cid}`: {e}"),
    }
}

/// Remember a signature; false when it was seen before (a replay). The key is the decoded
/// signature (the check decodes hex in any letter case, so the raw header would let the same
/// request through again in upper case).
async fn first_use(ctx: &Ctx, signature: &str, timestamp: &str) -> Result<bool, BusError> {
    let key = signature::replay_key(signature).unwrap_or_default();
    match ctx
        .state_set_if(REPLAY_SCOPE, &key, json!({"timestamp": timestamp}), 0)
        .await
    {
        Ok(_) => Ok(true),
        Err(BusError::VersionConflict(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Handle one webhook request: raw body and lower-cased headers.
pub async fn handle_webhook(
    ctx: &Ctx,
    cfg: &SlackConfig,
    headers: &HashMap<String, String>,
    body: &[u8],
    now_secs: u64,
) -> Reply {
    let Some(secret) = cfg.secret(SIGNING_SECRET, "SLACK_SIGNING_SECRET").await else {
        tracing::error!(
            "Slack request refused: the signing secret ({SIGNING_SECRET} or SLACK_SIGNING_SECRET) is unset or a placeholder; every Slack request is refused until it is set"
        );
        return reply(
            500,
            json!({"error": "the Slack signing secret is not configured"}),
        );
    };
    let timestamp = headers.get("x-slack-request-timestamp").map(String::as_str);
    let sig = headers.get("x-slack-signature").map(String::as_str);
    if let Err(r) = signature::verify(&secret, timestamp, sig, body, now_secs) {
        tracing::warn!(reason = r.message(), "Slack request refused");
        return reply(401, json!({"error": r.message()}));
    }
    match first_use(ctx, sig.unwrap_or(""), timestamp.unwrap_or("")).await {
        Ok(true) => {}
        Ok(false) => {
            return reply(
                401,
                json!({"error": "this request was already received (replay)"}),
            );
        }
        Err(e) => {
            return reply(
                503,
                json!({"error": format!("cannot check for replays: {e}")}),
            );
        }
    }
    let decision = match parse_decision(body) {
        Ok(d) => d,
        Err(e) => return reply(200, ephemeral(&e)),
    };
    if let Some(why) = cfg.refusal(&decision) {
        tracing::warn!(user = %decision.user_id, channel = ?decision.channel_id, "Slack decision refused: not an approver");
        return reply(200, ephemeral(&why));
    }
    let work = {
        let ctx = ctx.clone();
        let d = decision.clone();
        tokio::spawn(async move { resolve(&ctx, &d).await })
    };
    let answer = |text: String| {
        if decision.interactive {
            json!({"replace_original": true, "text": text})
        } else {
            json!({"response_type": "in_channel", "text": text})
        }
    };
    let mut work = work;
    match tokio::time::timeout(ACK_BUDGET, &mut work).await {
        Ok(Ok(text)) => reply(200, answer(text)),
        Ok(Err(e)) => reply(200, ephemeral(&format!("the decision failed: {e}"))),
        Err(_) => {
            // Acknowledge now; the outcome follows on response_url.
            let http = cfg.http.get().clone();
            let url = decision.response_url.clone();
            let interactive = decision.interactive;
            tokio::spawn(async move {
                let text = work
                    .await
                    .unwrap_or_else(|e| format!("the decision failed: {e}"));
                if let Some(url) = url {
                    let body = if interactive {
                        json!({"replace_original": true, "text": text})
                    } else {
                        json!({"response_type": "in_channel", "text": text})
                    };
                    if let Err(e) = http.post(url).json(&body).send().await {
                        tracing::warn!(error = %e, "Slack follow-up not delivered");
                    }
                }
            });
            reply(200, ephemeral("Received; deciding…"))
        }
    }
}

/// The message announcing a parked call, with its buttons.
pub fn parked_message(channel: &str, sid: &str, call: &Value) -> Value {
    let cid = call["function_call_id"].as_str().unwrap_or("?");
    let fid = call["function_id"].as_str().unwrap_or("?");
    let args = serde_json::to_string_pretty(&call["args"]).unwrap_or_default();
    let args: String = args.chars().take(2500).collect();
    let value = format!("{sid}/{cid}");
    json!({
        "channel": channel,
        "text": format!("Approval needed: `{fid}` in session `{sid}` (call `{cid}`)"),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": format!("*Approval needed*: `{fid}` in session `{sid}`\n```{args}```\nOr: `/approve {value} [reason]`, `/deny {value} [reason]`")}},
            {"type": "actions", "block_id": format!("approval-{cid}"), "elements": [
                {"type": "button", "action_id": "approve", "style": "primary", "text": {"type": "plain_text", "text": "Approve"}, "value": value},
                {"type": "button", "action_id": "deny", "style": "danger", "text": {"type": "plain_text", "text": "Deny"}, "value": value}
            ]}
        ]
    })
}

/// State trigger on the turn records: post each call that became parked, once.
pub async fn on_parked(ctx: Ctx, cfg: SlackConfig, event: Value) -> Result<Value, ErrorBody> {
    let key = event["key"].as_str().unwrap_or("");
    if !key.ends_with("/turn_state") {
        return Ok(json!({"ignored": key}));
    }
    let ids = |v: &Value| -> Vec<String> {
        v["awaiting_approval"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["function_call_id"].as_str().map(str::to_owned))
            .collect()
    };
    let before = ids(&event["old_value"]);
    let new = &event["new_value"];
    let sid = new["session_id"].as_str().unwrap_or("").to_string();
    let fresh: Vec<Value> = new["awaiting_approval"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["function_call_id"]
                .as_str()
                .is_some_and(|id| !before.iter().any(|b| b == id))
        })
        .cloned()
        .collect();
    if fresh.is_empty() {
        return Ok(json!({"posted": 0}));
    }
    let Some(channel) = cfg.channel.clone() else {
        return Ok(json!({"posted": 0, "reason": "no SLACK_CHANNEL"}));
    };
    let Some(token) = cfg.secret(BOT_TOKEN, "SLACK_BOT_TOKEN").await else {
        return Err(ErrorBody::new(
            "not_configured",
            "the Slack bot token is not configured",
        ));
    };
    let mut posted = 0;
    for call in fresh {
        let cid = call["function_call_id"].as_str().unwrap_or("").to_string();
        // Once per call, however often the trigger fires.
        match ctx
            .state_set_if(
                POSTED_SCOPE,
                &format!("{sid}/{cid}"),
                json!({"at": harness_sdk::messages::now_ms()}),
                0,
            )
            .await
        {
            Ok(_) => {}
            Err(BusError::VersionConflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
        let resp = cfg
            .http
            .get()
            .post(format!(
                "{}/chat.postMessage",
                cfg.api_base.trim_end_matches('/')
            ))
            .bearer_auth(&token)
            .json(&parked_message(&channel, &sid, &call))
            .send()
            .await;
        let ok = match resp {
            Ok(r) => r
                .json::<Value>()
                .await
                .ok()
                .is_some_and(|v| v["ok"] == true),
            Err(_) => false,
        };
        if !ok {
            // Let the trigger retry this one.
            let _ = ctx
                .state_delete(POSTED_SCOPE, &format!("{sid}/{cid}"))
                .await;
            return Err(ErrorBody::new(
                "slack_unavailable",
                "chat.postMessage failed",
            ));
        }
        posted += 1;
    }
    Ok(json!({"posted": posted}))
}

pub fn worker(cfg: SlackConfig) -> Worker {
    let mut w = Worker::new("slack-approval");
    let c = cfg.clone();
    w.register_function(
        def("slack::on_parked", "State trigger on turn records: posts each newly parked call to the Slack channel with Approve/Deny buttons.")
        .not_for_the_agent()
            .errors(&[("slack_unavailable", "chat.postMessage failed (retried)"), ("not_configured", "no bot token")]),
        move |ctx, data: Value| on_parked(ctx, c.clone(), data),
    );
    let c = cfg;
    w.register_function(
        def("slack::webhook", "A Slack request as data: {headers, body} (the HTTP entry points call the same handler).")
        .not_for_the_agent()
            .request(json!({"headers": {"x-slack-signature": "v0=…", "x-slack-request-timestamp": "unix seconds"}, "body": "the raw form body"}))
            .response(json!({"status": "HTTP status", "body": "JSON for Slack"})),
        move |ctx, data: Value| {
            let c = c.clone();
            async move {
                let headers = json_headers(&data["headers"]);
                let body = data["body"].as_str().unwrap_or("").as_bytes().to_vec();
                let r = handle_webhook(&ctx, &c, &headers, &body, now_secs()).await;
                Ok(json!({"status": r.status, "body": r.body}))
            }
        },
    );
    // Turn records only (the rest of the scope never parks a call), and only writes that
    // change the parked list: not every step of every turn.
    w.register_trigger(
        "state",
        "slack::on_parked",
        json!({"scope": "agent", "key": "session/*/turn_state", "changed": "awaiting_approval"}),
    );
    w
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The local HTTP entry point: `POST /slack/*` → [`handle_webhook`].
pub async fn serve(
    ctx: Ctx,
    cfg: SlackConfig,
    listen: &str,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    serve_with_limits(ctx, cfg, listen, webhook_limits()).await
}

/// The webhook's connection limits: Slack's requests are small and quick.
pub fn webhook_limits() -> http_bounded::Limits {
    http_bounded::Limits {
        max_connections: 128,
        header_timeout: Duration::from_secs(10),
        body_deadline: Duration::from_secs(10),
        max_body_bytes: 256 * 1024,
    }
}

/// [`serve`] with other limits (tests shorten the deadlines).
pub async fn serve_with_limits(
    ctx: Ctx,
    cfg: SlackConfig,
    listen: &str,
    limits: http_bounded::Limits,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;
    async fn hook(
        State((ctx, cfg)): State<(Ctx, SlackConfig)>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> axum::response::Response {
        let headers: HashMap<String, String> = headers
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    k.as_str().to_ascii_lowercase(),
                    v.to_str().ok()?.to_string(),
                ))
            })
            .collect();
        let r = handle_webhook(&ctx, &cfg, &headers, &body, now_secs()).await;
        let status = axum::http::StatusCode::from_u16(r.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(r.body)).into_response()
    }
    let app = axum::Router::new()
        .route("/slack/commands", axum::routing::post(hook))
        .route("/slack/interactive", axum::routing::post(hook))
        .with_state((ctx, cfg));
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(http_bounded::serve(listener, app, limits));
    Ok((url, task))
}

/// Headers given as a JSON object, names lower-cased (non-string values skipped).
fn json_headers(v: &Value) -> HashMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.to_ascii_lowercase(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A Lambda Function URL (or API Gateway HTTP API) event → the webhook → its response.
pub async fn handle_function_url(ctx: &Ctx, cfg: &SlackConfig, event: &Value) -> Value {
    let headers = json_headers(&event["headers"]);
    let raw = event["body"].as_str().unwrap_or("");
    let body = if event["isBase64Encoded"] == true {
        match base64_decode(raw) {
            Some(b) => b,
            None => {
                return json!({"statusCode": 400, "headers": {"content-type": "application/json"}, "body": json!({"error": "body is not valid base64"}).to_string()});
            }
        }
    } else {
        raw.as_bytes().to_vec()
    };
    let r = handle_webhook(ctx, cfg, &headers, &body, now_secs()).await;
    json!({"statusCode": r.status, "headers": {"content-type": "application/json"}, "body": r.body.to_string()})
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut buf = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace()) {
        if c == b'=' {
            break;
        }
        let v = T.iter().position(|&t| t == c)? as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_from_commands_and_buttons() {
        let d = parse_decision(b"command=%2Fdeny&text=s1%2Fc9+not+today&user_id=U1&user_name=ann&response_url=http%3A%2F%2Fx").unwrap();
        assert_eq!(
            (
                d.call.as_str(),
                d.decision,
                d.reason.as_str(),
                d.user_id.as_str()
            ),
            ("s1/c9", "deny", "not today", "U1")
        );
        let payload = json!({"type": "block_actions", "user": {"id": "U2", "username": "bob"}, "actions": [{"action_id": "approve", "value": "s1/c9"}], "response_url": "http://r"});
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish();
        let d = parse_decision(body.as_bytes()).unwrap();
        assert_eq!(
            (d.call.as_str(), d.decision, d.interactive),
            ("s1/c9", "allow", true)
        );
        assert!(
            parse_decision(b"command=%2Fdelete&text=x")
                .unwrap_err()
                .contains("/delete")
        );
        assert!(
            parse_decision(b"command=%2Fapprove&text=")
                .unwrap_err()
                .contains("usage")
        );
        assert!(parse_decision(b"payload=%7Bnot+json").is_err());
    }

    #[test]
    fn base64_bodies() {
        assert_eq!(
            base64_decode("Y29tbWFuZD0lMkZhcHByb3Zl").unwrap(),
            b"command=%2Fapprove"
        );
        assert!(base64_decode("!!").is_none());
    }
}
