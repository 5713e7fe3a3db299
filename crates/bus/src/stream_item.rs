//! Stream items as requests name them (`{stream_name, group_id, item_id, data}`) and where
//! they are stored: state scope `$stream:<name>`, key `<group>\u{1}<item>`.

use serde_json::Value;

use crate::fields::req_str;
use crate::fields::take_value;
use crate::protocol::{ErrorBody, kind_of};
use crate::state::STREAM_SCOPE_PREFIX;

/// `(state scope, group)` of a stream call; the item key is `<group>\u{1}<item>`.
pub fn stream_addr(data: &Value) -> Result<(String, String), ErrorBody> {
    let name = req_str(data, "stream_name")?;
    let group = req_str(data, "group_id")?;
    if name.is_empty() || group.is_empty() || group.contains('\u{1}') || name.contains('\0') {
        return Err(ErrorBody::invalid(
            "`stream_name` and `group_id` must be non-empty and free of control characters",
        ));
    }
    Ok((format!("{STREAM_SCOPE_PREFIX}{name}"), group))
}

/// The `streamevent` type a stored item is pushed with: `update` when the write replaced an
/// item, else `create`, also when that is not known (`None`: a transaction returns no old
/// images). Every backend's stream writes push by this.
pub fn stored_event_type(existed: Option<bool>) -> &'static str {
    if existed == Some(true) {
        "update"
    } else {
        "create"
    }
}

/// One item of a `stream::set_many` call, checked.
pub struct StreamItem {
    pub stream_name: String,
    /// The state scope and key it is stored under.
    pub scope: String,
    pub key: String,
    pub group_id: String,
    pub item_id: String,
    pub data: Value,
}

/// A request's list of stream items in `field` (`stream::set_many`'s `items`,
/// `state::transact`'s `stream_items`): each `{stream_name, group_id, item_id, data}`, at
/// most `SET_MANY_MAX` of them; an error names the item that is wrong.
pub fn stream_items(data: &mut Value, field: &str) -> Result<Vec<StreamItem>, ErrorBody> {
    let max = crate::state::SET_MANY_MAX;
    let items = match data.get_mut(field).map(Value::take) {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => {
            return Err(ErrorBody::invalid(format!(
                "missing required field `{field}`"
            )));
        }
        Some(other) => {
            return Err(ErrorBody::invalid(format!(
                "field `{field}` must be an array, got {}",
                kind_of(&other)
            )));
        }
    };
    if items.len() > max {
        return Err(ErrorBody::invalid(format!(
            "`{field}` holds {} items; one call writes at most {max}",
            items.len()
        )));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            let at = |e: ErrorBody| ErrorBody::invalid(format!("`{field}[{i}]`: {}", e.message));
            let (scope, group_id) = stream_addr(&item).map_err(at)?;
            let stream_name = req_str(&item, "stream_name").map_err(at)?;
            let item_id = req_str(&item, "item_id").map_err(at)?;
            let data = take_value(&mut item, "data").map_err(at)?;
            crate::state::check_value_depth_of(&data, || format!("`{field}[{i}].data`"))?;
            Ok(StreamItem {
                key: format!("{group_id}\u{1}{item_id}"),
                stream_name,
                scope,
                group_id,
                item_id,
                data,
            })
        })
        .collect()
}
