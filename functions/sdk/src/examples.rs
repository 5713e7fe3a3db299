//! Example workers, shared by the `echo-worker` binary, the composite entry point, the
//! benchmark and tests.

use crate::{ErrorBody, Worker};
use serde_json::{Value, json};

/// `demo::echo`, `demo::greet`, `demo::chain` (which calls `demo::echo` through the bus),
/// `demo::sleep` and `demo::stream` (frames on a channel, as a provider streams tokens).
pub fn echo_worker() -> Worker {
    Worker::new("echo")
        .function(
            "demo::echo",
            "Answer with the request unchanged.",
            |_ctx, data| async move { Ok(data) },
        )
        .function(
            "demo::greet",
            "Greet `name`.",
            |_ctx, data: Value| async move {
                let name = data
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ErrorBody::invalid("missing required field `name`"))?;
                Ok(json!({ "greeting": format!("Hello, {name}!") }))
            },
        )
        .function(
            "demo::chain",
            "Call demo::echo through the bus and wrap its answer.",
            |ctx, data| async move {
                let inner = ctx.trigger("demo::echo", data).await?;
                Ok(json!({ "via": "demo::chain", "inner": inner }))
            },
        )
        .function(
            "demo::sleep",
            "Wait `ms` milliseconds (at most 60 000), then answer.",
            |_ctx, data: Value| async move {
                let ms = data
                    .get("ms")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    .min(60_000);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                Ok(json!({ "slept_ms": ms }))
            },
        )
        .function(
            "demo::stream",
            "Write `count` text frames (at most 1000) `tok-0`, `tok-1`… to `writer_ref`, `gap_ms` apart, close it, and answer {sent}. Under a Lambda runtime, `crash_after: n` exits the process after n frames.",
            |ctx, data: Value| async move {
                let writer: crate::ChannelRef =
                    serde_json::from_value(data.get("writer_ref").cloned().unwrap_or(Value::Null))
                        .map_err(|e| ErrorBody::invalid(format!("`writer_ref`: {e}")))?;
                let count = data.get("count").and_then(Value::as_u64).unwrap_or(3).min(1000);
                let gap = std::time::Duration::from_millis(
                    data.get("gap_ms").and_then(Value::as_u64).unwrap_or(0).min(1000),
                );
                let crash_after = data.get("crash_after").and_then(Value::as_u64);
                if crash_after.is_some() && !crate::lambda::under_lambda_runtime() {
                    return Err(ErrorBody::invalid(
                        "`crash_after` is for Lambda processes only",
                    ));
                }
                let mut w = ctx.open_writer(&writer).await?;
                for i in 0..count {
                    if crash_after == Some(i) {
                        std::process::exit(3);
                    }
                    w.send_text(format!("tok-{i}")).await?;
                    tokio::time::sleep(gap).await;
                }
                w.close().await?;
                Ok(json!({ "sent": count }))
            },
        )
}

/// A worker for queue, state-trigger and secret examples:
/// - `demo::record_step {group, n, fail?}` (queue `demo-steps`, FIFO by `group`): appends `n`
///   to `demo-steps/<group>`; `fail: true` makes it fail;
/// - `demo::audit` (state trigger on scope `demo-watch`): writes `demo-audit/<key>`;
/// - `demo::secret_length {name}`: whether a secret exists and its length (never its value).
pub fn steps_worker() -> Worker {
    Worker::new("steps")
        .function("demo::record_step", "Append a step to its group's list.", |ctx, d: Value| async move {
            let group = d.get("group").and_then(Value::as_str).ok_or_else(|| ErrorBody::invalid("missing required field `group`"))?;
            if d.get("fail").and_then(Value::as_bool) == Some(true) {
                return Err(ErrorBody::new("step_refused", format!("step {} of {group} refused", d["n"])));
            }
            let out = ctx
                .state_update("demo-steps", group, json!([{"type": "append", "path": "seen", "value": d["n"]}]))
                .await?;
            Ok(json!({"seen": out["new_value"]["seen"]}))
        })
        .function("demo::audit", "Record a change seen in scope demo-watch.", |ctx, ev: Value| async move {
            let key = ev.get("key").and_then(Value::as_str).unwrap_or("?").to_string();
            ctx.state_set("demo-audit", &key, json!({"event_type": ev["event_type"], "new_value": ev["new_value"]}))
                .await?;
            Ok(json!({"audited": key}))
        })
        .function("demo::secret_length", "Whether a secret exists and how long it is.", |_ctx, d: Value| async move {
            let name = d.get("name").and_then(Value::as_str).ok_or_else(|| ErrorBody::invalid("missing required field `name`"))?;
            let store = crate::secrets_from_env().await;
            let secret = store
                .get(name)
                .await
                .map_err(|e| ErrorBody::new("storage_error", e.to_string()))?;
            Ok(json!({"found": secret.is_some(), "length": secret.map(|s| s.len())}))
        })
        .trigger(
            "queue",
            "demo::record_step",
            json!({"queue": "demo-steps", "type": "fifo", "message_group_field": "group", "max_retries": 1, "backoff_ms": 100, "visibility_timeout_ms": 5000}),
        )
        .trigger("state", "demo::audit", json!({"scope": "demo-watch"}))
}
