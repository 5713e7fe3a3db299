//! Streams: subscriptions and the fan-out of stream events to subscribers.

use super::*;

impl Engine {
    pub fn stream_subscribe(
        &self,
        worker_id: &str,
        stream_name: &str,
        group_id: Option<&str>,
    ) -> Result<(), ErrorBody> {
        self.principal_of(worker_id)?.may_subscribe(stream_name)?;
        write(&self.stream_subs)
            .entry((stream_name.to_string(), group_id.unwrap_or("*").to_string()))
            .or_default()
            .insert(worker_id.to_string());
        Ok(())
    }

    pub fn stream_unsubscribe(&self, worker_id: &str, stream_name: &str, group_id: Option<&str>) {
        let key = (stream_name.to_string(), group_id.unwrap_or("*").to_string());
        let mut subs = write(&self.stream_subs);
        if let Some(s) = subs.get_mut(&key) {
            s.remove(worker_id);
            if s.is_empty() {
                subs.remove(&key);
            }
        }
    }

    /// Fan a stream event out to subscribed connections and `stream` triggers.
    pub fn emit_stream_event(
        &self,
        stream_name: &str,
        group_id: &str,
        item_id: &str,
        event_type: &str,
        data: &Value,
        parent: &TraceContext,
    ) {
        // The event is built (a copy of `data`) only when someone listens: most stored items
        // (agent::events with no UI attached) have no subscriber and no trigger.
        let event = || StreamEventBody {
            event_type: event_type.to_string(),
            data: data.clone(),
        };
        let subscribers: Vec<String> = {
            let subs = read(&self.stream_subs);
            let mut ids: Vec<String> = Vec::new();
            for g in [group_id, "*"] {
                if let Some(s) = subs.get(&(stream_name.to_string(), g.to_string())) {
                    ids.extend(s.iter().cloned());
                }
            }
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        if !subscribers.is_empty() {
            let msg = Message::StreamEvent {
                stream_name: stream_name.to_string(),
                group_id: group_id.to_string(),
                item_id: item_id.to_string(),
                event: event(),
            };
            // A client sees only its own sessions' events, whatever it subscribed to (a
            // subscription to every session, or one made before the session existed). A
            // push that waits for the owner to be read holds the later ones of its lane, so
            // the subscriber gets the session's events in order.
            let owned = stream_name == crate::access::CLIENT_STREAMS[0];
            for w in subscribers {
                // Only an owned stream's pushes wait for an owner (the others go straight out).
                let lane = owned.then(|| lane_key("push", &w, stream_name, group_id));
                let sees = match &lane {
                    Some(lane) if self.lanes.is_busy(lane) => None,
                    _ => self.subscriber_sees(&w, stream_name, group_id),
                };
                match sees {
                    Some(true) => {
                        self.push(&w, &msg);
                    }
                    Some(false) => {}
                    None => {
                        let Some(engine) = self.arc() else { continue };
                        let lane =
                            lane.unwrap_or_else(|| lane_key("push", &w, stream_name, group_id));
                        let (group, msg) = (group_id.to_string(), msg.clone());
                        let held = self.lanes.run(lane, async move {
                            let owner = engine.session_owner(&group).await;
                            let sees = engine
                                .principal(&w)
                                .is_some_and(|p| p.acting().may_see(&owner));
                            if sees {
                                engine.push(&w, &msg);
                            }
                        });
                        if let Err(full) = held {
                            tracing::warn!(error = %full, "stream push dropped");
                        }
                    }
                }
            }
        }
        let functions: Vec<String> = read(&self.triggers)
            .values()
            .filter_map(|t| match &t.kind {
                TriggerKind::Stream {
                    stream_name: s,
                    group_id: g,
                    item_id: i,
                } if s == stream_name
                    && g.as_deref().is_none_or(|g| g == group_id)
                    && i.as_deref().is_none_or(|i| i == item_id) =>
                {
                    Some(t.reg.function_id.clone())
                }
                _ => None,
            })
            .collect();
        if functions.is_empty() {
            return;
        }
        let Some(engine) = self.arc() else { return };
        // Built by moving one copy of `data` in (`json!` would serialize it node by node).
        let payload = crate::fields::fields([
            ("type", "stream".into()),
            ("stream_name", stream_name.into()),
            ("group_id", group_id.into()),
            ("item_id", item_id.into()),
            (
                "event",
                crate::fields::fields([("type", event_type.into()), ("data", data.clone())]),
            ),
        ]);
        // One lane per trigger and session: a handler gets a session's events in the order
        // they were written, and a slow one holds only its own session's.
        for f in functions {
            let engine = engine.clone();
            let payload = payload.clone();
            let parent = parent.clone();
            let lane = lane_key("trigger", &f, stream_name, group_id);
            let held = self.lanes.run(lane, async move {
                if let Err(e) = engine.invoke(&f, payload, &parent, None, None).await {
                    tracing::debug!(function_id = %f, error = %e, "stream trigger handler failed");
                }
            });
            if let Err(full) = held {
                tracing::warn!(error = %full, "stream trigger event dropped");
            }
        }
    }

    /// How many stream lanes run now (an idle engine has none).
    pub fn stream_lanes_running(&self) -> usize {
        self.lanes.running()
    }
}

fn lane_key(kind: &str, who: &str, stream_name: &str, group_id: &str) -> String {
    // \u{1} is in no group, function or worker id the engine accepts; a stream name holding
    // one could at worst share another's lane, which keeps both orders all the same.
    format!("{kind}\u{1}{who}\u{1}{stream_name}\u{1}{group_id}")
}

impl Engine {
    /// Whether subscriber `worker_id` may get an event of `group_id` on `stream_name`:
    /// `None` when that depends on an owner not known here yet.
    fn subscriber_sees(&self, worker_id: &str, stream_name: &str, group_id: &str) -> Option<bool> {
        if stream_name != crate::access::CLIENT_STREAMS[0] {
            return Some(true);
        }
        let acting = self.principal(worker_id)?.acting();
        if acting.sees_all() {
            return Some(true);
        }
        let owners = read(&self.owners);
        owners.get(group_id).map(|o| acting.is(o))
    }

    /// Remember a session's recorded owner.
    pub fn remember_owner(&self, session_id: &str, owner: Value) {
        if owner.is_null() {
            return;
        }
        let mut owners = write(&self.owners);
        if owners.len() >= MAX_REMEMBERED_OWNERS {
            owners.clear();
        }
        owners.insert(session_id.to_string(), owner);
    }

    /// A session's recorded owner (`null`: none), from memory or the store.
    pub async fn session_owner(&self, session_id: &str) -> Value {
        if let Some(o) = read(&self.owners).get(session_id) {
            return o.clone();
        }
        let stored = self
            .state
            .get(super::OWNERS_SCOPE, session_id)
            .await
            .ok()
            .flatten()
            .map(|v| v.value)
            .unwrap_or(Value::Null);
        self.remember_owner(session_id, stored.clone());
        stored
    }

    /// Whether `principal` may see session `session_id` (a client: only its own).
    pub async fn may_see_session(
        &self,
        principal: &crate::access::Principal,
        session_id: &str,
    ) -> bool {
        let acting = principal.acting();
        acting.sees_all() || acting.is(&self.session_owner(session_id).await)
    }
}

/// Most session owners the engine remembers (then it forgets them all and reads again).
const MAX_REMEMBERED_OWNERS: usize = 100_000;
