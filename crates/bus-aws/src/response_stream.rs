//! A channel between two Lambdas is the callee's response stream (in AWS there is no engine
//! to hold the channel's two ends). The caller creates the channel itself, invokes the
//! function that writes to it with `InvokeWithResponseStream`, and the callee's runner answers
//! in streaming mode with one JSON object per line:
//!
//! ```text
//! {"frame": "<text frame>"}        as many as the callee writes, in order
//! {"binary": "<base64 frame>"}
//! {"result": …} | {"error": {…}}   last: the function's answer
//! ```
//!
//! The caller forwards the frames to its reader end as they arrive and returns the answer, so
//! token deltas reach the orchestrator while the model is still writing.

use super::AwsClients;
use super::registry::DynamoRegistry;
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvokeWithResponseStreamResponseEvent as Event;
use bus::channels::ChannelFrame;
use bus::protocol::{ErrorBody, codes};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The envelope field that asks a worker's runner for a streaming answer.
pub const RESPONSE_STREAM_FIELD: &str = "response_stream";

/// Longest line accepted from a response stream (a frame is a token delta or a partial
/// message; a final answer can be a whole assistant message).
pub const MAX_LINE_BYTES: usize = 8 << 20;

/// One frame as its line.
pub fn frame_line(frame: &ChannelFrame) -> String {
    use base64::Engine;
    let v = match frame {
        ChannelFrame::Text(t) => json!({ "frame": t }),
        ChannelFrame::Binary(b) => {
            json!({ "binary": base64::engine::general_purpose::STANDARD.encode(b) })
        }
    };
    format!("{v}\n")
}

/// The answer as the last line.
pub fn answer_line(answer: &Result<Value, ErrorBody>) -> String {
    let v = match answer {
        Ok(v) => json!({ "result": v }),
        Err(e) => json!({ "error": e }),
    };
    format!("{v}\n")
}

/// What one line says.
#[derive(Debug, PartialEq)]
pub enum Line {
    Frame(ChannelFrame),
    Answer(Result<Value, ErrorBody>),
}

/// Parse one line of a response stream; a line that is none of the three is an error that
/// names it.
pub fn parse_line(line: &[u8]) -> Result<Line, ErrorBody> {
    use base64::Engine;
    let bad = |why: String| ErrorBody::new(codes::INVALID_MESSAGE, why);
    let v: Value = serde_json::from_slice(line)
        .map_err(|e| bad(format!("a response stream line is not JSON: {e}")))?;
    if let Some(t) = v.get("frame") {
        let t = t
            .as_str()
            .ok_or_else(|| bad("`frame` is not a string".into()))?;
        return Ok(Line::Frame(ChannelFrame::Text(t.to_string())));
    }
    if let Some(b) = v.get("binary") {
        let b = b
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .ok_or_else(|| bad("`binary` is not base64".into()))?;
        return Ok(Line::Frame(ChannelFrame::Binary(b)));
    }
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        return Ok(Line::Answer(Err(serde_json::from_value(e.clone())
            .unwrap_or_else(|_| {
                ErrorBody::new(codes::INVOCATION_ERROR, e.to_string())
            }))));
    }
    if let Some(r) = v.get("result") {
        return Ok(Line::Answer(Ok(r.clone())));
    }
    let mut shown = v.to_string();
    shown.truncate(shown.floor_char_boundary(200));
    Err(bad(format!(
        "a response stream line is neither a frame nor an answer: {shown}"
    )))
}

/// Splits a byte stream into lines, refusing one longer than [`MAX_LINE_BYTES`].
#[derive(Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// Feed bytes; returns the complete lines (without their `\n`).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, ErrorBody> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        // One pass over what arrived; the consumed lines leave the buffer in one drain.
        let mut start = 0;
        while let Some(i) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let line = &self.buf[start..start + i];
            if !line.iter().all(u8::is_ascii_whitespace) {
                out.push(line.to_vec());
            }
            start += i + 1;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_LINE_BYTES {
            return Err(ErrorBody::new(
                codes::INVALID_MESSAGE,
                format!("a response stream line is over {MAX_LINE_BYTES} bytes"),
            ));
        }
        Ok(out)
    }

    /// What is left at the end (a last line without its newline).
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        let rest = std::mem::take(&mut self.buf);
        (!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest)
    }
}

/// Call `function_id` with `InvokeWithResponseStream`: its frames go to `frames` as they
/// arrive (dropped once the reader is gone), and its answer is returned. The frames' sender
/// is dropped at the end, which the reader sees as the channel closing.
pub async fn call_function_streaming(
    clients: &AwsClients,
    registry: &DynamoRegistry,
    function_id: &str,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
    frames: mpsc::Sender<ChannelFrame>,
) -> Result<Value, ErrorBody> {
    let record = crate::invoke::function_record(registry, function_id).await?;
    let lambda = crate::invoke::lambda_named(record.as_ref(), function_id)?;
    invoke_streaming(
        clients,
        &lambda,
        function_id,
        data,
        traceparent,
        baggage,
        frames,
    )
    .await
}

/// [`call_function_streaming`] to a Lambda named already.
pub async fn invoke_streaming(
    clients: &AwsClients,
    lambda: &str,
    function_id: &str,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
    frames: mpsc::Sender<ChannelFrame>,
) -> Result<Value, ErrorBody> {
    let mut envelope = crate::invoke::envelope(function_id, data, traceparent, baggage);
    envelope[RESPONSE_STREAM_FIELD] = json!(true);
    let failed = |what: String| ErrorBody::new(codes::INVOCATION_ERROR, what);
    let mut out = clients
        .lambda
        .invoke_with_response_stream()
        .function_name(lambda)
        .payload(Blob::new(serde_json::to_vec(&envelope).unwrap_or_default()))
        .send()
        .await
        .map_err(|e| {
            failed(format!(
                "invoke {lambda} (streaming): {}",
                super::err_text(&e)
            ))
        })?;
    let mut prelude = crate::lambda_stream::PreludeStripper::default();
    let mut lines = Lines::default();
    let mut frames = Some(frames);
    let mut answer: Option<Result<Value, ErrorBody>> = None;
    loop {
        let event = out.event_stream.recv().await.map_err(|e| {
            failed(format!(
                "{lambda}'s response stream: {}",
                super::err_text(&e)
            ))
        })?;
        let bytes = match event {
            None => break,
            Some(Event::PayloadChunk(chunk)) => {
                chunk.payload.map(|b| b.into_inner()).unwrap_or_default()
            }
            Some(Event::InvokeComplete(done)) => {
                if let Some(code) = done.error_code {
                    return Err(failed(format!(
                        "{lambda} failed ({code}): {}",
                        done.error_details.unwrap_or_default()
                    )));
                }
                break;
            }
            Some(_) => continue,
        };
        for line in lines.feed(&prelude.feed(&bytes))? {
            take_line(&line, &mut frames, &mut answer).await?;
        }
    }
    let tail = prelude.finish();
    let mut rest = lines.feed(&tail)?;
    rest.extend(lines.finish());
    for line in rest {
        take_line(&line, &mut frames, &mut answer).await?;
    }
    answer.unwrap_or_else(|| {
        Err(failed(format!(
            "{lambda}'s response stream ended without an answer"
        )))
    })
}

/// A frame goes to the reader (waiting for room: back-pressure; dropped once the reader is
/// gone); the answer is kept.
async fn take_line(
    line: &[u8],
    frames: &mut Option<mpsc::Sender<ChannelFrame>>,
    answer: &mut Option<Result<Value, ErrorBody>>,
) -> Result<(), ErrorBody> {
    match parse_line(line)? {
        Line::Frame(f) => {
            if let Some(tx) = frames.as_ref()
                && tx.send(f).await.is_err()
            {
                *frames = None;
            }
        }
        Line::Answer(a) => *answer = Some(a),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_hostile_ones_are_named() {
        let f = ChannelFrame::Text("tok".into());
        let b = ChannelFrame::Binary(vec![0, 1, 255]);
        let mut l = Lines::default();
        let mut got = l.feed(frame_line(&f).as_bytes()).unwrap();
        let split = frame_line(&b);
        got.extend(l.feed(&split.as_bytes()[..5]).unwrap());
        got.extend(l.feed(&split.as_bytes()[5..]).unwrap());
        got.extend(
            l.feed(answer_line(&Ok(json!({"n": 1}))).as_bytes())
                .unwrap(),
        );
        let parsed: Vec<Line> = got.iter().map(|x| parse_line(x).unwrap()).collect();
        assert_eq!(
            parsed,
            vec![
                Line::Frame(f),
                Line::Frame(b),
                Line::Answer(Ok(json!({"n": 1})))
            ]
        );
        let err = ErrorBody::new("denied", "no");
        assert_eq!(
            parse_line(answer_line(&Err(err.clone())).trim_end().as_bytes()).unwrap(),
            Line::Answer(Err(err))
        );
        for bad in [
            &b"not json"[..],
            br#"{"frame": 5}"#,
            br#"{"binary": "%%"}"#,
            br#"{"x": 1}"#,
        ] {
            let e = parse_line(bad).unwrap_err();
            assert_eq!(e.code, codes::INVALID_MESSAGE, "{e:?}");
        }
        let mut l = Lines::default();
        let e = l.feed(&vec![b'x'; MAX_LINE_BYTES + 1]).unwrap_err();
        assert!(e.message.contains("over"), "{e:?}");
    }
}
