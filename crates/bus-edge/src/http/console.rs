//! The web console's assets, embedded in the binary (no build step, no Node at run time):
//! one page, its script and its style sheet from `engine-gateway/console/`.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

use super::HttpState;

const INDEX: &str = include_str!("../../console/index.html");
const SCRIPT: &str = include_str!("../../console/app.js");
const STYLE: &str = include_str!("../../console/app.css");

/// The page talks only to its own origin and to engine URLs the user types (the deployed
/// WebSocket API); it runs no inline script and may not be framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    asset_owned(content_type, body.to_string())
}

/// The placeholder in index.html for where the admin token is.
const TOKEN_PLACE: &str = "<code id=\"token-place\">.harness-data/engine.token</code>";

/// The page, its sign-in card naming where this engine's token really is.
fn index_for(state: &HttpState) -> String {
    let place = match &state.token_file {
        Some(p) => format!(
            "<code id=\"token-place\">{}</code>",
            html_text(&p.display().to_string())
        ),
        None => {
            "the token given to the engine (<code id=\"token-place\">--token / ENGINE_TOKEN</code>)"
                .to_string()
        }
    };
    INDEX.replacen(TOKEN_PLACE, &place, 1)
}

/// Text safe inside an HTML element.
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn asset_owned(content_type: &'static str, body: String) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route(
            "/",
            get(
                |axum::extract::State(state): axum::extract::State<Arc<HttpState>>| async move {
                    asset_owned("text/html; charset=utf-8", index_for(&state))
                },
            ),
        )
        .route(
            "/console/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/console/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
}
