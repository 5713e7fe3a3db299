//! Plain HTTP on the engine's own port: the web console's assets at `/`, and the HTTP API
//! (`/api/…`) that chat front ends and scripts use besides the bus. A request that asks for
//! a WebSocket upgrade never gets here (the edge hands it to the bus); everything else does.
//!
//! The API is a thin door onto the bus: each route authenticates like `$connect` does (the
//! same tokens, the same roles), then calls the same function IDs a WebSocket client would
//! (`harness::trigger`, `turn::get_state`, `approval::resolve`, `run::abort`, the session
//! tree) under the caller's credential, so a client token reaches only public functions.
//! Errors are JSON, `{"error": {"code", "message"}}`, with the bus's codes.

mod api;
pub use api::ROUTES;
pub use http_bounded as bounded;
mod console;
pub mod doors;
mod drain;
mod following;
pub use doors::port::{DoorBus, Doors, EngineDoors};
pub use following::{Following, Pushed, pushed_item};
pub use sse::EVENTS_STREAM;
mod sse;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bus::access::{Access, Principal};
use bus::engine::Engine;
use bus::protocol::{ErrorBody, codes};
use bus_telemetry::trace::TraceContext;

/// The OpenAPI document of every route below (tested against the router).
pub const OPENAPI: &str = include_str!("openapi.json");

/// What every request handler shares.
pub struct HttpState {
    pub engine: Arc<Engine>,
    pub access: Access,
    /// What the doors and the API share: the bus port, origins, body bounds.
    pub doors: Doors,
    /// Most bytes queued for one event stream before it is closed (the client reconnects).
    pub max_queued_bytes: usize,
    /// An event stream is closed after this long (the client reconnects with Last-Event-ID).
    pub max_stream_lifetime: Duration,
    /// Where the admin token is (the console's sign-in card names it).
    pub token_file: Option<std::path::PathBuf>,
}

impl axum::extract::FromRef<Arc<HttpState>> for Doors {
    fn from_ref(state: &Arc<HttpState>) -> Self {
        state.doors.clone()
    }
}

/// An HTTP error with the bus's error body.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody::new(code, message),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID_MESSAGE, message)
    }
}

/// The HTTP status a bus error maps to.
fn status_of(code: &str) -> StatusCode {
    match code {
        codes::FORBIDDEN => StatusCode::FORBIDDEN,
        codes::FUNCTION_NOT_FOUND => StatusCode::NOT_IMPLEMENTED,
        codes::INVALID_MESSAGE | codes::SERIALIZATION_ERROR => StatusCode::BAD_REQUEST,
        codes::TIMEOUT => StatusCode::GATEWAY_TIMEOUT,
        codes::VERSION_CONFLICT => StatusCode::CONFLICT,
        codes::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        "not_found" | "entry_not_found" => StatusCode::NOT_FOUND,
        "unauthorized" => StatusCode::UNAUTHORIZED,
        codes::INVOCATION_STOPPED | codes::STORAGE_ERROR => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    }
}

impl From<ErrorBody> for ApiError {
    fn from(body: ErrorBody) -> Self {
        Self {
            status: status_of(&body.code),
            body,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(json!({"error": {"code": self.body.code, "message": self.body.message}})),
        )
            .into_response()
    }
}

/// Every answer that leaves part of its request body unread (408: it came too slowly; 413:
/// too much) closes the connection, and says so, so a client does not send its next request
/// on it; every 401 names the scheme it wants (RFC 6750), whichever door or error shape
/// answered. One layer for every route.
async fn close_after_unread_body(mut resp: Response) -> Response {
    if resp.status() == StatusCode::UNAUTHORIZED
        && !resp.headers().contains_key(http::header::WWW_AUTHENTICATE)
    {
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    if matches!(
        resp.status(),
        StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
    ) {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// The token a request presents: `Authorization: Bearer …`, else `?token=…` (an
/// `EventSource` cannot set headers).
fn presented_token(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
        .or_else(|| query_param(query, "token"))
}

pub(crate) fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| {
            url::form_urlencoded::parse(format!("v={v}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
    })
}

/// Who is calling: the credential the request presents, checked as `$connect` checks it
/// (including the browser's Origin).
pub struct Caller {
    pub principal: Principal,
    pub trace: TraceContext,
    /// The credential as presented: the doors Lambda opens the caller's own WebSocket with it
    /// to follow a session, so the router filters what it pushes as for the caller.
    pub credential: Option<String>,
}

impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    Doors: axum::extract::FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let doors = <Doors as axum::extract::FromRef<S>>::from_ref(state);
        check_origin(&parts.headers, &doors)?;
        let token = presented_token(&parts.headers, parts.uri.query());
        let principal = doors
            .bus
            .authenticate(token.as_deref())
            .await
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing or wrong engine token (send `Authorization: Bearer <token>`)",
                )
            })?;
        let header = |name: &str| parts.headers.get(name).and_then(|h| h.to_str().ok());
        let trace = TraceContext::from_headers(header("traceparent"), header("baggage"));
        Ok(Caller {
            trace: principal.stamp(trace),
            principal,
            credential: token,
        })
    }
}

/// A request from a browser page must come from an allowed origin, as on `$connect`.
fn check_origin(headers: &HeaderMap, doors: &Doors) -> Result<(), ApiError> {
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("").trim_end_matches('/');
    if crate::origins::origin_listed(origin, doors.origins.iter()) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        codes::FORBIDDEN,
        format!(
            "origin `{origin}` is not allowed: start the engine with --allowed-origins to admit it"
        ),
    ))
}

/// Every route: the console's pages and assets, the API and the doors; CORS for allowed
/// origins.
pub fn router(state: Arc<HttpState>) -> Router {
    api::routes()
        .merge(doors::routes())
        .merge(console::routes())
        .fallback(no_route)
        .layer(axum::middleware::map_response(close_after_unread_body))
        .layer(axum::middleware::from_fn(drain::drain_unread_body))
        .layer(axum::middleware::from_fn_with_state(
            state.doors.clone(),
            cors,
        ))
        .with_state(state)
}

/// The standard doors alone (the doors Lambda of the deployed shape), with the same CORS,
/// bounds and errors as on the engine's port.
pub fn doors_router(doors: Doors) -> Router {
    doors::routes()
        // What the chat door names for deciding a call its stream waits for.
        .route(
            "/api/approvals/{sid}/{cid}",
            axum::routing::post(api::resolve_approval),
        )
        .fallback(no_route)
        .layer(axum::middleware::map_response(close_after_unread_body))
        .layer(axum::middleware::from_fn(drain::drain_unread_body))
        .layer(axum::middleware::from_fn_with_state(doors.clone(), cors))
        .with_state(doors)
}

async fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route (see /api/openapi.json)",
    )
}

/// Headers a browser page may send cross-origin (a bearer credential, JSON, the SSE resume
/// point, trace context, the doors' session ids and MCP's protocol version).
const CORS_ALLOW_HEADERS: &str = "authorization, content-type, accept, last-event-id, traceparent, baggage, x-session-id, mcp-session-id, mcp-protocol-version";

/// CORS for the origins a browser may call from (`--allowed-origins` and the engine's own):
/// a preflight (`OPTIONS` with `Origin`) is answered 204 with the grant, and every answer to
/// such an origin names it. Any other origin gets no grant: its preflight is 403 and its
/// requests are refused as before (`check_origin`).
async fn cors(
    axum::extract::State(doors): axum::extract::State<Doors>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::http::{self as http, header};
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(|o| o.trim_end_matches('/').to_string());
    let granted = origin
        .filter(|o| crate::origins::origin_listed(o, doors.origins.iter()))
        .and_then(|o| http::HeaderValue::from_str(&o).ok());
    let preflight = req.method() == http::Method::OPTIONS;
    if preflight && req.headers().contains_key(header::ORIGIN) {
        let Some(origin) = granted else {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                codes::FORBIDDEN,
                "this origin is not allowed: start the engine with --allowed-origins to admit it",
            )
            .into_response();
        };
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            http::HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            http::HeaderValue::from_static(CORS_ALLOW_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            http::HeaderValue::from_static("600"),
        );
        h.insert(header::VARY, http::HeaderValue::from_static("Origin"));
        return resp;
    }
    let mut resp = next.run(req).await;
    if let Some(origin) = granted {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            http::HeaderValue::from_static("x-session-id, mcp-session-id"),
        );
        h.append(header::VARY, http::HeaderValue::from_static("Origin"));
    }
    resp
}

/// Serve one HTTP/1.1 connection (keep-alive included) until the peer or the engine closes it.
pub async fn serve_connection<S>(
    state: Arc<HttpState>,
    stream: S,
    addr: SocketAddr,
    header_timeout: Duration,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut closing = state.engine.closing();
    let service = hyper_util::service::TowerToHyperService::new(router(state));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!(%addr, error = %e, "HTTP connection ended with an error");
        },
        _ = closing.wait_for(|c| *c) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_decoded() {
        assert_eq!(
            query_param(Some("a=1&token=x%2By"), "token").as_deref(),
            Some("x+y")
        );
        assert_eq!(query_param(Some("token"), "token").as_deref(), Some(""));
        assert_eq!(query_param(None, "token"), None);
    }

    #[test]
    fn bus_codes_map_to_statuses() {
        assert_eq!(status_of(codes::FORBIDDEN), StatusCode::FORBIDDEN);
        assert_eq!(status_of(codes::TIMEOUT), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(status_of("not_found"), StatusCode::NOT_FOUND);
        assert_eq!(status_of("whatever"), StatusCode::BAD_GATEWAY);
    }
}
