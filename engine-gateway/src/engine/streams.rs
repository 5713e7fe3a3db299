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
            for w in subscribers {
                self.push(&w, &msg);
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
        for f in functions {
            let engine = engine.clone();
            let payload = payload.clone();
            let parent = parent.clone();
            tokio::spawn(async move {
                if let Err(e) = engine.invoke(&f, payload, &parent, None, None).await {
                    tracing::debug!(function_id = %f, error = %e, "stream trigger handler failed");
                }
            });
        }
    }
}
