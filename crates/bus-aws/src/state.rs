//! `StateStore` on DynamoDB. Item: `scope` (hash), `key` (range), `value` (the JSON as a
//! string), `version` (number), and the writer's `tp`/`bg` trace context so the stream record
//! that fires a trigger continues the writer's trace.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use serde_json::Value;
use std::collections::HashMap;

use super::{AwsClients, AwsNames, err_code, err_text};
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

/// Read `{value, version}` out of an item (also used for stream images).
pub fn decode_item(item: &Item) -> Result<Option<Versioned>, StateError> {
    let Some(AttributeValue::S(text)) = item.get("value") else {
        return Ok(None);
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| storage(format!("corrupt value: {e}")))?;
    let version = match item.get("version") {
        Some(AttributeValue::N(n)) => n.parse().map_err(|_| storage("corrupt version"))?,
        _ => 0,
    };
    Ok(Some(Versioned { value, version }))
}

/// The update expression of an unconditional write: the value, the version bumped from
/// wherever it is (or from just before a new record's first), and the writer's trace context.
struct UnconditionalSet {
    /// The version just before a new record's first (the wall clock: read once).
    before_first: u64,
    /// The stored value's length (the JSON text), for a transaction's size budget.
    value_bytes: usize,
    expression: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl UnconditionalSet {
    fn new(value: &Value, meta: &WriteMeta) -> Self {
        let before_first = next_version(None) - 1;
        let text = value.to_string();
        let value_bytes = text.len();
        let mut names = HashMap::from([
            ("#val".to_string(), "value".to_string()),
            ("#ver".to_string(), "version".to_string()),
        ]);
        let mut values = HashMap::from([
            (":val".to_string(), AttributeValue::S(text)),
            (
                ":before_first".to_string(),
                AttributeValue::N(before_first.to_string()),
            ),
            (":one".to_string(), AttributeValue::N("1".into())),
        ]);
        let mut set = vec![
            "#val = :val",
            "#ver = if_not_exists(#ver, :before_first) + :one",
        ];
        // The filled fields, for filters on the table's stream; gone when none are.
        names.insert("#fl".into(), FILLED_FIELDS_ATTRIBUTE.into());
        let filled = filled_set(value);
        let remove = if let Some(filled) = filled {
            values.insert(":fl".into(), filled);
            set.push("#fl = :fl");
            ""
        } else {
            " REMOVE #fl"
        };
        if let Some(tp) = &meta.traceparent {
            names.insert("#tp".into(), "tp".into());
            values.insert(":tp".into(), s(tp));
            set.push("#tp = :tp");
        }
        if let Some(bg) = &meta.baggage {
            names.insert("#bg".into(), "bg".into());
            values.insert(":bg".into(), s(bg));
            set.push("#bg = :bg");
        }
        Self {
            before_first,
            value_bytes,
            expression: format!("SET {}{remove}", set.join(", ")),
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
        version: u64,
        current: Option<u64>,
        meta: &WriteMeta,
    ) -> Self {
        let mut item = Item::from([
            ("scope".to_string(), s(scope)),
            ("key".to_string(), s(key)),
            ("value".to_string(), s(&value.to_string())),
            (
                "version".to_string(),
                AttributeValue::N(version.to_string()),
            ),
        ]);
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

/// What one transaction may hold: DynamoDB's 100 items and 4 MB (with room for the
/// attribute names and keys each item repeats).
const TRANSACT_MAX_ITEMS: usize = 100;
const TRANSACT_MAX_BYTES: usize = 3_500_000;

/// Why a transaction did not commit.
enum TxFailed {
    /// The condition of this item (by index) did not hold.
    Condition(usize),
    Storage(StateError),
}

impl DynamoState {
    pub fn new(clients: AwsClients, names: &AwsNames) -> Self {
        Self {
            clients,
            table: names.state_table(),
        }
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError> {
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
        match out.item() {
            Some(item) => decode_item(item),
            None => Ok(None),
        }
    }

    /// One `TransactWriteItems`, retried a few times when it lost a race with another
    /// transaction on the same items (DynamoDB cancels it; the SDK does not retry that).
    async fn transact(
        &self,
        items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
    ) -> Result<(), StateError> {
        match self.transact_checked(items).await {
            Ok(()) => Ok(()),
            Err(TxFailed::Condition(i)) => Err(storage(format!(
                "transaction item {i}: its condition failed"
            ))),
            Err(TxFailed::Storage(e)) => Err(e),
        }
    }

    /// [`Self::transact`], telling a failed condition (the index of the first item whose
    /// condition did not hold) from other failures.
    async fn transact_checked(
        &self,
        items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
    ) -> Result<(), TxFailed> {
        let mut attempt = 0;
        loop {
            let out = self
                .clients
                .dynamodb
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .send()
                .await;
            let Err(e) = out else { return Ok(()) };
            use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
            let (canceled, reasons) = match e.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                    (true, c.cancellation_reasons().to_vec())
                }
                _ => (false, Vec::new()),
            };
            if let Some(i) = reasons
                .iter()
                .position(|r| r.code() == Some("ConditionalCheckFailed"))
            {
                return Err(TxFailed::Condition(i));
            }
            let conflict = canceled
                && reasons
                    .iter()
                    .all(|r| matches!(r.code(), None | Some("None" | "TransactionConflict")));
            attempt += 1;
            if !conflict || attempt >= 5 {
                return Err(TxFailed::Storage(storage(err_text(&e))));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20 << attempt)).await;
        }
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
    /// (None = absent). `Ok(None)` means another writer got there first.
    async fn put_if(
        &self,
        scope: &str,
        key: &str,
        value: &Value,
        current: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<Option<(Option<Versioned>, u64)>, StateError> {
        let new_version = next_version(current);
        let put = ConditionalPut::new(scope, key, value, new_version, current, meta);
        let req = self
            .clients
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(put.item))
            .condition_expression(put.condition)
            .set_expression_attribute_names(Some(put.names))
            .set_expression_attribute_values(put.values)
            .return_values(ReturnValue::AllOld);
        match req.send().await {
            Ok(out) => match out.attributes() {
                Some(item) if !item.is_empty() => Ok(Some((decode_item(item)?, new_version))),
                _ => Ok(Some((None, new_version))),
            },
            Err(e) if err_code(&e).as_deref() == Some("ConditionalCheckFailedException") => {
                Ok(None)
            }
            Err(e) => Err(storage(err_text(&e))),
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
            if let Some((old, version)) = self.put_if(scope, key, &value, current, meta).await? {
                return Ok(WriteOutcome {
                    old_value: old.map(|o| o.value),
                    new_value: Some(value),
                    version,
                });
            }
            let found = self.read(scope, key).await?.map(|v| v.version);
            return Err(Self::conflict(scope, key, expected, found));
        }
        // Unconditional: one atomic UpdateItem bumps the version and returns the old image.
        let write = UnconditionalSet::new(&value, meta);
        let before_first = write.before_first;
        let out = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key("scope", s(scope))
            .key("key", s(key))
            .set_expression_attribute_names(Some(write.names))
            .set_expression_attribute_values(Some(write.values))
            .update_expression(write.expression)
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| storage(err_text(&e)))?;
        let old = match out.attributes() {
            Some(item) => decode_item(item)?,
            None => None,
        };
        Ok(WriteOutcome {
            version: old.as_ref().map_or(before_first + 1, |o| o.version + 1),
            old_value: old.map(|o| o.value),
            new_value: Some(value),
        })
    }

    async fn set_many(
        &self,
        items: Vec<(String, String, Value)>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<bool>>, StateError> {
        use aws_sdk_dynamodb::types::{TransactWriteItem, Update};
        for (scope, key, _) in &items {
            validate_address(scope, key)?;
        }
        let count = items.len();
        let mut chunk: Vec<TransactWriteItem> = Vec::new();
        let mut chunk_bytes = 0;
        let mut iter = items.into_iter().peekable();
        while let Some((scope, key, value)) = iter.next() {
            let write = UnconditionalSet::new(&value, meta);
            chunk_bytes += scope.len() + key.len() + write.value_bytes + 200;
            let update = Update::builder()
                .table_name(&self.table)
                .key("scope", s(&scope))
                .key("key", s(&key))
                .update_expression(write.expression)
                .set_expression_attribute_names(Some(write.names))
                .set_expression_attribute_values(Some(write.values))
                .build()
                .map_err(storage)?;
            chunk.push(TransactWriteItem::builder().update(update).build());
            let full = chunk.len() == TRANSACT_MAX_ITEMS || chunk_bytes >= TRANSACT_MAX_BYTES;
            if full || iter.peek().is_none() {
                self.transact(std::mem::take(&mut chunk)).await?;
                chunk_bytes = 0;
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
        use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};
        check_transaction(&writes)?;
        let mut items = Vec::with_capacity(writes.len());
        let mut versions = Vec::with_capacity(writes.len());
        for w in &writes {
            let item = match w.expected_version {
                // Conditional: a Put of the next version, if the record is still where the
                // caller saw it.
                Some(expected) => {
                    let current = (expected != 0).then_some(expected);
                    let version = next_version(current);
                    versions.push(Some(version));
                    let mut put =
                        ConditionalPut::new(&w.scope, &w.key, &w.value, version, current, meta);
                    let mut condition = put.condition.to_string();
                    // The value as stored is its JSON text, and serde_json writes one value
                    // one way (object keys sorted): text equality is value equality.
                    if let (Some(expected), Some(values)) = (&w.expected_value, &mut put.values) {
                        condition.push_str(" AND #val = :old");
                        put.names.insert("#val".into(), "value".into());
                        values.insert(":old".into(), s(&expected.to_string()));
                    }
                    let put = Put::builder()
                        .table_name(&self.table)
                        .set_item(Some(put.item))
                        .condition_expression(condition)
                        .set_expression_attribute_names(Some(put.names))
                        .set_expression_attribute_values(put.values)
                        .build()
                        .map_err(storage)?;
                    TransactWriteItem::builder().put(put).build()
                }
                // Unconditional: the version bumped from wherever it is (not known here).
                None => {
                    versions.push(None);
                    let write = UnconditionalSet::new(&w.value, meta);
                    let update = Update::builder()
                        .table_name(&self.table)
                        .key("scope", s(&w.scope))
                        .key("key", s(&w.key))
                        .update_expression(write.expression)
                        .set_expression_attribute_names(Some(write.names))
                        .set_expression_attribute_values(Some(write.values))
                        .build()
                        .map_err(storage)?;
                    TransactWriteItem::builder().update(update).build()
                }
            };
            items.push(item);
        }
        match self.transact_checked(items).await {
            Ok(()) => Ok(versions),
            Err(TxFailed::Condition(i)) => {
                let w = &writes[i];
                let found = self.read(&w.scope, &w.key).await?.map(|v| v.version);
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
            Err(TxFailed::Storage(e)) => Err(e),
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
                .put_if(scope, key, &new_value, current_version, meta)
                .await?
            {
                return Ok(WriteOutcome {
                    old_value,
                    new_value: Some(new_value),
                    version,
                });
            }
            if expected_version.is_some() {
                let found = self.read(scope, key).await?.map(|v| v.version);
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
        let mut req = self
            .clients
            .dynamodb
            .delete_item()
            .table_name(&self.table)
            .key("scope", s(scope))
            .key("key", s(key))
            .return_values(ReturnValue::AllOld);
        match expected_version {
            None => {}
            Some(0) => {
                req = req
                    .condition_expression("attribute_not_exists(#k)")
                    .expression_attribute_names("#k", "key")
            }
            Some(v) => {
                req = req
                    .condition_expression("#v = :v")
                    .expression_attribute_names("#v", "version")
                    .expression_attribute_values(":v", AttributeValue::N(v.to_string()))
            }
        }
        match req.send().await {
            Ok(out) => {
                let old = match out.attributes() {
                    Some(item) => decode_item(item)?,
                    None => None,
                };
                Ok(WriteOutcome {
                    version: old.as_ref().map(|o| o.version).unwrap_or(0),
                    old_value: old.map(|o| o.value),
                    new_value: None,
                })
            }
            Err(e) if err_code(&e).as_deref() == Some("ConditionalCheckFailedException") => {
                let found = self.read(scope, key).await?.map(|v| v.version);
                Err(Self::conflict(
                    scope,
                    key,
                    expected_version.unwrap_or(0),
                    found,
                ))
            }
            Err(e) => Err(storage(err_text(&e))),
        }
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
                if let Some(v) = decode_item(item)? {
                    if out.len() == limit {
                        return Ok((out, true));
                    }
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
