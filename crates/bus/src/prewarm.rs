//! Start-up work that does not block start-up. Building an HTTPS client loads the system's
//! root certificates, which was most of a bootstrap's cold start (about 70 of 90 ms for
//! engine-lambda in a debug build). Started at once, on a thread or task of its own, it
//! overlaps the Lambda runtime's wait for its first event; the first use waits for it only if
//! it is not done yet.

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use std::future::Future;
use std::sync::{Arc, OnceLock};

/// A value built on a thread of its own from creation on; [`Prewarmed::get`] waits for it.
pub struct Prewarmed<T> {
    cell: Arc<OnceLock<T>>,
    build: Arc<dyn Fn() -> T + Send + Sync>,
}

impl<T> Clone for Prewarmed<T> {
    fn clone(&self) -> Self {
        Self {
            cell: self.cell.clone(),
            build: self.build.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> Prewarmed<T> {
    pub fn new(build: impl Fn() -> T + Send + Sync + 'static) -> Self {
        let me = Self {
            cell: Arc::new(OnceLock::new()),
            build: Arc::new(build),
        };
        let early = me.clone();
        // Without a thread the value is simply built at its first use.
        let _ = std::thread::Builder::new()
            .name("prewarm".into())
            .spawn(move || {
                early.get();
            });
        me
    }

    /// The value (built here if the thread has not started on it; a concurrent build is
    /// waited for, never repeated).
    pub fn get(&self) -> &T {
        self.cell.get_or_init(|| (self.build)())
    }
}

impl<T> std::fmt::Debug for Prewarmed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.cell.get().is_some() {
            "Prewarmed(ready)"
        } else {
            "Prewarmed(building)"
        })
    }
}

/// What an async start-up step gives: its value, or why it failed (each waiter sees it).
pub type Started<T> = Shared<BoxFuture<'static, Result<T, String>>>;

/// Run `init` from now on; every clone of the answer awaits the same value. It runs on a
/// blocking-pool thread (driven by the runtime's handle), not a worker: certificate loading
/// is CPU work that would otherwise hold the worker the Lambda runtime needs to ask for its
/// first event (two such starts held both workers of a 2-core machine for 30 ms).
pub fn start<T: Clone + Send + Sync + 'static>(
    what: &'static str,
    init: impl Future<Output = T> + Send + 'static,
) -> Started<T> {
    let runtime = tokio::runtime::Handle::current();
    let task = tokio::task::spawn_blocking(move || runtime.block_on(init));
    async move {
        task.await
            .map_err(|e| format!("{what} failed to start: {e}"))
    }
    .boxed()
    .shared()
}

/// An already known value, in the same shape.
pub fn ready<T: Clone + Send + Sync + 'static>(value: T) -> Started<T> {
    futures_util::future::ready(Ok(value)).boxed().shared()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_prewarmed_value_is_built_once_whoever_asks_first() {
        let builds = Arc::new(AtomicUsize::new(0));
        let b = builds.clone();
        let p = Prewarmed::new(move || {
            b.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(50));
            7
        });
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || *p.get())
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 7);
        }
        assert_eq!(*p.get(), 7);
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_started_value_is_shared_and_a_failed_start_says_so() {
        let s = start("counter", async { 41 + 1 });
        assert_eq!(s.clone().await, Ok(42));
        assert_eq!(s.await, Ok(42));
        let broken: Started<u8> = start("broken", async { panic!("no config") });
        let e = broken.await.unwrap_err();
        assert!(e.contains("broken failed to start"), "{e}");
    }
}
