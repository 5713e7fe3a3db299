//! WebSocket connections as AWS sees them: pushes go through the API Gateway management API
//! (`POST @connections/{id}`), and stream subscriptions are registry items written by the
//! router at `streamsubscribe`. The router uses this for results; a Lambda uses it for what
//! it puts on a stream: `stream::send` (token deltas, stored nowhere) and the stream items it
//! stores, pushed once written (`push_stored`), so one writer's events reach a client in the
//! order it made them.

use super::AwsClients;
use super::registry::DynamoRegistry;
use aws_sdk_apigatewaymanagement::primitives::Blob;
use bus::registry::Registry;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Registry kind of a connection's stream subscription (owner: the connection).
pub const SUBSCRIPTION: &str = "subscription";

/// How long a Lambda reuses the subscribers it read for a stream group. `stream::send` is
/// called once per batch of token deltas; a client that subscribes within this window may
/// miss deltas, never a stored event (those come through the stream router).
pub const SUBSCRIBERS_TTL: Duration = Duration::from_secs(1);

/// Most stream groups whose subscribers are cached at once.
const MAX_CACHED_GROUPS: usize = 1024;

pub fn subscription_id(connection: &str, stream: &str, group: Option<&str>) -> String {
    format!("{connection}\u{1}{stream}\u{1}{}", group.unwrap_or("*"))
}

/// A subscriber: its connection id, (a client that sees only its own sessions) who it is,
/// and whether it takes `streamevents` (subscribed with `batch`).
type Subscriber = (String, Option<String>, bool);

/// A connection allowed an event, and whether it takes `streamevents`.
type Recipient = (String, bool);

/// Most bytes of events in one `streamevents` post: an API Gateway WebSocket message holds
/// 128 KiB; the rest is the envelope's room.
pub const BATCH_MAX_BYTES: usize = 96 * 1024;
/// What API Gateway takes in one WebSocket message; a larger post is refused.
pub const MESSAGE_MAX_BYTES: usize = 128 * 1024;

type SubscriberCache = HashMap<(String, String), (Instant, Vec<Subscriber>)>;

/// Most sessions' owners a Lambda remembers (an owner never changes once recorded).
const MAX_CACHED_OWNERS: usize = 10_000;

pub struct Connections {
    client: aws_sdk_apigatewaymanagement::Client,
    registry: DynamoRegistry,
    state: super::state::DynamoState,
    cache: Mutex<SubscriberCache>,
    owners: Mutex<HashMap<String, Value>>,
}

impl Connections {
    /// `endpoint`: `https://{api}.execute-api.{region}.amazonaws.com/{stage}`
    /// (`WS_MANAGEMENT_ENDPOINT`).
    pub fn new(clients: &AwsClients, names: &super::AwsNames, endpoint: &str) -> Self {
        let conf = aws_sdk_apigatewaymanagement::config::Builder::from(&clients.config)
            .endpoint_url(endpoint)
            .interceptor(super::api_calls::CountCalls)
            .build();
        Self {
            client: aws_sdk_apigatewaymanagement::Client::from_conf(conf),
            registry: DynamoRegistry::new(clients.clone(), names),
            state: super::state::DynamoState::new(clients.clone(), names),
            cache: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// A session's recorded owner (`null`: none), remembered once read.
    async fn owner(&self, session_id: &str) -> Value {
        if let Some(o) = self.lock_owners().get(session_id) {
            return o.clone();
        }
        use bus::state::StateStore;
        let owner = self
            .state
            .get(bus::engine::OWNERS_SCOPE, session_id)
            .await
            .ok()
            .flatten()
            .map(|v| v.value)
            .unwrap_or(Value::Null);
        if !owner.is_null() {
            let mut owners = self.lock_owners();
            if owners.len() >= MAX_CACHED_OWNERS {
                owners.clear();
            }
            owners.insert(session_id.to_string(), owner.clone());
        }
        owner
    }

    fn lock_owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Value>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Of `subs` (subscribed to `group`), the connections that may get its events: a client
    /// only its own session's, whatever it subscribed to.
    pub async fn allowed(&self, subs: Vec<Subscriber>, group: &str) -> Vec<Recipient> {
        if subs.iter().all(|(_, viewer, _)| viewer.is_none()) {
            return subs.into_iter().map(|(id, _, b)| (id, b)).collect();
        }
        let owner = self.owner(group).await;
        subs.into_iter()
            .filter(|(_, viewer, _)| {
                viewer.as_deref().is_none_or(|v| {
                    bus::access::Acting::parse(v).is_some_and(|a| a.may_see(&owner))
                })
            })
            .map(|(id, _, b)| (id, b))
            .collect()
    }

    /// Post a message to a connection → false when the connection is gone (then its records
    /// are forgotten).
    pub async fn post(&self, connection_id: &str, message: &Value) -> Result<bool, String> {
        match self
            .client
            .post_to_connection()
            .connection_id(connection_id)
            .data(Blob::new(message.to_string().into_bytes()))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_gone_exception()) => {
                self.forget(connection_id).await;
                Ok(false)
            }
            Err(e) => Err(super::err_text(&e)),
        }
    }

    /// Remove a connection's record and its subscriptions.
    pub async fn forget(&self, connection: &str) {
        let _ = self
            .registry
            .remove("connection", connection, connection)
            .await;
        if let Ok(subs) = self.registry.list(SUBSCRIPTION).await {
            for (id, owner, _) in subs {
                if owner == connection {
                    let _ = self.registry.remove(SUBSCRIPTION, &id, &owner).await;
                }
            }
        }
    }

    /// Every subscription (id, owner, body).
    pub async fn subscriptions(&self) -> Result<Vec<(String, String, Value)>, String> {
        self.registry.list(SUBSCRIPTION).await
    }

    /// The connections subscribed to `stream`'s `group` (or to all its groups), read at most
    /// once per [`SUBSCRIBERS_TTL`].
    pub async fn subscribers(&self, stream: &str, group: &str) -> Result<Vec<Recipient>, String> {
        let key = (stream.to_string(), group.to_string());
        let cached = self
            .lock_cache()
            .get(&key)
            .filter(|(at, _)| at.elapsed() < SUBSCRIBERS_TTL)
            .map(|(_, subs)| subs.clone());
        let subs = match cached {
            Some(subs) => subs,
            None => {
                let subs = subscribed_with_viewers(&self.subscriptions().await?, stream, group);
                self.remember_subscribers(stream, group, subs.clone());
                subs
            }
        };
        Ok(self.allowed(subs, group).await)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, SubscriberCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `stream::send`: push an event to the group's subscribers without storing it, in the
    /// engine's `streamevent` shape → how many connections it reached. A connection that
    /// cannot be reached is logged and skipped (best effort, as on the engine).
    pub async fn send_stream_event(
        &self,
        stream: &str,
        group: &str,
        item: &str,
        event_type: &str,
        data: &Value,
    ) -> Result<usize, String> {
        let ids = self.subscribers(stream, group).await?;
        let event = StreamEvent {
            stream,
            group,
            item,
            event_type,
            data,
        };
        Ok(self.post_all(posts_per_connection(&[(event, &ids)])).await)
    }

    /// Stored stream items, pushed by the Lambda that stored them once the write committed,
    /// in the order written (as the embedded engine pushes them): so a client gets a step's
    /// stored events after the token deltas the same Lambda posted before them. The
    /// subscriptions are read fresh, once per call (a Lambda's push queue makes one call for
    /// writes queued behind each other, after all of them committed): a client that
    /// subscribed a moment ago gets every stored event (the read also refreshes what
    /// `stream::send` reuses). A
    /// client that subscribed with `batch` gets a write's events of one group in one
    /// `streamevents` post (several when they pass [`BATCH_MAX_BYTES`]). `then`, called once
    /// the subscriptions are read, gives pushed (not stored) events that go after them in the
    /// same posts: what a Lambda's push queue holds behind the writes by then (a pushed event
    /// needs no fresher read than one made before it was sent). → how many posts reached a
    /// connection. Best effort: a failed post is logged.
    pub async fn push_stored(
        &self,
        events: &[StreamEvent<'_>],
        then: &mut (dyn FnMut() -> Vec<OwnedStreamEvent> + Send),
    ) -> Result<usize, String> {
        if events.is_empty() {
            return Ok(0);
        }
        let subs = self.subscriptions().await?;
        let sent_after = then();
        let events: Vec<StreamEvent<'_>> = events
            .iter()
            .copied()
            .chain(sent_after.iter().map(OwnedStreamEvent::as_event))
            .collect();
        let mut groups: HashMap<(&str, &str), Vec<Recipient>> = HashMap::new();
        for event in &events {
            let key = (event.stream, event.group);
            if let std::collections::hash_map::Entry::Vacant(slot) = groups.entry(key) {
                let found = subscribed_with_viewers(&subs, event.stream, event.group);
                self.remember_subscribers(event.stream, event.group, found.clone());
                slot.insert(self.allowed(found, event.group).await);
            }
        }
        let addressed: Vec<_> = events
            .iter()
            .map(|e| (*e, groups[&(e.stream, e.group)].as_slice()))
            .collect();
        Ok(self.post_all(posts_per_connection(&addressed)).await)
    }

    /// Each connection's messages, in order (a gone connection gets no more) → how many posts
    /// reached one. Best effort: a failed post is logged.
    async fn post_all(&self, posts: Vec<(&str, Vec<Value>)>) -> usize {
        let mut reached = 0;
        for (connection, messages) in posts {
            for message in messages {
                match self.post(connection, &message).await {
                    Ok(true) => reached += 1,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, connection = %connection, "stream event not pushed")
                    }
                }
            }
        }
        reached
    }

    fn remember_subscribers(&self, stream: &str, group: &str, subs: Vec<Subscriber>) {
        let mut cache = self.lock_cache();
        if cache.len() >= MAX_CACHED_GROUPS {
            cache.clear();
        }
        cache.insert(
            (stream.to_string(), group.to_string()),
            (Instant::now(), subs),
        );
    }
}

/// One event of a stream group, as pushed: `type` is `create`, `update` or `delete` for a
/// stored item, anything else for a pushed one (`message_update`).
#[derive(Debug, Clone, Copy)]
pub struct StreamEvent<'a> {
    pub stream: &'a str,
    pub group: &'a str,
    pub item: &'a str,
    pub event_type: &'a str,
    pub data: &'a Value,
}

impl<'a> StreamEvent<'a> {
    /// A stored item's event (`existed`: whether the write replaced one, if known).
    pub fn stored(item: &'a bus::stream_item::StreamItem, existed: Option<bool>) -> Self {
        StreamEvent {
            stream: &item.stream_name,
            group: &item.group_id,
            item: &item.item_id,
            event_type: bus::stream_item::stored_event_type(existed),
            data: &item.data,
        }
    }

    /// The engine's `streamevent` message. One that would pass [`MESSAGE_MAX_BYTES`] (a
    /// large tool result) goes with its largest fields replaced by what they were
    /// ([`fit_data`]): the client hears of the event, and reads it whole from the stream's
    /// stored items.
    pub fn message(&self) -> Value {
        let message = |data: &Value| json!({"type": "streamevent", "stream_name": self.stream, "group_id": self.group, "item_id": self.item, "event": {"type": self.event_type, "data": data}});
        let whole = message(self.data);
        // Most events are far under the limit, and their bound says so without writing
        // their JSON (the post writes it once).
        if bus::state::json_len_bound(&whole) <= MESSAGE_MAX_BYTES {
            return whole;
        }
        let bytes = whole.to_string().len();
        if bytes <= MESSAGE_MAX_BYTES {
            return whole;
        }
        let envelope = bytes - self.data.to_string().len();
        message(&fit_data(
            self.data,
            MESSAGE_MAX_BYTES.saturating_sub(envelope),
        ))
    }

    /// A `streamevents` message of `run` (events of one stream group, in order).
    pub fn batch_message(run: &[StreamEvent<'_>]) -> Value {
        let events: Vec<Value> = run
            .iter()
            .map(|e| json!({"item_id": e.item, "event": {"type": e.event_type, "data": e.data}}))
            .collect();
        let first = run.first();
        json!({"type": "streamevents", "stream_name": first.map(|e| e.stream), "group_id": first.map(|e| e.group), "events": events})
    }

    /// About what the event takes in a message (its data's JSON and its names).
    fn size(&self) -> usize {
        self.data.to_string().len() + self.item.len() + self.event_type.len() + 48
    }
}

/// `data` in at most `budget` bytes of JSON: its largest top-level fields, one by one, become
/// `{"omitted": {"bytes": n}}` (n: the field's JSON) until the rest fits; data that is not an
/// object, or whose field names alone pass the budget, becomes that marker whole.
pub fn fit_data(data: &Value, budget: usize) -> Value {
    let omitted = |v: &Value| json!({"omitted": {"bytes": v.to_string().len()}});
    let Some(fields) = data.as_object() else {
        return omitted(data);
    };
    let mut sizes: Vec<(&String, usize)> = fields
        .iter()
        .map(|(k, v)| (k, v.to_string().len()))
        .collect();
    sizes.sort_by_key(|s| std::cmp::Reverse(s.1));
    let mut out = fields.clone();
    let mut total = data.to_string().len();
    for (name, size) in sizes {
        if total <= budget {
            return Value::Object(out);
        }
        let marker = omitted(&fields[name]);
        total = total + marker.to_string().len() - size;
        out.insert(name.clone(), marker);
    }
    if total <= budget {
        Value::Object(out)
    } else {
        omitted(data)
    }
}

/// A [`StreamEvent`] that owns its parts, to be pushed after the call that made it has
/// moved on (a Lambda's push queue).
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedStreamEvent {
    pub stream: String,
    pub group: String,
    pub item: String,
    pub event_type: String,
    pub data: Value,
}

impl OwnedStreamEvent {
    /// A stored item's event (`existed`: whether the write replaced one, if known), taking
    /// the item's parts.
    pub fn stored(item: bus::stream_item::StreamItem, existed: Option<bool>) -> Self {
        Self {
            event_type: bus::stream_item::stored_event_type(existed).to_string(),
            stream: item.stream_name,
            group: item.group_id,
            item: item.item_id,
            data: item.data,
        }
    }

    pub fn as_event(&self) -> StreamEvent<'_> {
        StreamEvent {
            stream: &self.stream,
            group: &self.group,
            item: &self.item,
            event_type: &self.event_type,
            data: &self.data,
        }
    }
}

/// What each connection is posted for a write's events (each with the connections allowed
/// it), connections in the order first addressed, messages in the order written: one
/// `streamevent` per event, or for a `batch` subscriber the events of one group in a row
/// as one `streamevents` (a run of one stays a `streamevent`; a run is cut at
/// [`BATCH_MAX_BYTES`] of events).
pub fn posts_per_connection<'a>(
    addressed: &[(StreamEvent<'_>, &'a [Recipient])],
) -> Vec<(&'a str, Vec<Value>)> {
    /// A run of events for one connection, and the bytes they take.
    struct Run<'e> {
        events: Vec<StreamEvent<'e>>,
        bytes: usize,
    }
    let mut order: Vec<&'a str> = Vec::new();
    let mut runs: HashMap<&'a str, (bool, Vec<Run<'_>>)> = HashMap::new();
    for (event, recipients) in addressed {
        // Measured once, whoever it goes to (only a batch subscriber's runs need it).
        let mut size = None;
        for (id, batch) in recipients.iter() {
            let (takes_batches, list) = runs.entry(id.as_str()).or_insert_with(|| {
                order.push(id.as_str());
                (*batch, Vec::new())
            });
            let bytes = if *takes_batches {
                *size.get_or_insert_with(|| event.size())
            } else {
                0
            };
            match list.last_mut() {
                Some(run)
                    if *takes_batches
                        && run.events[0].stream == event.stream
                        && run.events[0].group == event.group
                        && run.bytes + bytes <= BATCH_MAX_BYTES =>
                {
                    run.events.push(*event);
                    run.bytes += bytes;
                }
                _ => list.push(Run {
                    events: vec![*event],
                    bytes,
                }),
            }
        }
    }
    order
        .into_iter()
        .map(|id| {
            let (_, list) = runs.remove(id).unwrap_or_default();
            let messages = list
                .into_iter()
                .map(|run| match run.events.as_slice() {
                    [one] => one.message(),
                    events => StreamEvent::batch_message(events),
                })
                .collect();
            (id, messages)
        })
        .collect()
}

/// The subscribers among `subs` of `stream`'s `group`, each with the client it is when it
/// sees only its own sessions (`viewer`).
pub fn subscribed_with_viewers(
    subs: &[(String, String, Value)],
    stream: &str,
    group: &str,
) -> Vec<Subscriber> {
    let mut out: Vec<Subscriber> = subs
        .iter()
        .filter(|(_, _, sub)| {
            sub["stream_name"].as_str() == Some(stream)
                && sub["group_id"].as_str().is_none_or(|g| g == group)
        })
        .filter_map(|(_, _, sub)| {
            let id = sub["connection_id"].as_str()?.to_owned();
            let batch = sub["batch"] == true;
            Some((id, sub["viewer"].as_str().map(str::to_owned), batch))
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_subscriber_gets_a_writes_events_of_a_group_in_one_message_in_order() {
        let data = json!({"type": "turn_end"});
        let big = json!("x".repeat(BATCH_MAX_BYTES / 2));
        let ev = |group: &'static str, item: &'static str, data: &'static Value| StreamEvent {
            stream: "agent::events",
            group,
            item,
            event_type: "create",
            data,
        };
        let data: &'static Value = Box::leak(Box::new(data));
        let big: &'static Value = Box::leak(Box::new(big));
        let both: Vec<Recipient> = vec![("plain".into(), false), ("batched".into(), true)];
        let only_plain: Vec<Recipient> = vec![("plain".into(), false)];
        let addressed = vec![
            (ev("s1", "s1-1", data), both.as_slice()),
            (ev("s1", "s1-2", data), both.as_slice()),
            (ev("s1", "s1-3", data), both.as_slice()),
            // Another group cuts the run; an event the batch subscriber may not see is
            // not in it.
            (ev("s2", "s2-1", data), both.as_slice()),
            (ev("s2", "s2-2", data), only_plain.as_slice()),
            // Runs are cut at the byte budget.
            (ev("s1", "s1-4", big), both.as_slice()),
            (ev("s1", "s1-5", big), both.as_slice()),
            (ev("s1", "s1-6", data), both.as_slice()),
        ];
        let posts = posts_per_connection(&addressed);
        let (id, plain) = &posts[0];
        assert_eq!(*id, "plain");
        assert_eq!(plain.len(), 8, "one message per event");
        assert!(plain.iter().all(|m| m["type"] == "streamevent"));
        let items: Vec<&str> = plain
            .iter()
            .map(|m| m["item_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            items,
            [
                "s1-1", "s1-2", "s1-3", "s2-1", "s2-2", "s1-4", "s1-5", "s1-6"
            ]
        );

        let (id, batched) = &posts[1];
        assert_eq!(*id, "batched");
        let shape: Vec<(String, Vec<String>)> = batched
            .iter()
            .map(|m| match m["type"].as_str().unwrap() {
                "streamevents" => (
                    m["group_id"].as_str().unwrap().to_string(),
                    m["events"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| e["item_id"].as_str().unwrap().to_string())
                        .collect(),
                ),
                _ => (
                    format!("alone:{}", m["group_id"].as_str().unwrap()),
                    vec![m["item_id"].as_str().unwrap().to_string()],
                ),
            })
            .collect();
        let expect = |g: &str, items: &[&str]| {
            (
                g.to_string(),
                items.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            shape,
            [
                expect("s1", &["s1-1", "s1-2", "s1-3"]),
                expect("alone:s2", &["s2-1"]),
                expect("alone:s1", &["s1-4"]),
                expect("s1", &["s1-5", "s1-6"]),
            ]
        );
        for m in batched {
            assert!(
                m.to_string().len() < 128 * 1024,
                "fits one WebSocket message"
            );
            let parsed = bus::protocol::parse(&m.to_string()).expect("a protocol message");
            if m["type"] == "streamevents" {
                assert!(matches!(
                    parsed,
                    bus::protocol::Message::StreamEvents { .. }
                ));
            }
        }
    }

    #[test]
    fn an_event_over_one_websocket_message_goes_with_its_largest_fields_omitted() {
        let result = json!({"content": "\"x\"".repeat(100_000)});
        let data = json!({"type": "function_execution_end", "function_call_id": "c1", "is_error": false, "result": result});
        let event = StreamEvent {
            stream: "agent::events",
            group: "s1",
            item: "e7",
            event_type: "create",
            data: &data,
        };
        let m = event.message();
        assert!(
            m.to_string().len() <= MESSAGE_MAX_BYTES,
            "{}",
            m.to_string().len()
        );
        let sent = &m["event"]["data"];
        assert_eq!(sent["function_call_id"], "c1");
        assert_eq!(sent["is_error"], false);
        assert_eq!(
            sent["result"],
            json!({"omitted": {"bytes": result.to_string().len()}})
        );
        assert_eq!(m["item_id"], "e7", "the stored item to read it whole from");
        // What fits goes whole; what has no fields to drop goes as one marker.
        let small = json!({"type": "x", "n": 1});
        assert_eq!(fit_data(&small, 1000), small);
        let text = json!("y".repeat(200_000));
        assert_eq!(
            fit_data(&text, 1000),
            json!({"omitted": {"bytes": 200_002}})
        );
        // Many medium fields: the largest go first, until the rest fits.
        let many: serde_json::Map<String, Value> = (0..40)
            .map(|i| (format!("f{i:02}"), json!("z".repeat(4_000 + i * 10))))
            .collect();
        let fitted = fit_data(&Value::Object(many), 100_000);
        assert!(fitted.to_string().len() <= 100_000);
        assert!(fitted["f39"]["omitted"].is_object() && fitted["f00"].is_string());
    }

    #[test]
    fn a_group_or_all_groups_subscribe() {
        let sub = |c: &str, g: Option<&str>| {
            (
                subscription_id(c, "agent::events", g),
                c.to_string(),
                json!({"connection_id": c, "stream_name": "agent::events", "group_id": g}),
            )
        };
        let subs = vec![
            sub("a", Some("s1")),
            sub("b", None),
            sub("c", Some("s2")),
            sub("a", None),
        ];
        let subscribed = |stream: &str, group: &str| -> Vec<String> {
            subscribed_with_viewers(&subs, stream, group)
                .into_iter()
                .map(|(id, _, _)| id)
                .collect()
        };
        assert_eq!(subscribed("agent::events", "s1"), ["a", "b"]);
        assert_eq!(subscribed("agent::events", "s2"), ["a", "b", "c"]);
        assert!(subscribed("other", "s1").is_empty());
    }
}
