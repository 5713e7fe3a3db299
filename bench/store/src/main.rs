//! Issue 15's store comparison (not a test). One tool call's writes, as the embedded engine
//! sees them since `state::transact`, run against three stores in one process, interleaved:
//!
//! - **engine**: the engine's own store (`EmbeddedBackend`: a write-ahead log in front of
//!   redb, one fdatasync per durable commit shared by the commits waiting for it), through
//!   its `StateStore` port, as the engine calls it;
//! - **sqlite**: SQLite in WAL mode (rusqlite, bundled), `synchronous=FULL` for a durable
//!   commit and `NORMAL` for a deferred one (its WAL sync then covers both);
//! - **fjall**: fjall's transactional keyspace, `PersistMode::SyncData` for a durable commit
//!   and none for a deferred one (its journal holds it in the process until the next sync);
//! - **fjall-buffered**: the same with `PersistMode::Buffer` for a deferred commit, which hands
//!   it to the OS as the engine's log does, so a killed process loses none of it.
//!
//! Per tool call: two point reads (the turn record, the session head), eight deferred
//! single-record writes of ~300 B (UI events, history entries, sequence counters, the queue's
//! send and acknowledgement) and one durable transaction: the record (~4 KB, conditional on
//! the version read) with three event items. Values are JSON; every store gets the same
//! `serde_json::Value`s and serialises them, as the engine must.
//!
//! `STORE_K` tool calls per session (default 50), `STORE_SESSIONS` sessions one after the
//! other (default 10), `STORE_CONCURRENT` sessions at once for the throughput figure
//! (default 16), `STORE_ROUNDS` interleaved rounds (default 3), `STORE_DIR` where the files
//! go (default: a temporary directory under /var/tmp, on disk rather than tmpfs), `STORE_ONLY`
//! one store (to count its syscalls with `strace -f -c`).

use engine_gateway::embedded::EmbeddedBackend;
use engine_gateway::state::{DURABILITY_BAGGAGE, StateStore, TxWrite, WriteMeta};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SCOPE: &str = "turn";
const EVENTS: &str = "$stream:agent::events";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The three stores behind one small async interface: what a tool call needs of a store.
#[derive(Clone)]
enum Store {
    Engine(Arc<EmbeddedBackend>),
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    /// The keyspace, its partition, and whether a deferred commit flushes its journal to the
    /// OS (`PersistMode::Buffer`) as the engine's log does, so that a killed process loses
    /// none of it; without, fjall keeps it in the process until the next durable commit.
    Fjall(fjall::TxKeyspace, fjall::TxPartitionHandle, bool),
}

fn meta(deferred: bool) -> WriteMeta {
    WriteMeta {
        baggage: deferred.then(|| format!("{DURABILITY_BAGGAGE}=deferred")),
        unwatched: true,
        ..Default::default()
    }
}

fn address(scope: &str, key: &str) -> String {
    format!("{scope}\u{0}{key}")
}

/// A stored value: its version (8 bytes, little-endian) and its JSON.
fn encode(version: u64, value: &Value) -> Vec<u8> {
    let mut out = version.to_le_bytes().to_vec();
    serde_json::to_writer(&mut out, value).expect("json");
    out
}

fn decode(bytes: &[u8]) -> (u64, Value) {
    let version = u64::from_le_bytes(bytes[..8].try_into().expect("version"));
    (version, serde_json::from_slice(&bytes[8..]).expect("json"))
}

/// One write of a transaction: (scope, key, value, the version it must be at).
type Write = (String, String, Value, Option<u64>);

impl Store {
    async fn open(kind: &str, dir: &Path) -> Store {
        match kind {
            "engine" => Store::Engine(EmbeddedBackend::open(dir).expect("engine store")),
            "sqlite" => {
                let conn = rusqlite::Connection::open(dir.join("store.sqlite")).expect("sqlite");
                conn.execute_batch(
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
                     CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;",
                )
                .expect("sqlite schema");
                Store::Sqlite(Arc::new(Mutex::new(conn)))
            }
            "fjall" | "fjall-buffered" => {
                let ks = fjall::Config::new(dir.join("fjall"))
                    .open_transactional()
                    .expect("fjall");
                let part = ks
                    .open_partition("state", fjall::PartitionCreateOptions::default())
                    .expect("partition");
                Store::Fjall(ks, part, kind == "fjall-buffered")
            }
            other => panic!("unknown store {other}"),
        }
    }

    async fn get(&self, scope: &str, key: &str) -> Option<(u64, Value)> {
        match self {
            Store::Engine(b) => b
                .get(scope, key)
                .await
                .expect("get")
                .map(|v| (v.version, v.value)),
            Store::Sqlite(c) => {
                let c = c.lock().expect("lock");
                let mut stmt = c
                    .prepare_cached("SELECT v FROM kv WHERE k = ?1")
                    .expect("prepare");
                let mut rows = stmt.query([address(scope, key)]).expect("query");
                rows.next()
                    .expect("row")
                    .map(|r| decode(&r.get::<_, Vec<u8>>(0).expect("blob")))
            }
            Store::Fjall(_, p, _) => p.get(address(scope, key)).expect("get").map(|v| decode(&v)),
        }
    }

    /// The writes together or not at all; `deferred`: durable with the next durable commit.
    async fn commit(&self, writes: Vec<Write>, deferred: bool) {
        match self {
            Store::Engine(b) => {
                let meta = meta(deferred);
                if writes.len() == 1 {
                    let (scope, key, value, expected) = writes.into_iter().next().expect("one");
                    b.set(&scope, &key, value, expected, &meta)
                        .await
                        .expect("set");
                } else {
                    let writes = writes
                        .into_iter()
                        .map(|(scope, key, value, expected_version)| {
                            TxWrite::new(&scope, &key, value, expected_version)
                        })
                        .collect();
                    b.transact(writes, &meta).await.expect("transact");
                }
            }
            Store::Sqlite(c) => {
                let c = c.clone();
                let work = move || {
                    let mut c = c.lock().expect("lock");
                    c.pragma_update(
                        None,
                        "synchronous",
                        if deferred { "NORMAL" } else { "FULL" },
                    )
                    .expect("pragma");
                    let tx = c.transaction().expect("begin");
                    for (scope, key, value, expected) in writes {
                        let k = address(&scope, &key);
                        let current: Option<Vec<u8>> = tx
                            .prepare_cached("SELECT v FROM kv WHERE k = ?1")
                            .expect("prepare")
                            .query_row([&k], |r| r.get(0))
                            .ok();
                        let version = current.as_deref().map_or(0, |b| decode(b).0);
                        if let Some(e) = expected {
                            assert_eq!(e, version, "version conflict on {k}");
                        }
                        tx.prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")
                            .expect("prepare")
                            .execute(rusqlite::params![k, encode(version + 1, &value)])
                            .expect("insert");
                    }
                    tx.commit().expect("commit");
                };
                in_place_unless_durable(deferred, work).await;
            }
            Store::Fjall(ks, p, buffered) => {
                let (ks, p, buffered) = (ks.clone(), p.clone(), *buffered);
                let work = move || {
                    let mode = match (deferred, buffered) {
                        (false, _) => Some(fjall::PersistMode::SyncData),
                        (true, true) => Some(fjall::PersistMode::Buffer),
                        (true, false) => None,
                    };
                    let mut tx = ks.write_tx().durability(mode);
                    for (scope, key, value, expected) in writes {
                        let k = address(&scope, &key);
                        let version = tx.get(&p, &k).expect("get").map_or(0, |b| decode(&b).0);
                        if let Some(e) = expected {
                            assert_eq!(e, version, "version conflict on {k}");
                        }
                        tx.insert(&p, &k, encode(version + 1, &value));
                    }
                    tx.commit().expect("commit");
                };
                in_place_unless_durable(deferred, work).await;
            }
        }
    }
}

/// A deferred commit runs in place (no sync to wait for); a durable one goes to the blocking
/// pool, as the engine's own durable commits do.
async fn in_place_unless_durable(deferred: bool, work: impl FnOnce() + Send + 'static) {
    if deferred {
        work();
    } else {
        tokio::task::spawn_blocking(work).await.expect("join");
    }
}

fn record(sid: &str, call: usize) -> Value {
    // About 4 KB, as a turn record with its batch and budgets is.
    json!({
        "session_id": sid, "state": "function_execute", "turn_count": call,
        "event_seq": call * 7, "tree_leaf": format!("{sid}-m-{call:06}"),
        "batch": (0..8).map(|i| json!({"function_call_id": format!("call-{call}-{i}"),
            "function_id": "demo::echo", "args": {"text": "x".repeat(300)}, "status": "done"}))
            .collect::<Vec<_>>(),
    })
}

fn event(sid: &str, n: usize) -> Value {
    json!({"type": "message_update", "session_id": sid, "seq": n, "text": "y".repeat(240)})
}

/// One session of `k` tool calls; the time of each.
async fn session(store: &Store, sid: &str, k: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(k);
    let mut seq = 0;
    for call in 0..k {
        let t0 = Instant::now();
        let version = store.get(SCOPE, sid).await.map_or(0, |(v, _)| v);
        let _head = store.get("session", &format!("{sid}/head")).await;
        for _ in 0..8 {
            seq += 1;
            store
                .commit(
                    vec![(
                        EVENTS.into(),
                        format!("{sid}-{seq:012}"),
                        event(sid, seq),
                        None,
                    )],
                    true,
                )
                .await;
        }
        let mut writes = vec![(
            SCOPE.to_string(),
            sid.to_string(),
            record(sid, call),
            Some(version),
        )];
        for _ in 0..3 {
            seq += 1;
            writes.push((
                EVENTS.into(),
                format!("{sid}-{seq:012}"),
                event(sid, seq),
                None,
            ));
        }
        store.commit(writes, false).await;
        times.push(t0.elapsed());
    }
    times
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Figures {
    p50_per_call: Duration,
    concurrent_calls_per_s: f64,
}

async fn measure(
    kind: &str,
    dir: &Path,
    round: usize,
    k: usize,
    sessions: usize,
    concurrent: usize,
) -> Figures {
    let dir = dir.join(format!("{kind}-{round}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = Store::open(kind, &dir).await;
    let mut times = Vec::new();
    for s in 0..sessions {
        times.extend(session(&store, &format!("seq-{s}"), k).await);
    }
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..concurrent)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move { session(&store, &format!("conc-{s}"), k).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("session");
    }
    let concurrent_calls_per_s = (concurrent * k) as f64 / t0.elapsed().as_secs_f64();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Figures {
        p50_per_call: p50(times),
        concurrent_calls_per_s,
    }
}

#[tokio::main]
async fn main() {
    let k = env_usize("STORE_K", 50);
    let sessions = env_usize("STORE_SESSIONS", 10);
    let concurrent = env_usize("STORE_CONCURRENT", 16);
    let rounds = env_usize("STORE_ROUNDS", 3);
    let base = std::env::var("STORE_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::Builder::new()
        .prefix("store-compare-")
        .tempdir_in(base)
        .expect("tempdir");
    println!(
        "store comparison: K = {k}, {sessions} sessions in a row, {concurrent} at once, {rounds} rounds, in {}",
        dir.path().display()
    );
    let only = std::env::var("STORE_ONLY").ok();
    let kinds: Vec<&str> = ["engine", "sqlite", "fjall", "fjall-buffered"]
        .into_iter()
        .filter(|k| only.as_deref().is_none_or(|o| o == *k))
        .collect();
    let mut all: Vec<Vec<Figures>> = kinds.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, kind) in kinds.iter().enumerate() {
            let f = measure(kind, dir.path(), round, k, sessions, concurrent).await;
            println!(
                "round {round} {kind:>6}: p50 {:>7.1} µs per tool call; {concurrent} at once: {:>7.0} tool calls/s",
                f.p50_per_call.as_secs_f64() * 1e6,
                f.concurrent_calls_per_s
            );
            all[i].push(f);
        }
    }
    println!(
        "\n| store | per tool call, p50 (median of rounds) | {concurrent} sessions at once, tool calls/s (median) |"
    );
    println!("| --- | --- | --- |");
    for (kind, figures) in kinds.iter().zip(all) {
        let mut p: Vec<f64> = figures
            .iter()
            .map(|f| f.p50_per_call.as_secs_f64() * 1e6)
            .collect();
        let mut c: Vec<f64> = figures.iter().map(|f| f.concurrent_calls_per_s).collect();
        p.sort_by(f64::total_cmp);
        c.sort_by(f64::total_cmp);
        println!(
            "| {kind} | {:.1} µs | {:.0} |",
            p[p.len() / 2],
            c[c.len() / 2]
        );
    }
}
