//! The `state::*` functions as plain logic over a `StateStore`, so the engine's built-ins and
//! a Lambda talking to DynamoDB directly (the SDK's AWS transport) answer them identically.

use serde_json::{Value, json};

use crate::builtins::{opt_str, opt_u64, req_str};
use crate::protocol::ErrorBody;
use crate::state::{StateStore, UpdateOp, WriteMeta};

pub const FUNCTIONS: &[&str] = &[
    "state::get",
    "state::get_versioned",
    "state::set",
    "state::update",
    "state::delete",
    "state::list",
];

fn value_of(data: &Value, field: &str) -> Result<Value, ErrorBody> {
    data.get(field)
        .cloned()
        .ok_or_else(|| ErrorBody::invalid(format!("missing required field `{field}`")))
}

/// Answer one `state::*` call; `None` when `function_id` is not a state function.
pub async fn call(
    store: &dyn StateStore,
    function_id: &str,
    data: &Value,
    meta: &WriteMeta,
) -> Option<Result<Value, ErrorBody>> {
    let r = match function_id {
        "state::get" => get(store, data, false).await,
        "state::get_versioned" => get(store, data, true).await,
        "state::set" => set(store, data, meta).await,
        "state::update" => update(store, data, meta).await,
        "state::delete" => delete(store, data, meta).await,
        "state::list" => list(store, data).await,
        _ => return None,
    };
    Some(r)
}

async fn get(store: &dyn StateStore, data: &Value, versioned: bool) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let v = store.get(&scope, &key).await?;
    Ok(match (v, versioned) {
        (Some(v), true) => json!({"value": v.value, "version": v.version}),
        (Some(v), false) => v.value,
        (None, _) => Value::Null,
    })
}

async fn set(store: &dyn StateStore, data: &Value, meta: &WriteMeta) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let value = value_of(data, "value")?;
    let expected = opt_u64(data, "expected_version")?;
    let out = store.set(&scope, &key, value, expected, meta).await?;
    Ok(json!({"old_value": out.old_value, "new_value": out.new_value, "version": out.version}))
}

async fn update(
    store: &dyn StateStore,
    data: &Value,
    meta: &WriteMeta,
) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let ops: Vec<UpdateOp> = serde_json::from_value(value_of(data, "ops")?)
        .map_err(|err| ErrorBody::invalid(format!("invalid `ops`: {err}")))?;
    let expected = opt_u64(data, "expected_version")?;
    let out = store.update(&scope, &key, ops, expected, meta).await?;
    Ok(json!({"old_value": out.old_value, "new_value": out.new_value, "version": out.version}))
}

async fn delete(
    store: &dyn StateStore,
    data: &Value,
    meta: &WriteMeta,
) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let expected = opt_u64(data, "expected_version")?;
    let out = store.delete(&scope, &key, expected, meta).await?;
    Ok(json!({"old_value": out.old_value, "deleted": out.old_value.is_some()}))
}

async fn list(store: &dyn StateStore, data: &Value) -> Result<Value, ErrorBody> {
    let scope = req_str(data, "scope")?;
    let prefix = opt_str(data, "prefix")?;
    let entries = store.list(&scope, prefix.as_deref()).await?;
    Ok(json!({"items": entries}))
}
