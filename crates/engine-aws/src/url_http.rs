//! A Function URL's payload-2.0 event as an HTTP request, and an HTTP response as the
//! Function URL's streamed answer (a JSON prelude of status, headers and cookies, then the
//! body as it is written): how the doors Lambda serves the same axum routes as the engine's
//! port.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, header};
use serde_json::Value;

/// Most a request body may hold (Lambda's synchronous payload limit).
const MAX_BODY_BYTES: usize = 6 << 20;

/// Why an event is not a Function URL request.
#[derive(Debug, thiserror::Error)]
pub enum BadEvent {
    #[error("not a Function URL event: `{0}` is missing")]
    Missing(&'static str),
    #[error("the Function URL event's `{0}` is invalid: {1}")]
    Invalid(&'static str, String),
}

/// The request a Function URL event carries.
pub fn request_of(event: &Value) -> Result<Request<Body>, BadEvent> {
    use base64::Engine;
    let method = event
        .pointer("/requestContext/http/method")
        .and_then(Value::as_str)
        .ok_or(BadEvent::Missing("requestContext.http.method"))?;
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|e| BadEvent::Invalid("requestContext.http.method", e.to_string()))?;
    let path = event["rawPath"]
        .as_str()
        .ok_or(BadEvent::Missing("rawPath"))?;
    let query = event["rawQueryString"].as_str().unwrap_or("");
    let uri = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    let mut builder = Request::builder().method(method).uri(&uri);
    let headers = builder
        .headers_mut()
        .ok_or_else(|| BadEvent::Invalid("rawPath", uri.clone()))?;
    for (name, value) in event["headers"].as_object().into_iter().flatten() {
        let (Ok(name), Some(Ok(value))) = (
            HeaderName::from_bytes(name.as_bytes()),
            value.as_str().map(HeaderValue::from_str),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let cookies: Vec<&str> = event["cookies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !cookies.is_empty()
        && let Ok(v) = HeaderValue::from_str(&cookies.join("; "))
    {
        headers.insert(header::COOKIE, v);
    }
    let body = match &event["body"] {
        Value::String(b) if event["isBase64Encoded"] == true => {
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| BadEvent::Invalid("body", e.to_string()))?
        }
        Value::String(b) => b.clone().into_bytes(),
        _ => Vec::new(),
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(BadEvent::Invalid(
            "body",
            format!("over {MAX_BODY_BYTES} bytes"),
        ));
    }
    builder
        .body(Body::from(body))
        .map_err(|e| BadEvent::Invalid("rawPath", e.to_string()))
}

/// The prelude of a streamed answer: the response's status, headers and cookies.
pub fn prelude_of<B>(response: &Response<B>) -> lambda_runtime::MetadataPrelude {
    let mut headers = response.headers().clone();
    let cookies = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    headers.remove(header::SET_COOKIE);
    // The connection is the Function URL's, not this function's to close.
    headers.remove(header::CONNECTION);
    lambda_runtime::MetadataPrelude {
        status_code: response.status(),
        headers,
        cookies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, Uri};

    /// The emulated Function URL's events (`aws_local::function_url::event`, which follows
    /// Lambda's mapping) come back as the requests they were made from.
    #[tokio::test]
    async fn function_url_events_read_back_as_their_requests() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("authorization", "Bearer t0k".parse().unwrap());
        h.append("x-multi", "a".parse().unwrap());
        h.append("x-multi", "b".parse().unwrap());
        h.insert("cookie", "s=1; t=2".parse().unwrap());
        let uri: Uri = "/v1/chat/completions?x=1".parse().unwrap();
        let e = aws_local::function_url::event(
            "u1",
            &Method::POST,
            &uri,
            &h,
            "127.0.0.1",
            br#"{"a":1}"#,
        );
        let r = request_of(&e).unwrap();
        assert_eq!(r.method(), Method::POST);
        assert_eq!(r.uri(), "/v1/chat/completions?x=1");
        assert_eq!(r.headers()["authorization"], "Bearer t0k");
        assert_eq!(r.headers()["x-multi"], "a,b");
        assert_eq!(r.headers()["cookie"], "s=1; t=2");
        let body = axum::body::to_bytes(r.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], br#"{"a":1}"#);

        let bin = aws_local::function_url::event(
            "u1",
            &Method::PUT,
            &"/x".parse().unwrap(),
            &HeaderMap::new(),
            "::1",
            &[0, 159, 146],
        );
        let body = axum::body::to_bytes(request_of(&bin).unwrap().into_body(), 16)
            .await
            .unwrap();
        assert_eq!(&body[..], &[0, 159, 146]);
    }

    #[test]
    fn other_events_are_refused_naming_what_is_wrong() {
        let e = request_of(&serde_json::json!({"Records": []})).unwrap_err();
        assert!(e.to_string().contains("requestContext.http.method"), "{e}");
        let e = request_of(
            &serde_json::json!({"rawPath": "/", "requestContext": {"http": {"method": "G T"}}}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("method"), "{e}");
        let e = request_of(&serde_json::json!({"rawPath": "/", "requestContext": {"http": {"method": "POST"}}, "body": "%%", "isBase64Encoded": true}))
            .unwrap_err();
        assert!(e.to_string().contains("body"), "{e}");
    }

    #[test]
    fn the_prelude_carries_status_headers_and_cookies() {
        let r = Response::builder()
            .status(409)
            .header("content-type", "text/event-stream")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
            .header("connection", "close")
            .body(())
            .unwrap();
        let p = prelude_of(&r);
        assert_eq!(p.status_code, 409);
        assert_eq!(p.headers["content-type"], "text/event-stream");
        assert_eq!(p.cookies, vec!["a=1", "b=2"]);
        assert!(p.headers.get("set-cookie").is_none() && p.headers.get("connection").is_none());
    }
}
