//! Example workers, shared by the `echo-worker` binary, the composite entry point, the
//! benchmark and tests.

use crate::{ErrorBody, Worker};
use serde_json::{Value, json};

/// `demo::echo`, `demo::greet`, and `demo::chain` (which calls `demo::echo` through the bus).
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
}
