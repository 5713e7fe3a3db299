//! Ordered lanes: jobs under one key run one at a time, in the order they were handed in;
//! jobs under other keys run beside them. A stream trigger gets a session's events in the
//! order they were written (a browser's pushes, through `ui::on_event`, keep the order of
//! its session's events), as a DynamoDB stream hands a shard's records in order.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Most jobs one lane holds behind the one running; past it a job is refused (and logged by
/// the caller), so a handler that stopped answering cannot make the engine hold events
/// without a bound.
pub const MAX_LANE_BACKLOG: usize = 10_000;

#[derive(Default)]
pub struct Lanes {
    /// Key → the jobs waiting behind the one running. A key is present while its lane runs.
    waiting: Mutex<HashMap<String, VecDeque<Job>>>,
}

/// A job a full lane did not take.
#[derive(Debug, thiserror::Error)]
#[error("lane `{0}` already holds {MAX_LANE_BACKLOG} jobs")]
pub struct LaneFull(pub String);

impl Lanes {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Job>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether jobs under `key` are running or waiting: what comes next for it must queue
    /// behind them to keep its place.
    pub fn is_busy(&self, key: &str) -> bool {
        self.waiting().contains_key(key)
    }

    /// Run `job` after every job already handed in under `key`.
    pub fn run(
        self: &Arc<Self>,
        key: String,
        job: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), LaneFull> {
        let job: Job = Box::pin(job);
        {
            let mut waiting = self.waiting();
            if let Some(queue) = waiting.get_mut(&key) {
                if queue.len() >= MAX_LANE_BACKLOG {
                    return Err(LaneFull(key));
                }
                queue.push_back(job);
                return Ok(());
            }
            waiting.insert(key.clone(), VecDeque::new());
        }
        let lanes = self.clone();
        tokio::spawn(async move {
            let mut job = job;
            loop {
                // A task of its own: a job that panics ends itself, not the lane.
                let _ = tokio::spawn(job).await;
                let mut waiting = lanes.waiting();
                match waiting.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(next) => job = next,
                    None => {
                        waiting.remove(&key);
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    /// How many lanes run now (for tests: an idle engine has none).
    pub fn running(&self) -> usize {
        self.waiting().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_key_runs_in_order_and_other_keys_beside_it() {
        let lanes = Arc::new(Lanes::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        // The first job of `a` is the slowest: run as tasks each, the others would pass it.
        for (i, ms) in [(0u64, 60u64), (1, 0), (2, 20), (3, 0)] {
            let seen = seen.clone();
            lanes
                .run("a".into(), async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    seen.lock().unwrap().push(format!("a{i}"));
                })
                .unwrap();
        }
        let s = seen.clone();
        lanes
            .run(
                "b".into(),
                async move { s.lock().unwrap().push("b0".into()) },
            )
            .unwrap();
        // A job that panics does not stop its lane.
        lanes
            .run("a".into(), async { panic!("a handler that panics") })
            .unwrap();
        let s = seen.clone();
        lanes
            .run(
                "a".into(),
                async move { s.lock().unwrap().push("a5".into()) },
            )
            .unwrap();
        for _ in 0..200 {
            if lanes.running() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(lanes.running(), 0, "every lane ends once it is empty");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen[0], "b0", "another key does not wait: {seen:?}");
        assert_eq!(seen[1..], ["a0", "a1", "a2", "a3", "a5"], "{seen:?}");
    }

    #[tokio::test]
    async fn a_lane_holds_a_bounded_backlog() {
        let lanes = Arc::new(Lanes::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        lanes
            .run("k".into(), async move {
                let _ = rx.await;
            })
            .unwrap();
        for _ in 0..MAX_LANE_BACKLOG {
            lanes.run("k".into(), async {}).unwrap();
        }
        let full = lanes.run("k".into(), async {}).unwrap_err();
        assert!(full.to_string().contains("lane `k`"), "{full}");
        assert!(lanes.run("other".into(), async {}).is_ok());
        tx.send(()).unwrap();
    }
}
