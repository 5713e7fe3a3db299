//! A Lambda Function URL, emulated on this machine (the Slack webhook's endpoint in the
//! deployed shape): every HTTP request becomes an `APIGatewayProxyRequest` payload-2.0 event
//! for the function, and its answer the HTTP response, as Lambda maps them:
//!
//! - a text body (`text/*`, JSON, XML, JavaScript, form-encoded) passes as it is, any other is
//!   base64 with `isBase64Encoded: true`; repeated headers are joined with commas, cookies go
//!   to `cookies`; bodies over 6 MB are refused (413);
//! - an answer with `statusCode` gives the status, `headers`, `cookies` (as `Set-Cookie`) and
//!   `body` (decoded when `isBase64Encoded`); any other answer is returned as JSON with 200;
//!   a failed invocation is `502`.

use crate::apigw_ws::RouteTarget;
use crate::lambda_host::Answer;
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::net::SocketAddr;
use std::sync::Arc;

/// Most a request body may hold (Lambda's synchronous payload limit).
pub const MAX_BODY_BYTES: usize = 6 << 20;

struct Url {
    target: Arc<dyn RouteTarget>,
    url_id: String,
    /// `InvokeMode: RESPONSE_STREAM`: the answer is passed on as the function writes it.
    streams: bool,
}

/// Serve `target` as a Function URL on `listener` → its base URL. `streams`: the URL's
/// `InvokeMode` is `RESPONSE_STREAM` (else `BUFFERED`).
pub fn serve(
    target: Arc<dyn RouteTarget>,
    listener: tokio::net::TcpListener,
    streams: bool,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    let url = format!("http://{}", listener.local_addr()?);
    let state = Arc::new(Url {
        target,
        url_id: bus_telemetry::trace::random_hex(16),
        streams,
    });
    let app = Router::new().fallback(handle).with_state(state);
    let task = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    Ok((url, task))
}

fn is_text(content_type: &str) -> bool {
    let ct = content_type.to_ascii_lowercase();
    ct.starts_with("text/")
        || [
            "application/json",
            "application/xml",
            "application/javascript",
            "application/x-www-form-urlencoded",
        ]
        .iter()
        .any(|t| ct.starts_with(t))
        || ct.ends_with("+json")
        || ct.ends_with("+xml")
}

/// The payload-2.0 event for one request.
pub fn event(
    url_id: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    source_ip: &str,
    body: &[u8],
) -> Value {
    use base64::Engine;
    let mut joined: Map<String, Value> = Map::new();
    let mut cookies: Vec<Value> = Vec::new();
    for (k, v) in headers {
        let v = v.to_str().unwrap_or("");
        if k == "cookie" {
            cookies.extend(v.split(';').map(|c| json!(c.trim())).filter(|c| c != ""));
            continue;
        }
        match joined.get_mut(k.as_str()) {
            Some(Value::String(s)) => {
                s.push(',');
                s.push_str(v);
            }
            _ => {
                joined.insert(k.as_str().to_string(), json!(v));
            }
        }
    }
    let query = uri.query().unwrap_or("");
    let mut params: Map<String, Value> = Map::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match params.get_mut(k.as_ref()) {
            Some(Value::String(s)) => {
                s.push(',');
                s.push_str(&v);
            }
            _ => {
                params.insert(k.to_string(), json!(v));
            }
        }
    }
    let text = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_text);
    let (body, encoded) = if body.is_empty() {
        (Value::Null, false)
    } else if text && std::str::from_utf8(body).is_ok() {
        (json!(String::from_utf8_lossy(body)), false)
    } else {
        (
            json!(base64::engine::general_purpose::STANDARD.encode(body)),
            true,
        )
    };
    let now = bus_telemetry::trace::now_ms();
    let mut e = json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": uri.path(),
        "rawQueryString": query,
        "headers": joined,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": url_id,
            "domainName": format!("{url_id}.lambda-url.{}.on.aws", bus::events::REGION),
            "domainPrefix": url_id,
            "http": {
                "method": method.as_str(),
                "path": uri.path(),
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or(""),
            },
            "requestId": uuid::Uuid::new_v4().to_string(),
            "routeKey": "$default",
            "stage": "$default",
            "timeEpoch": now,
        },
        "isBase64Encoded": encoded,
    });
    if !cookies.is_empty() {
        e["cookies"] = Value::Array(cookies);
    }
    if !params.is_empty() {
        e["queryStringParameters"] = Value::Object(params);
    }
    if !body.is_null() {
        e["body"] = body;
    }
    e
}

/// The function's answer → the HTTP response.
pub fn response_of(answer: &Value) -> Response {
    use base64::Engine;
    let Some(status) = answer.get("statusCode").and_then(Value::as_u64) else {
        // Not the response shape: the answer itself is the JSON body.
        let mut r = (StatusCode::OK, answer.to_string()).into_response();
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        return r;
    };
    let status = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let body = match answer.get("body") {
        Some(Value::String(s)) if answer["isBase64Encoded"] == true => {
            match base64::engine::general_purpose::STANDARD.decode(s) {
                Ok(b) => b,
                Err(_) => {
                    return (StatusCode::BAD_GATEWAY, "the function's body is not base64")
                        .into_response();
                }
            }
        }
        Some(Value::String(s)) => s.clone().into_bytes(),
        Some(Value::Null) | None => Vec::new(),
        Some(other) => other.to_string().into_bytes(),
    };
    let mut r = (status, body).into_response();
    set_headers(&mut r, answer);
    r
}

/// An answer's (or a prelude's) `headers` and `cookies` (as `Set-Cookie`) on the response.
fn set_headers(r: &mut Response, answer: &Value) {
    if let Some(h) = answer.get("headers").and_then(Value::as_object) {
        for (k, v) in h {
            if let (Ok(name), Some(Ok(value))) = (
                k.parse::<axum::http::HeaderName>(),
                v.as_str().map(HeaderValue::from_str),
            ) {
                r.headers_mut().insert(name, value);
            }
        }
    }
    if let Some(c) = answer.get("cookies").and_then(Value::as_array) {
        for v in c.iter().filter_map(Value::as_str) {
            if let Ok(v) = HeaderValue::from_str(v) {
                r.headers_mut().append("set-cookie", v);
            }
        }
    }
}

/// A streamed answer → the response: its HTTP prelude (`{statusCode, headers, cookies}` and
/// eight NUL bytes) gives the status and headers, and the rest is the body, passed on as it
/// comes. A stream without a prelude is a 200 `application/octet-stream` body, as Lambda
/// serves it; a failure before the prelude ends is a 502, after it the body breaks off.
pub async fn streamed_response(
    mut pieces: tokio::sync::mpsc::Receiver<bus_aws::lambda_stream::StreamPiece>,
) -> Response {
    let mut strip = bus_aws::lambda_stream::PreludeStripper::default();
    let mut rest: Vec<u8> = Vec::new();
    while !strip.decided() {
        match pieces.recv().await {
            Some(Ok(chunk)) => rest.extend_from_slice(&strip.feed(&chunk)),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "Function URL stream failed before its prelude");
                return (
                    StatusCode::BAD_GATEWAY,
                    axum::Json(json!({"Message": "Internal Server Error"})),
                )
                    .into_response();
            }
            None => rest.extend(strip.finish()),
        }
    }
    let prelude: Option<Value> = strip.prelude().and_then(|p| serde_json::from_slice(p).ok());
    let first = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(rest))]);
    let more = futures_util::stream::unfold(pieces, |mut pieces| async move {
        let piece = pieces.recv().await?;
        Some((piece.map_err(std::io::Error::other), pieces))
    });
    let body = axum::body::Body::from_stream(futures_util::StreamExt::chain(first, more));
    let mut r = Response::new(body);
    let Some(prelude) = prelude else {
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        return r;
    };
    *r.status_mut() = prelude["statusCode"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    set_headers(&mut r, &prelude);
    r
}

async fn handle(
    State(url): State<Arc<Url>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(json!({"Message": format!("Request must be smaller than {MAX_BODY_BYTES} bytes for the InvokeFunction operation")})),
            )
                .into_response();
        }
    };
    let e = event(
        &url.url_id,
        &method,
        &uri,
        &headers,
        &peer.ip().to_string(),
        &body,
    );
    let answer = if url.streams {
        url.target.invoke_streaming(&e).await
    } else {
        url.target.invoke(&e).await.map(Answer::Json)
    };
    match answer {
        Ok(Answer::Json(answer)) => response_of(&answer),
        Ok(Answer::Stream(pieces)) => streamed_response(pieces).await,
        Err(err) => {
            tracing::warn!(error = %err, "Function URL invocation failed");
            (
                StatusCode::BAD_GATEWAY,
                axum::Json(json!({"Message": "Internal Server Error"})),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_map_as_lambda_maps_them() {
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            "application/x-www-form-urlencoded".parse().unwrap(),
        );
        h.append("x-multi", "a".parse().unwrap());
        h.append("x-multi", "b".parse().unwrap());
        h.insert("cookie", "s=1; t=2".parse().unwrap());
        let uri: Uri = "/slack/commands?x=1&x=2".parse().unwrap();
        let e = event(
            "u1",
            &Method::POST,
            &uri,
            &h,
            "127.0.0.1",
            b"text=approve+c1",
        );
        assert_eq!(e["rawPath"], "/slack/commands");
        assert_eq!(e["requestContext"]["http"]["method"], "POST");
        assert_eq!(e["headers"]["x-multi"], "a,b");
        assert_eq!(e["cookies"], json!(["s=1", "t=2"]));
        assert_eq!(e["queryStringParameters"]["x"], "1,2");
        assert_eq!(
            (&e["body"], &e["isBase64Encoded"]),
            (&json!("text=approve+c1"), &json!(false))
        );
        let bin = event(
            "u1",
            &Method::POST,
            &uri,
            &HeaderMap::new(),
            "::1",
            &[0, 159, 146],
        );
        assert_eq!(bin["isBase64Encoded"], true);
        assert_eq!(bin["body"], "AJ+S");

        let r = response_of(
            &json!({"statusCode": 401, "headers": {"content-type": "application/json"}, "body": "{}", "cookies": ["a=1"]}),
        );
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["set-cookie"], "a=1");
        let r = response_of(&json!({"ok": true}));
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/json");
        let r = response_of(&json!({"statusCode": 200, "body": "%%", "isBase64Encoded": true}));
        assert_eq!(r.status(), 502);
    }

    /// A streamed answer: the prelude gives status, headers and cookies and the rest is the
    /// body; without a prelude the bytes are the body; a failure before the prelude is 502.
    #[tokio::test]
    async fn streamed_answers_map_as_lambda_maps_them() {
        use crate::lambda_host::LambdaError;
        let feed = |pieces: Vec<bus_aws::lambda_stream::StreamPiece>| {
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            for p in pieces {
                tx.try_send(p).unwrap();
            }
            rx
        };
        let body = |r: Response| async move {
            axum::body::to_bytes(r.into_body(), 1 << 20)
                .await
                .map(|b| b.to_vec())
        };
        let prelude = br#"{"statusCode":409,"headers":{"content-type":"text/event-stream"},"cookies":["a=1"]}"#;
        let mut first = prelude[..20].to_vec();
        let mut rest = prelude[20..].to_vec();
        rest.extend_from_slice(&[0u8; 8]);
        rest.extend_from_slice(b"data: 1\n\n");
        first.truncate(20);
        let r = streamed_response(feed(vec![
            Ok(first.into()),
            Ok(rest.into()),
            Ok(bytes::Bytes::from_static(b"data: 2\n\n")),
        ]))
        .await;
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        assert_eq!(r.headers()["set-cookie"], "a=1");
        assert_eq!(body(r).await.unwrap(), b"data: 1\n\ndata: 2\n\n");

        let r = streamed_response(feed(vec![Ok(bytes::Bytes::from_static(b"plain"))])).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/octet-stream");
        assert_eq!(body(r).await.unwrap(), b"plain");

        let r = streamed_response(feed(vec![Err(LambdaError::Crashed("gone".into()))])).await;
        assert_eq!(r.status(), 502);
        // After the prelude a failure breaks the body off.
        let mut head = br#"{"statusCode":200}"#.to_vec();
        head.extend_from_slice(&[0u8; 8]);
        let r = streamed_response(feed(vec![
            Ok(head.into()),
            Err(LambdaError::Crashed("gone".into())),
        ]))
        .await;
        assert_eq!(r.status(), 200);
        assert!(body(r).await.is_err());
    }
}
