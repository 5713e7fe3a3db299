//! Values too large for one DynamoDB item, stored apart.
//!
//! DynamoDB refuses an item over 400 KB, and with it a whole transaction. A value whose JSON
//! text is over [`INLINE_MAX`] bytes is written first as parts of at most [`PART_BYTES`],
//! each an item of the partition `$parts/{generation}` (keys `0`, `1`…, the bytes in the
//! binary attribute `b`); the record's own item then holds `pg` (the generation), `np` (how
//! many parts) and `vh` (the text's SHA-256, for an `expected_value`) where an inline record
//! holds `value`. A generation is random and its parts are never rewritten, so whoever reads
//! a record's item finds its parts whole; and each generation is a partition of its own, so
//! large writes spread over the table rather than heating one partition.
//!
//! Parts are born marked to expire ([`EXPIRES`], the table's TTL attribute, a little over a
//! day later), and the write of the record's item that points to them takes the mark off in
//! the same transaction ([`claims`]), while it marks the parts of the value it replaces
//! ([`retirements`]). So parts no record points to are always marked, whatever step a writer
//! dies at: before its record's write (its parts were never claimed) or after it (nothing is
//! left to do). Marked parts are not deleted at once: a stream record (kept 24 hours) still
//! reads the value its image names.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

use bus::state::{StateError, Versioned};

type Item = HashMap<String, AttributeValue>;

/// Values whose JSON text is longer than this are stored apart (DynamoDB's item is 400 KB,
/// its attribute names and the record's other attributes included).
pub const INLINE_MAX: usize = 300 * 1024;
/// The most bytes one part holds.
pub const PART_BYTES: usize = 350 * 1024;
/// The longest value (its JSON text) this store holds: 24 parts.
pub const MAX_VALUE_BYTES: usize = 8 * 1024 * 1024;
/// The partition prefix of parts; `$` scopes reach no state trigger.
pub const PARTS_SCOPE: &str = "$parts/";
/// The table's TTL attribute (epoch seconds), set on parts no record points to.
pub const EXPIRES: &str = "expires";
/// How long parts no record points to stay readable: a stream record's 24 hours and an hour.
const RETIRED_FOR_SECS: u64 = 25 * 3600;

/// The attributes of a record's item that say where its parts are.
pub const GENERATION: &str = "pg";
pub const COUNT: &str = "np";
pub const DIGEST: &str = "vh";

/// A value as one write stores it.
pub enum Body {
    /// The JSON text, in the item's `value`.
    Inline(String),
    /// The JSON text in parts, their generation drawn for this write.
    Apart {
        parts: Parts,
        digest: String,
        text: String,
    },
}

/// Where a record's parts are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parts {
    pub generation: String,
    pub count: usize,
    /// The value's text's SHA-256 (`vh`), checked when the parts are read.
    pub digest: Option<String>,
}

impl Parts {
    fn scope(&self) -> String {
        format!("{PARTS_SCOPE}{}", self.generation)
    }
}

/// The SHA-256 of a value's JSON text, as stored in `vh`.
pub fn digest(text: &str) -> String {
    bus::hash::hex(&Sha256::digest(text.as_bytes()))
}

impl Body {
    /// How `value` is stored, or why it cannot be.
    pub fn of(value: &Value) -> Result<Self, StateError> {
        let text = value.to_string();
        if text.len() <= INLINE_MAX {
            return Ok(Self::Inline(text));
        }
        if text.len() > MAX_VALUE_BYTES {
            return Err(StateError::Invalid(format!(
                "the value is {} bytes of JSON; the DynamoDB store holds at most {MAX_VALUE_BYTES}",
                text.len()
            )));
        }
        let digest = digest(&text);
        Ok(Self::Apart {
            parts: Parts {
                generation: bus_telemetry::trace::random_hex(16),
                count: text.len().div_ceil(PART_BYTES),
                digest: Some(digest.clone()),
            },
            digest,
            text,
        })
    }

    /// The JSON text's length.
    pub fn text_len(&self) -> usize {
        match self {
            Self::Inline(text) | Self::Apart { text, .. } => text.len(),
        }
    }

    /// The items a write of this value takes in a transaction: its record's, and a claim on
    /// each of its parts ([`claims`]).
    pub fn transaction_items(&self) -> usize {
        1 + self.parts().map_or(0, |p| p.count)
    }

    /// The parts this write makes, if any.
    pub fn parts(&self) -> Option<&Parts> {
        match self {
            Self::Inline(_) => None,
            Self::Apart { parts, .. } => Some(parts),
        }
    }

    /// The attributes of the record's item that hold the value (or point to it).
    pub fn attributes(&self) -> Vec<(&'static str, AttributeValue)> {
        match self {
            Self::Inline(text) => vec![("value", AttributeValue::S(text.clone()))],
            Self::Apart { parts, digest, .. } => vec![
                (GENERATION, AttributeValue::S(parts.generation.clone())),
                (COUNT, AttributeValue::N(parts.count.to_string())),
                (DIGEST, AttributeValue::S(digest.clone())),
            ],
        }
    }

    /// The attributes an update of the item removes: those of the other way of storing.
    pub fn cleared(&self) -> &'static [&'static str] {
        match self {
            Self::Inline(_) => &[GENERATION, COUNT, DIGEST],
            Self::Apart { .. } => &["value"],
        }
    }
}

/// A record's item, read: its value inline, or where its parts are.
pub enum Head {
    Inline(Versioned),
    Apart { version: u64, parts: Parts },
}

impl Head {
    pub fn version(&self) -> u64 {
        match self {
            Self::Inline(v) => v.version,
            Self::Apart { version, .. } => *version,
        }
    }

    pub fn parts(&self) -> Option<&Parts> {
        match self {
            Self::Inline(_) => None,
            Self::Apart { parts, .. } => Some(parts),
        }
    }
}

fn storage(e: impl std::fmt::Display) -> StateError {
    StateError::Storage(e.to_string())
}

/// Where the parts are, from a record's `pg`, `np` and `vh` (text, as any image holds them).
pub fn parts_of(
    generation: Option<&str>,
    count: Option<&str>,
    digest: Option<&str>,
) -> Result<Option<Parts>, StateError> {
    let (Some(generation), Some(count)) = (generation, count) else {
        return Ok(None);
    };
    let count: usize = count
        .parse()
        .map_err(|_| storage(format!("corrupt part count `{count}`")))?;
    if generation.is_empty()
        || !generation.bytes().all(|b| b.is_ascii_hexdigit())
        || count == 0
        || count > MAX_VALUE_BYTES.div_ceil(PART_BYTES)
    {
        return Err(storage(format!("corrupt parts `{generation}` × {count}")));
    }
    Ok(Some(Parts {
        generation: generation.to_string(),
        count,
        digest: digest.map(str::to_owned),
    }))
}

/// Where a stream image's parts are (the Lambda event's JSON form of an item).
pub fn parts_in_json_image(image: &Value) -> Result<Option<Parts>, StateError> {
    parts_of(
        image[GENERATION]["S"].as_str(),
        image[COUNT]["N"].as_str(),
        image[DIGEST]["S"].as_str(),
    )
}

/// A record's item in a Lambda event's JSON form, as a stream record's image shows it (the
/// string, number and string-set attributes a record's item holds; the inverse of what
/// [`parts_in_json_image`] reads).
pub fn json_image(item: &Item) -> Value {
    let attributes = item.iter().filter_map(|(name, v)| {
        let v = match v {
            AttributeValue::S(s) => serde_json::json!({"S": s}),
            AttributeValue::N(n) => serde_json::json!({"N": n}),
            AttributeValue::Ss(ss) => serde_json::json!({"SS": ss}),
            _ => return None,
        };
        Some((name.clone(), v))
    });
    Value::Object(attributes.collect())
}

/// Whether a stream image (the Lambda event's JSON form) points to parts.
pub fn json_image_is_apart(image: &Value) -> bool {
    image.get("value").is_none() && image.get(GENERATION).is_some()
}

/// An image's value (the Lambda event's JSON form of an item): inline, or read from its
/// parts.
pub async fn json_image_value(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    image: &Value,
) -> Result<Option<Value>, StateError> {
    if let Some(text) = image["value"]["S"].as_str() {
        return Ok(serde_json::from_str(text).ok());
    }
    match parts_in_json_image(image)? {
        Some(parts) => read_parts(ddb, table, &parts).await.map(Some),
        None => Ok(None),
    }
}

/// A stream record's values (old, new) when an image of it points to parts (`None` when
/// neither does: its images hold their values).
pub async fn json_record_values(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    record: &Value,
) -> Result<Option<(Option<Value>, Option<Value>)>, StateError> {
    let (old, new) = (&record["OldImage"], &record["NewImage"]);
    if !json_image_is_apart(old) && !json_image_is_apart(new) {
        return Ok(None);
    }
    Ok(Some((
        json_image_value(ddb, table, old).await?,
        json_image_value(ddb, table, new).await?,
    )))
}

/// Read a record's item (also a stream image's): `None` when it holds no value.
pub fn decode_head(item: &Item) -> Result<Option<Head>, StateError> {
    let version = match item.get("version") {
        Some(AttributeValue::N(n)) => n.parse().map_err(|_| storage("corrupt version"))?,
        _ => 0,
    };
    if let Some(AttributeValue::S(text)) = item.get("value") {
        let value: Value =
            serde_json::from_str(text).map_err(|e| storage(format!("corrupt value: {e}")))?;
        return Ok(Some(Head::Inline(Versioned { value, version })));
    }
    let text = |name: &str| match item.get(name) {
        Some(AttributeValue::S(s)) => Some(s.as_str()),
        Some(AttributeValue::N(n)) => Some(n.as_str()),
        _ => None,
    };
    Ok(parts_of(text(GENERATION), text(COUNT), text(DIGEST))?
        .map(|parts| Head::Apart { version, parts }))
}

/// When parts marked now expire (epoch seconds).
fn retired_at() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + RETIRED_FOR_SECS
}

/// Write `body`'s parts (before the record's item that points to them); nothing for an
/// inline value. They are born marked to expire: until a write of the record claims them,
/// nothing points to them (and a writer that dies here leaves nothing unmarked).
pub async fn write_parts(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    body: &Body,
) -> Result<(), StateError> {
    let Body::Apart { parts, text, .. } = body else {
        return Ok(());
    };
    let expires = AttributeValue::N(retired_at().to_string());
    let mut writes = tokio::task::JoinSet::new();
    for (i, chunk) in text.as_bytes().chunks(PART_BYTES).enumerate() {
        let put = ddb
            .put_item()
            .table_name(table)
            .item("scope", AttributeValue::S(parts.scope()))
            .item("key", AttributeValue::S(i.to_string()))
            .item("b", AttributeValue::B(Blob::new(chunk.to_vec())))
            .item(EXPIRES, expires.clone());
        writes.spawn(async move { put.send().await.map_err(|e| storage(crate::err_text(&e))) });
    }
    let mut failed = None;
    while let Some(done) = writes.join_next().await {
        if let Err(e) = done.map_err(storage).and_then(|r| r.map(|_| ())) {
            failed.get_or_insert(e);
        }
    }
    match failed {
        None => Ok(()),
        Some(e) => Err(StateError::Storage(format!("a part of a large value: {e}"))),
    }
}

/// One transaction `Update` per part of `parts`, each on the part's key with `#e` naming
/// the mark, finished by `finish`.
fn part_updates(
    table: &str,
    parts: &Parts,
    finish: impl Fn(UpdateBuilder) -> UpdateBuilder,
) -> Result<Vec<TransactWriteItem>, StateError> {
    (0..parts.count)
        .map(|i| {
            let update = Update::builder()
                .table_name(table)
                .key("scope", AttributeValue::S(parts.scope()))
                .key("key", AttributeValue::S(i.to_string()))
                .expression_attribute_names("#e", EXPIRES);
            let update = finish(update).build().map_err(storage)?;
            Ok(TransactWriteItem::builder().update(update).build())
        })
        .collect()
}

/// The updates that take the mark off `parts` (each only if it is still there), for the
/// transaction that makes a record point to them.
pub fn claims(table: &str, parts: &Parts) -> Result<Vec<TransactWriteItem>, StateError> {
    part_updates(table, parts, |update| {
        update
            .update_expression("REMOVE #e")
            .condition_expression("attribute_exists(#k)")
            .expression_attribute_names("#k", "key")
    })
}

/// The updates that mark `parts` to expire, for the transaction that makes their record
/// point elsewhere (or deletes it). Unconditional: a part already gone leaves a stub that
/// expires with the mark, rather than a record nobody could write again.
pub fn retirements(table: &str, parts: &Parts) -> Result<Vec<TransactWriteItem>, StateError> {
    let at = AttributeValue::N(retired_at().to_string());
    part_updates(table, parts, |update| {
        update
            .update_expression("SET #e = :e")
            .expression_attribute_values(":e", at.clone())
    })
}

/// The value whose parts these are.
pub async fn read_parts(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    parts: &Parts,
) -> Result<Value, StateError> {
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..parts.count {
        let get = ddb
            .get_item()
            .table_name(table)
            .key("scope", AttributeValue::S(parts.scope()))
            .key("key", AttributeValue::S(i.to_string()))
            .consistent_read(true);
        reads.spawn(async move {
            let out = get.send().await.map_err(|e| storage(crate::err_text(&e)))?;
            match out.item().and_then(|item| item.get("b")) {
                Some(AttributeValue::B(b)) => Ok((i, b.clone().into_inner())),
                _ => Err(storage(format!("part {i} is missing"))),
            }
        });
    }
    let mut chunks = vec![Vec::new(); parts.count];
    while let Some(done) = reads.join_next().await {
        let (i, bytes) = done.map_err(storage)??;
        chunks[i] = bytes;
    }
    let text = chunks.concat();
    if let Some(want) = &parts.digest
        && bus::hash::hex(&Sha256::digest(&text)) != *want
    {
        return Err(storage(format!(
            "the value stored apart as {} × {} does not match its digest",
            parts.generation, parts.count
        )));
    }
    serde_json::from_slice(&text).map_err(|e| {
        storage(format!(
            "the value stored apart as {} × {} is corrupt: {e}",
            parts.generation, parts.count
        ))
    })
}

/// Mark parts no record points to any more to expire, after the write that left them (only
/// where a transaction had no room for their [`retirements`]). Best effort: a part left
/// unmarked is only space.
pub async fn retire(ddb: &aws_sdk_dynamodb::Client, table: &str, parts: &Parts) {
    let at = retired_at();
    let mut marks = tokio::task::JoinSet::new();
    for i in 0..parts.count {
        let mark = ddb
            .update_item()
            .table_name(table)
            .key("scope", AttributeValue::S(parts.scope()))
            .key("key", AttributeValue::S(i.to_string()))
            .update_expression("SET #e = :e")
            .condition_expression("attribute_exists(#k)")
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_names("#k", "key")
            .expression_attribute_values(":e", AttributeValue::N(at.to_string()));
        marks.spawn(async move { mark.send().await.map_err(|e| crate::err_text(&e)) });
    }
    while let Some(done) = marks.join_next().await {
        if let Ok(Err(e)) = done
            && !e.contains("ConditionalCheckFailed")
        {
            tracing::warn!(generation = %parts.generation, error = %e, "parts not marked to expire");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_value_is_stored_inline_up_to_the_limit_and_apart_past_it() {
        let small = json!({"text": "x".repeat(INLINE_MAX - 20)});
        assert!(matches!(Body::of(&small).unwrap(), Body::Inline(_)));
        assert_eq!(Body::of(&small).unwrap().transaction_items(), 1);
        let large = json!({"text": "é".repeat(INLINE_MAX)});
        let body = Body::of(&large).unwrap();
        let parts = body.parts().unwrap().clone();
        assert_eq!(parts.count, body.text_len().div_ceil(PART_BYTES));
        assert_eq!(parts.generation.len(), 32);
        assert_eq!(body.transaction_items(), 1 + parts.count);
        let attrs: Vec<_> = body.attributes().into_iter().map(|(n, _)| n).collect();
        assert_eq!(attrs, [GENERATION, COUNT, DIGEST]);
        assert_eq!(body.cleared(), ["value"]);
    }

    #[test]
    fn a_value_over_the_most_the_store_holds_is_refused_with_its_size() {
        let huge = json!("y".repeat(MAX_VALUE_BYTES));
        let err = Body::of(&huge).err().unwrap().to_string();
        assert!(err.contains(&format!("{}", MAX_VALUE_BYTES + 2)), "{err}");
        assert!(err.contains("at most"), "{err}");
    }

    #[test]
    fn a_head_reads_its_value_or_where_its_parts_are_and_refuses_corrupt_pointers() {
        let inline = Item::from([
            ("value".to_string(), AttributeValue::S("{\"a\":1}".into())),
            ("version".to_string(), AttributeValue::N("7".into())),
        ]);
        assert!(matches!(decode_head(&inline).unwrap(), Some(Head::Inline(v)) if v.version == 7));
        let apart = Item::from([
            (GENERATION.to_string(), AttributeValue::S("ab12".into())),
            (COUNT.to_string(), AttributeValue::N("3".into())),
            ("version".to_string(), AttributeValue::N("8".into())),
        ]);
        let head = decode_head(&apart).unwrap().unwrap();
        assert_eq!(head.version(), 8);
        assert_eq!(head.parts().unwrap().count, 3);
        for (generation, count) in [("ab12", "0"), ("ab12", "1000"), ("../x", "1"), ("ab", "-1")] {
            assert!(
                parts_of(Some(generation), Some(count), None).is_err(),
                "{generation} {count}"
            );
        }
        assert!(decode_head(&Item::new()).unwrap().is_none());
        let image = json!({"pg": {"S": "ff"}, "np": {"N": "2"}, "vh": {"S": "ab"}});
        assert_eq!(
            parts_in_json_image(&image).unwrap(),
            Some(Parts {
                generation: "ff".into(),
                count: 2,
                digest: Some("ab".into()),
            })
        );
    }
}
