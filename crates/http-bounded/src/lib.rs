//! A plain HTTP server with the limits the engine's port has, for listeners of their own
//! (the Slack webhook): at most so many connections, a deadline for each request head (which
//! also closes idle keep-alive connections), and a deadline and a size limit for each body.
//! A peer that opens sockets and says nothing, or sends a byte now and then, holds nothing
//! for long.

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections open at once; more are closed right after `accept`.
    pub max_connections: usize,
    /// A request head (the first, or the next on a kept-alive connection) must arrive whole
    /// within this; a silent or idle connection is closed then.
    pub header_timeout: Duration,
    /// A request body must arrive whole within this (408, and the connection closes).
    pub body_deadline: Duration,
    /// Largest body accepted (413).
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            body_deadline: Duration::from_secs(10),
            max_body_bytes: 1024 * 1024,
        }
    }
}

fn refusal(status: StatusCode, message: String) -> Response {
    let mut resp = (status, axum::Json(json!({"error": message}))).into_response();
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    resp
}

/// Reads the whole body within the deadline and the size limit, then hands the request on.
async fn read_body_in_time(
    State(limits): State<Arc<Limits>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(
        limits.body_deadline,
        axum::body::to_bytes(body, limits.max_body_bytes),
    )
    .await;
    match read {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(_)) => refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is over {} bytes, or was cut",
                limits.max_body_bytes
            ),
        ),
        Err(_) => refusal(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                limits.body_deadline.as_secs_f64()
            ),
        ),
    }
}

/// The next connection that gets one of `slots` (of `max`): a failed accept (out of file
/// descriptors, say) backs off instead of spinning, and a connection past the cap is closed
/// at once.
pub async fn accept_with_slot(
    listener: &TcpListener,
    slots: &Arc<tokio::sync::Semaphore>,
    max: usize,
) -> (
    tokio::net::TcpStream,
    std::net::SocketAddr,
    tokio::sync::OwnedSemaphorePermit,
) {
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => return (stream, addr, slot),
            Err(_) => {
                tracing::warn!(%addr, max, "connection refused: too many open connections");
                drop(stream);
            }
        }
    }
}

/// Serve `app` on `listener` under `limits` until the listener fails.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) {
    let limits = Arc::new(limits);
    let app = app.layer(axum::middleware::from_fn_with_state(
        limits.clone(),
        read_body_in_time,
    ));
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let (stream, addr, slot) =
            accept_with_slot(&listener, &slots, limits.max_connections).await;
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(64 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(%addr, error = %e, "HTTP connection ended with an error");
            }
        });
    }
}
