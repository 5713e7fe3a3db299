//! The engine's own functions: registry listings, state, streams, queues, durable topics,
//! channels, traces and connection pushes. Registered as in-process handlers owned by
//! `engine`, so they route, time out and trace exactly like any worker's function.

use futures_util::FutureExt;
use serde_json::{Value, json};
use std::future::Future;
use std::sync::{Arc, Weak};

use crate::engine::{Engine, HandlerResult, Invocation};
use crate::fields::take_value;
use crate::protocol::{ErrorBody, Message, RegisterFunction, codes};
use crate::queue::QueueConfig;
use crate::state::WriteMeta;
use bus_telemetry::trace::Span;

pub use crate::engine::ENGINE_OWNER;
// Workers read their requests' fields with these; they live in `fields` (a leaf module, so
// `state_api` needs nothing from here).
pub use crate::fields::{opt_bool, opt_str, opt_u64, req_str};
pub use crate::stream_item::{StreamItem, stored_event_type, stream_addr, stream_items};

fn req_value(data: &Value, field: &str) -> Result<Value, ErrorBody> {
    data.get(field)
        .cloned()
        .ok_or_else(|| ErrorBody::invalid(format!("missing required field `{field}`")))
}

fn meta_of(inv: &Invocation) -> WriteMeta {
    WriteMeta {
        traceparent: inv.trace.traceparent(),
        baggage: inv.trace.baggage_header(),
        unwatched: false,
    }
}

/// A state write's meta, marked when no trigger watches its scope.
fn write_meta_of(engine: &Engine, inv: &Invocation) -> WriteMeta {
    let mut meta = meta_of(inv);
    meta.unwatched = inv.data["scope"]
        .as_str()
        .is_some_and(|scope| engine.scope_unwatched(scope));
    meta
}

/// A transaction's meta, marked unwatched when no trigger watches the scope of any of its
/// writes (its stream items are in the engine's own scopes, which never have change records).
/// One watched scope records them all; the dispatcher drops the ones nobody watches.
fn transact_meta_of(engine: &Engine, inv: &Invocation) -> WriteMeta {
    let mut meta = meta_of(inv);
    meta.unwatched = match inv.data.get("writes") {
        Some(Value::Array(writes)) => writes.iter().all(|w| {
            w["scope"]
                .as_str()
                .is_some_and(|scope| engine.scope_unwatched(scope))
        }),
        _ => true,
    };
    meta
}

/// `state::get`, `get_versioned`, `list`: a read writes nothing, so no trace headers are
/// formatted for a change record.
async fn state_read(e: Arc<Engine>, inv: Invocation) -> HandlerResult {
    state_call(&e, inv, &WriteMeta::default()).await
}

/// `state::set`, `update`, `delete`: the write's meta, marked unwatched when no trigger
/// watches its scope.
async fn state_write(e: Arc<Engine>, inv: Invocation) -> HandlerResult {
    let meta = write_meta_of(&e, &inv);
    // A session's owner, as it is recorded: the engine filters the session's events for
    // client subscribers by it, so it knows it before the session's first event.
    let owner = (inv.function_id == "state::set"
        && inv.data["scope"] == crate::engine::OWNERS_SCOPE)
        .then(|| {
            (
                inv.data["key"].as_str().map(str::to_owned),
                inv.data["value"].clone(),
            )
        });
    let out = state_call(&e, inv, &meta).await;
    if let (Ok(_), Some((Some(sid), value))) = (&out, owner) {
        e.remember_owner(&sid, value);
    }
    out
}

async fn state_call(e: &Engine, inv: Invocation, meta: &WriteMeta) -> HandlerResult {
    crate::state_api::call(e.state.as_ref(), &inv.function_id, inv.data, meta)
        .await
        .unwrap_or_else(|| Err(ErrorBody::invalid("not a state function")))
}

fn add<F, Fut>(engine: &Arc<Engine>, id: &str, description: &str, request: Value, f: F)
where
    F: Fn(Arc<Engine>, Invocation) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    let weak: Weak<Engine> = Arc::downgrade(engine);
    let f = Arc::new(f);
    let handler = Arc::new(move |inv: Invocation| {
        let weak = weak.clone();
        let f = f.clone();
        async move {
            let engine = weak.upgrade().ok_or_else(|| {
                ErrorBody::new(codes::INVOCATION_STOPPED, "the engine is shutting down")
            })?;
            f(engine, inv).await
        }
        .boxed()
    });
    let mut def = RegisterFunction::new(id);
    def.description = Some(description.to_string());
    def.request_format = Some(request);
    // Registration of a built-in cannot fail: the ids are valid constants.
    let _ = engine.register_local(ENGINE_OWNER, def, handler);
}

fn schema(required: &[&str], props: Value) -> Value {
    json!({"type": "object", "required": required, "properties": props})
}

pub fn register(engine: &Arc<Engine>) {
    let s = |t: &str| json!({"type": t});

    add(
        engine,
        "engine::functions::list",
        "Registered functions with their schemas and owners, by id, in pages of about 96 KiB: {prefix?, after? (the last page's `next`), limit? (1-1000), formats? (default true)} → {functions, next?, catalogue_version} (`catalogue_version` changes whenever the catalogue does).",
        schema(
            &[],
            json!({"prefix": s("string"), "after": s("string"), "limit": s("integer"), "formats": s("boolean")}),
        ),
        |e, inv| async move {
            // Read before the entries: a change in between makes the page look older, never
            // newer, than it is.
            let version = e.catalogue_version();
            let req = crate::paging::PageRequest::parse(&inv.data)?;
            let entries = e.function_entries_from(
                req.formats,
                req.prefix.as_deref(),
                req.after.as_deref(),
                // One more than a page can hold: the page knows there is a next one.
                req.limit as usize + 1,
            );
            let mut page = crate::paging::page(entries, &req);
            page["catalogue_version"] = json!(version);
            Ok(page)
        },
    );
    add(
        engine,
        "engine::triggers::list",
        "Every registered trigger.",
        schema(&[], json!({})),
        |e, _| async move { Ok(e.list_triggers()) },
    );
    add(
        engine,
        "engine::workers::list",
        "Connected workers (remote and embedded) and their functions.",
        schema(&[], json!({})),
        |e, _| async move { Ok(e.list_workers()) },
    );
    add(
        engine,
        "engine::workers::register",
        "Connect-time announce: name and metadata of the calling worker.",
        schema(&[], json!({"name": s("string"), "metadata": s("object")})),
        |e, inv| async move {
            let name = opt_str(&inv.data, "name")?;
            let caller = inv
                .caller
                .clone()
                .ok_or_else(|| ErrorBody::invalid("only a connected worker can announce itself"))?;
            let metadata = inv.data.get("metadata").cloned().unwrap_or(Value::Null);
            e.set_worker_info(&caller, name, metadata);
            Ok(json!({"worker_id": caller}))
        },
    );
    add(
        engine,
        "engine::channels::create",
        "Create a channel; returns writer and reader refs, each attachable once.",
        schema(&[], json!({"buffer_size": s("integer")})),
        |e, inv| async move {
            let buffer = opt_u64(&inv.data, "buffer_size")?.map(|b| b as usize);
            let (writer, reader) = e.channels.create(buffer);
            Ok(json!({"writer": writer, "reader": reader}))
        },
    );
    add(
        engine,
        "engine::connections::post",
        "Push data to a connection (the @connections model); `gone` if it closed.",
        schema(
            &["connection_id", "data"],
            json!({"connection_id": s("string"), "data": {}}),
        ),
        |e, inv| async move {
            let id = req_str(&inv.data, "connection_id")?;
            let data = req_value(&inv.data, "data")?;
            if e.push(&id, &Message::Push { data }) {
                Ok(json!({"ok": true}))
            } else {
                Err(ErrorBody::new(
                    codes::GONE,
                    format!("connection `{id}` is gone"),
                ))
            }
        },
    );

    // ---- traces
    add(
        engine,
        "engine::traces::group_by",
        "Group recent spans by an attribute value.",
        schema(
            &["attribute"],
            json!({"attribute": s("string"), "since_ms": s("integer"), "limit": s("integer")}),
        ),
        |e, inv| async move {
            let attribute = req_str(&inv.data, "attribute")?;
            let since = opt_u64(&inv.data, "since_ms")?;
            let limit = opt_u64(&inv.data, "limit")?.map(|l| l as usize);
            Ok(e.spans.group_by(&attribute, since, limit))
        },
    );
    add(
        engine,
        "engine::traces::list",
        "Recent spans, optionally of one trace.",
        schema(&[], json!({"trace_id": s("string")})),
        |e, inv| async move {
            let trace_id = opt_str(&inv.data, "trace_id")?;
            let spans: Vec<Span> = match trace_id {
                Some(t) => e.spans.of_trace(&t),
                None => e.spans.snapshot(),
            };
            Ok(json!({"spans": spans}))
        },
    );
    add(
        engine,
        "engine::traces::ingest",
        "Workers report their finished spans here.",
        schema(&["spans"], json!({"spans": s("array")})),
        |e, inv| async move {
            let spans: Vec<Span> = serde_json::from_value(req_value(&inv.data, "spans")?)
                .map_err(|err| ErrorBody::invalid(format!("invalid `spans`: {err}")))?;
            let n = spans.len();
            for sp in spans {
                e.spans.record_ingested(sp);
            }
            Ok(json!({"accepted": n}))
        },
    );

    // ---- state
    add(
        engine,
        "state::get",
        "Read a value (null when absent).",
        schema(
            &["scope", "key"],
            json!({"scope": s("string"), "key": s("string")}),
        ),
        state_read,
    );
    add(
        engine,
        "state::get_versioned",
        "Read a value with its version: {value, version} or null.",
        schema(
            &["scope", "key"],
            json!({"scope": s("string"), "key": s("string")}),
        ),
        state_read,
    );
    add(
        engine,
        "state::set",
        "Write a value; with expected_version the write is conditional (0 = only if absent).",
        schema(
            &["scope", "key", "value"],
            json!({"scope": s("string"), "key": s("string"), "value": {}, "expected_version": s("integer")}),
        ),
        state_write,
    );
    add(
        engine,
        "state::update",
        "Apply ops (set, append, increment, remove) atomically.",
        schema(
            &["scope", "key", "ops"],
            json!({"scope": s("string"), "key": s("string"), "ops": s("array"), "expected_version": s("integer")}),
        ),
        state_write,
    );
    add(
        engine,
        "state::delete",
        "Delete a value.",
        schema(
            &["scope", "key"],
            json!({"scope": s("string"), "key": s("string"), "expected_version": s("integer")}),
        ),
        state_write,
    );
    add(
        engine,
        "state::list",
        "List the entries of a scope, optionally under a key prefix.",
        schema(
            &["scope"],
            json!({"scope": s("string"), "prefix": s("string")}),
        ),
        state_read,
    );
    add(
        engine,
        "state::sync",
        "Return once every write committed before this call is durable, deferred ones too: {synced: true}.",
        schema(&[], json!({})),
        state_read,
    );

    // ---- streams
    add(
        engine,
        "stream::set",
        "Store a stream item and push it to subscribers.",
        schema(
            &["stream_name", "group_id", "item_id", "data"],
            json!({"stream_name": s("string"), "group_id": s("string"), "item_id": s("string"), "data": {}}),
        ),
        |e, mut inv| async move {
            let (scope, group) = stream_addr(&inv.data)?;
            let item = req_str(&inv.data, "item_id")?;
            let name = req_str(&inv.data, "stream_name")?;
            let data = take_value(&mut inv.data, "data")?;
            crate::state::check_value_depth("`data`", &data)?;
            let key = format!("{group}\u{1}{item}");
            let out = e
                .state
                .set(&scope, &key, data, None, &meta_of(&inv))
                .await?;
            let event_type = stored_event_type(Some(out.old_value.is_some()));
            let new_value = out.new_value.unwrap_or(Value::Null);
            e.emit_stream_event(&name, &group, &item, event_type, &new_value, &inv.trace);
            let mut answer = serde_json::Map::with_capacity(2);
            answer.insert("old_value".into(), out.old_value.unwrap_or(Value::Null));
            answer.insert("new_value".into(), new_value);
            Ok(Value::Object(answer))
        },
    );
    add(
        engine,
        "state::transact",
        "Write several records and stream items together: all commit or none does. Each write may name the version it expects; a conflict on one writes nothing and names it.",
        schema(
            &[],
            json!({
                "writes": {"type": "array", "maxItems": crate::state::TRANSACT_MAX_WRITES, "items": schema(
                    &["scope", "key", "value"],
                    json!({"scope": s("string"), "key": s("string"), "value": {}, "expected_version": s("integer")}),
                )},
                "stream_items": {"type": "array", "maxItems": crate::state::SET_MANY_MAX, "items": schema(
                    &["stream_name", "group_id", "item_id", "data"],
                    json!({"stream_name": s("string"), "group_id": s("string"), "item_id": s("string"), "data": {}}),
                )},
            }),
        ),
        |e, mut inv| async move {
            let meta = transact_meta_of(&e, &inv);
            let (answer, items) =
                crate::state_api::transact(e.state.as_ref(), &mut inv.data, &meta).await?;
            // Pushed only after the commit, in order; whether an item was new is not known.
            for item in &items {
                e.emit_stream_event(
                    &item.stream_name,
                    &item.group_id,
                    &item.item_id,
                    stored_event_type(None),
                    &item.data,
                    &inv.trace,
                );
            }
            Ok(answer)
        },
    );
    add(
        engine,
        "stream::set_many",
        "Store several stream items in one write and push each to its subscribers, in order.",
        schema(
            &["items"],
            json!({"items": {"type": "array", "maxItems": crate::state::SET_MANY_MAX, "items": schema(
                &["stream_name", "group_id", "item_id", "data"],
                json!({"stream_name": s("string"), "group_id": s("string"), "item_id": s("string"), "data": {}}),
            )}}),
        ),
        |e, mut inv| async move {
            let items = stream_items(&mut inv.data, "items")?;
            let writes = items
                .iter()
                .map(|i| (i.scope.clone(), i.key.clone(), i.data.clone()))
                .collect();
            let existed = e.state.set_many(writes, &meta_of(&inv)).await?;
            for (item, existed) in items.iter().zip(existed) {
                let event_type = stored_event_type(existed);
                e.emit_stream_event(
                    &item.stream_name,
                    &item.group_id,
                    &item.item_id,
                    event_type,
                    &item.data,
                    &inv.trace,
                );
            }
            Ok(json!({"count": items.len()}))
        },
    );
    add(
        engine,
        "stream::send",
        "Push an event to a stream group without storing it.",
        schema(
            &["stream_name", "group_id", "data"],
            json!({"stream_name": s("string"), "group_id": s("string"), "type": s("string"), "item_id": s("string"), "latest": s("boolean"), "data": {}}),
        ),
        |e, mut inv| async move {
            let (_, group) = stream_addr(&inv.data)?;
            let name = req_str(&inv.data, "stream_name")?;
            // `latest` (the event supersedes the one before it of its type) lets a Lambda's
            // push queue merge it; here every event goes to its connections' queues at once.
            crate::fields::opt_bool(&inv.data, "latest")?;
            let event_type = opt_str(&inv.data, "type")?.unwrap_or_else(|| "send".into());
            let item = opt_str(&inv.data, "item_id")?.unwrap_or_default();
            let data = take_value(&mut inv.data, "data")?;
            e.emit_stream_event(&name, &group, &item, &event_type, &data, &inv.trace);
            Ok(json!({"ok": true}))
        },
    );
    add(
        engine,
        "stream::get",
        "Read one stream item.",
        schema(&["stream_name", "group_id", "item_id"], json!({})),
        |e, inv| async move {
            let (scope, group) = stream_addr(&inv.data)?;
            let item = req_str(&inv.data, "item_id")?;
            Ok(e.state
                .get(&scope, &format!("{group}\u{1}{item}"))
                .await?
                .map(|v| v.value)
                .unwrap_or(Value::Null))
        },
    );
    add(
        engine,
        "stream::delete",
        "Delete one stream item and push a delete event.",
        schema(&["stream_name", "group_id", "item_id"], json!({})),
        |e, inv| async move {
            let (scope, group) = stream_addr(&inv.data)?;
            let item = req_str(&inv.data, "item_id")?;
            let out = e
                .state
                .delete(
                    &scope,
                    &format!("{group}\u{1}{item}"),
                    None,
                    &WriteMeta::default(),
                )
                .await?;
            if let Some(old) = &out.old_value {
                let name = req_str(&inv.data, "stream_name")?;
                e.emit_stream_event(&name, &group, &item, "delete", old, &inv.trace);
            }
            Ok(json!({"deleted": out.old_value.is_some()}))
        },
    );
    add(
        engine,
        "stream::list",
        "The stored items of a stream group, in item-id order.",
        schema(
            &["stream_name", "group_id"],
            json!({"stream_name": s("string"), "group_id": s("string")}),
        ),
        |e, inv| async move {
            let (scope, group) = stream_addr(&inv.data)?;
            let prefix = format!("{group}\u{1}");
            let items: Vec<Value> = e
                .state
                .list(&scope, Some(&prefix))
                .await?
                .into_iter()
                .map(|en| {
                    crate::fields::fields([
                        ("item_id", en.key[prefix.len()..].into()),
                        ("data", en.value),
                    ])
                })
                .collect();
            Ok(crate::fields::fields([("items", Value::Array(items))]))
        },
    );

    // ---- queues and durable topics
    add(
        engine,
        "engine::queue::declare",
        "Declare a queue: type fifo|standard, message_group_field, max_retries, backoff_ms, visibility_timeout_ms, concurrency.",
        schema(
            &["queue"],
            json!({"queue": s("string"), "type": s("string")}),
        ),
        |e, inv| async move {
            let cfg = QueueConfig::from_json(&inv.data)?;
            e.declare_queue(cfg.clone()).await?;
            Ok(serde_json::to_value(cfg).unwrap_or(Value::Null))
        },
    );
    for id in ["engine::queue::redrive", "iii::queue::redrive"] {
        add(
            engine,
            id,
            "Move every dead-lettered message of a queue back onto it.",
            schema(&["queue"], json!({"queue": s("string")})),
            |e, inv| async move {
                let queue = req_str(&inv.data, "queue")?;
                let redriven = e.queues.redrive(&queue).await?;
                Ok(json!({"queue": queue, "redriven": redriven}))
            },
        );
    }
    add(
        engine,
        "engine::queue::stats",
        "Pending, in-flight and dead-lettered counts of a queue.",
        schema(&["queue"], json!({"queue": s("string")})),
        |e, inv| async move {
            let queue = req_str(&inv.data, "queue")?;
            let stats = e.queues.stats(&queue).await?;
            Ok(
                json!({"queue": queue, "pending": stats.pending, "in_flight": stats.in_flight, "dead": stats.dead}),
            )
        },
    );
    add(
        engine,
        "engine::queue::dead_letters",
        "The dead-lettered messages of a queue.",
        schema(&["queue"], json!({"queue": s("string")})),
        |e, inv| async move {
            let queue = req_str(&inv.data, "queue")?;
            Ok(json!({"queue": queue, "messages": e.queues.dead_letters(&queue).await?}))
        },
    );
    add(
        engine,
        "engine::queue::list",
        "Declared queues and their settings.",
        schema(&[], json!({})),
        |e, _| async move { Ok(json!({"queues": e.queues.queues().await})) },
    );
    for id in ["engine::durable::publish", "iii::durable::publish"] {
        add(
            engine,
            id,
            "Publish to a durable topic: every subscribed function gets its own copy.",
            schema(
                &["topic", "data"],
                json!({"topic": s("string"), "data": {}}),
            ),
            |e, inv| async move {
                let topic = req_str(&inv.data, "topic")?;
                let data = req_value(&inv.data, "data")?;
                let delivered_to = e.publish_durable(&topic, data, &inv.trace).await?;
                Ok(json!({"topic": topic, "subscribers": delivered_to}))
            },
        );
    }
}
