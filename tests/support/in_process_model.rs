//! A provider transport to the scripted model in this process (`provider_core::Transport`):
//! the request goes to the model's router with no socket, HTTP framing or connection task
//! on either side. The dialect builds the same request and reads the same SSE answer as
//! over the network. Shared by `tests/providers.rs` and `benches/turn.rs`
//! (`BENCH_MODEL=in-process`, the peers' fake models also answer in process).

pub struct InProcessModel(pub axum::Router);

#[async_trait::async_trait]
impl provider_core::Transport for InProcessModel {
    async fn execute(&self, request: reqwest::Request) -> Result<reqwest::Response, String> {
        use tower_service::Service;
        let mut to_model = http::Request::builder()
            .method(request.method().clone())
            .uri(request.url().path());
        for (name, value) in request.headers() {
            to_model = to_model.header(name, value);
        }
        let body = request
            .body()
            .and_then(reqwest::Body::as_bytes)
            .map(bytes::Bytes::copy_from_slice)
            .unwrap_or_default();
        let to_model = to_model
            .body(axum::body::Body::from(body))
            .map_err(|e| e.to_string())?;
        let Ok(answer) = self.0.clone().call(to_model).await;
        let (parts, body) = answer.into_parts();
        let body = reqwest::Body::wrap_stream(body.into_data_stream());
        Ok(reqwest::Response::from(http::Response::from_parts(
            parts, body,
        )))
    }
}
