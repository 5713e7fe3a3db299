//! A request body the handler left unread is read, within a bound, before the answer leaves.
//!
//! Why: an answer given without reading the body (a 401 from the credential check, a 404, a
//! refusal before the handler reads) makes hyper close the connection with the body's bytes
//! still arriving; the kernel answers those with a reset, and the client can lose the answer
//! and see only "disconnected" (the official MCP client did, given a wrong key). Reading at
//! most [`DRAIN_BYTES`] for at most [`DRAIN_WAIT`] keeps that cheap and bounded: a larger or
//! slower body still gets its answer, with `Connection: close`.

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// The most of an unread body read before answering.
pub const DRAIN_BYTES: usize = 64 * 1024;
/// The longest an answer waits for an unread body.
pub const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// The request's body, shared with the layer so it can find what the handler left.
struct Shared(Arc<Mutex<Option<Body>>>);

impl hyper::body::Body for Shared {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(body) = inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            *inner = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        inner.as_ref().is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), hyper::body::Body::size_hint)
    }
}

/// The layer: the handler runs on a shared body; what it left unread (and no longer holds)
/// is read before the answer goes out.
pub async fn drain_unread_body(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let shared = Arc::new(Mutex::new(Some(body)));
    let mut resp = next
        .run(Request::from_parts(
            parts,
            Body::new(Shared(shared.clone())),
        ))
        .await;
    // Still held elsewhere (a handler streaming it on): not ours to read.
    if Arc::strong_count(&shared) > 1 {
        return resp;
    }
    let rest = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(rest) = rest.filter(|b| !hyper::body::Body::is_end_stream(b)) {
        let limited = http_body_util::Limited::new(rest, DRAIN_BYTES);
        let read = tokio::time::timeout(DRAIN_WAIT, limited.collect()).await;
        if !matches!(read, Ok(Ok(_))) {
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
    }
    resp
}
