//! How the session worker stores a session's tree, for a caller that writes an append in a
//! transaction of its own (the turn orchestrator carries a batch's results in the record's
//! save: one write instead of two). The session worker answers its index with [`LAYOUT`]
//! (`index_seen.layout`); a caller writes on it only then, so a session worker that stores
//! its tree otherwise is never written behind its back.
//!
//! The append is the session worker's one-transaction append: the index (its `seq` reserved,
//! `last_entry` set) at the version and value it was answered, and each entry absent before.

use crate::contracts::session_tree::{Entry, EntryInput, IndexSeen};
use bus::state::{TRANSACT_MAX_BYTES, TRANSACT_MAX_WRITES, TxWrite, json_len, json_len_bound};
use serde_json::{Value, json};

/// The layout named here, as the session worker answers it in `index_seen.layout`.
pub const LAYOUT: &str = "session-tree/1";
/// `<sid>` → the session's index (its metadata).
pub const INDEX: &str = "session-index";
/// `<sid>/<entry_id>` → [`Entry`].
pub const ENTRIES: &str = "session-entries";

/// `<sid>/<name>` → `{items: [...]}`: a session's inboxes.
pub const INBOX: &str = "session-inbox";
/// The most inboxes one listing of a session's reads (a session has a few).
pub const INBOXES_LISTED: usize = 64;

pub fn entry_key(sid: &str, entry_id: &str) -> String {
    format!("{sid}/{entry_id}")
}

/// The prefix of a session's inbox keys, for one listing of them all.
pub fn inbox_prefix(sid: &str) -> String {
    format!("{sid}/")
}

/// Among a listing of the session's inboxes (`state::list`'s `{key, value}` rows), the first
/// of `names` that holds items → its name and items.
pub fn first_inbox<'a>(
    rows: &[Value],
    sid: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<(String, Vec<Value>)> {
    names.into_iter().find_map(|name| {
        let key = format!("{}{name}", inbox_prefix(sid));
        let items = rows
            .iter()
            .find(|r| r["key"] == key.as_str())
            .and_then(|r| r["value"]["items"].as_array().cloned())
            .unwrap_or_default();
        (!items.is_empty()).then(|| (name.to_string(), items))
    })
}

/// The most entries one carried append writes (with the writer's own in one transaction).
pub const CARRIED_MAX_ENTRIES: usize = 16;
/// The most JSON a carried append's entries hold: a quarter of a transaction, so the writer's
/// own writes fit beside them.
pub const CARRIED_MAX_BYTES: usize = TRANSACT_MAX_BYTES / 4;
/// The most JSON one carried entry holds: well under DynamoDB's 400 KB item. The AWS store
/// keeps a larger value apart (bus-aws `spill`: parts written before the transaction), but a
/// store without that would fail the writer's whole transaction, and the record's save stays
/// small: a larger entry goes through the session worker.
pub const CARRIED_MAX_ENTRY_BYTES: usize = 256 * 1024;

/// Whether every entry of `plan` is small enough to be an item of the writer's transaction
/// ([`CARRIED_MAX_ENTRY_BYTES`]).
pub fn entries_fit_one_item_each(plan: &PlannedAppend) -> bool {
    plan.writes[1..].iter().all(|w| {
        json_len_bound(&w.value) <= CARRIED_MAX_ENTRY_BYTES
            || json_len(&w.value) <= CARRIED_MAX_ENTRY_BYTES
    })
}

/// An append planned on an index: the writes (the index first), the index as written, and the
/// entries.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedAppend {
    pub writes: Vec<TxWrite>,
    pub index: Value,
    pub entries: Vec<Entry>,
}

/// The index an append is written on.
#[derive(Debug, Clone, Copy)]
pub struct Base<'a> {
    pub index: &'a Value,
    pub version: u64,
    /// The transaction also requires the stored index to hold exactly `index` (a caller's
    /// copy, not trusted).
    pub check_value: bool,
}

/// The append of `inputs` after `parent` (`None`: a new root) on `base`. `None` when the
/// index is not an object, its `seq` would overflow, or the entries pass `max_bytes` of JSON
/// (the caller appends otherwise). Entries without an id get `new_id()`, without a timestamp
/// `now`.
pub fn plan_append(
    sid: &str,
    parent: Option<&str>,
    inputs: &[EntryInput],
    base: Base<'_>,
    max_bytes: usize,
    mut new_id: impl FnMut() -> String,
    now: u64,
) -> Option<PlannedAppend> {
    let Base {
        index: base,
        version,
        check_value,
    } = base;
    if inputs.is_empty() || inputs.len() >= TRANSACT_MAX_WRITES {
        return None;
    }
    let mut index = base.clone();
    let obj = index.as_object_mut()?;
    let n = inputs.len() as u64;
    // A caller's index is not trusted to hold a sane `seq` (its transaction would fail, but
    // not before the sum): one that would overflow is not written on.
    let (first, last) = obj
        .get("seq")
        .map_or(Some(0), Value::as_u64)
        .and_then(|seq| Some((seq.checked_add(1)?, seq.checked_add(n)?)))?;
    obj.insert("seq".into(), json!(last));
    obj.insert("updated_at_ms".into(), json!(now));
    let mut writes = vec![TxWrite {
        scope: INDEX.into(),
        key: sid.into(),
        value: Value::Null,
        expected_version: Some(version),
        expected_value: check_value.then(|| base.clone()),
    }];
    let mut entries = Vec::with_capacity(inputs.len());
    // At least the entries' JSON length (`json_len_bound`).
    let mut bound = 0;
    let mut parent_id = parent.map(str::to_string);
    for (i, input) in inputs.iter().enumerate() {
        let entry = Entry {
            id: input.id.clone().unwrap_or_else(&mut new_id),
            parent_id: parent_id.take(),
            timestamp: input.timestamp.unwrap_or(now),
            seq: first + i as u64,
            body: input.body.clone(),
        };
        parent_id = Some(entry.id.clone());
        let value = serde_json::to_value(&entry).ok()?;
        bound += json_len_bound(&value);
        writes.push(TxWrite::new(
            ENTRIES,
            &entry_key(sid, &entry.id),
            value,
            Some(0),
        ));
        entries.push(entry);
    }
    if let Some(last) = entries.last() {
        index["last_entry"] = json!(last.id);
    }
    writes[0].value = index.clone();
    // Exactly only when the bound says it may be over.
    if bound >= max_bytes
        && writes[1..]
            .iter()
            .map(|w| json_len(&w.value))
            .sum::<usize>()
            >= max_bytes
    {
        return None;
    }
    Some(PlannedAppend {
        writes,
        index,
        entries,
    })
}

/// The first of `names` that holds items among the session's inboxes, read with one
/// `state::list` of them → its name and items.
pub async fn read_first_inbox<'a>(
    ctx: &crate::Ctx,
    sid: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<Option<(String, Vec<Value>)>, crate::BusError> {
    let page = ctx
        .state_list_page(INBOX, Some(&inbox_prefix(sid)), None, Some(INBOXES_LISTED))
        .await?;
    let rows = page["items"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    Ok(first_inbox(rows, sid, names))
}

/// Whether `seen` is an index of this layout that an append after `parent` may be written on
/// without reading it: its `last_entry` is the parent (a new root: any).
pub fn carries_after(seen: &IndexSeen, parent: Option<&str>) -> bool {
    seen.layout.as_deref() == Some(LAYOUT)
        && (parent.is_none() || seen.value["last_entry"].as_str() == parent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contracts::session_tree::EntryBody;
    use crate::messages::user_text;

    fn input(id: &str) -> EntryInput {
        EntryInput {
            id: Some(id.into()),
            timestamp: None,
            body: EntryBody::Message {
                message: user_text("hi"),
            },
        }
    }

    #[test]
    fn an_append_reserves_its_seqs_and_names_its_last_entry_in_the_index() {
        let base = json!({"session_id": "s", "seq": 4, "last_entry": "e4"});
        let p = plan_append(
            "s",
            Some("e4"),
            &[input("a"), input("b")],
            Base {
                index: &base,
                version: 7,
                check_value: true,
            },
            CARRIED_MAX_BYTES,
            || unreachable!(),
            100,
        )
        .unwrap();
        assert_eq!(p.index["seq"], 6);
        assert_eq!(p.index["last_entry"], "b");
        assert_eq!(p.writes[0].expected_version, Some(7));
        assert_eq!(p.writes[0].expected_value, Some(base));
        assert_eq!(p.writes[0].value, p.index);
        let keys: Vec<_> = p.writes[1..].iter().map(|w| w.key.as_str()).collect();
        assert_eq!(keys, ["s/a", "s/b"]);
        assert!(p.writes[1..].iter().all(|w| w.expected_version == Some(0)));
        assert_eq!(
            (
                p.entries[0].parent_id.as_deref(),
                p.entries[1].parent_id.as_deref()
            ),
            (Some("e4"), Some("a"))
        );
        assert_eq!((p.entries[0].seq, p.entries[1].seq), (5, 6));
    }

    #[test]
    fn no_plan_on_a_hostile_index_or_past_the_bytes() {
        let plan = |base: Value, max: usize| {
            plan_append(
                "s",
                None,
                &[input("a")],
                Base {
                    index: &base,
                    version: 1,
                    check_value: true,
                },
                max,
                String::new,
                1,
            )
        };
        assert!(plan(json!({"seq": u64::MAX}), CARRIED_MAX_BYTES).is_none());
        assert!(plan(json!({"seq": "3"}), CARRIED_MAX_BYTES).is_none());
        assert!(plan(json!([1]), CARRIED_MAX_BYTES).is_none());
        assert!(plan(json!({"seq": 1}), 10).is_none());
        assert!(plan(json!({"seq": 1}), CARRIED_MAX_BYTES).is_some());
    }

    #[test]
    fn an_entry_too_large_for_one_item_is_not_carried() {
        let base = json!({"seq": 0});
        let big = EntryInput {
            id: Some("big".into()),
            timestamp: None,
            body: EntryBody::Message {
                message: user_text(&"x".repeat(CARRIED_MAX_ENTRY_BYTES)),
            },
        };
        let on = Base {
            index: &base,
            version: 1,
            check_value: true,
        };
        let plan = |inputs: &[EntryInput]| {
            plan_append("s", None, inputs, on, CARRIED_MAX_BYTES, String::new, 1).unwrap()
        };
        assert!(entries_fit_one_item_each(&plan(&[input("a"), input("b")])));
        assert!(!entries_fit_one_item_each(&plan(&[input("a"), big])));
    }

    #[test]
    fn the_first_inbox_with_items_in_the_order_asked() {
        let rows = [
            json!({"key": "s/followup", "value": {"items": ["f"]}}),
            json!({"key": "s/steering", "value": {"items": []}}),
            json!({"key": "t/steering", "value": {"items": ["other session"]}}),
            json!({"key": "s/odd", "value": {"items": "not a list"}}),
        ];
        assert_eq!(
            first_inbox(&rows, "s", ["steering", "followup"]),
            Some(("followup".into(), vec![json!("f")]))
        );
        assert_eq!(first_inbox(&rows, "s", ["steering", "odd"]), None);
        assert_eq!(first_inbox(&[], "s", ["steering"]), None);
    }

    #[test]
    fn only_an_index_of_this_layout_at_the_parent_is_carried_on() {
        let seen = |layout: Option<&str>| IndexSeen {
            value: json!({"last_entry": "e4"}),
            version: 3,
            layout: layout.map(str::to_string),
        };
        assert!(carries_after(&seen(Some(LAYOUT)), Some("e4")));
        assert!(carries_after(&seen(Some(LAYOUT)), None));
        assert!(!carries_after(&seen(Some(LAYOUT)), Some("e3")));
        assert!(!carries_after(&seen(None), Some("e4")));
        assert!(!carries_after(&seen(Some("other/2")), Some("e4")));
    }
}
