//! `StateStore` on DynamoDB. Item: `scope` (hash), `key` (range), `value` (the JSON as a
//! string; a value over DynamoDB's item size is stored apart and the item says where, see
//! [`super::spill`]), `version` (number), and the writer's `tp`/`bg` trace context so the
//! stream record that fires a trigger continues the writer's trace.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use serde_json::Value;
use std::collections::HashMap;

use super::spill::{self, Body, Head, Parts, decode_head};
use super::{AwsClients, AwsNames, err_code, err_text};
use transactions::{TRANSACT_MAX_BYTES, TRANSACT_MAX_ITEMS, TxItem, TxRefused};

mod transactions;
use bus::state::{
    Entry, FILLED_FIELDS_ATTRIBUTE, StateError, StateStore, TxWrite, UpdateOp, Versioned,
    WriteMeta, WriteOutcome, apply_ops, check_expected, check_transaction, filled_fields,
    next_version, validate_address,
};

/// How often a `state::update` retries after losing a race to another writer.
const UPDATE_RETRIES: usize = 64;

pub struct DynamoState {
    clients: AwsClients,
    table: String,
}

type Item = HashMap<String, AttributeValue>;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

/// The value's filled fields as a string set (`bus::state::filled_fields`); `None` when there
/// are none (a set cannot be empty).
fn filled_set(value: &Value) -> Option<AttributeValue> {
    let filled = filled_fields(value);
    (!filled.is_empty())
        .then(|| AttributeValue::Ss(filled.into_iter().map(str::to_owned).collect()))
}

fn storage(e: impl std::fmt::Display) -> StateError {
    StateError::Storage(e.to_string())
}

/// The update expression of an unconditional write: the value, the version bumped from
/// wherever it is (or from just before a new record's first), and the writer's trace context.
struct UnconditionalSet {
    /// The version just before a new record's first (the wall clock: read once).
    before_first: u64,
    expression: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl UnconditionalSet {
    fn new(value: &Value, body: &Body, meta: &WriteMeta) -> Self {
        let before_first = next_version(None) - 1;
        let mut names = HashMap::from([("#ver".to_string(), "version".to_string())]);
        let mut values = HashMap::from([
            (
                ":before_first".to_string(),
                AttributeValue::N(before_first.to_string()),
            ),
            (":one".to_string(), AttributeValue::N("1".into())),
        ]);
        let mut set = vec!["#ver = if_not_exists(#ver, :before_first) + :one".to_string()];
        let mut remove = Vec::new();
        // The value (or where its parts are), and none of the other way of storing it.
        for (i, (name, attribute)) in body.attributes().into_iter().enumerate() {
            names.insert(format!("#b{i}"), name.into());
            values.insert(format!(":b{i}"), attribute);
            set.push(format!("#b{i} = :b{i}"));
        }
        for (i, name) in body.cleared().iter().enumerate() {
            names.insert(format!("#c{i}"), (*name).into());
            remove.push(format!("#c{i}"));
        }
        // The filled fields, for filters on the table's stream; gone when none are.
        names.insert("#fl".into(), FILLED_FIELDS_ATTRIBUTE.into());
        if let Some(filled) = filled_set(value) {
            values.insert(":fl".into(), filled);
            set.push("#fl = :fl".into());
        } else {
            remove.push("#fl".into());
        }
        if let Some(tp) = &meta.traceparent {
            names.insert("#tp".into(), "tp".into());
            values.insert(":tp".into(), s(tp));
            set.push("#tp = :tp".into());
        }
        if let Some(bg) = &meta.baggage {
            names.insert("#bg".into(), "bg".into());
            values.insert(":bg".into(), s(bg));
            set.push("#bg = :bg".into());
        }
        Self {
            before_first,
            expression: format!("SET {} REMOVE {}", set.join(", "), remove.join(", ")),
            names,
            values,
        }
    }
}

/// A Put of `value` at `version`, conditional on the record being at `current` (None: absent),
/// with the writer's trace context: the same for a `PutItem` and a transaction's item.
struct ConditionalPut {
    item: Item,
    condition: &'static str,
    names: HashMap<String, String>,
    values: Option<HashMap<String, AttributeValue>>,
}

impl ConditionalPut {
    fn new(
        scope: &str,
        key: &str,
        value: &Value,
        body: &Body,
        version: u64,
        current: Option<u64>,
        meta: &WriteMeta,
    ) -> Self {
        let mut item = Item::from([
            ("scope".to_string(), s(scope)),
            ("key".to_string(), s(key)),
            (
                "version".to_string(),
                AttributeValue::N(version.to_string()),
            ),
        ]);
        for (name, attribute) in body.attributes() {
            item.insert(name.into(), attribute);
        }
        if let Some(filled) = filled_set(value) {
            item.insert(FILLED_FIELDS_ATTRIBUTE.into(), filled);
        }
        if let Some(tp) = &meta.traceparent {
            item.insert("tp".into(), s(tp));
        }
        if let Some(bg) = &meta.baggage {
            item.insert("bg".into(), s(bg));
        }
        match current {
            None => Self {
                item,
                condition: "attribute_not_exists(#k)",
                names: HashMap::from([("#k".to_string(), "key".to_string())]),
                values: None,
            },
            Some(v) => Self {
                item,
                condition: "#v = :v",
                names: HashMap::from([("#v".to_string(), "version".to_string())]),
                values: Some(HashMap::from([(
                    ":v".to_string(),
                    AttributeValue::N(v.to_string()),
                )])),
            },
        }
    }
}

impl DynamoState {
    pub fn new(clients: AwsClients, names: &AwsNames) -> Self {
        Self {
            clients,
            table: names.state_table(),
        }
    }

    /// A record's item as stored (a consistent read): its value inline, or where its parts
    /// are, not read. What a stream record's image of it shows.
    pub async fn stored_item(&self, scope: &str, key: &str) -> Result<Option<Item>, StateError> {
        let out = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key("scope", s(scope))
            .key("key", s(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| storage(err_text(&e)))?;
        Ok(out.item)
    }

    /// A record's item as stored: its value inline, or where its parts are.
    async fn read_head(&self, scope: &str, key: &str) -> Result<Option<Head>, StateError> {
        match self.stored_item(scope, key).await? {
            Some(item) => decode_head(&item),
            None => Ok(None),
        }
    }

    /// A record's item as a write over it sees it: as [`Self::read_head`], except that a
    /// pointer to parts that cannot be read as one (changed behind the store's back) is kept
    /// as it is, with no parts to mark, so the record can still be overwritten or deleted
    /// (guarded on that pointer) rather than refuse every write.
    async fn head_to_write_over(&self, scope: &str, key: &str) -> Result<Option<Head>, StateError> {
        let Some(item) = self.stored_item(scope, key).await? else {
            return Ok(None);
        };
        match decode_head(&item) {
            Ok(head) => Ok(head),
            Err(e) => {
                let (Some(AttributeValue::S(generation)), Some(AttributeValue::N(version))) =
                    (item.get(spill::GENERATION), item.get("version"))
                else {
                    return Err(e);
                };
                let version = version.parse().map_err(|_| storage("corrupt version"))?;
                tracing::warn!(%scope, %key, error = %e, "a corrupt parts pointer is written over");
                Ok(Some(Head::Apart {
                    version,
                    parts: Parts {
                        generation: generation.clone(),
                        count: 0,
                        digest: None,
                    },
                }))
            }
        }
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError> {
        match self.read_head(scope, key).await? {
            Some(head) => Ok(Some(self.resolve(head).await?)),
            None => Ok(None),
        }
    }

    async fn version_of(&self, scope: &str, key: &str) -> Result<Option<u64>, StateError> {
        Ok(self
            .head_to_write_over(scope, key)
            .await?
            .map(|h| h.version()))
    }

    /// The value of a record's item, its parts read when it is stored apart.
    async fn resolve(&self, head: Head) -> Result<Versioned, StateError> {
        match head {
            Head::Inline(v) => Ok(v),
            Head::Apart { version, parts } => Ok(Versioned {
                value: self.read_parts(&parts).await?,
                version,
            }),
        }
    }

    /// The value stored apart in these parts.
    async fn read_parts(&self, parts: &Parts) -> Result<Value, StateError> {
        spill::read_parts(&self.clients.dynamodb, &self.table, parts).await
    }

    async fn write_parts(&self, body: &Body) -> Result<(), StateError> {
        spill::write_parts(&self.clients.dynamodb, &self.table, body).await
    }

    async fn retire(&self, parts: &Parts) {
        spill::retire(&self.clients.dynamodb, &self.table, parts).await;
    }

    /// What a one-item write replaced, from its old image. Those writes carry
    /// `attribute_not_exists(pg)` (a record stored apart goes through a transaction, which
    /// marks its parts), so the image holds its value inline; were it ever to point to
    /// parts, the old value is given as null rather than failing a write that happened.
    fn replaced(old: Option<&Item>) -> Result<Option<Versioned>, StateError> {
        let head = old.filter(|i| !i.is_empty()).map(decode_head).transpose()?;
        Ok(match head.flatten() {
            None => None,
            Some(Head::Inline(v)) => Some(v),
            Some(Head::Apart { version, .. }) => Some(Versioned {
                value: Value::Null,
                version,
            }),
        })
    }

    fn conflict(scope: &str, key: &str, expected: u64, found: Option<u64>) -> StateError {
        StateError::VersionConflict {
            scope: scope.into(),
            key: key.into(),
            expected,
            found,
        }
    }

    /// Write `value` at the next version only if the record is still at `current`
    /// (None = absent). `Ok(None)` means another writer got there first. The old value's
    /// parts are read only when `want_old`.
    async fn put_if(
        &self,
        scope: &str,
        key: &str,
        value: &Value,
        current: Option<u64>,
        meta: &WriteMeta,
        want_old: bool,
    ) -> Result<Option<(Option<Versioned>, u64)>, StateError> {
        let body = Body::of(value)?;
        let new_version = next_version(current);
        if body.parts().is_none() {
            // Inline over inline: one PutItem, which hands back the old item. It is refused
            // over a record stored apart, whose parts are marked in the write's transaction.
            let put = ConditionalPut::new(scope, key, value, &body, new_version, current, meta);
            let mut names = put.names;
            names.insert("#pg".into(), spill::GENERATION.into());
            let req = self
                .clients
                .dynamodb
                .put_item()
                .table_name(&self.table)
                .set_item(Some(put.item))
                .condition_expression(format!("{} AND attribute_not_exists(#pg)", put.condition))
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(put.values)
                .return_values(ReturnValue::AllOld);
            match req.send().await {
                Ok(out) => {
                    let old = Self::replaced(out.attributes())?;
                    return Ok(Some((old, new_version)));
                }
                Err(e) if err_code(&e).as_deref() == Some("ConditionalCheckFailedException") => {}
                Err(e) => return Err(storage(err_text(&e))),
            }
        }
        let head = self.head_to_write_over(scope, key).await?;
        if head.as_ref().map(Head::version) != current {
            return Ok(None);
        }
        self.put_over(scope, key, value, body, head, new_version, meta, want_old)
            .await
    }

    /// Write `value` at `version` over the record as `head` was read, in one transaction
    /// that also claims the new value's parts and marks the old value's (see
    /// `transactions`); `None` when another writer got there first. The old value's parts
    /// are read (before the write) only when `want_old`.
    #[allow(clippy::too_many_arguments)]
    async fn put_over(
        &self,
        scope: &str,
        key: &str,
        value: &Value,
        body: Body,
        head: Option<Head>,
        version: u64,
        meta: &WriteMeta,
        want_old: bool,
    ) -> Result<Option<(Option<Versioned>, u64)>, StateError> {
        let current = head.as_ref().map(Head::version);
        let old_parts = head.as_ref().and_then(|h| h.parts().cloned());
        let old = match head {
            None => None,
            Some(Head::Inline(v)) => Some(v),
            Some(Head::Apart { version, parts }) => Some(Versioned {
                value: if want_old {
                    self.old_value_of(&parts).await
                } else {
                    Value::Null
                },
                version,
            }),
        };
        let mut write = [TxItem {
            scope,
            key,
            value,
            body,
            expected_version: Some(current.unwrap_or(0)),
            expected_value: None,
            version: Some(version),
            old_parts,
        }];
        match self.transact_writes(&mut write, meta).await {
            Ok(()) => Ok(Some((old, version))),
            Err(TxRefused::Conflict { .. }) => Ok(None),
            Err(TxRefused::Storage(e)) => Err(e),
        }
    }

    /// A value about to be replaced, read from its parts; null (logged) when they cannot be
    /// read, rather than a record that can never be written again.
    async fn old_value_of(&self, parts: &Parts) -> Value {
        self.read_parts(parts).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the replaced value's parts could not be read");
            Value::Null
        })
    }

    /// One chunk of a `set_many`, in one transaction; emptied after.
    async fn set_chunk(
        &self,
        chunk: &mut Vec<TxItem<'_>>,
        meta: &WriteMeta,
    ) -> Result<(), StateError> {
        let out = self.transact_writes(chunk, meta).await;
        chunk.clear();
        match out {
            Ok(()) => Ok(()),
            Err(TxRefused::Conflict { index, .. }) => Err(storage(format!(
                "transaction item {index}: its condition failed"
            ))),
            Err(TxRefused::Storage(e)) => Err(e),
        }
    }
}

#[async_trait]
impl StateStore for DynamoState {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError> {
        validate_address(scope, key)?;
        self.read(scope, key).await
    }

    async fn set(
        &self,
        scope: &str,
        key: &str,
        value: Value,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        validate_address(scope, key)?;
        if let Some(expected) = expected_version {
            let current = if expected == 0 { None } else { Some(expected) };
            if let Some((old, version)) =
                self.put_if(scope, key, &value, current, meta, true).await?
            {
                return Ok(WriteOutcome {
                    old_value: old.map(|o| o.value),
                    new_value: Some(value),
                    version,
                });
            }
            let found = self.version_of(scope, key).await?;
            return Err(Self::conflict(scope, key, expected, found));
        }
        // Unconditional and inline over inline: one atomic UpdateItem bumps the version and
        // returns the old image. It is refused over a record stored apart.
        let body = Body::of(&value)?;
        if body.parts().is_none() {
            let write = UnconditionalSet::new(&value, &body, meta);
            let before_first = write.before_first;
            let mut names = write.names;
            names.insert("#pg".into(), spill::GENERATION.into());
            let out = self
                .clients
                .dynamodb
                .update_item()
                .table_name(&self.table)
                .key("scope", s(scope))
                .key("key", s(key))
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(write.values))
                .update_expression(write.expression)
                .condition_expression("attribute_not_exists(#pg)")
                .return_values(ReturnValue::AllOld)
                .send()
                .await;
            match out {
                Ok(out) => {
                    let old = Self::replaced(out.attributes())?;
                    return Ok(WriteOutcome {
                        version: old.as_ref().map_or(before_first + 1, |o| o.version + 1),
                        old_value: old.map(|o| o.value),
                        new_value: Some(value),
                    });
                }
                Err(e) if err_code(&e).as_deref() == Some("ConditionalCheckFailedException") => {}
                Err(e) => return Err(storage(err_text(&e))),
            }
        }
        // Stored apart, or over a record stored apart: a transaction at the version read
        // (which tells the old value), read again when another writer came between. A retry
        // stores its value afresh: the parts of the attempt that lost stay marked.
        let mut first = Some(body);
        for _ in 0..UPDATE_RETRIES {
            let head = self.head_to_write_over(scope, key).await?;
            let version = next_version(head.as_ref().map(Head::version));
            let body = match first.take() {
                Some(body) => body,
                None => Body::of(&value)?,
            };
            if let Some((old, version)) = self
                .put_over(scope, key, &value, body, head, version, meta, true)
                .await?
            {
                return Ok(WriteOutcome {
                    version,
                    old_value: old.map(|o| o.value),
                    new_value: Some(value),
                });
            }
        }
        Err(StateError::Storage(format!(
            "set of {scope}/{key} kept conflicting after {UPDATE_RETRIES} attempts"
        )))
    }

    async fn set_many(
        &self,
        items: Vec<(String, String, Value)>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<bool>>, StateError> {
        for (scope, key, _) in &items {
            validate_address(scope, key)?;
        }
        let count = items.len();
        let mut chunk: Vec<TxItem<'_>> = Vec::new();
        let (mut chunk_bytes, mut chunk_items) = (0, 0);
        let mut iter = items.iter().peekable();
        while let Some((scope, key, value)) = iter.next() {
            let body = Body::of(value)?;
            let needs = body.transaction_items();
            if !chunk.is_empty() && chunk_items + needs > TRANSACT_MAX_ITEMS {
                self.set_chunk(&mut chunk, meta).await?;
                (chunk_bytes, chunk_items) = (0, 0);
            }
            chunk_items += needs;
            chunk_bytes +=
                scope.len() + key.len() + body.parts().map_or(body.text_len(), |_| 0) + 200;
            chunk.push(TxItem {
                scope,
                key,
                value,
                body,
                expected_version: None,
                expected_value: None,
                version: None,
                old_parts: None,
            });
            let full = chunk_items >= TRANSACT_MAX_ITEMS || chunk_bytes >= TRANSACT_MAX_BYTES;
            if full || iter.peek().is_none() {
                self.set_chunk(&mut chunk, meta).await?;
                (chunk_bytes, chunk_items) = (0, 0);
            }
        }
        // A transaction returns no old images: whether each record existed is not known.
        Ok(vec![None; count])
    }

    async fn transact(
        &self,
        writes: Vec<TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<u64>>, StateError> {
        check_transaction(&writes)?;
        let mut items = Vec::with_capacity(writes.len());
        for w in &writes {
            let version = w
                .expected_version
                .map(|expected| next_version((expected != 0).then_some(expected)));
            items.push(TxItem {
                scope: &w.scope,
                key: &w.key,
                value: &w.value,
                body: Body::of(&w.value)?,
                expected_version: w.expected_version,
                expected_value: w.expected_value.as_ref(),
                version,
                old_parts: None,
            });
        }
        let versions = items.iter().map(|i| i.version).collect();
        match self.transact_writes(&mut items, meta).await {
            Ok(()) => Ok(versions),
            Err(TxRefused::Conflict { index, found }) => {
                let w = &writes[index];
                if w.expected_value.is_some() && found.is_some() && found == w.expected_version {
                    return Err(StateError::ValueConflict {
                        scope: w.scope.clone(),
                        key: w.key.clone(),
                        version: found.unwrap_or(0),
                    });
                }
                Err(Self::conflict(
                    &w.scope,
                    &w.key,
                    w.expected_version.unwrap_or(0),
                    found,
                ))
            }
            Err(TxRefused::Storage(e)) => Err(e),
        }
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        ops: Vec<UpdateOp>,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        validate_address(scope, key)?;
        for attempt in 0..UPDATE_RETRIES {
            if attempt > 0 {
                // Contending writers back off by a random, growing amount, so they stop
                // colliding in lockstep.
                let spread = 2 + 4 * attempt as u64;
                let wait = u64::from_str_radix(&bus_telemetry::trace::random_hex(2), 16)
                    .unwrap_or(0)
                    % spread;
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
            let current = self.read(scope, key).await?;
            let current_version = current.as_ref().map(|c| c.version);
            check_expected(scope, key, expected_version, current_version)?;
            let old_value = current.map(|c| c.value);
            let base = old_value
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default()));
            let new_value = apply_ops(base, &ops)?;
            if let Some((_, version)) = self
                .put_if(scope, key, &new_value, current_version, meta, false)
                .await?
            {
                return Ok(WriteOutcome {
                    old_value,
                    new_value: Some(new_value),
                    version,
                });
            }
            if expected_version.is_some() {
                let found = self.version_of(scope, key).await?;
                return Err(Self::conflict(
                    scope,
                    key,
                    expected_version.unwrap_or(0),
                    found,
                ));
            }
            // Lost a race: read again and re-apply.
        }
        Err(StateError::Storage(format!(
            "update of {scope}/{key} kept conflicting after {UPDATE_RETRIES} attempts"
        )))
    }

    async fn delete(
        &self,
        scope: &str,
        key: &str,
        expected_version: Option<u64>,
        _meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        validate_address(scope, key)?;
        for _ in 0..UPDATE_RETRIES {
            // One DeleteItem, which hands back the old item; refused over a record stored
            // apart, whose parts are marked in the delete's transaction.
            let mut req = self
                .clients
                .dynamodb
                .delete_item()
                .table_name(&self.table)
                .key("scope", s(scope))
                .key("key", s(key))
                .return_values(ReturnValue::AllOld);
            req = match expected_version {
                None => req
                    .condition_expression("attribute_not_exists(#pg)")
                    .expression_attribute_names("#pg", spill::GENERATION),
                Some(0) => req
                    .condition_expression("attribute_not_exists(#k)")
                    .expression_attribute_names("#k", "key"),
                Some(v) => req
                    .condition_expression("#v = :v AND attribute_not_exists(#pg)")
                    .expression_attribute_names("#v", "version")
                    .expression_attribute_names("#pg", spill::GENERATION)
                    .expression_attribute_values(":v", AttributeValue::N(v.to_string())),
            };
            match req.send().await {
                Ok(out) => {
                    let old = Self::replaced(out.attributes())?;
                    return Ok(WriteOutcome {
                        version: old.as_ref().map(|o| o.version).unwrap_or(0),
                        old_value: old.map(|o| o.value),
                        new_value: None,
                    });
                }
                Err(e) if err_code(&e).as_deref() == Some("ConditionalCheckFailedException") => {}
                Err(e) => return Err(storage(err_text(&e))),
            }
            let head = self.head_to_write_over(scope, key).await?;
            let (version, parts) = match head {
                Some(Head::Apart { version, parts })
                    if expected_version.is_none_or(|v| v == version) =>
                {
                    (version, parts)
                }
                other if expected_version.is_some() => {
                    let found = other.as_ref().map(Head::version);
                    return Err(Self::conflict(
                        scope,
                        key,
                        expected_version.unwrap_or(0),
                        found,
                    ));
                }
                // Changed since the delete was refused: try again.
                _ => continue,
            };
            let old_value = self.old_value_of(&parts).await;
            if self.delete_apart(scope, key, version, &parts).await? {
                return Ok(WriteOutcome {
                    version,
                    old_value: Some(old_value),
                    new_value: None,
                });
            }
            if expected_version.is_some() {
                let found = self.version_of(scope, key).await?;
                return Err(Self::conflict(
                    scope,
                    key,
                    expected_version.unwrap_or(0),
                    found,
                ));
            }
        }
        Err(StateError::Storage(format!(
            "delete of {scope}/{key} kept conflicting after {UPDATE_RETRIES} attempts"
        )))
    }

    async fn list_page(
        &self,
        scope: &str,
        prefix: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool), StateError> {
        if scope.is_empty() {
            return Err(StateError::Invalid("`scope` must not be empty".into()));
        }
        let mut out = Vec::new();
        let mut start: Option<Item> =
            after.map(|a| Item::from([("scope".to_string(), s(scope)), ("key".to_string(), s(a))]));
        loop {
            // One record more than asked tells whether another page follows.
            let want = (limit + 1 - out.len()).min(1000) as i32;
            let mut req = self
                .clients
                .dynamodb
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .limit(want)
                .expression_attribute_names("#s", "scope")
                .expression_attribute_values(":s", s(scope));
            req = match prefix.filter(|p| !p.is_empty()) {
                Some(p) => req
                    .key_condition_expression("#s = :s AND begins_with(#k, :p)")
                    .expression_attribute_names("#k", "key")
                    .expression_attribute_values(":p", s(p)),
                None => req.key_condition_expression("#s = :s"),
            };
            if let Some(k) = start.take() {
                req = req.set_exclusive_start_key(Some(k));
            }
            let page = req.send().await.map_err(|e| storage(err_text(&e)))?;
            for item in page.items() {
                let key = match item.get("key") {
                    Some(AttributeValue::S(k)) => k.clone(),
                    _ => continue,
                };
                if let Some(head) = decode_head(item)? {
                    if out.len() == limit {
                        return Ok((out, true));
                    }
                    let v = self.resolve(head).await?;
                    out.push(Entry {
                        key,
                        value: v.value,
                        version: v.version,
                    });
                }
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        Ok((out, false))
    }
}
