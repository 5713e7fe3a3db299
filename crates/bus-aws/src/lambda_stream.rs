//! Lambda response streaming, as the local Runtime API host serves it.
//!
//! - **Runtime API side**: a `bootstrap` answers in streaming mode by posting its response
//!   with `Lambda-Runtime-Function-Response-Mode: streaming` and a chunked body; a mid-stream
//!   failure comes as the trailers `Lambda-Runtime-Function-Error-Type` / `-Body` (base64).
//!   [`pump`] forwards the chunks to the invoker as they arrive.
//! - **Invoke API side**: `InvokeWithResponseStream` answers with an AWS event stream
//!   (`application/vnd.amazon.eventstream`): `PayloadChunk` events carrying the bytes, then one
//!   `InvokeComplete` (with `ErrorCode`/`ErrorDetails` when the function failed).
//!   [`event_message`] encodes one event as the SDK's parser reads it.
//! - **Either side**: a runtime that uses the HTTP-integration format starts the stream with a
//!   JSON prelude and eight NUL bytes; [`PreludeStripper`] removes it.

use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use axum::http::HeaderMap;
use bus::lambda::LambdaError;
use bytes::Bytes;
use std::borrow::Cow;
use std::time::Instant;
use tokio::sync::mpsc;

/// One piece of a response stream: bytes, or the failure that ended it.
pub type StreamPiece = Result<Bytes, LambdaError>;

/// Whether a Runtime API response is posted in streaming mode.
pub fn is_streaming(headers: &HeaderMap) -> bool {
    headers
        .get("lambda-runtime-function-response-mode")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("streaming"))
}

/// The error a streaming response's trailers report, if any.
fn trailer_error(trailers: &HeaderMap) -> Option<LambdaError> {
    use base64::Engine;
    let error_type = trailers
        .get("lambda-runtime-function-error-type")?
        .to_str()
        .ok()?
        .to_string();
    let message = trailers
        .get("lambda-runtime-function-error-body")
        .and_then(|v| v.to_str().ok())
        .map(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map(|d| String::from_utf8_lossy(&d).into_owned())
                .unwrap_or_else(|_| b.to_string())
        })
        .unwrap_or_default();
    Some(LambdaError::Function {
        error_type,
        message,
    })
}

/// Forward a streaming response body to `tx` until it ends, fails, or `deadline` passes (the
/// function's timeout: then the invoker gets `TimedOut`). Stops early when the invoker has
/// gone.
pub async fn pump(
    body: axum::body::Body,
    tx: mpsc::Sender<StreamPiece>,
    deadline: Instant,
    timeout_ms: u128,
) {
    use http_body_util::BodyExt;
    let mut body = body;
    loop {
        let frame = match tokio::time::timeout_at(deadline.into(), body.frame()).await {
            Err(_) => {
                let _ = tx.send(Err(LambdaError::TimedOut(timeout_ms))).await;
                return;
            }
            Ok(None) => return,
            Ok(Some(Err(e))) => {
                let _ = tx
                    .send(Err(LambdaError::Crashed(format!(
                        "the response stream broke: {e}"
                    ))))
                    .await;
                return;
            }
            Ok(Some(Ok(frame))) => frame,
        };
        match frame.into_data() {
            Ok(data) => {
                if !data.is_empty() && tx.send(Ok(data)).await.is_err() {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers()
                    && let Some(e) = trailer_error(&trailers)
                {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    }
}

/// Drops the HTTP-integration prelude (`{…}` then eight NUL bytes) from the start of a
/// stream, if there is one. It is recognised by its NUL bytes coming before any newline (a
/// prelude is one line of JSON; the payloads we stream are newline-delimited).
#[derive(Default)]
pub struct PreludeStripper {
    /// Bytes held while it is not yet known whether they are a prelude.
    pending: Vec<u8>,
    decided: bool,
    /// The prelude's JSON, once one was found (a Function URL reads its status and headers).
    prelude: Option<Vec<u8>>,
}

/// Longest prelude looked for before deciding there is none.
const MAX_PRELUDE: usize = 64 * 1024;

impl PreludeStripper {
    /// Feed `chunk`; returns the payload bytes it releases (the chunk itself, uncopied, once
    /// it is known whether there was a prelude).
    pub fn feed<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        if self.decided {
            return Cow::Borrowed(chunk);
        }
        self.pending.extend_from_slice(chunk);
        if self.pending.first().is_some_and(|b| *b != b'{') {
            return Cow::Owned(self.release(0));
        }
        let nuls = self.pending.windows(8).position(|w| w == [0u8; 8]);
        let newline = self.pending.iter().position(|b| *b == b'\n');
        Cow::Owned(match (nuls, newline) {
            (Some(n), nl) if nl.is_none_or(|nl| n < nl) => self.release(n + 8),
            (_, Some(_)) => self.release(0),
            _ if self.pending.len() > MAX_PRELUDE => self.release(0),
            _ => Vec::new(),
        })
    }

    /// End of stream: whatever is still held is payload.
    pub fn finish(&mut self) -> Vec<u8> {
        self.release(0)
    }

    /// Whether it is known yet if the stream has a prelude.
    pub fn decided(&self) -> bool {
        self.decided
    }

    /// The prelude's JSON (without its eight NUL bytes), if the stream had one.
    pub fn prelude(&self) -> Option<&[u8]> {
        self.prelude.as_deref()
    }

    fn release(&mut self, skip: usize) -> Vec<u8> {
        self.decided = true;
        let rest = self.pending.split_off(skip.min(self.pending.len()));
        if skip >= 8 {
            self.pending.truncate(skip - 8);
            self.prelude = Some(std::mem::take(&mut self.pending));
        }
        self.pending.clear();
        rest
    }
}

/// One event of an `InvokeWithResponseStream` answer, encoded.
pub fn event_message(event_type: &str, content_type: &str, payload: Bytes) -> Bytes {
    let message = Message::new(payload)
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ))
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String(event_type.to_string().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String(content_type.to_string().into()),
        ));
    let mut buf = Vec::new();
    // Writing to a Vec fails only for a message over the format's limits (16 MiB), which a
    // chunk of a Lambda response (at most 20 MiB in all, sent in far smaller pieces) is not.
    if aws_smithy_eventstream::frame::write_message_to(&message, &mut buf).is_err() {
        buf.clear();
    }
    Bytes::from(buf)
}

/// `PayloadChunk` with `bytes`.
pub fn payload_chunk(bytes: Bytes) -> Bytes {
    event_message("PayloadChunk", "application/octet-stream", bytes)
}

/// `InvokeComplete`, with the error when the invocation failed.
pub fn invoke_complete(error: Option<&LambdaError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({
            "ErrorCode": e.error_type(),
            "ErrorDetails": e.to_string(),
        }),
    };
    event_message(
        "InvokeComplete",
        "application/json",
        Bytes::from(body.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prelude_is_stripped_and_a_plain_stream_is_left_alone() {
        let mut s = PreludeStripper::default();
        assert!(s.feed(br#"{"statusCode":200,"#).is_empty(), "undecided yet");
        let mut out = s
            .feed(b"\"headers\":{}}\0\0\0\0\0\0\0\0{\"frame\":\"a\"}\n")
            .into_owned();
        out.extend_from_slice(&s.feed(b"{\"result\":1}\n"));
        assert_eq!(out, b"{\"frame\":\"a\"}\n{\"result\":1}\n");
        assert_eq!(
            s.prelude(),
            Some(&br#"{"statusCode":200,"headers":{}}"#[..]),
            "the prelude is kept for who reads it"
        );
        let mut s = PreludeStripper::default();
        let mut out = s.feed(b"{\"frame\":\"a\"}\n").into_owned();
        out.extend(s.finish());
        assert_eq!(out, b"{\"frame\":\"a\"}\n");
        assert_eq!(s.prelude(), None);
        let mut s = PreludeStripper::default();
        assert_eq!(&*s.feed(b"[1]"), b"[1]");
    }

    #[test]
    fn events_decode_as_the_sdk_reads_them() {
        let chunk = payload_chunk(Bytes::from_static(b"hello"));
        let m = aws_smithy_eventstream::frame::read_message_from(chunk).unwrap();
        assert_eq!(m.payload().as_ref(), b"hello");
        let kind = m
            .headers()
            .iter()
            .find(|h| h.name().as_str() == ":event-type")
            .and_then(|h| h.value().as_string().ok())
            .map(|s| s.as_str().to_string());
        assert_eq!(kind.as_deref(), Some("PayloadChunk"));
        let done = invoke_complete(Some(&LambdaError::TimedOut(5)));
        let m = aws_smithy_eventstream::frame::read_message_from(done).unwrap();
        let v: serde_json::Value = serde_json::from_slice(m.payload()).unwrap();
        assert_eq!(v["ErrorCode"], "Sandbox.Timedout");
    }

    #[test]
    fn trailers_name_the_failure() {
        let mut t = HeaderMap::new();
        t.insert(
            "lambda-runtime-function-error-type",
            "Runtime.StreamError".parse().unwrap(),
        );
        t.insert(
            "lambda-runtime-function-error-body",
            "Ym9vbQ==".parse().unwrap(),
        );
        assert_eq!(
            trailer_error(&t),
            Some(LambdaError::Function {
                error_type: "Runtime.StreamError".into(),
                message: "boom".into()
            })
        );
        assert_eq!(trailer_error(&HeaderMap::new()), None);
    }
}
