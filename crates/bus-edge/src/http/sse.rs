//! `GET /api/sessions/{sid}/events`: the session's `agent::events` as Server-Sent Events.
//!
//! Stored events carry their item id as the SSE `id` (`<sid>-<seq>`, zero-padded, so text
//! order is event order); a client that reconnects with `Last-Event-ID` (or
//! `?last_event_id=`) gets every stored event after it, then the live ones, with none missed
//! and none twice: the subscription is opened before the stored items are read, and a live
//! event at or before the last id sent is dropped. Token deltas (`message_update`) are pushed,
//! never stored, so they carry no id and are not replayed; the `message_complete` after them
//! is. The stream is bounded like a WebSocket connection: too far behind, or older than the
//! connection lifetime, and it ends; the client reconnects from its last id.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

use super::api::check_id;
use super::following::Following;
use super::{ApiError, Caller, HttpState, query_param};
use bus::state::STREAM_SCOPE_PREFIX;

pub const EVENTS_STREAM: &str = "agent::events";
/// A stream says something at least this often (a keep-alive comment if nothing else), so
/// proxies and clients do not take a quiet turn for a dead connection.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Stored events read from the state port per page.
const BACKLOG_PAGE: usize = 200;

fn frame(id: Option<&str>, event: &str, data: &Value) -> Bytes {
    let mut out = String::new();
    if let Some(id) = id {
        out.push_str("id: ");
        out.push_str(id);
        out.push('\n');
    }
    // Event names come from the bus: keep them on one line.
    let event: String = event.chars().filter(|c| !c.is_control()).collect();
    out.push_str("event: ");
    out.push_str(&event);
    out.push_str("\ndata: ");
    // serde_json never writes a raw newline, so one `data:` line holds the whole event.
    out.push_str(&data.to_string());
    out.push_str("\n\n");
    Bytes::from(out)
}

/// A stored event's SSE frame: its type is the `type` its data carries.
fn stored_frame(item_id: &str, data: &Value) -> Bytes {
    let event = data["type"].as_str().unwrap_or("event");
    frame(
        Some(item_id),
        event,
        &json!({"item_id": item_id, "data": data}),
    )
}

pub async fn events(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Path(sid): Path<String>,
) -> Result<Response, ApiError> {
    check_id("session id", &sid)?;
    caller.principal.may_subscribe(EVENTS_STREAM)?;
    let last = headers
        .get("last-event-id")
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| query_param(uri.query(), "last_event_id"))
        .filter(|id| !id.is_empty());
    if let Some(id) = &last
        && !id.starts_with(&format!("{sid}-"))
    {
        return Err(ApiError::invalid(format!(
            "Last-Event-ID `{id}` is not an event of session `{sid}`"
        )));
    }
    // Subscribe first, so nothing written between the backlog read and the subscription is lost.
    let engine = state.engine.clone();
    let mut following = Following::start(
        &engine,
        state.max_queued_bytes,
        &caller,
        &sid,
        "http:events",
        format!("http events of {sid}"),
    )?;
    // Another's session streams as one that does not exist: no backlog, and the engine never
    // pushes its events to this subscription.
    let visible = engine.may_see_session(&caller.principal, &sid).await;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let lifetime = state.max_stream_lifetime;
    tokio::spawn(async move {
        let mut last_sent = last;
        let scope = format!("{STREAM_SCOPE_PREFIX}{EVENTS_STREAM}");
        let prefix = format!("{sid}\u{1}");
        let _ = tx.send(Bytes::from_static(b"retry: 1000\n\n")).await;
        // The stored backlog after the last id, a page at a time.
        let mut after = last_sent.as_ref().map(|id| format!("{prefix}{id}"));
        let mut more_pages = visible;
        while more_pages {
            let page = engine
                .state
                .list_page(&scope, Some(&prefix), after.as_deref(), BACKLOG_PAGE)
                .await;
            let (items, more) = match page {
                Ok(p) => p,
                Err(e) => {
                    let _ = tx
                        .send(frame(
                            None,
                            "error",
                            &json!({"code": "storage_error", "message": e.to_string()}),
                        ))
                        .await;
                    return;
                }
            };
            for entry in &items {
                let item_id = &entry.key[prefix.len()..];
                if tx.send(stored_frame(item_id, &entry.value)).await.is_err() {
                    return;
                }
                last_sent = Some(item_id.to_string());
            }
            after = items.last().map(|e| e.key.clone()).or(after);
            more_pages = more;
        }
        let deadline = tokio::time::sleep(lifetime);
        tokio::pin!(deadline);
        let mut closing = engine.closing();
        let closed = async move {
            let _ = closing.wait_for(|c| *c).await;
        };
        tokio::pin!(closed);
        let overflowed = following.overflowed();
        tokio::pin!(overflowed);
        loop {
            let next = tokio::select! {
                p = following.next_item() => p,
                _ = tokio::time::sleep(KEEP_ALIVE) => {
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() { break }
                    continue;
                }
                _ = tx.closed() => break,
                _ = &mut overflowed => break,
                _ = &mut deadline => break,
                _ = &mut closed => break,
            };
            let Some((item_id, event_type, data)) = next else {
                break;
            };
            let bytes = match event_type.as_str() {
                // A stored item (written or rewritten): at most once, in order.
                "create" | "update" if !item_id.is_empty() => {
                    if last_sent.as_deref().is_some_and(|l| item_id.as_str() <= l) {
                        continue;
                    }
                    let b = stored_frame(&item_id, &data);
                    last_sent = Some(item_id);
                    b
                }
                other => frame(None, other, &json!({"data": data})),
            };
            if tx.send(bytes).await.is_err() {
                break;
            }
        }
    });
    Ok(sse_response(rx))
}

/// A Server-Sent Events answer whose frames come from `frames` as they are made; it ends
/// when the sender is dropped.
pub(crate) fn sse_response(frames: mpsc::Receiver<bytes::Bytes>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = futures_util::stream::unfold(frames, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    (
        axum::http::StatusCode::OK,
        [
            (http::header::CONTENT_TYPE, "text/event-stream"),
            (http::header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_one_event_each() {
        let f = stored_frame(
            "s-000000000001",
            &json!({"type": "turn_end", "text": "a\nb"}),
        );
        let text = std::str::from_utf8(&f).unwrap();
        assert!(
            text.starts_with("id: s-000000000001\nevent: turn_end\ndata: {"),
            "{text}"
        );
        assert!(text.ends_with("}\n\n"));
        assert_eq!(
            text.matches('\n').count(),
            4,
            "the data stays on one line: {text}"
        );
        let f = frame(None, "bad\nname", &json!({}));
        assert!(
            std::str::from_utf8(&f)
                .unwrap()
                .starts_with("event: badname\n")
        );
    }
}
