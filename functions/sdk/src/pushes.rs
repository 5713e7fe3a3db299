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

use bus_aws::connections::{Connections, OwnedStreamEvent};
use bus_telemetry::tracing_bridge::CallPosition;
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, oneshot};

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
    /// Answered once every job before it is done.
    Drained(oneshot::Sender<()>),
}

const GONE: &str = "this Lambda's push queue is gone";

pub(crate) struct Pushes {
    connections: Arc<Connections>,
    /// Started with the first push (a task needs the runtime, which a bus built outside it
    /// would not have).
    queue: OnceLock<mpsc::Sender<Job>>,
}

impl Pushes {
    pub(crate) fn new(connections: Connections) -> Self {
        Self {
            connections: Arc::new(connections),
            queue: OnceLock::new(),
        }
    }

    fn queue(&self) -> &mpsc::Sender<Job> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(run(self.connections.clone(), rx));
            tx
        })
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
        if self.queue().send(job).await.is_err() {
            tracing::warn!("{GONE}; stored stream events not pushed");
        }
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
        self.queue().send(job).await.map_err(|_| GONE.to_string())?;
        answer.await.map_err(|_| GONE.to_string())?
    }

    /// Once every push queued so far went out (a Lambda, before it answers).
    pub(crate) async fn drained(&self) {
        let Some(queue) = self.queue.get() else {
            return;
        };
        let (done, finished) = oneshot::channel();
        if queue.send(Job::Drained(done)).await.is_ok() {
            let _ = finished.await;
        }
    }
}

/// The queue's one consumer: jobs in order, consecutive stored writes together.
async fn run(connections: Arc<Connections>, mut jobs: mpsc::Receiver<Job>) {
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
                if let Err(e) = at.run(connections.push_stored(&borrowed)).await {
                    tracing::warn!(error = %e, "stream subscriptions unreadable; stored items not pushed");
                }
            }
            Job::Send { event, at, done } => {
                let e = event.as_event();
                let reached = at
                    .run(connections.send_stream_event(
                        e.stream,
                        e.group,
                        e.item,
                        e.event_type,
                        e.data,
                    ))
                    .await;
                let _ = done.send(reached);
            }
            Job::Drained(done) => {
                let _ = done.send(());
            }
        }
    }
}
