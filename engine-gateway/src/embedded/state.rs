//! The embedded backend as a state store and a change feed.

use super::*;

#[async_trait]
impl StateStore for EmbeddedBackend {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError> {
        validate_address(scope, key)?;
        let k = state_key(scope, key);
        // A point read is a few microseconds from redb's cache: done in place, not handed to
        // the blocking pool (that hand-off cost more than the read).
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(STATE).map_err(storage)?;
        match table.get(k.as_str()).map_err(storage)? {
            Some(g) => Ok(Some(decode(g.value())?)),
            None => Ok(None),
        }
    }

    async fn set(
        &self,
        scope: &str,
        key: &str,
        value: Value,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        self.write(scope, key, expected_version, meta, move |_| Ok(Some(value)))
            .await
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        ops: Vec<UpdateOp>,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        self.write(scope, key, expected_version, meta, move |current| {
            let base = current
                .map(|c| c.value.clone())
                .unwrap_or_else(|| Value::Object(Default::default()));
            apply_ops(base, &ops).map(Some)
        })
        .await
    }

    async fn delete(
        &self,
        scope: &str,
        key: &str,
        expected_version: Option<u64>,
        meta: &WriteMeta,
    ) -> Result<WriteOutcome, StateError> {
        self.write(scope, key, expected_version, meta, |_| Ok(None))
            .await
    }

    async fn transact(
        &self,
        writes: Vec<crate::state::TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<u64>>, StateError> {
        self.write_all(writes, meta).await
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
        let start = state_key(scope, prefix.unwrap_or(""));
        let after = after.map(|a| state_key(scope, a));
        let scope_len = scope.len() + 1;
        self.blocking(move |db| {
            use std::ops::Bound;
            let read = db.begin_read().map_err(storage)?;
            let table = read.open_table(STATE).map_err(storage)?;
            let from = match after.as_deref() {
                Some(a) if a >= start.as_str() => Bound::Excluded(a),
                _ => Bound::Included(start.as_str()),
            };
            let mut out = Vec::new();
            for row in table
                .range::<&str>((from, Bound::Unbounded))
                .map_err(storage)?
            {
                let (k, v) = row.map_err(storage)?;
                let k = k.value();
                if !k.starts_with(start.as_str()) {
                    break;
                }
                if out.len() == limit {
                    return Ok((out, true));
                }
                let rec = decode(v.value())?;
                out.push(Entry {
                    key: k[scope_len..].to_string(),
                    value: rec.value,
                    version: rec.version,
                });
            }
            Ok((out, false))
        })
        .await
    }
}

#[async_trait]
impl ChangeFeed for EmbeddedBackend {
    async fn next_batch(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<ChangeRecord>, StateError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.change_notify.notified();
            let batch: Vec<ChangeRecord> = {
                let mut feed = self.feed.lock().unwrap_or_else(|p| p.into_inner());
                let mut out = Vec::new();
                while out.len() < max {
                    match feed.pop_first() {
                        Some((_, r)) => out.push(r),
                        None => break,
                    }
                }
                out
            };
            if !batch.is_empty() {
                return Ok(batch);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn ack(&self, records: &[ChangeRecord]) -> Result<(), StateError> {
        let Some(seq) = records.iter().map(|r| r.seq).max() else {
            return Ok(());
        };
        // Not waited for on disk: a lost acknowledgement fires the trigger again after a
        // machine crash (at least once), and a killed process loses no log record.
        self.commit(true, |txn, log| {
            let mut table = txn.open_table(CHANGES).map_err(storage)?;
            table.retain_in(..=seq, |_, _| false).map_err(storage)?;
            log.push(Op::ChangesRetainAfter(seq));
            Ok::<_, StateError>(())
        })
        .await
    }
}
