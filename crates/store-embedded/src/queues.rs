//! The embedded backend's queues: durable messages in redb, scheduling in memory.

use super::*;

impl EmbeddedBackend {
    fn with_queue<T>(&self, queue: &str, f: impl FnOnce(&mut MemQueue) -> T) -> T {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let q = queues
            .entry(queue.to_string())
            .or_insert_with(|| MemQueue::new(QueueConfig::standard(queue)));
        f(q)
    }

    fn seq_of(d: &Delivery) -> Result<u64, QueueError> {
        d.receipt
            .parse()
            .map_err(|_| QueueError::Invalid(format!("unknown receipt `{}`", d.receipt)))
    }
}

#[async_trait]
impl QueueBackend for EmbeddedBackend {
    async fn declare(&self, cfg: &QueueConfig) -> Result<(), QueueError> {
        let bytes = serde_json::to_vec(cfg).map_err(qstorage)?;
        let name = cfg.name.clone();
        self.commit(false, |_, log| {
            log.push(Op::QueueConfigPut(name, bytes));
            Ok::<_, QueueError>(())
        })
        .await?;
        self.with_queue(&cfg.name, |q| {
            q.set_config(cfg.clone());
            q.notify.notify_one();
        });
        Ok(())
    }

    async fn config(&self, queue: &str) -> Option<QueueConfig> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.get(queue).map(|q| q.cfg.clone())
    }

    async fn send(&self, msg: QueueMessage) -> Result<String, QueueError> {
        if let Some(dedup) = &msg.deduplication_id {
            let now = Instant::now();
            let seen = self.with_queue(&msg.queue, |q| {
                q.expire_dedup(now);
                q.dedup.get(dedup).map(|(id, _)| id.clone())
            });
            if let Some(id) = seen {
                return Ok(id);
            }
        }
        let bytes = serde_json::to_vec(&msg).map_err(qstorage)?;
        let queue = msg.queue.clone();
        let seqs = self.queue_seq.clone();
        let deferred = bus::state::baggage_defers(msg.baggage.as_deref());
        let seq = self
            .commit(deferred, |_, log| {
                let seq = seqs.fetch_add(1, Ordering::SeqCst) + 1;
                log.push(Op::MsgPut(queue, seq, bytes));
                Ok::<_, QueueError>(seq)
            })
            .await?;
        let id = msg.id.clone();
        self.with_queue(&msg.queue.clone(), |q| {
            if let Some(dedup) = &msg.deduplication_id {
                let now = Instant::now();
                q.dedup.insert(dedup.clone(), (id.clone(), now));
                q.dedup_order.push_back((now, dedup.clone()));
            }
            let now = Instant::now();
            q.insert(
                seq,
                MemMsg {
                    message: msg,
                    visible_at: now,
                    in_flight: false,
                },
                now,
            );
            q.notify.notify_one();
        });
        Ok(id)
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let now = Instant::now();
            let (batch, next_visible, notify) = self.with_queue(queue, |q| {
                let (taken, next_visible) = q.take(max, now);
                let batch: Vec<Delivery> = taken
                    .into_iter()
                    .map(|(seq, message)| Delivery {
                        receipt: seq.to_string(),
                        attempt: message.attempts + 1,
                        message,
                    })
                    .collect();
                (batch, next_visible, q.notify.clone())
            });
            if !batch.is_empty() {
                return Ok(batch);
            }
            let mut wake = deadline;
            if let Some(nv) = next_visible {
                let nv = tokio::time::Instant::from_std(nv);
                if nv < wake {
                    wake = nv;
                }
            }
            if tokio::time::timeout_at(wake, notify.notified())
                .await
                .is_err()
                && tokio::time::Instant::now() >= deadline
            {
                return Ok(Vec::new());
            }
        }
    }

    async fn ack(&self, d: &Delivery) -> Result<(), QueueError> {
        let seq = Self::seq_of(d)?;
        let queue = d.message.queue.clone();
        // A message sent with deferred durability is acknowledged the same way: losing the
        // acknowledgement in a crash redelivers a step whose writes were lost with it.
        let deferred = bus::state::baggage_defers(d.message.baggage.as_deref());
        // The handler is done: free its FIFO group for the next message now, while the
        // acknowledgement commits. If that commit is lost, a restart delivers the message once
        // more, as a crash between handler and acknowledgement always could (at least once).
        self.with_queue(&d.message.queue, |q| {
            q.remove(seq);
            q.notify.notify_one();
        });
        self.commit(deferred, |_, log| {
            log.push(Op::MsgDel(queue, seq));
            Ok::<_, QueueError>(())
        })
        .await
    }

    async fn fail(
        &self,
        d: &Delivery,
        error: &str,
        delay: Duration,
        dead_letter: bool,
    ) -> Result<(), QueueError> {
        let seq = Self::seq_of(d)?;
        let mut message = d.message.clone();
        message.attempts = d.attempt;
        message.last_error = Some(error.chars().take(2000).collect());
        let bytes = serde_json::to_vec(&message).map_err(qstorage)?;
        let queue = message.queue.clone();
        self.commit(false, |_, log| {
            if dead_letter {
                log.push(Op::MsgDel(queue.clone(), seq));
                log.push(Op::DeadPut(queue, seq, bytes));
            } else {
                log.push(Op::MsgPut(queue, seq, bytes));
            }
            Ok::<_, QueueError>(())
        })
        .await?;
        self.with_queue(&d.message.queue, |q| {
            if dead_letter {
                q.remove(seq);
            } else if let Some(m) = q.get_mut(seq) {
                *m = message;
                let now = Instant::now();
                q.retry(seq, now + delay, now);
            }
            q.notify.notify_one();
        });
        Ok(())
    }

    async fn release(&self, d: &Delivery, delay: Duration) -> Result<(), QueueError> {
        let seq = Self::seq_of(d)?;
        self.with_queue(&d.message.queue, |q| {
            let now = Instant::now();
            q.retry(seq, now + delay, now);
            q.notify.notify_one();
        });
        Ok(())
    }

    async fn redrive(&self, queue: &str) -> Result<usize, QueueError> {
        let name = queue.to_string();
        let seqs = self.queue_seq.clone();
        let moved = self
            .commit(false, |txn, log| {
                let mut out = Vec::new();
                {
                    let dead = txn.open_table(QUEUE_DEAD).map_err(qstorage)?;
                    let mut revived = Vec::new();
                    for row in dead
                        .range((name.as_str(), 0)..=(name.as_str(), u64::MAX))
                        .map_err(qstorage)?
                    {
                        let (k, v) = row.map_err(qstorage)?;
                        let mut m: QueueMessage =
                            serde_json::from_slice(v.value()).map_err(qstorage)?;
                        m.attempts = 0;
                        revived.push((k.value().1, m));
                    }
                    for (old_seq, m) in revived {
                        let seq = seqs.fetch_add(1, Ordering::SeqCst) + 1;
                        let bytes = serde_json::to_vec(&m).map_err(qstorage)?;
                        log.push(Op::DeadDel(name.clone(), old_seq));
                        log.push(Op::MsgPut(name.clone(), seq, bytes));
                        out.push((seq, m));
                    }
                }
                Ok::<_, QueueError>(out)
            })
            .await?;
        let count = moved.len();
        self.with_queue(queue, |q| {
            let now = Instant::now();
            for (seq, message) in moved {
                q.insert(
                    seq,
                    MemMsg {
                        message,
                        visible_at: now,
                        in_flight: false,
                    },
                    now,
                );
            }
            q.notify.notify_one();
        });
        Ok(count)
    }

    async fn dead_letters(&self, queue: &str) -> Result<Vec<QueueMessage>, QueueError> {
        let name = queue.to_string();
        let wal = self.wal.clone();
        self.blocking(move |db| {
            let read = wal.snapshot(db)?;
            let dead = read.open_table(QUEUE_DEAD).map_err(qstorage)?;
            let mut out = Vec::new();
            for row in dead
                .range((name.as_str(), 0)..=(name.as_str(), u64::MAX))
                .map_err(qstorage)?
            {
                let (_, v) = row.map_err(qstorage)?;
                out.push(serde_json::from_slice(v.value()).map_err(qstorage)?);
            }
            Ok(out)
        })
        .await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let dead = self.dead_letters(queue).await?.len();
        let (pending, in_flight) = self.with_queue(queue, |q| q.counts());
        Ok(QueueStats {
            pending,
            in_flight,
            dead,
        })
    }

    async fn queues(&self) -> Vec<QueueConfig> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<QueueConfig> = queues.values().map(|q| q.cfg.clone()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}
