//! Following a session's `agent::events` over the HTTP edge (the SSE endpoint and the
//! standard doors). On the engine's port it is a connection of the caller's subscribed to the
//! session's group before the turn is started or resumed, so no event is missed; in the doors
//! Lambda it is the caller's own WebSocket to the API Gateway (`bus_aws::doors`). Dropping
//! it disconnects.

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

use super::{ApiError, Caller, sse::EVENTS_STREAM};
use bus::engine::{Engine, Outbound, Outbox};
use bus::protocol::Message;

/// One pushed item: `(item_id, event_type, data)`.
pub type Pushed = (String, String, Value);

/// A pushed `streamevent` frame → its item (anything else: `None`).
pub fn pushed_item(text: &str) -> Option<Pushed> {
    match bus::protocol::parse(text) {
        Ok(Message::StreamEvent { item_id, event, .. }) => {
            Some((item_id, event.event_type, event.data))
        }
        _ => None,
    }
}

pub struct Following {
    source: Source,
}

enum Source {
    Engine {
        engine: Arc<Engine>,
        worker_id: String,
        pushes: mpsc::UnboundedReceiver<Outbound>,
        outbox: Outbox,
    },
    /// Items read elsewhere (a WebSocket's pushes); `overflow` turns true when its reader
    /// fell behind; `_link` holds what ends with the follower (the connection).
    Relayed {
        items: mpsc::Receiver<Pushed>,
        overflow: watch::Receiver<bool>,
        _link: Box<dyn Send + Sync>,
    },
}

impl Following {
    /// Subscribe as `caller` to session `sid`'s events on `engine`. `connection` and `name`
    /// are how the subscription shows in `engine::workers::list` (an operator tells it from a
    /// worker).
    pub fn start(
        engine: &Arc<Engine>,
        max_queued_bytes: usize,
        caller: &Caller,
        sid: &str,
        connection: &str,
        name: String,
    ) -> Result<Self, ApiError> {
        let (outbox, pushes) = Outbox::bounded(max_queued_bytes);
        let worker_id = engine.connect_remote(
            outbox.clone(),
            Some(connection.into()),
            caller.principal.clone(),
        );
        engine.set_worker_info(&worker_id, Some(name), Value::Null);
        let following = Self {
            source: Source::Engine {
                engine: engine.clone(),
                worker_id: worker_id.clone(),
                pushes,
                outbox,
            },
        };
        engine.stream_subscribe(&worker_id, EVENTS_STREAM, Some(sid))?;
        Ok(following)
    }

    /// Items another reader relays; `link` is dropped with the follower.
    pub fn relayed(
        items: mpsc::Receiver<Pushed>,
        overflow: watch::Receiver<bool>,
        link: Box<dyn Send + Sync>,
    ) -> Self {
        Self {
            source: Source::Relayed {
                items,
                overflow,
                _link: link,
            },
        }
    }

    /// The next item pushed to the subscription: `(item_id, event_type, data)` (`item_id` is
    /// empty for a pushed, unstored event). `None` when the subscription ended (its queue
    /// overflowed, or the engine closed it).
    pub async fn next_item(&mut self) -> Option<Pushed> {
        match &mut self.source {
            Source::Engine { pushes, outbox, .. } => loop {
                let Outbound::Text(text) = pushes.recv().await? else {
                    return None;
                };
                outbox.written(text.len());
                if let Some(item) = pushed_item(&text) {
                    return Some(item);
                }
            },
            Source::Relayed { items, .. } => items.recv().await,
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
    pub fn overflowed(&self) -> BoxFuture<'static, ()> {
        match &self.source {
            Source::Engine { outbox, .. } => {
                let outbox = outbox.clone();
                Box::pin(async move { outbox.overflowed().await })
            }
            Source::Relayed { overflow, .. } => {
                let mut overflow = overflow.clone();
                Box::pin(async move {
                    // A closed sender without an overflow never resolves: the items end instead.
                    if overflow.wait_for(|o| *o).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                })
            }
        }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        if let Source::Engine {
            engine, worker_id, ..
        } = &self.source
        {
            engine.disconnect(worker_id);
        }
    }
}
