//! The embedded backend as a state store and a change feed.

use super::*;

#[async_trait]
impl StateStore for EmbeddedBackend {
    /// The log fdatasynced up to its last record (the group commit: a sync in progress or
    /// the next one covers it).
    async fn sync(&self) -> Result<(), StateError> {
        let last = self.wal.last_appended();
        self.wal.wait_synced(last).await?;
        Ok(())
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Versioned>, StateError> {
        validate_address(scope, key)?;
        let k = state_key(scope, key);
        // A point read is a few microseconds from redb's cache: done in place, not handed to
        // the blocking pool (that hand-off cost more than the read). The bytes are copied out
        // and decoded after the store is let go.
        let bytes = self
            .wal
            .read_async(&self.db, |txn| {
                let table = txn.open_table(STATE).map_err(storage)?;
                let bytes = table.get(k.as_str()).map_err(storage)?;
                Ok::<_, StateError>(bytes.map(|g| g.value().to_vec()))
            })
            .await?;
        bytes.as_deref().map(decode).transpose()
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
            let base = match current {
                Some(c) => c.value()?,
                None => Value::Object(Default::default()),
            };
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

    async fn set_many(
        &self,
        items: Vec<(String, String, Value)>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<bool>>, StateError> {
        self.set_many_in_one(items, meta).await
    }

    async fn transact(
        &self,
        writes: Vec<bus::state::TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<Option<u64>>, StateError> {
        self.write_all(writes, meta).await
    }

    async fn transact_keeping(
        &self,
        writes: Vec<bus::state::TxWrite>,
        meta: &WriteMeta,
    ) -> Result<Vec<(Option<u64>, Value)>, StateError> {
        self.write_all_keeping(writes, meta).await
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
        // The rows are copied out under the store's lock (every logged write included) and
        // decoded after it is let go: in place when small (the hand-off to the blocking pool
        // and back cost more than an inbox peek or a session's history), else on the pool.
        let (rows, more) = self
            .wal
            .read_async(&self.db, |txn| {
                let table = txn.open_table(STATE).map_err(storage)?;
                raw_page(&table, &start, after.as_deref(), limit)
            })
            .await?;
        let scope_len = scope.len() + 1;
        let bytes: usize = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
        let entries = if bytes <= DECODE_IN_PLACE_BYTES {
            decode_rows(rows, scope_len)?
        } else {
            self.blocking(move |_| decode_rows(rows, scope_len)).await?
        };
        Ok((entries, more))
    }
}

/// A page of at most this much JSON is decoded in the caller's task.
const DECODE_IN_PLACE_BYTES: usize = 256 << 10;
/// A page stops early (with `more`) once it holds this many rows and `PAGE_BYTES` of them,
/// so one page never copies and decodes hundreds of large records at once.
const PAGE_ROWS_BEFORE_BYTES_COUNT: usize = 64;
const PAGE_BYTES: usize = 1 << 20;

/// A record's full key and its stored bytes.
type RawRow = (String, Vec<u8>);

/// Up to `limit` rows whose keys start with `start` (scope and prefix),
/// after `after`; `true` when more follow.
fn raw_page(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    start: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<RawRow>, bool), StateError> {
    use std::ops::Bound;
    let from = match after {
        Some(a) if a >= start => Bound::Excluded(a),
        _ => Bound::Included(start),
    };
    let mut out = Vec::new();
    let mut bytes = 0;
    for row in table
        .range::<&str>((from, Bound::Unbounded))
        .map_err(storage)?
    {
        let (k, v) = row.map_err(storage)?;
        let k = k.value();
        if !k.starts_with(start) {
            break;
        }
        if out.len() == limit || (out.len() >= PAGE_ROWS_BEFORE_BYTES_COUNT && bytes >= PAGE_BYTES)
        {
            return Ok((out, true));
        }
        bytes += v.value().len();
        out.push((k.to_string(), v.value().to_vec()));
    }
    Ok((out, false))
}

fn decode_rows(rows: Vec<RawRow>, scope_len: usize) -> Result<Vec<Entry>, StateError> {
    rows.into_iter()
        .map(|(k, v)| {
            let rec = decode(&v)?;
            Ok(Entry {
                key: k[scope_len..].to_string(),
                value: rec.value,
                version: rec.version,
            })
        })
        .collect()
}

impl EmbeddedBackend {
    /// The next committed change records after the last one handed out, at most `max`, read
    /// from the `changes` table (seq order is commit order, and a write transaction is visible
    /// once committed, so no record can appear later behind one already handed out). A record
    /// that does not decode is logged and passed over: it could never be delivered, and
    /// stopping at it would stop every trigger behind it.
    fn read_changes(&self, max: usize) -> Result<Vec<ChangeRecord>, StateError> {
        let mut handed_out = self.handed_out.lock().unwrap_or_else(|p| p.into_inner());
        let rows = self.wal.read(&self.db, |txn| {
            let table = txn.open_table(CHANGES).map_err(storage)?;
            let mut rows = Vec::new();
            for row in table.range(*handed_out + 1..).map_err(storage)? {
                if rows.len() >= max.max(1) {
                    break;
                }
                let (seq, bytes) = row.map_err(storage)?;
                rows.push((seq.value(), bytes.value().to_vec()));
            }
            Ok::<_, StateError>(rows)
        })?;
        let mut out = Vec::with_capacity(rows.len());
        for (seq, bytes) in rows {
            *handed_out = seq;
            match serde_json::from_slice::<ChangeRecord>(&bytes) {
                Ok(record) => out.push(record),
                Err(e) => {
                    tracing::error!(seq, error = %e, "change record does not decode; passed over")
                }
            }
        }
        Ok(out)
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
            let batch = self.read_changes(max)?;
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
        self.commit(true, |_, log| {
            log.push(Op::ChangesRetainAfter(seq));
            Ok::<_, StateError>(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(records: &[ChangeRecord]) -> Vec<&str> {
        records.iter().map(|r| r.key.as_str()).collect()
    }

    /// `state::sync` makes the deferred writes before it durable (they return before their
    /// log record is on disk).
    #[tokio::test]
    async fn sync_makes_the_deferred_writes_before_it_durable() {
        let dir = tempfile::tempdir().unwrap();
        let b = EmbeddedBackend::open(dir.path()).unwrap();
        let deferred = WriteMeta {
            baggage: Some(format!("{}=deferred", bus::state::DURABILITY_BAGGAGE)),
            ..WriteMeta::default()
        };
        b.set("s", "a", json!(1), None, &deferred).await.unwrap();
        let last = b.wal.last_appended();
        assert!(!b.wal.is_synced(last), "a deferred write does not wait");
        let answer = bus::state_api::call(b.as_ref(), "state::sync", json!({}), &deferred)
            .await
            .expect("a state function")
            .unwrap();
        assert_eq!(answer, json!({"synced": true}));
        assert!(b.wal.is_synced(last));
    }

    #[tokio::test]
    async fn a_page_of_large_records_stops_early_and_the_next_page_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let b = EmbeddedBackend::open(dir.path()).unwrap();
        let big = "x".repeat(20 << 10);
        for i in 0..100 {
            b.set(
                "big",
                &format!("k{i:03}"),
                json!(big),
                None,
                &WriteMeta::default(),
            )
            .await
            .unwrap();
        }
        let (page, more) = b.list_page("big", None, None, 1000).await.unwrap();
        assert!(more, "2 MB of records do not fit one page");
        assert!(
            (PAGE_ROWS_BEFORE_BYTES_COUNT..100).contains(&page.len()),
            "{} rows",
            page.len()
        );
        let all = b.list("big", None).await.unwrap();
        let keys: Vec<String> = all.iter().map(|e| e.key.clone()).collect();
        let expected: Vec<String> = (0..100).map(|i| format!("k{i:03}")).collect();
        assert_eq!(keys, expected, "every record once, in order");
        assert_eq!(all[99].value, json!(big));
    }

    #[tokio::test]
    async fn the_feed_reads_changes_from_the_table_once_each_and_passes_over_one_that_does_not_decode()
     {
        let dir = tempfile::tempdir().unwrap();
        let wait = Duration::from_millis(50);
        // The stored form is written from borrowed parts and read back as a `ChangeRecord`:
        // every field must survive the trip, the trace context too.
        let meta = WriteMeta {
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            baggage: Some("tenant=a".into()),
            ..WriteMeta::default()
        };
        let b = EmbeddedBackend::open(dir.path()).unwrap();
        b.set("s", "a", json!(1), None, &meta).await.unwrap();
        // A record that does not decode, between two that do.
        let seq = b.change_seq.fetch_add(1, Ordering::SeqCst) + 1;
        b.commit(true, |_, log| {
            log.push(Op::ChangePut(seq, b"not a change record".to_vec()));
            Ok::<_, StateError>(())
        })
        .await
        .unwrap();
        b.set("s", "b", json!(2), None, &meta).await.unwrap();

        let got = b.next_batch(1, wait).await.unwrap();
        assert_eq!(keys(&got), ["a"], "at most `max` a batch");
        let got = b.next_batch(10, wait).await.unwrap();
        assert_eq!(keys(&got), ["b"]);
        assert_eq!(got[0].new_value, Some(json!(2)));
        assert!(
            b.next_batch(10, wait).await.unwrap().is_empty(),
            "none twice"
        );

        // Not acknowledged: a restart hands them out again, with their values.
        drop(b);
        let b = EmbeddedBackend::open(dir.path()).unwrap();
        let got = b.next_batch(10, wait).await.unwrap();
        assert_eq!(keys(&got), ["a", "b"]);
        assert_eq!(got[0].new_value, Some(json!(1)));
        assert_eq!(got[1].old_value, None);
        assert_eq!(
            (got[1].kind, got[1].scope.as_str()),
            (ChangeKind::Created, "s")
        );
        assert_eq!(got[1].traceparent, meta.traceparent);
        assert_eq!(got[1].baggage, meta.baggage);
        assert!(got[0].seq < got[1].seq && got[1].position.is_none());
        // What the dispatcher keeps of them is enough to acknowledge them.
        let marks: Vec<ChangeRecord> = got.iter().map(ChangeRecord::acknowledgement).collect();
        assert!(
            marks
                .iter()
                .all(|m| m.new_value.is_none() && m.key.is_empty())
        );
        ChangeFeed::ack(b.as_ref(), &marks).await.unwrap();
        drop(b);
        let b = EmbeddedBackend::open(dir.path()).unwrap();
        assert!(b.next_batch(10, wait).await.unwrap().is_empty());
        b.set("s", "c", json!(3), None, &meta).await.unwrap();
        assert_eq!(keys(&b.next_batch(10, wait).await.unwrap()), ["c"]);
    }
}
