//! The `state::*` functions as plain logic over a `StateStore`, so the engine's built-ins and
//! a Lambda talking to DynamoDB directly (the SDK's AWS transport) answer them identically.

use serde_json::{Value, json};

use crate::fields::{fields, opt_str, opt_u64, req_str, take_value};
use crate::protocol::ErrorBody;
use crate::protocol::kind_of;
use crate::state::{LIST_PAGE_MAX, StateStore, TxWrite, UpdateOp, WriteMeta, WriteOutcome};
use crate::stream_item::{StreamItem, stream_items};

pub const FUNCTIONS: &[&str] = &[
    "state::get",
    "state::get_versioned",
    "state::set",
    "state::update",
    "state::delete",
    "state::list",
    "state::transact",
    "state::sync",
];

/// `{old_value, new_value, version}`, built by moving the values (`json!` would copy them).
fn outcome_json(out: WriteOutcome) -> Value {
    fields([
        ("old_value", out.old_value.unwrap_or(Value::Null)),
        ("new_value", out.new_value.unwrap_or(Value::Null)),
        ("version", out.version.into()),
    ])
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
        // Stored stream items reach subscribers from the store's change feed here (the
        // engine's built-in pushes them itself).
        "state::transact" => transact(store, &mut data, meta).await.map(|(v, _)| v),
        "state::sync" => store
            .sync()
            .await
            .map(|()| json!({"synced": true}))
            .map_err(Into::into),
        _ => return None,
    };
    Some(r)
}

/// What a state read reaches: one key, or every key under a prefix of a scope. The one
/// definition the engine answers by ([`call`]) and a policy checks (the harness's
/// `policy::check_permissions`), so the two cannot read a request differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateReach {
    Key {
        scope: String,
        key: String,
    },
    /// `prefix` is empty when the request names none: the whole scope.
    Prefix {
        scope: String,
        prefix: String,
    },
}

/// What the read `function_id` with `data` reaches; `None` when it is not a state read.
/// `state::list` reads `prefix` only: a `key` beside it is ignored, as the store ignores it.
pub fn read_reach(function_id: &str, data: &Value) -> Option<Result<StateReach, ErrorBody>> {
    let reach = match function_id {
        "state::get" | "state::get_versioned" => (|| {
            Ok(StateReach::Key {
                scope: req_str(data, "scope")?,
                key: req_str(data, "key")?,
            })
        })(),
        "state::list" => (|| {
            Ok(StateReach::Prefix {
                scope: req_str(data, "scope")?,
                prefix: opt_str(data, "prefix")?.unwrap_or_default(),
            })
        })(),
        _ => return None,
    };
    Some(reach)
}

async fn get(store: &dyn StateStore, data: &Value, versioned: bool) -> Result<Value, ErrorBody> {
    let Some(Ok(StateReach::Key { scope, key })) = read_reach("state::get", data) else {
        return Err(read_reach("state::get", data)
            .and_then(Result::err)
            .unwrap_or_else(|| ErrorBody::invalid("missing required field `key`")));
    };
    let v = store.get(&scope, &key).await?;
    Ok(match (v, versioned) {
        (Some(v), true) => fields([("value", v.value), ("version", v.version.into())]),
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
    let (scope, prefix) = match read_reach("state::list", data) {
        Some(Ok(StateReach::Prefix { scope, prefix })) => (scope, prefix),
        Some(Err(e)) => return Err(e),
        _ => return Err(ErrorBody::invalid("missing required field `scope`")),
    };
    let prefix = (!prefix.is_empty()).then_some(prefix);
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
    // Moved into the answer, not copied through `json!`.
    let items: Vec<Value> = entries
        .into_iter()
        .map(|e| {
            fields([
                ("key", e.key.into()),
                ("value", e.value),
                ("version", e.version.into()),
            ])
        })
        .collect();
    Ok(fields([
        ("items", Value::Array(items)),
        ("next_cursor", json!(next_cursor)),
    ]))
}

/// `state::transact {writes: [{scope, key, value, expected_version?, expected_value?}],
/// stream_items?: [...]}`: every write and every stream item commit together or none does (a
/// version conflict on one names it; `expected_value`: the record holds exactly that value) → `{versions: [version or null, per write], stream_items: n}`, and the
/// stream items written (for the engine to push).
pub async fn transact(
    store: &dyn StateStore,
    data: &mut Value,
    meta: &WriteMeta,
) -> Result<(Value, Vec<StreamItem>), ErrorBody> {
    let mut writes = tx_writes(data)?;
    let mut items = match data.get("stream_items") {
        None | Some(Value::Null) => Vec::new(),
        Some(_) => stream_items(data, "stream_items")?,
    };
    let count = writes.len();
    // The items' data goes into the writes and comes back after the commit, to be pushed.
    writes.extend(items.iter_mut().map(|i| TxWrite {
        scope: i.scope.clone(),
        key: i.key.clone(),
        value: i.data.take(),
        ..TxWrite::default()
    }));
    let mut kept = store.transact_keeping(writes, meta).await?;
    // One per write from every store; a short answer must not panic here either.
    let pushed = kept.split_off(count.min(kept.len()));
    for (item, (_, data)) in items.iter_mut().zip(pushed) {
        item.data = data;
    }
    let versions: Vec<Option<u64>> = kept.into_iter().map(|(version, _)| version).collect();
    let answer = json!({"versions": versions, "stream_items": items.len()});
    Ok((answer, items))
}

/// `state::transact`'s `writes` (may be empty when stream items are given); an error names
/// the write that is wrong.
fn tx_writes(data: &mut Value) -> Result<Vec<TxWrite>, ErrorBody> {
    let writes = match data.get_mut("writes").map(Value::take) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(w)) => w,
        Some(other) => {
            return Err(ErrorBody::invalid(format!(
                "field `writes` must be an array, got {}",
                kind_of(&other)
            )));
        }
    };
    if writes.len() > crate::state::TRANSACT_MAX_WRITES {
        return Err(ErrorBody::invalid(format!(
            "`writes` holds {} writes; one transaction holds at most {}",
            writes.len(),
            crate::state::TRANSACT_MAX_WRITES
        )));
    }
    writes
        .into_iter()
        .enumerate()
        .map(|(i, mut w)| {
            let at = |e: ErrorBody| ErrorBody::invalid(format!("`writes[{i}]`: {}", e.message));
            if !w.is_object() {
                return Err(ErrorBody::invalid(format!(
                    "`writes[{i}]` must be an object, got {}",
                    kind_of(&w)
                )));
            }
            Ok(TxWrite {
                scope: req_str(&w, "scope").map_err(at)?,
                key: req_str(&w, "key").map_err(at)?,
                expected_version: opt_u64(&w, "expected_version").map_err(at)?,
                expected_value: match w.get_mut("expected_value").map(Value::take) {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v),
                },
                value: take_value(&mut w, "value").map_err(at)?,
            })
        })
        .collect()
}
