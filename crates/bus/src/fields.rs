//! Reading a request's fields, with errors that name the field and what it holds, and
//! building an object from fields.

use crate::protocol::{ErrorBody, kind_of};
use serde_json::Value;

/// A required string field, with an error that names it.
pub fn req_str(data: &Value, field: &str) -> Result<String, ErrorBody> {
    match data.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(ErrorBody::invalid(format!(
            "missing required field `{field}`"
        ))),
        Some(other) => Err(ErrorBody::invalid(format!(
            "field `{field}` must be a string, got {}",
            kind_of(other)
        ))),
    }
}

pub fn opt_str(data: &Value, field: &str) -> Result<Option<String>, ErrorBody> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ErrorBody::invalid(format!(
            "field `{field}` must be a string, got {}",
            kind_of(other)
        ))),
    }
}

pub fn opt_u64(data: &Value, field: &str) -> Result<Option<u64>, ErrorBody> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ErrorBody::invalid(format!(
                "field `{field}` must be a non-negative integer, got {}",
                kind_of(v)
            ))
        }),
    }
}

pub fn opt_bool(data: &Value, field: &str) -> Result<Option<bool>, ErrorBody> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ErrorBody::invalid(format!(
            "field `{field}` must be a boolean, got {}",
            kind_of(other)
        ))),
    }
}

/// An object of these fields, built by moving the values in: `json!` would copy a caller's
/// value (it serializes by reference), which for a turn record or an event is a deep copy per
/// call.
pub fn fields<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    let mut map = serde_json::Map::with_capacity(N);
    for (k, v) in pairs {
        map.insert(k.to_string(), v);
    }
    Value::Object(map)
}

/// Take `field` out of a request the caller owns (no copy of a large value).
pub fn take_value(data: &mut Value, field: &str) -> Result<Value, ErrorBody> {
    data.get_mut(field)
        .map(Value::take)
        .ok_or_else(|| ErrorBody::invalid(format!("missing required field `{field}`")))
}
