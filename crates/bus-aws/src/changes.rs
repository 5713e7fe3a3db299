//! `ChangeFeed` from DynamoDB Streams (`NEW_AND_OLD_IMAGES`): every shard is read, a child
//! shard only after its parent is finished (order per item), and sequence numbers are
//! checkpointed durably in the checkpoint table, so a restart resumes right after what was
//! acknowledged: nothing acknowledged is replayed, nothing unacknowledged is skipped.

use async_trait::async_trait;
use aws_sdk_dynamodbstreams::types::{AttributeValue, OperationType, ShardIteratorType};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::{AwsClients, AwsNames, err_code, err_text, spill};
use bus::state::{ChangeFeed, ChangeKind, ChangeRecord, StateError, is_reserved_scope};

const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// How often the engine's own feed (state triggers) polls an idle shard.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How often an event-source mapping polls an idle shard: "Lambda polls shards in your
/// DynamoDB stream for records at a base rate of 4 times per second" (the Lambda developer
/// guide, "Using AWS Lambda with Amazon DynamoDB", Polling and batching streams).
pub const MAPPING_POLL_EVERY: Duration = Duration::from_millis(250);
const SEP: char = '\u{1}';

#[derive(Default)]
struct ShardState {
    parent: Option<String>,
    iterator: Option<String>,
    finished: bool,
    /// Sequence number of the last record handed out (to reopen an expired iterator).
    last_handed: Option<String>,
}

#[derive(Default)]
struct Inner {
    stream_arn: Option<String>,
    shards: BTreeMap<String, ShardState>,
    refreshed: Option<Instant>,
}

pub struct StreamsFeed {
    clients: AwsClients,
    table: String,
    checkpoints: String,
    inner: tokio::sync::Mutex<Inner>,
    /// Hand out every record, as a DynamoDB stream does (an event-source mapping's filter
    /// decides what reaches its function); the engine's own feed (state triggers) leaves
    /// every `$` scope out.
    every_record: bool,
    /// Whose checkpoints these are, when not the engine's.
    consumer: Option<String>,
    /// How long an idle read waits before it polls the shards again.
    poll_every: Duration,
}

fn storage(e: impl std::fmt::Display) -> StateError {
    StateError::Storage(e.to_string())
}

fn text(img: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    match img.get(name) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    }
}

/// An image's value: inline, or read from its parts when it was stored apart (`spill`).
async fn image_value(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    img: Option<&HashMap<String, AttributeValue>>,
) -> Result<Option<Value>, StateError> {
    let Some(img) = img else { return Ok(None) };
    if let Some(t) = text(img, "value") {
        return Ok(serde_json::from_str(&t).ok());
    }
    let count = match img.get(spill::COUNT) {
        Some(AttributeValue::N(n)) => Some(n.as_str()),
        _ => None,
    };
    let (generation, digest) = (text(img, spill::GENERATION), text(img, spill::DIGEST));
    match spill::parts_of(generation.as_deref(), count, digest.as_deref())? {
        Some(parts) => spill::read_parts(ddb, table, &parts).await.map(Some),
        None => Ok(None),
    }
}

impl StreamsFeed {
    pub fn new(clients: AwsClients, names: &AwsNames) -> Self {
        Self {
            clients,
            table: names.state_table(),
            checkpoints: names.checkpoint_table(),
            inner: tokio::sync::Mutex::new(Inner::default()),
            every_record: false,
            consumer: None,
            poll_every: POLL_EVERY,
        }
    }

    /// The feed an event-source mapping to the stream router reads: every record of the
    /// table's stream (the mapping's `FilterCriteria` picks), checkpointed under `consumer`,
    /// an idle shard polled at Lambda's rate ([`MAPPING_POLL_EVERY`]).
    pub fn for_stream_router(clients: AwsClients, names: &AwsNames, consumer: &str) -> Self {
        Self {
            every_record: true,
            consumer: Some(consumer.to_string()),
            poll_every: MAPPING_POLL_EVERY,
            ..Self::new(clients, names)
        }
    }

    fn checkpoint_id(&self, shard: &str) -> String {
        match &self.consumer {
            None => format!("stream/{}/{shard}", self.table),
            Some(c) => format!("stream/{}/{c}/{shard}", self.table),
        }
    }

    async fn refresh(&self, inner: &mut Inner) -> Result<(), StateError> {
        if inner.stream_arn.is_none() {
            let d = self
                .clients
                .dynamodb
                .describe_table()
                .table_name(&self.table)
                .send()
                .await
                .map_err(|e| storage(err_text(&e)))?;
            let arn = d
                .table()
                .and_then(|t| t.latest_stream_arn())
                .ok_or_else(|| storage(format!("table {} has no stream enabled", self.table)))?;
            inner.stream_arn = Some(arn.to_string());
        }
        let arn = inner.stream_arn.clone().unwrap_or_default();
        let mut start: Option<String> = None;
        loop {
            let mut req = self.clients.streams.describe_stream().stream_arn(&arn);
            if let Some(s) = &start {
                req = req.exclusive_start_shard_id(s);
            }
            let out = req.send().await.map_err(|e| storage(err_text(&e)))?;
            let Some(desc) = out.stream_description() else {
                break;
            };
            for shard in desc.shards() {
                let Some(id) = shard.shard_id() else { continue };
                inner
                    .shards
                    .entry(id.to_string())
                    .or_insert_with(|| ShardState {
                        parent: shard.parent_shard_id().map(str::to_owned),
                        ..Default::default()
                    });
            }
            match desc.last_evaluated_shard_id() {
                Some(last) => start = Some(last.to_string()),
                None => break,
            }
        }
        inner.refreshed = Some(Instant::now());
        Ok(())
    }

    async fn load_checkpoint(&self, shard: &str) -> Result<Option<String>, StateError> {
        let out = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.checkpoints)
            .key(
                "id",
                aws_sdk_dynamodb::types::AttributeValue::S(self.checkpoint_id(shard)),
            )
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| storage(err_text(&e)))?;
        Ok(match out.item().and_then(|i| i.get("seq")) {
            Some(aws_sdk_dynamodb::types::AttributeValue::S(s)) => Some(s.clone()),
            _ => None,
        })
    }

    async fn open_iterator(
        &self,
        arn: &str,
        shard: &str,
        after: Option<String>,
    ) -> Result<Option<String>, StateError> {
        let mut req = self
            .clients
            .streams
            .get_shard_iterator()
            .stream_arn(arn)
            .shard_id(shard);
        req = match &after {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        match req.send().await {
            Ok(out) => Ok(out.shard_iterator().map(str::to_owned)),
            Err(e) if err_code(&e).as_deref() == Some("ResourceNotFoundException") => Ok(None),
            Err(e) => Err(storage(err_text(&e))),
        }
    }

    /// Read one shard; returns the records it had (possibly none).
    async fn read_shard(
        &self,
        inner: &mut Inner,
        shard: &str,
        max: usize,
    ) -> Result<Vec<ChangeRecord>, StateError> {
        let arn = inner.stream_arn.clone().unwrap_or_default();
        let needs_open = inner
            .shards
            .get(shard)
            .is_some_and(|s| s.iterator.is_none());
        if needs_open {
            let after = match inner.shards.get(shard).and_then(|s| s.last_handed.clone()) {
                Some(seq) => Some(seq),
                None => self.load_checkpoint(shard).await?,
            };
            let it = self.open_iterator(&arn, shard, after).await?;
            let st = inner.shards.entry(shard.to_string()).or_default();
            match it {
                Some(it) => st.iterator = Some(it),
                None => {
                    st.finished = true;
                    return Ok(Vec::new());
                }
            }
        }
        let Some(iterator) = inner.shards.get(shard).and_then(|s| s.iterator.clone()) else {
            return Ok(Vec::new());
        };
        let out = match self
            .clients
            .streams
            .get_records()
            .shard_iterator(&iterator)
            .limit(max.clamp(1, 1000) as i32)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                let code = err_code(&e);
                if matches!(
                    code.as_deref(),
                    Some("ExpiredIteratorException") | Some("TrimmedDataAccessException")
                ) {
                    // Reopen after the last record handed out (or the checkpoint).
                    if let Some(st) = inner.shards.get_mut(shard) {
                        st.iterator = None;
                    }
                    return Ok(Vec::new());
                }
                return Err(storage(err_text(&e)));
            }
        };
        let mut records = Vec::new();
        let mut last_seq = None;
        for r in out.records() {
            let Some(ddb) = r.dynamodb() else { continue };
            let Some(seq) = ddb.sequence_number() else {
                continue;
            };
            last_seq = Some(seq.to_string());
            let keys = ddb.keys().cloned().unwrap_or_default();
            let (Some(scope), Some(key)) = (text(&keys, "scope"), text(&keys, "key")) else {
                continue;
            };
            if is_reserved_scope(&scope) && !self.every_record {
                continue;
            }
            let kind = match r.event_name() {
                Some(OperationType::Insert) => ChangeKind::Created,
                Some(OperationType::Modify) => ChangeKind::Updated,
                Some(OperationType::Remove) => ChangeKind::Deleted,
                _ => continue,
            };
            let new_image = ddb.new_image();
            records.push(ChangeRecord {
                seq: 0,
                position: Some(format!("{shard}{SEP}{seq}")),
                kind,
                scope,
                key,
                old_value: image_value(&self.clients.dynamodb, &self.table, ddb.old_image())
                    .await?,
                new_value: image_value(&self.clients.dynamodb, &self.table, new_image).await?,
                traceparent: new_image.and_then(|i| text(i, "tp")),
                baggage: new_image.and_then(|i| text(i, "bg")),
            });
        }
        let st = inner.shards.entry(shard.to_string()).or_default();
        if last_seq.is_some() {
            st.last_handed = last_seq;
        }
        match out.next_shard_iterator() {
            Some(next) => st.iterator = Some(next.to_string()),
            None => {
                st.iterator = None;
                st.finished = true;
            }
        }
        Ok(records)
    }
}

#[async_trait]
impl ChangeFeed for StreamsFeed {
    async fn next_batch(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<ChangeRecord>, StateError> {
        let deadline = Instant::now() + wait;
        loop {
            {
                let mut inner = self.inner.lock().await;
                if inner.refreshed.is_none_or(|t| t.elapsed() >= REFRESH_EVERY) {
                    self.refresh(&mut inner).await?;
                }
                // Shards whose parent is done (or unknown: trimmed away) may be read.
                let ready: Vec<String> = inner
                    .shards
                    .iter()
                    .filter(|(_, s)| !s.finished)
                    .filter(|(_, s)| {
                        s.parent
                            .as_ref()
                            .is_none_or(|p| inner.shards.get(p).is_none_or(|ps| ps.finished))
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                for shard in ready {
                    let records = self.read_shard(&mut inner, &shard, max).await?;
                    if !records.is_empty() {
                        return Ok(records);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            tokio::time::sleep(
                self.poll_every
                    .min(deadline.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    async fn ack(&self, records: &[ChangeRecord]) -> Result<(), StateError> {
        // The last record of each shard in the batch (records of a shard are in order).
        let mut last: HashMap<&str, &str> = HashMap::new();
        for r in records {
            if let Some((shard, seq)) = r.position.as_deref().and_then(|p| p.split_once(SEP)) {
                last.insert(shard, seq);
            }
        }
        for (shard, seq) in last {
            self.clients
                .dynamodb
                .put_item()
                .table_name(&self.checkpoints)
                .item(
                    "id",
                    aws_sdk_dynamodb::types::AttributeValue::S(self.checkpoint_id(shard)),
                )
                .item(
                    "seq",
                    aws_sdk_dynamodb::types::AttributeValue::S(seq.to_string()),
                )
                .send()
                .await
                .map_err(|e| storage(err_text(&e)))?;
        }
        Ok(())
    }
}
