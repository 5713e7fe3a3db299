//! The HTTP API's routes (documented in `openapi.json`, which a test holds to this table).

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

use super::{ApiError, Caller, HttpState, OPENAPI, check_origin, presented_token, query_param};
use bus::protocol::codes;

/// `(method, path)` of every API route, as `openapi.json` must list them.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/api/login"),
    ("post", "/api/logout"),
    ("get", "/api/whoami"),
    ("get", "/api/sessions"),
    ("get", "/api/sessions/{sid}"),
    ("post", "/api/sessions/{sid}/turns"),
    ("get", "/api/sessions/{sid}/events"),
    ("post", "/api/sessions/{sid}/abort"),
    ("post", "/api/approvals/{sid}/{cid}"),
    ("get", "/api/openapi.json"),
    ("post", "/v1/chat/completions"),
    ("get", "/v1/models"),
    ("post", "/ag-ui"),
    ("post", "/mcp"),
    ("get", "/mcp"),
    ("delete", "/mcp"),
    ("post", "/a2a"),
    ("get", "/.well-known/agent-card.json"),
];

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/api/login", post(login))
        .route("/api/logout", post(logout))
        .route("/api/whoami", get(whoami))
        .route("/api/sessions", get(list_sessions))
        .route("/api/sessions/{sid}", get(get_session))
        .route("/api/sessions/{sid}/turns", post(start_turn))
        .route("/api/sessions/{sid}/events", get(super::sse::events))
        .route("/api/sessions/{sid}/abort", post(abort))
        .route("/api/approvals/{sid}/{cid}", post(resolve_approval))
        .route("/api/openapi.json", get(openapi))
}

/// An id taken from a path: what the bus's session and call ids may hold.
pub fn check_id(what: &str, id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "`{what}` must be 1 to 128 characters of letters, digits and `-_.:@`"
        )))
    }
}

/// Read a JSON object body of at most `max_body_bytes`. An empty body reads as `{}`.
pub(crate) async fn json_body(state: &super::Doors, body: Body) -> Result<Value, ApiError> {
    let value = json_value(state, body).await?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    Ok(value)
}

/// Read a JSON body of any kind, bounded and checked as `json_body`'s.
pub(crate) async fn json_value(state: &super::Doors, body: Body) -> Result<Value, ApiError> {
    let limit = state.max_body_bytes;
    // A body has a deadline, so a peer sending a byte now and then cannot hold the
    // connection (the minimum rate is the limit over the deadline).
    let deadline = state.body_deadline;
    let bytes = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    deadline.as_secs_f64()
                ),
            )
        })?
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::PAYLOAD_TOO_LARGE,
                format!("the request body is over {limit} bytes"),
            )
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    bus::state::check_value_depth("the body", &value).map_err(bus::protocol::ErrorBody::from)?;
    Ok(value)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    token: Option<String>,
    code: Option<String>,
}

/// Exchange a credential (`token`) or a one-time code (`code`) for a session token with the
/// same role. The console keeps it for this tab only.
async fn login(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_origin(&headers, &state.doors)?;
    let body = json_body(&state.doors, body).await?;
    let login: LoginBody = serde_json::from_value(body).map_err(|e| {
        ApiError::invalid(format!("login: {e} (send {{\"token\"}} or {{\"code\"}})"))
    })?;
    let issued = state.access.issued();
    let principal = match (login.token.as_deref(), login.code.as_deref()) {
        (Some(t), None) => state.access.authenticate_credential(t),
        (None, Some(c)) => issued.redeem_code(c),
        _ => {
            return Err(ApiError::invalid(
                "login: send exactly one of `token` and `code`",
            ));
        }
    }
    .ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "that token is not valid, or that sign-in code was used or has expired",
        )
    })?;
    let grant = issued.issue_session(principal);
    tracing::info!(name = %grant.principal.name, role = grant.principal.role.as_str(), "console sign-in");
    Ok(axum::Json(json!({
        "session_token": grant.token,
        "role": grant.principal.role.as_str(),
        "name": grant.principal.name,
        "expires_in_s": grant.expires_in.as_secs(),
    }))
    .into_response())
}

async fn logout(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    _caller: Caller,
) -> axum::Json<Value> {
    let revoked =
        presented_token(&headers, None).is_some_and(|t| state.access.issued().revoke_session(&t));
    axum::Json(json!({"ok": true, "revoked": revoked}))
}

async fn whoami(caller: Caller) -> axum::Json<Value> {
    axum::Json(json!({"name": caller.principal.name, "role": caller.principal.role.as_str()}))
}

fn page_number(what: &str, v: Option<&str>, default: u64, max: u64) -> Result<u64, ApiError> {
    match v {
        None => Ok(default),
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(ApiError::invalid(format!(
                "`{what}` must be a whole number from 0 to {max}"
            ))),
        },
    }
}

/// The sessions, newest first, a page at a time, each with its turn's state and totals.
async fn list_sessions(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    uri: axum::http::Uri,
) -> Result<axum::Json<Value>, ApiError> {
    let q = uri.query();
    let limit = page_number("limit", query_param(q, "limit").as_deref(), 50, 200)?.max(1);
    let offset = page_number(
        "offset",
        query_param(q, "offset").as_deref(),
        0,
        u64::from(u32::MAX),
    )?;
    let listed = state
        .doors
        .call(
            &caller,
            "session-tree::list",
            json!({"limit": limit, "offset": offset}),
        )
        .await?;
    // Each session's turn, asked at once (a page is at most 200).
    let metas: Vec<&Value> = listed["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["session_id"].is_string())
        .collect();
    let turns = futures_util::future::join_all(metas.iter().map(|meta| {
        state.doors.call(
            &caller,
            "turn::get_state",
            json!({"session_id": meta["session_id"]}),
        )
    }))
    .await;
    let sessions: Vec<Value> = metas
        .into_iter()
        .zip(turns)
        .map(|(meta, turn)| {
            json!({"session_id": meta["session_id"], "session": meta, "turn": turn.unwrap_or(Value::Null)})
        })
        .collect();
    Ok(axum::Json(json!({
        "sessions": sessions,
        "total": listed["total"],
        "next_offset": listed["next_offset"],
    })))
}

async fn get_session(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    Path(sid): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    check_id("session id", &sid)?;
    let turn = state
        .doors
        .call(&caller, "turn::get_state", json!({"session_id": sid}))
        .await?;
    if turn.is_null() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no session `{sid}` has run"),
        ));
    }
    Ok(axum::Json(turn))
}

/// Start a turn: the body is `harness::trigger`'s (`{payload, message_id?}`), or
/// `{"message": "text"}` for a user message with the run defaults. 409 while the session
/// is busy.
async fn start_turn(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    Path(sid): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    check_id("session id", &sid)?;
    let mut body = json_body(&state.doors, body).await?;
    let mut payload = match (
        body.get_mut("payload").map(Value::take),
        body.get("message"),
    ) {
        (Some(p @ Value::Object(_)), None) => p,
        (None, Some(Value::String(text))) if !text.trim().is_empty() => json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}], "timestamp": bus_telemetry::trace::now_ms()}]
        }),
        (Some(_), None) => return Err(ApiError::invalid("`payload` must be an object")),
        (None, Some(_)) => return Err(ApiError::invalid("`message` must be a non-empty string")),
        _ => {
            return Err(ApiError::invalid(
                "send `payload` (run::start's request) or `message` (a user message), not both or neither",
            ));
        }
    };
    payload["session_id"] = json!(sid);
    let mut request = json!({"session_id": sid, "payload": payload});
    if let Some(mid) = body.get("message_id") {
        let Some(m) = mid.as_str() else {
            return Err(ApiError::invalid("`message_id` must be a string"));
        };
        check_id("message_id", m)?;
        request["message_id"] = json!(m);
    }
    let answer = state
        .doors
        .call(&caller, "harness::trigger", request)
        .await?;
    let status = answer["status_code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::OK);
    Ok((status, axum::Json(answer)).into_response())
}

async fn abort(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    Path(sid): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    check_id("session id", &sid)?;
    Ok(axum::Json(
        state
            .doors
            .call(&caller, "run::abort", json!({"session_id": sid}))
            .await?,
    ))
}

/// Decide a parked call: `{"decision": "allow"|"deny", "reason"?}`. 409 when it is not
/// waiting (decided already, or never parked). Served beside the doors too (the doors Lambda),
/// since the chat door names it as the way to decide a call its stream waits for.
pub(super) async fn resolve_approval(
    State(state): State<super::Doors>,
    caller: Caller,
    Path((sid, cid)): Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    check_id("session id", &sid)?;
    check_id("call id", &cid)?;
    let body = json_body(&state, body).await?;
    let decision = match body["decision"].as_str() {
        Some(d @ ("allow" | "deny")) => d,
        _ => {
            return Err(ApiError::invalid(
                "`decision` must be \"allow\" or \"deny\"",
            ));
        }
    };
    let mut request = json!({"session_id": sid, "function_call_id": cid, "decision": decision});
    match body.get("reason") {
        None | Some(Value::Null) => {}
        Some(Value::String(r)) if r.len() <= 2000 => request["reason"] = json!(r),
        Some(_) => {
            return Err(ApiError::invalid(
                "`reason` must be a string of at most 2000 bytes",
            ));
        }
    }
    let answer = state.call(&caller, "approval::resolve", request).await?;
    let status = match (answer["ok"].as_bool(), answer["error"].as_str()) {
        (Some(true), _) => StatusCode::OK,
        (_, Some("not_pending")) => StatusCode::CONFLICT,
        (_, Some("invalid_payload")) => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    Ok((status, axum::Json(answer)).into_response())
}

async fn openapi() -> Response {
    ([(http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_paths_are_checked() {
        check_id("session id", "cli-1a2b").unwrap();
        check_id("session id", "s:1@x.y_z").unwrap();
        for bad in ["", "a/b", "a b", "..%2f", &"x".repeat(129), "é"] {
            assert!(check_id("session id", bad).is_err(), "{bad}");
        }
    }

    /// Every route is documented, and everything documented is routed.
    #[test]
    fn the_openapi_document_lists_exactly_the_routes() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("openapi.json parses");
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    documented.push((method.clone(), path.clone()));
                }
            }
        }
        documented.sort();
        let mut routed: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        routed.sort();
        assert_eq!(documented, routed);
    }
}
