//! Following a session's `agent::events` over the HTTP edge (the SSE endpoint and the
//! standard doors): a connection of the caller's subscribed to the session's group before the
//! turn is started or resumed, so no event is missed; dropping it disconnects.

use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::mpsc;

use super::{ApiError, Caller, HttpState, sse::EVENTS_STREAM};
use crate::engine::{Engine, Outbound, Outbox};
use crate::protocol::Message;

pub struct Following {
    engine: Arc<Engine>,
    worker_id: String,
    pushes: mpsc::UnboundedReceiver<Outbound>,
    outbox: Outbox,
}

impl Following {
    /// Subscribe as `caller` to session `sid`'s events. `connection` and `name` are how the
    /// subscription shows in `engine::workers::list` (an operator tells it from a worker).
    pub async fn start(
        state: &HttpState,
        caller: &Caller,
        sid: &str,
        connection: &str,
        name: String,
    ) -> Result<Self, ApiError> {
        let engine = state.engine.clone();
        let (outbox, pushes) = Outbox::bounded(state.max_queued_bytes);
        let worker_id = engine.connect_remote(
            outbox.clone(),
            Some(connection.into()),
            caller.principal.clone(),
        );
        engine.set_worker_info(&worker_id, Some(name), Value::Null);
        let following = Self {
            engine,
            worker_id,
            pushes,
            outbox,
        };
        following
            .engine
            .stream_subscribe(&following.worker_id, EVENTS_STREAM, Some(sid))?;
        Ok(following)
    }

    /// The next item pushed to the subscription: `(item_id, event_type, data)` (`item_id` is
    /// empty for a pushed, unstored event). `None` when the subscription ended (its queue
    /// overflowed, or the engine closed it).
    pub async fn next_item(&mut self) -> Option<(String, String, Value)> {
        loop {
            let Outbound::Text(text) = self.pushes.recv().await? else {
                return None;
            };
            self.outbox.written(text.len());
            if let Ok(Message::StreamEvent { item_id, event, .. }) = crate::protocol::parse(&text) {
                return Some((item_id, event.event_type, event.data));
            }
        }
    }

    /// The next event's data, with its `type` (what the doors read).
    pub async fn next(&mut self) -> Option<Value> {
        let (_, event_type, mut data) = self.next_item().await?;
        if data.get("type").is_none() {
            data["type"] = json!(event_type);
        }
        Some(data)
    }

    /// Resolves once the subscription's queue went over its limit (the reader fell behind);
    /// made once, beside the reads.
    pub fn overflowed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let outbox = self.outbox.clone();
        async move { outbox.overflowed().await }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.engine.disconnect(&self.worker_id);
    }
}
