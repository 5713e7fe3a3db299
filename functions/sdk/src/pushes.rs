//! A Lambda's pushes to WebSocket clients (`PostToConnection`), off the path of the call
//! that wrote them. A write's stored stream events used to be posted before the write's call
//! returned: a read of the subscriptions and a post, about a tenth of a tool call on the
//! turn's path, twice per tool call. They now go to one queue per process, which a task
//! empties in order while the call goes on; `stream::send` goes through the same queue, so
//! a client still gets one Lambda's events in the order they were written and sent. Before
//! a Lambda answers, [`Pushes::drained`] waits for the queue: once answered, its process
//! may be frozen.
//!
//! Stored writes queued behind each other go out after one read of the subscriptions
//! (made after all of them committed, so a client that subscribed before any of those
//! commits gets every event), and a `batch` subscriber gets their events of one group in
//! one message.
//!
//! A `stream::send` marked `latest` (an event that holds everything the one before it of the
//! same kind did: the orchestrator's partial message) returns once queued, not once posted,
//! and replaces the event of its kind still waiting at the queue's end: the queue's order is
//! the order a client gets them in, so its sender need not wait for the post to keep its
//! events in order, and a fast stream still costs a post per post's time, not per event.

use async_trait::async_trait;
use bus_aws::connections::{Connections, OwnedStreamEvent, StreamEvent};
use bus_telemetry::tracing_bridge::CallPosition;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::{mpsc, oneshot};

/// Where the queue's jobs are posted: the WebSocket API's connections (a port, so the queue's
/// order and merging are tested without AWS).
#[async_trait]
pub(crate) trait Post: Send + Sync + 'static {
    /// A committed write's events, then those `then` gives once the subscriptions are read,
    /// in the same posts → how many posts reached a connection.
    async fn stored(
        &self,
        events: &[StreamEvent<'_>],
        then: &mut (dyn FnMut() -> Vec<OwnedStreamEvent> + Send),
    ) -> Result<usize, String>;
    /// One `stream::send` event → how many connections it reached.
    async fn send(&self, event: StreamEvent<'_>) -> Result<usize, String>;
}

#[async_trait]
impl Post for Connections {
    async fn stored(
        &self,
        events: &[StreamEvent<'_>],
        then: &mut (dyn FnMut() -> Vec<OwnedStreamEvent> + Send),
    ) -> Result<usize, String> {
        self.push_stored(events, then).await
    }
    async fn send(&self, e: StreamEvent<'_>) -> Result<usize, String> {
        self.send_stream_event(e.stream, e.group, e.item, e.event_type, e.data)
            .await
    }
}

/// Most pushes waiting; a writer past it waits for room (the queue never grows unbounded).
const QUEUE: usize = 256;
/// Most stored writes whose events go out after one read of the subscriptions.
const COALESCE: usize = 32;

enum Job {
    /// A committed write's stored events, in the order written.
    Stored {
        events: Vec<OwnedStreamEvent>,
        at: CallPosition,
    },
    /// `stream::send`: answered with how many connections it reached.
    Send {
        event: OwnedStreamEvent,
        at: CallPosition,
        done: oneshot::Sender<Result<usize, String>>,
    },
    /// `stream::send` marked `latest`: the newest event of its kind, until it is taken.
    Latest(LatestSlot),
    /// Answered once every job before it is done.
    Drained(oneshot::Sender<()>),
}

/// A queued `latest` event, which a later one of the same kind replaces until the queue's
/// consumer takes it (and leaves `None`).
type LatestSlot = Arc<Mutex<Option<(OwnedStreamEvent, CallPosition)>>>;

/// Whether `b` may replace `a`: the same stream, group, item and type.
fn same_kind(a: &OwnedStreamEvent, b: &OwnedStreamEvent) -> bool {
    (&a.stream, &a.group, &a.item, &a.event_type) == (&b.stream, &b.group, &b.item, &b.event_type)
}

fn lock(slot: &LatestSlot) -> std::sync::MutexGuard<'_, Option<(OwnedStreamEvent, CallPosition)>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

const GONE: &str = "this Lambda's push queue is gone";

pub(crate) struct Pushes {
    connections: Arc<dyn Post>,
    /// Started with the first push (a task needs the runtime, which a bus built outside it
    /// would not have).
    queue: OnceLock<mpsc::Sender<Job>>,
    /// Held while a job is queued (so the queue's order is the order jobs were handed in):
    /// the `latest` event at the queue's end, if that is what it is, which a next one of its
    /// kind may replace while it waits.
    tail: tokio::sync::Mutex<Option<LatestSlot>>,
}

impl Pushes {
    pub(crate) fn new(connections: impl Post) -> Self {
        Self {
            connections: Arc::new(connections),
            queue: OnceLock::new(),
            tail: tokio::sync::Mutex::new(None),
        }
    }

    fn queue(&self) -> &mpsc::Sender<Job> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(run(self.connections.clone(), rx));
            tx
        })
    }

    /// Queue a job behind every one before it (waiting for room: the queue is bounded).
    async fn queue_job(&self, job: Job) -> Result<(), String> {
        let mut tail = self.tail.lock().await;
        self.queue_behind(&mut tail, job).await
    }

    /// [`Self::queue_job`] with the tail's lock held: the job becomes the queue's end.
    async fn queue_behind(&self, tail: &mut Option<LatestSlot>, job: Job) -> Result<(), String> {
        let latest = match &job {
            Job::Latest(slot) => Some(slot.clone()),
            _ => None,
        };
        self.queue().send(job).await.map_err(|_| GONE.to_string())?;
        *tail = latest;
        Ok(())
    }

    /// A committed write's stored events: queued behind every push before them, and
    /// returns once queued. Best effort, as a post was: a failure is logged, the write
    /// stands (a client reads what it missed with `stream::list`).
    pub(crate) async fn stored(&self, events: Vec<OwnedStreamEvent>) {
        if events.is_empty() {
            return;
        }
        let job = Job::Stored {
            events,
            at: CallPosition::current(),
        };
        if self.queue_job(job).await.is_err() {
            tracing::warn!("{GONE}; stored stream events not pushed");
        }
    }

    /// `stream::send` of an event that supersedes the one before it of its kind: it replaces
    /// that one if it is still waiting at the queue's end, else it is queued; returns once
    /// queued (best effort, as a post is: a failed post is logged).
    pub(crate) async fn send_latest(&self, event: OwnedStreamEvent) -> Result<(), String> {
        let at = CallPosition::current();
        let mut tail = self.tail.lock().await;
        if let Some(slot) = tail.as_ref() {
            let mut waiting = lock(slot);
            if waiting
                .as_ref()
                .is_some_and(|(queued, _)| same_kind(queued, &event))
            {
                *waiting = Some((event, at));
                return Ok(());
            }
        }
        let slot = Arc::new(Mutex::new(Some((event, at))));
        self.queue_behind(&mut tail, Job::Latest(slot)).await
    }

    /// `stream::send`'s event, posted after every push queued before it → how many
    /// connections it reached. Returns once posted: a sender that merges what comes while
    /// one is in flight (the orchestrator's token deltas) keeps doing so.
    pub(crate) async fn send(&self, event: OwnedStreamEvent) -> Result<usize, String> {
        let (done, answer) = oneshot::channel();
        let job = Job::Send {
            event,
            at: CallPosition::current(),
            done,
        };
        self.queue_job(job).await?;
        answer.await.map_err(|_| GONE.to_string())?
    }

    /// Once every push queued so far went out (a Lambda, before it answers).
    pub(crate) async fn drained(&self) {
        if self.queue.get().is_none() {
            return;
        }
        let (done, finished) = oneshot::channel();
        if self.queue_job(Job::Drained(done)).await.is_ok() {
            let _ = finished.await;
        }
    }
}

/// The `latest` events queued right behind stored writes whose subscriptions were just read:
/// they go out in the same posts, after them (one post instead of two to a `batch`
/// subscriber). Stops at any other job, held to go next: a stored write queued after the
/// read needs a read of its own.
fn latest_behind(jobs: &mut mpsc::Receiver<Job>, held: &mut Option<Job>) -> Vec<OwnedStreamEvent> {
    let mut behind = Vec::new();
    while behind.len() < COALESCE {
        let job = match held.take() {
            Some(job) => job,
            None => match jobs.try_recv() {
                Ok(job) => job,
                Err(_) => break,
            },
        };
        match job {
            Job::Latest(slot) => behind.extend(lock(&slot).take().map(|(event, _)| event)),
            other => {
                *held = Some(other);
                break;
            }
        }
    }
    behind
}

/// The queue's one consumer: jobs in order, consecutive stored writes together.
async fn run(connections: Arc<dyn Post>, mut jobs: mpsc::Receiver<Job>) {
    let mut held: Option<Job> = None;
    loop {
        let job = match held.take() {
            Some(job) => job,
            None => match jobs.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        match job {
            Job::Stored { mut events, at } => {
                let mut writes = 1;
                while writes < COALESCE {
                    match jobs.try_recv() {
                        Ok(Job::Stored { events: more, .. }) => {
                            events.extend(more);
                            writes += 1;
                        }
                        Ok(other) => {
                            held = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let borrowed: Vec<_> = events.iter().map(OwnedStreamEvent::as_event).collect();
                let mut then = || latest_behind(&mut jobs, &mut held);
                if let Err(e) = at.run(connections.stored(&borrowed, &mut then)).await {
                    tracing::warn!(error = %e, "stream subscriptions unreadable; stored items not pushed");
                }
            }
            Job::Send { event, at, done } => {
                let reached = at.run(connections.send(event.as_event())).await;
                let _ = done.send(reached);
            }
            Job::Latest(slot) => {
                // Taken now: a later event of its kind is queued after this post.
                let Some((event, at)) = lock(&slot).take() else {
                    continue;
                };
                if let Err(why) = at.run(connections.send(event.as_event())).await {
                    tracing::warn!(error = %why, "stream subscriptions unreadable; event not pushed");
                }
            }
            Job::Drained(done) => {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Semaphore;

    /// Records what is posted, in order; each post first takes a permit, so a test holds the
    /// queue's consumer inside a post until it adds permits.
    struct Recorder {
        posted: Mutex<Vec<String>>,
        permits: Arc<Semaphore>,
        /// Posts begun (the consumer took their job).
        begun: AtomicUsize,
    }

    #[async_trait]
    impl Post for Arc<Recorder> {
        async fn stored(
            &self,
            events: &[StreamEvent<'_>],
            then: &mut (dyn FnMut() -> Vec<OwnedStreamEvent> + Send),
        ) -> Result<usize, String> {
            self.begun.fetch_add(1, Ordering::SeqCst);
            // The subscriptions' read.
            self.permits.acquire().await.unwrap().forget();
            let behind = then();
            let names = events
                .iter()
                .map(|e| format!("stored:{}", e.data["n"]))
                .chain(
                    behind
                        .iter()
                        .map(|e| format!("with:{}:{}", e.event_type, e.data["n"])),
                );
            self.posted.lock().unwrap().extend(names);
            Ok(events.len())
        }
        async fn send(&self, e: StreamEvent<'_>) -> Result<usize, String> {
            self.begun.fetch_add(1, Ordering::SeqCst);
            self.permits.acquire().await.unwrap().forget();
            let name = format!("{}:{}", e.event_type, e.data["n"]);
            self.posted.lock().unwrap().push(name);
            Ok(1)
        }
    }

    fn queue() -> (Pushes, Arc<Recorder>) {
        let recorder = Arc::new(Recorder {
            posted: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(0)),
            begun: AtomicUsize::new(0),
        });
        (Pushes::new(recorder.clone()), recorder)
    }

    fn event(event_type: &str, n: u64) -> OwnedStreamEvent {
        OwnedStreamEvent {
            stream: "agent::events".into(),
            group: "s1".into(),
            item: String::new(),
            event_type: event_type.into(),
            data: json!({ "n": n }),
        }
    }

    async fn latest(pushes: &Pushes, event_type: &str, n: u64) {
        pushes.send_latest(event(event_type, n)).await.unwrap();
    }

    fn posted(r: &Recorder) -> Vec<String> {
        r.posted.lock().unwrap().clone()
    }

    /// Until the queue's consumer waits inside its first post (it took that job).
    async fn consumer_in_a_post(r: &Recorder) {
        for _ in 0..10_000 {
            if r.begun.load(Ordering::SeqCst) > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the queue's consumer never began a post");
    }

    #[tokio::test]
    async fn latest_events_answer_once_queued_and_merge_while_one_is_posted() {
        let (pushes, r) = queue();
        latest(&pushes, "message_update", 1).await;
        consumer_in_a_post(&r).await;
        // The first post is held: the next three are queued without waiting for it, and the
        // two after the first merge into the one still waiting.
        for n in 2..=4 {
            tokio::time::timeout(
                Duration::from_secs(1),
                pushes.send_latest(event("message_update", n)),
            )
            .await
            .expect("a latest event waits for its place in the queue, not for a post")
            .unwrap();
        }
        r.permits.add_permits(10);
        pushes.drained().await;
        assert_eq!(
            posted(&r),
            ["message_update:1", "message_update:4"],
            "the held post, then the newest of those that waited"
        );
    }

    #[tokio::test]
    async fn a_latest_event_keeps_its_place_behind_and_before_other_pushes() {
        let (pushes, r) = queue();
        latest(&pushes, "message_update", 1).await;
        consumer_in_a_post(&r).await;
        latest(&pushes, "message_update", 2).await;
        // A stored write after it: the next update may not jump ahead of it by merging.
        pushes.stored(vec![event("create", 3)]).await;
        latest(&pushes, "message_update", 4).await;
        latest(&pushes, "message_update", 5).await;
        // Another kind is not merged into an update.
        latest(&pushes, "turn_step_retry", 6).await;
        latest(&pushes, "message_update", 7).await;
        r.permits.add_permits(20);
        pushes.drained().await;
        assert_eq!(
            posted(&r),
            [
                "message_update:1",
                "message_update:2",
                // Those queued behind a stored write go out in its posts, still in order.
                "stored:3",
                "with:message_update:5",
                "with:turn_step_retry:6",
                "with:message_update:7"
            ]
        );
    }

    #[tokio::test]
    async fn latest_events_behind_a_stored_write_share_its_posts_but_a_later_write_reads_again() {
        let (pushes, r) = queue();
        pushes.stored(vec![event("create", 1)]).await;
        // Held in the subscriptions' read.
        consumer_in_a_post(&r).await;
        latest(&pushes, "message_update", 2).await;
        latest(&pushes, "message_update", 3).await;
        pushes.stored(vec![event("create", 4)]).await;
        latest(&pushes, "message_update", 5).await;
        r.permits.add_permits(10);
        pushes.drained().await;
        assert_eq!(
            posted(&r),
            [
                "stored:1",
                "with:message_update:3",
                "stored:4",
                "with:message_update:5"
            ],
            "the second write's events wait for a read made after it was queued"
        );
        assert_eq!(
            r.begun.load(Ordering::SeqCst),
            2,
            "one read per stored write"
        );
    }

    #[tokio::test]
    async fn drained_waits_for_every_queued_post_and_a_send_for_its_own() {
        let (pushes, r) = queue();
        latest(&pushes, "message_update", 1).await;
        pushes
            .stored(vec![event("create", 2), event("create", 3)])
            .await;
        let sent = {
            let pushes = &pushes;
            async move { pushes.send(event("send", 4)).await }
        };
        let drained = async {
            // Queued after the send.
            tokio::task::yield_now().await;
            pushes.drained().await;
            posted(&r)
        };
        let release = async {
            consumer_in_a_post(&r).await;
            assert!(posted(&r).is_empty(), "nothing posted while held");
            r.permits.add_permits(10);
        };
        let (reached, seen, ()) = tokio::join!(sent, drained, release);
        assert_eq!(reached.unwrap(), 1);
        assert_eq!(seen, ["message_update:1", "stored:2", "stored:3", "send:4"]);
    }
}
