//! Transactions on DynamoDB: `TransactWriteItems` returns no old images, so each write is
//! guarded on how its record stores its value (inline, or apart: `spill`), and a failed guard
//! is read and tried again.

use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

use super::{ConditionalPut, DynamoState, UnconditionalSet, s, storage};
use crate::err_text;
use crate::spill::{self, Body, Head, Parts};
use bus::state::{StateError, WriteMeta};
use serde_json::Value;

/// What one transaction may hold: DynamoDB's 100 items and 4 MB (with room for the
/// attribute names and keys each item repeats).
pub(super) const TRANSACT_MAX_ITEMS: usize = 100;
pub(super) const TRANSACT_MAX_BYTES: usize = 3_500_000;
/// How often a transaction is sent again after a guard on a record's parts failed (another
/// writer stored or dropped a large value there since it was read).
const PARTS_GUARD_ROUNDS: usize = 5;

/// Why a transaction did not commit.
enum TxFailed {
    /// The conditions of these items (by index) did not hold.
    Condition(Vec<usize>),
    Storage(StateError),
}

/// Why a transaction's writes were not made.
pub(super) enum TxRefused {
    /// The record of this write (by index) is not where the write expected it: at `found`
    /// (absent: `None`), as read after the transaction was refused.
    Conflict {
        index: usize,
        found: Option<u64>,
    },
    Storage(StateError),
}

/// One write of a transaction, kept to be built again with another guard on the parts its
/// record holds: a transaction returns no old images, so each write is conditioned on the
/// record's parts being what was last seen (none, at first), and a failed guard is read and
/// tried again. The parts replaced are retired once it commits.
pub(super) struct TxItem<'a> {
    pub(super) scope: &'a str,
    pub(super) key: &'a str,
    pub(super) value: &'a Value,
    pub(super) body: Body,
    /// `None`: unconditional; `Some(0)`: only if absent; `Some(n)`: only at version n.
    pub(super) expected_version: Option<u64>,
    pub(super) expected_value: Option<&'a Value>,
    /// The version a conditional write stores.
    pub(super) version: Option<u64>,
    /// The parts the record holds before this write, as last read.
    pub(super) old_parts: Option<Parts>,
}

impl DynamoState {
    /// One `TransactWriteItems`, retried a few times when it lost a race with another
    /// transaction on the same items (DynamoDB cancels it; the SDK does not retry that).
    /// Tells a failed condition (the indices of the items whose conditions did not hold)
    /// from other failures.
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
            let failed: Vec<usize> = reasons
                .iter()
                .enumerate()
                .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
                .map(|(i, _)| i)
                .collect();
            if !failed.is_empty() {
                return Err(TxFailed::Condition(failed));
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

    /// A transaction's write as DynamoDB takes it, guarded on the parts its record holds.
    fn build(
        &self,
        w: &TxItem<'_>,
        meta: &WriteMeta,
    ) -> Result<aws_sdk_dynamodb::types::TransactWriteItem, StateError> {
        use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};
        let guard = |names: &mut HashMap<String, String>,
                     values: &mut HashMap<String, AttributeValue>| {
            names.insert("#pg".into(), spill::GENERATION.into());
            match &w.old_parts {
                None => "attribute_not_exists(#pg)",
                Some(parts) => {
                    values.insert(":pg".into(), s(&parts.generation));
                    "#pg = :pg"
                }
            }
        };
        match (w.expected_version, w.version) {
            // Conditional: a Put of the next version, if the record is still where the
            // caller saw it.
            (Some(expected), Some(version)) => {
                let current = (expected != 0).then_some(expected);
                let mut put =
                    ConditionalPut::new(w.scope, w.key, w.value, &w.body, version, current, meta);
                let mut condition = put.condition.to_string();
                if let Some(values) = &mut put.values {
                    let guard = guard(&mut put.names, values);
                    condition.push_str(&format!(" AND {guard}"));
                    // The value as stored is its JSON text, and serde_json writes one value
                    // one way (object keys sorted): text equality is value equality (and a
                    // large one's digest stands for its text).
                    if let Some(expected) = w.expected_value {
                        let text = expected.to_string();
                        if text.len() > spill::INLINE_MAX {
                            condition.push_str(" AND #vh = :old");
                            put.names.insert("#vh".into(), spill::DIGEST.into());
                            values.insert(":old".into(), s(&spill::digest(&text)));
                        } else {
                            condition.push_str(" AND #val = :old");
                            put.names.insert("#val".into(), "value".into());
                            values.insert(":old".into(), s(&text));
                        }
                    }
                }
                let put = Put::builder()
                    .table_name(&self.table)
                    .set_item(Some(put.item))
                    .condition_expression(condition)
                    .set_expression_attribute_names(Some(put.names))
                    .set_expression_attribute_values(put.values)
                    .build()
                    .map_err(storage)?;
                Ok(TransactWriteItem::builder().put(put).build())
            }
            // Unconditional: the version bumped from wherever it is (not known here).
            _ => {
                let mut write = UnconditionalSet::new(w.value, &w.body, meta);
                let guard = guard(&mut write.names, &mut write.values);
                let update = Update::builder()
                    .table_name(&self.table)
                    .key("scope", s(w.scope))
                    .key("key", s(w.key))
                    .update_expression(write.expression)
                    .condition_expression(guard)
                    .set_expression_attribute_names(Some(write.names))
                    .set_expression_attribute_values(Some(write.values))
                    .build()
                    .map_err(storage)?;
                Ok(TransactWriteItem::builder().update(update).build())
            }
        }
    }

    /// Delete a record stored apart, still at `version` with `parts`, and mark its parts to
    /// expire, in one transaction. `false`: the record is no longer so.
    pub(super) async fn delete_apart(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        parts: &Parts,
    ) -> Result<bool, StateError> {
        use aws_sdk_dynamodb::types::{Delete, TransactWriteItem};
        let delete = Delete::builder()
            .table_name(&self.table)
            .key("scope", s(scope))
            .key("key", s(key))
            .condition_expression("#v = :v AND #pg = :pg")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#pg", spill::GENERATION)
            .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
            .expression_attribute_values(":pg", s(&parts.generation))
            .build()
            .map_err(storage)?;
        let mut items = vec![TransactWriteItem::builder().delete(delete).build()];
        items.extend(spill::retirements(&self.table, parts)?);
        match self.transact_checked(items).await {
            Ok(()) => Ok(true),
            Err(TxFailed::Condition(_)) => Ok(false),
            Err(TxFailed::Storage(e)) => Err(e),
        }
    }

    /// Commit `writes` in one transaction (their parts written first). The transaction also
    /// takes the mark off their parts and marks the parts they replace (`spill`), so a writer
    /// that dies at any step leaves no part unmarked that no record points to. Parts of a
    /// transaction that failed keep the mark they were born with.
    pub(super) async fn transact_writes(
        &self,
        writes: &mut [TxItem<'_>],
        meta: &WriteMeta,
    ) -> Result<(), TxRefused> {
        // Known before any part is written.
        let needed: usize = writes.iter().map(|w| w.body.transaction_items()).sum();
        if needed > TRANSACT_MAX_ITEMS {
            return Err(TxRefused::Storage(StateError::Invalid(format!(
                "{} writes and the parts of their large values are {needed} DynamoDB items; one \
                 transaction holds at most {TRANSACT_MAX_ITEMS}",
                writes.len()
            ))));
        }
        for w in writes.iter() {
            self.write_parts(&w.body)
                .await
                .map_err(TxRefused::Storage)?;
        }
        let retire_after = self.transact_guarded(writes, meta).await?;
        for parts in &retire_after {
            self.retire(parts).await;
        }
        Ok(())
    }

    /// The transaction's items: each write's, then the claims on their new parts, then the
    /// marks on the parts they replace, as many as DynamoDB's 100 items leave room for (the
    /// rest are returned, to be marked after it commits).
    fn build_all(&self, writes: &[TxItem<'_>], meta: &WriteMeta) -> Result<Built, StateError> {
        let mut items = Vec::with_capacity(writes.len());
        let mut roles = Vec::with_capacity(writes.len());
        for (i, w) in writes.iter().enumerate() {
            items.push(self.build(w, meta)?);
            roles.push(Role::Write(i));
        }
        for (i, w) in writes.iter().enumerate() {
            if let Some(parts) = w.body.parts() {
                for claim in spill::claims(&self.table, parts)? {
                    items.push(claim);
                    roles.push(Role::Claim(i));
                }
            }
        }
        let mut retire_after = Vec::new();
        for old in writes.iter().filter_map(|w| w.old_parts.as_ref()) {
            if items.len() + old.count <= TRANSACT_MAX_ITEMS {
                for mark in spill::retirements(&self.table, old)? {
                    items.push(mark);
                    roles.push(Role::Retire);
                }
            } else {
                retire_after.push(old.clone());
            }
        }
        Ok(Built {
            items,
            roles,
            retire_after,
        })
    }

    /// Send `writes` until the guards on their records' parts hold (or a condition of the
    /// caller's fails); the parts replaced that the transaction had no room to mark.
    async fn transact_guarded(
        &self,
        writes: &mut [TxItem<'_>],
        meta: &WriteMeta,
    ) -> Result<Vec<Parts>, TxRefused> {
        for _ in 0..PARTS_GUARD_ROUNDS {
            let built = self.build_all(writes, meta).map_err(TxRefused::Storage)?;
            let failed = match self.transact_checked(built.items).await {
                Ok(()) => return Ok(built.retire_after),
                Err(TxFailed::Storage(e)) => return Err(TxRefused::Storage(e)),
                Err(TxFailed::Condition(failed)) => failed,
            };
            for item in failed {
                let i = match built.roles.get(item) {
                    Some(Role::Write(i)) => *i,
                    Some(Role::Claim(i)) => {
                        let w = &writes[*i];
                        return Err(TxRefused::Storage(storage(format!(
                            "a part of the value for {}/{} was gone before the record pointed \
                             to it",
                            w.scope, w.key
                        ))));
                    }
                    // Marks have no condition.
                    Some(Role::Retire) | None => continue,
                };
                // A failed condition may be only the guard on the parts: read where they are.
                let w = &mut writes[i];
                let head = self
                    .head_to_write_over(w.scope, w.key)
                    .await
                    .map_err(TxRefused::Storage)?;
                let version_holds = match w.expected_version {
                    None => true,
                    Some(0) => head.is_none(),
                    Some(v) => head.as_ref().map(Head::version) == Some(v),
                };
                let parts = head.as_ref().and_then(|h| h.parts().cloned());
                if !version_holds || (w.expected_version.is_some() && parts == w.old_parts) {
                    return Err(TxRefused::Conflict {
                        index: i,
                        found: head.as_ref().map(Head::version),
                    });
                }
                w.old_parts = parts;
            }
        }
        Err(TxRefused::Storage(storage(
            "the transaction's records kept changing how they were stored",
        )))
    }
}

/// What one item of a built transaction is.
enum Role {
    /// The write of `writes[i]`'s record.
    Write(usize),
    /// A claim on a part of `writes[i]`'s new value.
    Claim(usize),
    /// A mark on a part of a value replaced.
    Retire,
}

/// A transaction as sent: its items, what each is, and the replaced parts it had no room
/// to mark.
struct Built {
    items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
    roles: Vec<Role>,
    retire_after: Vec<Parts>,
}
