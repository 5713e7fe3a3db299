//! The `state::*` functions as plain logic over a `StateStore`, so the engine's built-ins and
//! a Lambda talking to DynamoDB directly (the SDK's AWS transport) answer them identically.

use serde_json::{Map, Value, json};

use crate::fields::{opt_str, opt_u64, req_str};
use crate::protocol::ErrorBody;
use crate::state::{LIST_PAGE_MAX, StateStore, UpdateOp, WriteMeta, WriteOutcome};

pub const FUNCTIONS: &[&str] = &[
    "state::get",
    "state::get_versioned",
    "state::set",
    "state::update",
    "state::delete",
    "state::list",
];

/// Take `field` out of a request the caller owns (no copy of a large value).
pub(crate) fn take_value(data: &mut Value, field: &str) -> Result<Value, ErrorBody> {
    data.get_mut(field)
        .map(Value::take)
        .ok_or_else(|| ErrorBody::invalid(format!("missing required field `{field}`")))
}

/// `{old_value, new_value, version}`, built by moving the values (`json!` would copy them).
fn outcome_json(out: WriteOutcome) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("old_value".into(), out.old_value.unwrap_or(Value::Null));
    m.insert("new_value".into(), out.new_value.unwrap_or(Value::Null));
    m.insert("version".into(), Value::from(out.version));
    Value::Object(m)
}

/// Answer one `state::*` call; `None` when `function_id` is not a state function.
pub async fn call(
    store: &dyn StateStore,
    function_id: &str,
    mut data: Value,
    meta: &WriteMeta,
) -> Option<Result<Value, ErrorBody>> {
    let r = match function_id {
        "state::get" => get(store, &data, false).await,
        "state::get_versioned" => get(store, &data, true).await,
        "state::set" => set(store, &mut data, meta).await,
        "state::update" => update(store, &mut data, meta).await,
        "state::delete" => delete(store, &data, meta).await,
        "state::list" => list(store, &data).await,
        _ => return None,
    };
    Some(r)
}

async fn get(store: &dyn StateStore, data: &Value, versioned: bool) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let v = store.get(&scope, &key).await?;
    Ok(match (v, versioned) {
        (Some(v), true) => {
            let mut m = Map::with_capacity(2);
            m.insert("value".into(), v.value);
            m.insert("version".into(), Value::from(v.version));
            Value::Object(m)
        }
        (Some(v), false) => v.value,
        (None, _) => Value::Null,
    })
}

async fn set(
    store: &dyn StateStore,
    data: &mut Value,
    meta: &WriteMeta,
) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let expected = opt_u64(data, "expected_version")?;
    let value = take_value(data, "value")?;
    crate::state::check_value_depth("`value`", &value)?;
    let out = store.set(&scope, &key, value, expected, meta).await?;
    Ok(outcome_json(out))
}

async fn update(
    store: &dyn StateStore,
    data: &mut Value,
    meta: &WriteMeta,
) -> Result<Value, ErrorBody> {
    let (scope, key) = (req_str(data, "scope")?, req_str(data, "key")?);
    let expected = opt_u64(data, "expected_version")?;
    let ops: Vec<UpdateOp> = serde_json::from_value(take_value(data, "ops")?)
        .map_err(|err| ErrorBody::invalid(format!("invalid `ops`: {err}")))?;
    let out = store.update(&scope, &key, ops, expected, meta).await?;
    Ok(outcome_json(out))
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

/// One page: `limit` (default and most [`LIST_PAGE_MAX`]) records after `cursor`;
/// `next_cursor` is set when more follow.
async fn list(store: &dyn StateStore, data: &Value) -> Result<Value, ErrorBody> {
    let scope = req_str(data, "scope")?;
    let prefix = opt_str(data, "prefix")?;
    let cursor = opt_str(data, "cursor")?;
    let limit = match opt_u64(data, "limit")? {
        None => LIST_PAGE_MAX,
        Some(0) => return Err(ErrorBody::invalid("`limit` must be at least 1")),
        Some(n) => (n as usize).min(LIST_PAGE_MAX),
    };
    let (entries, more) = store
        .list_page(&scope, prefix.as_deref(), cursor.as_deref(), limit)
        .await?;
    let next_cursor = more
        .then(|| entries.last().map(|e| e.key.clone()))
        .flatten();
    Ok(json!({"items": entries, "next_cursor": next_cursor}))
}
