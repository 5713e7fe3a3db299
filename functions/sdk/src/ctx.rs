//! `Ctx`: what a handler holds to talk to the bus. Every call it makes carries the handler's
//! span as parent and the baggage it received, so a chain of calls is one trace.

use ::bus::channels::ChannelRef;
use bus_telemetry::trace::{ATTR_MESSAGE_ID, ATTR_SESSION_ID, TraceContext};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

use crate::bus::{Bus, EnqueueOptions};
use crate::channel::{ChannelReader, ChannelWriter};
use crate::error::BusError;

pub struct Ctx {
    bus: Arc<dyn Bus>,
    trace: TraceContext,
    function_id: Arc<str>,
    /// What the caller handed this call unserialized (only to a function registered with
    /// [`crate::Worker::accept_attachments`], only in process).
    attachment: Option<bus::Attachment>,
}

/// A clone is for the calls a handler makes, so it leaves the attachment behind: what the
/// caller shared is released when the handler is done with it, not when the last task it
/// spawned is.
impl Clone for Ctx {
    fn clone(&self) -> Self {
        Self {
            bus: self.bus.clone(),
            trace: self.trace.clone(),
            function_id: self.function_id.clone(),
            attachment: None,
        }
    }
}

impl Ctx {
    pub fn new(bus: Arc<dyn Bus>, trace: TraceContext, function_id: &str) -> Self {
        Self {
            bus,
            trace,
            function_id: function_id.into(),
            attachment: None,
        }
    }

    pub(crate) fn with_attachment(mut self, attachment: Option<bus::Attachment>) -> Self {
        self.attachment = attachment;
        self
    }

    /// The part of the payload the caller handed over as it is, when it is a `T` (see
    /// [`bus::Attachment`]).
    pub fn attachment<T: std::any::Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.attachment.as_ref()?.get::<T>()
    }

    /// A context outside any handler (a program or test driving the bus): a new trace.
    pub fn root(bus: Arc<dyn Bus>) -> Self {
        Self::new(bus, TraceContext::new_root(), "")
    }

    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }
    pub fn trace(&self) -> &TraceContext {
        &self.trace
    }
    pub fn function_id(&self) -> &str {
        &self.function_id
    }
    pub fn session_id(&self) -> Option<&str> {
        self.trace.baggage_get(ATTR_SESSION_ID)
    }
    pub fn message_id(&self) -> Option<&str> {
        self.trace.baggage_get(ATTR_MESSAGE_ID)
    }

    /// The same call at another position in its trace.
    pub(crate) fn at(&self, trace: TraceContext) -> Ctx {
        Ctx {
            bus: self.bus.clone(),
            trace,
            function_id: self.function_id.clone(),
            attachment: None,
        }
    }

    /// The same context with one more baggage entry (travels to every downstream call).
    pub fn with_baggage(&self, key: &str, value: &str) -> Ctx {
        self.at(self.trace.clone().with_baggage(key, value))
    }

    pub async fn trigger(&self, function_id: &str, payload: Value) -> Result<Value, BusError> {
        self.bus.call(function_id, payload, &self.trace, None).await
    }

    /// The engine's `catalogue_version` (asked with a page of one function): it moves whenever
    /// a function is registered or removed or a worker is named. `None` where the engine gives
    /// none (the deployed catalogue) or cannot be asked.
    pub async fn catalogue_version(&self) -> Option<String> {
        self.trigger(
            "engine::functions::list",
            serde_json::json!({"formats": false, "limit": 1}),
        )
        .await
        .ok()
        .and_then(|page| page["catalogue_version"].as_str().map(str::to_owned))
    }

    /// Every registered function (`engine::functions::list`, page after page); `formats`:
    /// with their request and response schemas.
    pub async fn functions(&self, formats: bool) -> Result<Vec<Value>, BusError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        // A registry of a million functions would be 1 000 pages: stop well before.
        for _ in 0..1000 {
            let mut page = self
                .trigger(
                    "engine::functions::list",
                    serde_json::json!({"formats": formats, "after": after}),
                )
                .await?;
            if let Some(fs) = page["functions"].as_array_mut() {
                out.append(fs);
            }
            match page["next"].as_str() {
                Some(n) if after.as_deref() != Some(n) => after = Some(n.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }

    pub async fn trigger_timeout(
        &self,
        function_id: &str,
        payload: Value,
        timeout: Duration,
    ) -> Result<Value, BusError> {
        self.bus
            .call(function_id, payload, &self.trace, Some(timeout))
            .await
    }

    /// [`Self::trigger_timeout`] with part of the payload beside it: a handler in this
    /// process that accepts attachments gets it as it is, any other gets it written into
    /// `payload` (see [`bus::Attachment`]).
    pub async fn trigger_attached(
        &self,
        function_id: &str,
        payload: Value,
        attachment: bus::Attachment,
        timeout: Duration,
    ) -> Result<Value, BusError> {
        self.bus
            .call_attached(function_id, payload, attachment, &self.trace, Some(timeout))
            .await
    }

    pub async fn trigger_void(&self, function_id: &str, payload: Value) -> Result<(), BusError> {
        self.bus.call_void(function_id, payload, &self.trace).await
    }

    pub async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        payload: Value,
    ) -> Result<String, BusError> {
        self.bus
            .enqueue(
                queue,
                function_id,
                payload,
                &self.trace,
                EnqueueOptions::default(),
            )
            .await
    }

    pub async fn enqueue_with(
        &self,
        queue: &str,
        function_id: &str,
        payload: Value,
        opts: EnqueueOptions,
    ) -> Result<String, BusError> {
        self.bus
            .enqueue(queue, function_id, payload, &self.trace, opts)
            .await
    }

    // ---- state helpers (the engine's state::* functions)

    pub async fn state_get(&self, scope: &str, key: &str) -> Result<Value, BusError> {
        self.trigger("state::get", json!({"scope": scope, "key": key}))
            .await
    }

    /// `{value, version}` or null.
    pub async fn state_get_versioned(&self, scope: &str, key: &str) -> Result<Value, BusError> {
        self.trigger("state::get_versioned", json!({"scope": scope, "key": key}))
            .await
    }

    pub async fn state_set(&self, scope: &str, key: &str, value: Value) -> Result<Value, BusError> {
        self.trigger(
            "state::set",
            fields([
                ("scope", scope.into()),
                ("key", key.into()),
                ("value", value),
            ]),
        )
        .await
    }

    /// Conditional write: fails with `version_conflict` unless the record is at `expected`
    /// (0 = only if absent).
    pub async fn state_set_if(
        &self,
        scope: &str,
        key: &str,
        value: Value,
        expected: u64,
    ) -> Result<Value, BusError> {
        self.trigger(
            "state::set",
            fields([
                ("scope", scope.into()),
                ("key", key.into()),
                ("value", value),
                ("expected_version", expected.into()),
            ]),
        )
        .await
    }

    /// Return once every write committed before it is durable, deferred ones too
    /// (`state::sync`).
    pub async fn state_sync(&self) -> Result<Value, BusError> {
        self.trigger("state::sync", Value::Object(Default::default()))
            .await
    }

    /// Writes and stream items that commit together or not at all (`state::transact`);
    /// stream items as `(stream_name, group_id, item_id, data)`. → `{versions, stream_items}`;
    /// a conflict on any write answers `version_conflict` and nothing is written.
    pub async fn state_commit(
        &self,
        writes: Vec<::bus::state::TxWrite>,
        stream_items: Vec<(String, String, String, Value)>,
    ) -> Result<Value, BusError> {
        let writes: Vec<Value> = writes
            .into_iter()
            .map(|w| {
                let mut o = fields([
                    ("scope", w.scope.into()),
                    ("key", w.key.into()),
                    ("value", w.value),
                ]);
                if let Some(v) = w.expected_version {
                    o["expected_version"] = v.into();
                }
                if let Some(v) = w.expected_value {
                    o["expected_value"] = v;
                }
                o
            })
            .collect();
        let items: Vec<Value> = stream_items.into_iter().map(stream_item).collect();
        self.trigger(
            "state::transact",
            fields([
                ("writes", Value::Array(writes)),
                ("stream_items", Value::Array(items)),
            ]),
        )
        .await
    }

    pub async fn state_update(
        &self,
        scope: &str,
        key: &str,
        ops: Value,
    ) -> Result<Value, BusError> {
        self.trigger(
            "state::update",
            fields([("scope", scope.into()), ("key", key.into()), ("ops", ops)]),
        )
        .await
    }

    pub async fn state_delete(&self, scope: &str, key: &str) -> Result<Value, BusError> {
        self.trigger("state::delete", json!({"scope": scope, "key": key}))
            .await
    }

    /// Every record of a scope, `{items}`, following `state::list`'s pages.
    pub async fn state_list(&self, scope: &str, prefix: Option<&str>) -> Result<Value, BusError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut page = self
                .state_list_page(scope, prefix, cursor.as_deref(), None)
                .await?;
            if let Some(Value::Array(more)) = page.get_mut("items").map(Value::take) {
                items.extend(more);
            }
            match page["next_cursor"].as_str() {
                Some(next) if cursor.as_deref() != Some(next) => cursor = Some(next.to_string()),
                _ => return Ok(fields([("items", Value::Array(items))])),
            }
        }
    }

    /// One page of `state::list`: `{items, next_cursor}` (null on the last page).
    pub async fn state_list_page(
        &self,
        scope: &str,
        prefix: Option<&str>,
        cursor: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Value, BusError> {
        self.trigger(
            "state::list",
            json!({"scope": scope, "prefix": prefix, "cursor": cursor, "limit": limit}),
        )
        .await
    }

    // ---- streams

    pub async fn stream_set(
        &self,
        stream_name: &str,
        group_id: &str,
        item_id: &str,
        data: Value,
    ) -> Result<Value, BusError> {
        self.trigger(
            "stream::set",
            fields([
                ("stream_name", stream_name.into()),
                ("group_id", group_id.into()),
                ("item_id", item_id.into()),
                ("data", data),
            ]),
        )
        .await
    }

    /// Several stored items in one call (`stream::set_many`): `(stream_name, group_id,
    /// item_id, data)` each, at most 100.
    pub async fn stream_set_many(
        &self,
        items: Vec<(String, String, String, Value)>,
    ) -> Result<Value, BusError> {
        let items: Vec<Value> = items.into_iter().map(stream_item).collect();
        self.trigger("stream::set_many", fields([("items", Value::Array(items))]))
            .await
    }

    pub async fn stream_send(
        &self,
        stream_name: &str,
        group_id: &str,
        event_type: &str,
        data: Value,
    ) -> Result<Value, BusError> {
        self.trigger(
            "stream::send",
            stream_send_payload(stream_name, group_id, event_type, data),
        )
        .await
    }

    /// [`Self::stream_send`] of an event that holds everything the one before it of the same
    /// type and group did (a snapshot: a message's partial). Where this process posts its
    /// pushes from one ordered queue (a Lambda), it answers once queued, not once posted, and
    /// may replace such an event still waiting there; the engine pushes it as any other.
    pub async fn stream_send_latest(
        &self,
        stream_name: &str,
        group_id: &str,
        event_type: &str,
        data: Value,
    ) -> Result<Value, BusError> {
        let mut payload = stream_send_payload(stream_name, group_id, event_type, data);
        payload["latest"] = true.into();
        self.trigger("stream::send", payload).await
    }

    // ---- channels

    /// Create a channel: `(writer_ref, reader_ref)`, each to be attached once.
    pub async fn create_channel(
        &self,
        buffer_size: Option<usize>,
    ) -> Result<(ChannelRef, ChannelRef), BusError> {
        let v = self
            .trigger(
                "engine::channels::create",
                json!({"buffer_size": buffer_size}),
            )
            .await?;
        let parse = |field: &str| {
            serde_json::from_value::<ChannelRef>(v.get(field).cloned().unwrap_or(Value::Null))
                .map_err(|e| BusError::InvalidMessage(format!("bad channel ref `{field}`: {e}")))
        };
        Ok((parse("writer")?, parse("reader")?))
    }

    pub async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError> {
        // This invocation's own response stream (a Lambda answering in streaming mode).
        if let Some(w) = crate::channel::take_response_stream(channel) {
            return Ok(w);
        }
        self.bus.open_writer(channel).await
    }

    pub async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError> {
        self.bus.open_reader(channel).await
    }
}

/// What a [`Ctx::state_transact`] step wants written.
pub enum Write {
    /// Leave the record as it is.
    Keep,
    Put(Value),
    Delete,
}

impl Ctx {
    /// Read-modify-write of one key, atomic across processes: `f` sees the current value
    /// (or `None`) and decides; the write is conditional on the version read, and a conflict
    /// (another writer got there first) runs `f` again on the fresh value.
    pub async fn state_transact<T, F>(
        &self,
        scope: &str,
        key: &str,
        mut f: F,
    ) -> Result<T, BusError>
    where
        F: FnMut(Option<Value>) -> Result<(Write, T), BusError>,
    {
        const ATTEMPTS: u32 = 64;
        for attempt in 0..ATTEMPTS {
            let current = self.state_get_versioned(scope, key).await?;
            let (value, version) = if current.is_null() {
                (None, 0)
            } else {
                (
                    Some(current["value"].clone()),
                    current["version"].as_u64().unwrap_or(0),
                )
            };
            let (write, out) = f(value)?;
            let written = match write {
                Write::Keep => return Ok(out),
                Write::Put(v) => self.state_set_if(scope, key, v, version).await.map(|_| ()),
                Write::Delete if version == 0 => return Ok(out),
                Write::Delete => self
                    .trigger(
                        "state::delete",
                        json!({"scope": scope, "key": key, "expected_version": version}),
                    )
                    .await
                    .map(|_| ()),
            };
            match written {
                Ok(()) => return Ok(out),
                Err(BusError::VersionConflict(_)) => {
                    // Spread the retries of contending writers apart.
                    let jitter = rand::random::<u64>() % (2 + u64::from(attempt) * 2);
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(BusError::VersionConflict(format!(
            "{scope}/{key} kept changing under {ATTEMPTS} attempts"
        )))
    }
}

/// A request object built by moving its values in (the engine's, shared by every worker).
pub use ::bus::fields::fields;

/// A stream item as `state::transact` and `stream::set_many` take it, its data moved in.
fn stream_item((stream_name, group_id, item_id, data): (String, String, String, Value)) -> Value {
    fields([
        ("stream_name", stream_name.into()),
        ("group_id", group_id.into()),
        ("item_id", item_id.into()),
        ("data", data),
    ])
}

fn stream_send_payload(stream_name: &str, group_id: &str, event_type: &str, data: Value) -> Value {
    fields([
        ("stream_name", stream_name.into()),
        ("group_id", group_id.into()),
        ("type", event_type.into()),
        ("data", data),
    ])
}
