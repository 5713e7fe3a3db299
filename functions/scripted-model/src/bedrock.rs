//! Amazon Bedrock's ConverseStream: `POST /model/{modelId}/converse-stream`, answered as
//! `application/vnd.amazon.eventstream` frames (prelude, headers, payload, CRC32s), written
//! with the AWS event-stream crate: `messageStart`, `contentBlockStart` (a tool use),
//! `contentBlockDelta` (`text`, `reasoningContent`, `toolUse.input`), `contentBlockStop`,
//! `messageStop` (`stopReason`), `metadata` (`usage` with cache reads and writes). A scripted
//! HTTP error answers as Bedrock does (`x-amzn-ErrorType` and `{"message"}`).
//!
//! `malformed`: `truncate` cuts the stream in the middle of a frame; `bad_crc` sends a frame
//! whose message CRC is wrong; `unknown_event` sends an event type the API does not have
//! (clients skip it); `stream_error` sends a `throttlingException` frame mid-stream;
//! `huge_frame` announces a 20 MiB frame (over the format's 16 MiB).

use crate::{ScriptedModel, Turn, begin, chunks, stop_of};
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use std::time::Duration;

/// The exception a scripted HTTP status stands for.
pub(crate) fn exception_for(status: u16) -> &'static str {
    match status {
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 | 529 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

pub(crate) fn error_response(status: u16, message: &str) -> Response {
    let status = if status == 529 { 503 } else { status };
    let mut resp = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(json!({"message": message})),
    )
        .into_response();
    if let Ok(v) = exception_for(status).parse() {
        resp.headers_mut().insert("x-amzn-errortype", v);
    }
    resp
}

fn frame(message: Message) -> Vec<u8> {
    let mut buf = Vec::new();
    // Only a frame over the format's limits fails to encode; none written here is.
    let _ = aws_smithy_eventstream::frame::write_message_to(&message, &mut buf);
    buf
}

fn event(kind: &str, payload: Value) -> Vec<u8> {
    frame(
        Message::new(Bytes::from(payload.to_string()))
            .add_header(Header::new(
                ":event-type",
                HeaderValue::String(kind.to_string().into()),
            ))
            .add_header(Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ))
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String("event".into()),
            )),
    )
}

fn exception(kind: &str, message: &str) -> Vec<u8> {
    frame(
        Message::new(Bytes::from(json!({"message": message}).to_string()))
            .add_header(Header::new(
                ":exception-type",
                HeaderValue::String(kind.to_string().into()),
            ))
            .add_header(Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ))
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String("exception".into()),
            )),
    )
}

fn stream(frames: Vec<Vec<u8>>, delay_ms: u64) -> Response {
    let s = futures_util::stream::unfold(frames.into_iter(), move |mut it| async move {
        let next = it.next()?;
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        Some((Ok::<Bytes, std::io::Error>(Bytes::from(next)), it))
    });
    Response::builder()
        .header("content-type", "application/vnd.amazon.eventstream")
        .body(Body::from_stream(s))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn frames_of(turn: &Turn) -> Vec<Vec<u8>> {
    let size = turn.chunk_size.unwrap_or(8);
    let mut out = vec![event("messageStart", json!({"role": "assistant"}))];
    let mut index = 0;
    if let Some(t) = &turn.thinking {
        for c in chunks(t, size) {
            out.push(event(
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"reasoningContent": {"text": c}}}),
            ));
        }
        out.push(event("contentBlockDelta", json!({"contentBlockIndex": index, "delta": {"reasoningContent": {"signature": "sig-scripted"}}})));
        out.push(event(
            "contentBlockStop",
            json!({"contentBlockIndex": index}),
        ));
        index += 1;
    }
    if let Some(t) = &turn.text {
        for (n, c) in chunks(t, size).into_iter().enumerate() {
            out.push(event(
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"text": c}}),
            ));
            if n == 0 {
                match turn.malformed.as_deref() {
                    Some("truncate") => {
                        let half = event(
                            "contentBlockDelta",
                            json!({"contentBlockIndex": index, "delta": {"text": "cut here"}}),
                        );
                        out.push(half[..half.len() / 2].to_vec());
                        return out;
                    }
                    Some("bad_crc") => {
                        let mut bad = event(
                            "contentBlockDelta",
                            json!({"contentBlockIndex": index, "delta": {"text": "garbled"}}),
                        );
                        if let Some(last) = bad.last_mut() {
                            *last ^= 0xff;
                        }
                        out.push(bad);
                        return out;
                    }
                    Some("unknown_event") => {
                        out.push(event("futureEvent", json!({"anything": true})));
                    }
                    Some("stream_error") => {
                        out.push(exception(
                            "throttlingException",
                            "Too many tokens, please wait before trying again.",
                        ));
                        return out;
                    }
                    Some("huge_frame") => {
                        // A prelude announcing 20 MiB (its CRC correct), then the bytes.
                        let total: u32 = 20 * 1024 * 1024;
                        let mut prelude = Vec::with_capacity(12);
                        prelude.extend_from_slice(&total.to_be_bytes());
                        prelude.extend_from_slice(&0u32.to_be_bytes());
                        let crc = crc32(&prelude);
                        prelude.extend_from_slice(&crc.to_be_bytes());
                        out.push(prelude);
                        for _ in 0..20 {
                            out.push(vec![b'x'; 1024 * 1024]);
                        }
                        return out;
                    }
                    _ => {}
                }
            }
        }
        out.push(event(
            "contentBlockStop",
            json!({"contentBlockIndex": index}),
        ));
        index += 1;
    }
    for call in &turn.tool_calls {
        out.push(event("contentBlockStart", json!({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": call.id, "name": call.name}}})));
        for c in chunks(&call.arguments.to_string(), size) {
            out.push(event(
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"toolUse": {"input": c}}}),
            ));
        }
        out.push(event(
            "contentBlockStop",
            json!({"contentBlockIndex": index}),
        ));
        index += 1;
    }
    let stop = match stop_of(turn).as_str() {
        "tool_use" => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    };
    out.push(event("messageStop", json!({"stopReason": stop})));
    let u = &turn.usage;
    out.push(event("metadata", json!({
        "usage": {"inputTokens": u.input, "outputTokens": u.output, "totalTokens": u.input + u.output,
                  "cacheReadInputTokens": u.cache_read, "cacheWriteInputTokens": u.cache_write},
        "metrics": {"latencyMs": 1}
    })));
    out
}

/// CRC-32 (IEEE), as the event-stream prelude uses.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

pub(crate) async fn converse_stream(
    State(s): State<ScriptedModel>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/model/{model}/converse-stream");
    let (_req, turn) = match begin(&s, &path, &headers, &body).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    stream(frames_of(&turn), turn.chunk_delay_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_decode_with_the_aws_crate_and_the_crc_is_ieee() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        let turn = Turn {
            text: Some("hello".into()),
            ..Default::default()
        };
        let frames = frames_of(&turn);
        let mut kinds = Vec::new();
        for f in frames {
            let mut b = Bytes::from(f);
            let m = aws_smithy_eventstream::frame::read_message_from(&mut b).unwrap();
            let kind = m
                .headers()
                .iter()
                .find(|h| h.name().as_str() == ":event-type")
                .and_then(|h| h.value().as_string().ok())
                .map(|s| s.as_str().to_string())
                .unwrap();
            kinds.push(kind);
        }
        assert_eq!(
            kinds,
            [
                "messageStart",
                "contentBlockDelta",
                "contentBlockStop",
                "messageStop",
                "metadata"
            ]
        );
    }
}
