//! A queue's messages and their scheduling in memory (redb holds them durably): which message
//! may be delivered next, found without looking at the others.
//!
//! A message that may be delivered is *scheduled*: in `ready` once it is visible, or in
//! `delayed` until then. In a FIFO queue only the first message of a group is ever scheduled,
//! and only while none of the group is in flight; a message without a group (or any message
//! of a standard queue) is scheduled whenever it is not in flight. So a receive takes the
//! first entries of `ready` (after moving the delayed ones that are due), whatever the number
//! of messages queued behind busy or delayed groups: it used to scan every message of the
//! queue, and rebuild the set of busy groups, on each call.

use bus::queue::{QueueConfig, QueueKind, QueueMessage};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a deduplication id suppresses a second enqueue (as SQS FIFO).
pub(super) const DEDUP_WINDOW: Duration = Duration::from_secs(300);

pub(super) struct MemMsg {
    pub message: QueueMessage,
    pub visible_at: Instant,
    pub in_flight: bool,
}

/// One FIFO group's messages.
#[derive(Default)]
struct Group {
    seqs: BTreeSet<u64>,
    in_flight: usize,
    /// The message of the group in `ready` or `delayed`, if any (its first).
    scheduled: Option<u64>,
}

pub(super) struct MemQueue {
    pub cfg: QueueConfig,
    msgs: BTreeMap<u64, MemMsg>,
    groups: HashMap<String, Group>,
    ready: BTreeSet<u64>,
    delayed: BTreeSet<(Instant, u64)>,
    in_flight: usize,
    pub dedup: HashMap<String, (String, Instant)>,
    /// The deduplication ids in the order they were recorded, so expiring them is amortized
    /// O(1) per send instead of a scan of every id of the last five minutes.
    pub dedup_order: VecDeque<(Instant, String)>,
    pub notify: Arc<Notify>,
}

impl MemQueue {
    pub fn new(cfg: QueueConfig) -> Self {
        Self {
            cfg,
            msgs: BTreeMap::new(),
            groups: HashMap::new(),
            ready: BTreeSet::new(),
            delayed: BTreeSet::new(),
            in_flight: 0,
            dedup: HashMap::new(),
            dedup_order: Default::default(),
            notify: Arc::new(Notify::new()),
        }
    }

    pub fn expire_dedup(&mut self, now: Instant) {
        while let Some((at, _)) = self.dedup_order.front() {
            if now.duration_since(*at) < DEDUP_WINDOW {
                break;
            }
            if let Some((at, id)) = self.dedup_order.pop_front()
                && self
                    .dedup
                    .get(&id)
                    .is_some_and(|(_, recorded)| *recorded == at)
            {
                self.dedup.remove(&id);
            }
        }
    }

    /// A new config; a queue that becomes FIFO (or stops being one) is scheduled anew.
    pub fn set_config(&mut self, cfg: QueueConfig) {
        let regroup = (cfg.kind == QueueKind::Fifo) != self.fifo();
        self.cfg = cfg;
        if regroup {
            let msgs = std::mem::take(&mut self.msgs);
            self.groups.clear();
            self.ready.clear();
            self.delayed.clear();
            self.in_flight = 0;
            let now = Instant::now();
            for (seq, m) in msgs {
                self.insert(seq, m, now);
            }
        }
    }

    /// Messages not in flight, and in flight.
    pub fn counts(&self) -> (usize, usize) {
        (self.msgs.len() - self.in_flight, self.in_flight)
    }

    pub fn get_mut(&mut self, seq: u64) -> Option<&mut QueueMessage> {
        self.msgs.get_mut(&seq).map(|m| &mut m.message)
    }

    fn fifo(&self) -> bool {
        self.cfg.kind == QueueKind::Fifo
    }

    /// The FIFO group a message waits in (none outside a FIFO queue).
    fn group_of<'a>(&self, m: &'a MemMsg) -> Option<&'a str> {
        m.message.group.as_deref().filter(|_| self.fifo())
    }

    /// [`MemQueue::group_of`] the message numbered `seq`, owned (the group is then changed).
    fn group_of_seq(&self, seq: u64) -> Option<String> {
        self.msgs
            .get(&seq)
            .and_then(|m| self.group_of(m))
            .map(str::to_owned)
    }

    /// Add a message (a send, a redrive, a message found at open).
    pub fn insert(&mut self, seq: u64, m: MemMsg, now: Instant) {
        // The same number again (not expected): replaced, as if removed first.
        self.remove(seq);
        let group = self.group_of(&m).map(str::to_owned);
        let in_flight = m.in_flight;
        if in_flight {
            self.in_flight += 1;
        }
        self.msgs.insert(seq, m);
        match group {
            Some(g) => {
                let entry = self.groups.entry(g.clone()).or_default();
                entry.seqs.insert(seq);
                if in_flight {
                    entry.in_flight += 1;
                }
                self.reschedule_group(&g, now);
            }
            None if !in_flight => self.schedule(seq, now),
            None => {}
        }
    }

    /// Up to `max` messages to deliver now, in order, marked in flight; and when the next
    /// delayed one becomes visible.
    pub fn take(
        &mut self,
        max: usize,
        now: Instant,
    ) -> (Vec<(u64, QueueMessage)>, Option<Instant>) {
        while let Some(&(at, seq)) = self.delayed.first() {
            if at > now {
                break;
            }
            self.delayed.pop_first();
            self.ready.insert(seq);
        }
        let mut out = Vec::new();
        while out.len() < max {
            let Some(seq) = self.ready.pop_first() else {
                break;
            };
            let group = self.group_of_seq(seq);
            let Some(m) = self.msgs.get_mut(&seq) else {
                continue;
            };
            m.in_flight = true;
            self.in_flight += 1;
            out.push((seq, m.message.clone()));
            if let Some(g) = group.and_then(|g| self.groups.get_mut(&g)) {
                g.in_flight += 1;
                g.scheduled = None;
            }
        }
        (out, self.delayed.first().map(|(at, _)| *at))
    }

    /// A message is done with (acknowledged, or moved to the dead letters): its group's next
    /// one may go.
    pub fn remove(&mut self, seq: u64) -> Option<QueueMessage> {
        self.unschedule(seq);
        let m = self.msgs.remove(&seq)?;
        if m.in_flight {
            self.in_flight -= 1;
        }
        if let Some(g) = self.group_of(&m).map(str::to_owned)
            && let Some(group) = self.groups.get_mut(&g)
        {
            group.seqs.remove(&seq);
            if m.in_flight {
                group.in_flight = group.in_flight.saturating_sub(1);
            }
            if group.scheduled == Some(seq) {
                group.scheduled = None;
            }
            if group.seqs.is_empty() {
                self.groups.remove(&g);
            } else {
                self.reschedule_group(&g, Instant::now());
            }
        }
        Some(m.message)
    }

    /// A message goes back to wait (a failure to retry, a release): visible again at
    /// `visible_at`, no longer in flight.
    pub fn retry(&mut self, seq: u64, visible_at: Instant, now: Instant) {
        self.unschedule(seq);
        let Some(m) = self.msgs.get_mut(&seq) else {
            return;
        };
        let was_in_flight = std::mem::replace(&mut m.in_flight, false);
        m.visible_at = visible_at;
        if was_in_flight {
            self.in_flight -= 1;
        }
        match self.group_of_seq(seq) {
            Some(g) => {
                if let Some(group) = self.groups.get_mut(&g) {
                    if was_in_flight {
                        group.in_flight = group.in_flight.saturating_sub(1);
                    }
                    // Unscheduled above: scheduled again below, at its new time.
                    if group.scheduled == Some(seq) {
                        group.scheduled = None;
                    }
                }
                self.reschedule_group(&g, now);
            }
            None => self.schedule(seq, now),
        }
    }

    /// The group's first message scheduled, if none of the group is in flight.
    fn reschedule_group(&mut self, g: &str, now: Instant) {
        let Some(group) = self.groups.get_mut(g) else {
            return;
        };
        let want = if group.in_flight == 0 {
            group.seqs.first().copied()
        } else {
            None
        };
        if group.scheduled == want {
            return;
        }
        let old = std::mem::replace(&mut group.scheduled, want);
        if let Some(old) = old {
            self.unschedule(old);
        }
        if let Some(seq) = want {
            self.schedule(seq, now);
        }
    }

    fn schedule(&mut self, seq: u64, now: Instant) {
        let Some(m) = self.msgs.get(&seq) else {
            return;
        };
        if m.visible_at <= now {
            self.ready.insert(seq);
        } else {
            self.delayed.insert((m.visible_at, seq));
        }
    }

    fn unschedule(&mut self, seq: u64) {
        if !self.ready.remove(&seq)
            && let Some(m) = self.msgs.get(&seq)
        {
            self.delayed.remove(&(m.visible_at, seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(group: Option<&str>) -> QueueMessage {
        let wire = serde_json::json!({"id": "m", "queue": "q", "group": group, "data": null, "enqueued_at_ms": 0});
        serde_json::from_value(wire).expect("a queue message")
    }

    fn add(q: &mut MemQueue, seq: u64, group: Option<&str>, now: Instant) {
        let m = MemMsg {
            message: msg(group),
            visible_at: now,
            in_flight: false,
        };
        q.insert(seq, m, now);
    }

    fn seqs(taken: (Vec<(u64, QueueMessage)>, Option<Instant>)) -> Vec<u64> {
        taken.0.into_iter().map(|(s, _)| s).collect()
    }

    /// One message per group at a time, in order; a message without a group goes whenever
    /// it is not in flight.
    #[test]
    fn a_fifo_group_delivers_its_messages_one_at_a_time_in_order() {
        let now = Instant::now();
        let mut q = MemQueue::new(QueueConfig::fifo("q", "sid"));
        add(&mut q, 1, Some("a"), now);
        add(&mut q, 2, Some("a"), now);
        add(&mut q, 3, Some("b"), now);
        add(&mut q, 4, None, now);
        add(&mut q, 5, Some("b"), now);
        assert_eq!(seqs(q.take(10, now)), vec![1, 3, 4]);
        assert_eq!(q.counts(), (2, 3));
        assert!(seqs(q.take(10, now)).is_empty(), "both groups are busy");
        q.remove(3);
        assert_eq!(seqs(q.take(10, now)), vec![5]);
        q.remove(1);
        assert_eq!(seqs(q.take(1, now)), vec![2]);
        for seq in [2, 4, 5] {
            assert!(q.remove(seq).is_some());
        }
        assert_eq!(q.counts(), (0, 0));
        assert!(q.groups.is_empty() && q.ready.is_empty() && q.delayed.is_empty());
    }

    /// A group whose first message waits out its backoff waits with it; the others go on.
    #[test]
    fn a_delayed_first_message_holds_its_group_until_it_is_visible() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        let mut q = MemQueue::new(QueueConfig::fifo("q", "sid"));
        add(&mut q, 1, Some("a"), now);
        add(&mut q, 2, Some("a"), now);
        add(&mut q, 3, Some("b"), now);
        assert_eq!(seqs(q.take(1, now)), vec![1]);
        q.retry(1, later, now);
        let (taken, next) = q.take(10, now);
        assert_eq!(taken.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![3]);
        assert_eq!(
            next,
            Some(later),
            "the receive wakes when the first is visible"
        );
        assert!(seqs(q.take(10, now)).is_empty());
        assert_eq!(seqs(q.take(10, later)), vec![1]);
        // A release puts it back at once.
        q.retry(1, later, later);
        assert_eq!(seqs(q.take(10, later)), vec![1]);
        q.remove(1);
        assert_eq!(seqs(q.take(10, later)), vec![2]);
    }

    /// A standard queue ignores groups; a queue declared FIFO afterwards groups what it holds.
    #[test]
    fn groups_count_only_once_the_queue_is_fifo() {
        let now = Instant::now();
        let mut q = MemQueue::new(QueueConfig::standard("q"));
        for seq in 1..=3 {
            add(&mut q, seq, Some("a"), now);
        }
        add(&mut q, 4, Some("b"), now);
        assert_eq!(seqs(q.take(2, now)), vec![1, 2]);
        q.set_config(QueueConfig::fifo("q", "sid"));
        // Group a has two in flight: it waits for both; b goes.
        assert_eq!(q.counts(), (2, 2));
        assert_eq!(seqs(q.take(10, now)), vec![4]);
        q.remove(1);
        assert!(seqs(q.take(10, now)).is_empty());
        q.remove(2);
        assert_eq!(seqs(q.take(10, now)), vec![3]);
    }

    /// A release or failure of a message that is not in flight (a repeated one, or a
    /// consumer's mistake) moves it to its new time and keeps it scheduled, in a group or
    /// not.
    #[test]
    fn a_message_put_back_while_not_in_flight_stays_scheduled() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let mut q = MemQueue::new(QueueConfig::fifo("q", "sid"));
        add(&mut q, 1, Some("a"), now);
        add(&mut q, 2, None, now);
        q.retry(1, later, now);
        q.retry(2, later, now);
        q.retry(2, later, now);
        let (taken, next) = q.take(10, now);
        assert!(taken.is_empty());
        assert_eq!(next, Some(later));
        assert_eq!(seqs(q.take(10, later)), vec![1, 2]);
        assert_eq!(q.counts(), (0, 2));
    }

    /// Tens of thousands of messages behind busy groups are not looked at by a receive: only
    /// each group's first message is ever scheduled.
    #[test]
    fn messages_behind_busy_groups_are_never_scheduled() {
        let now = Instant::now();
        let mut q = MemQueue::new(QueueConfig::fifo("q", "sid"));
        let groups: Vec<String> = (0..50).map(|g| format!("s{g}")).collect();
        for seq in 0..50_000u64 {
            add(&mut q, seq + 1, Some(&groups[(seq % 50) as usize]), now);
        }
        assert_eq!(q.ready.len(), 50, "one per group");
        let first = seqs(q.take(usize::MAX, now));
        assert_eq!(first, (1..=50).collect::<Vec<_>>());
        assert!(q.ready.is_empty() && q.delayed.is_empty());
        assert!(seqs(q.take(usize::MAX, now)).is_empty());
        // Each acknowledgement schedules its group's next message, and only that one.
        q.remove(7);
        assert_eq!(q.ready.len(), 1);
        assert_eq!(seqs(q.take(usize::MAX, now)), vec![57]);
        assert_eq!(q.counts(), (50_000 - 1 - 50, 50));
    }
}
