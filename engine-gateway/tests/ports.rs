//! Port conformance, run against the selected backend (embedded by default,
//! `HARNESS_TEST_BACKEND=aws` for DynamoDB/Streams/Secrets Manager on the emulator).

use crate::common;

use engine_gateway::secrets::{FileSecrets, SecretError, SecretStore};
use engine_gateway::server::{self, BackendKind};
use engine_gateway::state::{ChangeKind, ChangeRecord, WriteMeta};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

async fn drain(feed: &dyn engine_gateway::state::ChangeFeed, want: usize) -> Vec<ChangeRecord> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while got.len() < want && tokio::time::Instant::now() < deadline {
        got.extend(
            feed.next_batch(100, Duration::from_millis(300))
                .await
                .expect("feed"),
        );
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_feed_resumes_after_exactly_what_was_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    let meta = WriteMeta {
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        baggage: None,
        unwatched: false,
    };
    {
        let b = server::backends(&opts).await.unwrap();
        if opts.backend == BackendKind::Embedded {
            // Marked unwatched by the engine (no trigger on the scope): no change record.
            let quiet = WriteMeta {
                unwatched: true,
                ..meta.clone()
            };
            b.state
                .set("feed", "quiet", json!(0), None, &quiet)
                .await
                .unwrap();
        }
        b.state
            .set("feed", "a", json!(1), None, &meta)
            .await
            .unwrap();
        b.state
            .set("feed", "a", json!(2), None, &meta)
            .await
            .unwrap();
        b.state
            .set("$stream:x", "g\u{1}i", json!("reserved"), None, &meta)
            .await
            .unwrap();
        b.state.delete("feed", "a", None, &meta).await.unwrap();
        let got = drain(b.changes.as_ref(), 3).await;
        assert_eq!(got.len(), 3, "reserved scopes are not in the feed: {got:?}");
        assert_eq!(got[0].kind, ChangeKind::Created);
        assert_eq!(got[0].new_value, Some(json!(1)));
        assert_eq!(
            got[0].traceparent, meta.traceparent,
            "the writer's trace travels with the change"
        );
        assert_eq!(got[1].kind, ChangeKind::Updated);
        assert_eq!(
            (got[1].old_value.clone(), got[1].new_value.clone()),
            (Some(json!(1)), Some(json!(2)))
        );
        assert_eq!(got[2].kind, ChangeKind::Deleted);
        assert_eq!(got[2].old_value, Some(json!(2)));
        // Acknowledge only the first two, then "crash".
        b.changes.ack(&got[..2]).await.unwrap();
        // Handed-out records are not handed out again by the same process.
        assert!(
            b.changes
                .next_batch(100, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty()
        );
    }
    if opts.backend == BackendKind::Embedded {
        // The redb file is released when the backend is dropped.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    {
        let b = server::backends(&opts).await.unwrap();
        let got = drain(b.changes.as_ref(), 1).await;
        assert_eq!(
            got.len(),
            1,
            "only the unacknowledged record comes back: {got:?}"
        );
        assert_eq!(got[0].kind, ChangeKind::Deleted);
        b.changes.ack(&got).await.unwrap();
        b.state
            .set("feed", "b", json!(3), None, &WriteMeta::default())
            .await
            .unwrap();
        let got = drain(b.changes.as_ref(), 1).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key, "b");
        b.changes.ack(&got).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = server::backends(&opts).await.unwrap();
    assert!(
        b.changes
            .next_batch(100, Duration::from_millis(800))
            .await
            .unwrap()
            .is_empty(),
        "nothing acknowledged is replayed"
    );
}

async fn secret_store() -> (Arc<dyn SecretStore>, Option<tempfile::TempDir>) {
    if common::aws_backend() {
        let clients = engine_gateway::aws::AwsClients::from_env().await;
        let names = engine_gateway::aws::AwsNames::new(&common::fresh_prefix());
        (
            Arc::new(engine_gateway::aws::secrets::AwsSecrets::new(
                clients, names,
            )),
            None,
        )
    } else {
        let dir = tempfile::tempdir().unwrap();
        (
            Arc::new(FileSecrets::new(dir.path().join("secrets.json"))),
            Some(dir),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_store_conformance() {
    let (s, _dir) = secret_store().await;
    assert_eq!(s.get("providers/openai").await.unwrap(), None);
    s.put("providers/openai", r#"{"type":"api_key","key":"sk-test"}"#)
        .await
        .unwrap();
    s.put("providers/openai", r#"{"type":"api_key","key":"sk-new"}"#)
        .await
        .unwrap();
    assert_eq!(
        s.get("providers/openai").await.unwrap().as_deref(),
        Some(r#"{"type":"api_key","key":"sk-new"}"#)
    );
    s.put("providers/anthropic", "x").await.unwrap();
    let mut names = s.list().await.unwrap();
    names.sort();
    assert_eq!(names, vec!["providers/anthropic", "providers/openai"]);
    assert!(s.delete("providers/openai").await.unwrap());
    assert!(!s.delete("providers/openai").await.unwrap());
    assert_eq!(s.get("providers/openai").await.unwrap(), None);
    assert!(matches!(
        s.get("no spaces").await,
        Err(SecretError::InvalidName(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_from_separate_backends_are_atomic() {
    // Two independent backend instances (two processes' worth of clients) racing on one key.
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    if opts.backend == BackendKind::Embedded {
        return; // one redb file has one owner; the embedded case is covered in-process
    }
    let a = server::backends(&opts).await.unwrap();
    let b = server::backends(&opts).await.unwrap();
    let op = || {
        vec![serde_json::from_value(json!({"type": "increment", "path": "n", "by": 1})).unwrap()]
    };
    let v0 = a
        .state
        .set(
            "race",
            "counter",
            json!({"n": 0}),
            Some(0),
            &WriteMeta::default(),
        )
        .await
        .unwrap()
        .version;
    let mut tasks = Vec::new();
    for store in [a.state.clone(), b.state.clone()] {
        for _ in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    store
                        .update("race", "counter", op(), None, &WriteMeta::default())
                        .await
                        .unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = a.state.get("race", "counter").await.unwrap().unwrap();
    assert_eq!(v.value["n"], 80);
    assert_eq!(v.version, v0 + 80);
    let err = a
        .state
        .set("race", "counter", json!({}), Some(3), &WriteMeta::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("version_conflict")
            && err.to_string().contains(&format!("found {}", v0 + 80)),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_lists_come_in_pages_that_resume_after_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    let b = server::backends(&opts).await.unwrap();
    let meta = WriteMeta::default();
    for i in 0..25 {
        b.state
            .set("paged", &format!("k/{i:02}"), json!(i), None, &meta)
            .await
            .unwrap();
    }
    b.state
        .set("paged", "other", json!("x"), None, &meta)
        .await
        .unwrap();
    b.state
        .set("paged2", "k/00", json!("y"), None, &meta)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let (page, more) = b
            .state
            .list_page("paged", Some("k/"), after.as_deref(), 10)
            .await
            .unwrap();
        pages += 1;
        assert!(page.len() <= 10);
        seen.extend(page.iter().map(|e| e.value.as_i64().unwrap()));
        after = page.last().map(|e| e.key.clone());
        if !more {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        (0..25).collect::<Vec<_>>(),
        "every record once, in key order"
    );
    // An exact multiple ends with `more = false` on the last full page.
    let (page, more) = b
        .state
        .list_page("paged", Some("k/2"), None, 5)
        .await
        .unwrap();
    assert_eq!((page.len(), more), (5, false));
    // The whole-scope reader still sees everything.
    assert_eq!(b.state.list("paged", None).await.unwrap().len(), 26);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_only_what_outlived_its_scope() {
    use engine_gateway::retention::{RetentionRule, created_at_ms, sweep};
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    let b = server::backends(&opts).await.unwrap();
    let meta = WriteMeta::default();
    let scope = format!("ret-{}", engine_gateway::trace::random_hex(3));
    let mut created = 0;
    for i in 0..7 {
        let out = b
            .state
            .set(&scope, &format!("old{i}"), json!(i), None, &meta)
            .await
            .unwrap();
        created = created_at_ms(out.version);
    }
    b.state
        .set("kept-scope", "x", json!(1), None, &meta)
        .await
        .unwrap();
    let now = engine_gateway::trace::now_ms();
    assert!(
        created <= now && now - created < 60_000,
        "versions carry creation time"
    );
    let rules = vec![RetentionRule::new(&scope, Duration::from_secs(3600))];
    // Young: nothing goes.
    assert_eq!(sweep(&*b.state, &rules, now).await.unwrap(), 0);
    // Two hours on, with a one-hour limit: all of them go.
    let later = now + 2 * 3600 * 1000;
    assert_eq!(sweep(&*b.state, &rules, later).await.unwrap(), 7);
    assert!(b.state.list(&scope, None).await.unwrap().is_empty());
    assert!(
        b.state.get("kept-scope", "x").await.unwrap().is_some(),
        "other scopes untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_commits_every_write_or_none() {
    use engine_gateway::state::{StateError, TxWrite};
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    let b = server::backends(&opts).await.unwrap();
    let meta = WriteMeta::default();
    let scope = format!("tx-{}", engine_gateway::trace::random_hex(4));
    let w = |key: &str, value: serde_json::Value, expected: Option<u64>| {
        TxWrite::new(&scope, key, value, expected)
    };
    // Created together, each only if absent.
    let versions = b
        .state
        .transact(
            vec![w("a", json!(1), Some(0)), w("b", json!(2), Some(0))],
            &meta,
        )
        .await
        .unwrap();
    let a = b.state.get(&scope, "a").await.unwrap().unwrap();
    let bv = b.state.get(&scope, "b").await.unwrap().unwrap();
    assert_eq!((a.value.clone(), bv.value.clone()), (json!(1), json!(2)));
    assert_eq!(versions, vec![Some(a.version), Some(bv.version)]);

    // One stale condition: nothing is written, and the error names that write.
    let err = b
        .state
        .transact(
            vec![
                w("a", json!(10), Some(a.version)),
                w("c", json!(3), None),
                w("b", json!(20), Some(bv.version + 7)),
            ],
            &meta,
        )
        .await
        .unwrap_err();
    match &err {
        StateError::VersionConflict {
            key,
            expected,
            found,
            ..
        } => assert_eq!(
            (key.as_str(), *expected, *found),
            ("b", bv.version + 7, Some(bv.version))
        ),
        other => panic!("a version conflict on b, not {other:?}"),
    }
    assert_eq!(b.state.get(&scope, "a").await.unwrap().unwrap(), a);
    assert!(
        b.state.get(&scope, "c").await.unwrap().is_none(),
        "not half written"
    );

    // Conditional and unconditional writes together; stream items (reserved scope) too.
    let versions = b
        .state
        .transact(
            vec![
                w("a", json!(11), Some(a.version)),
                w("c", json!(3), None),
                TxWrite::new("$stream:tx", "g\u{1}i", json!({"n": 1}), None),
            ],
            &meta,
        )
        .await
        .unwrap();
    let a2 = b.state.get(&scope, "a").await.unwrap().unwrap();
    assert_eq!((a2.value, Some(a2.version)), (json!(11), versions[0]));
    assert!(a2.version > a.version);
    assert_eq!(
        b.state.get(&scope, "c").await.unwrap().unwrap().value,
        json!(3)
    );

    // A compare-and-set on the content (`expected_value`): at the version and holding
    // exactly that value, it writes; at the version but holding anything else (a caller's
    // altered copy), nothing is written and the conflict says the value, not the version.
    let held = json!({"seq": 4, "title": "t", "last_entry": "e4", "f": 1.5});
    let v = b
        .state
        .transact(vec![w("cas", held.clone(), Some(0))], &meta)
        .await
        .unwrap()[0]
        .expect("a conditional write's version");
    let cas = |expected_value: serde_json::Value, version: u64| TxWrite {
        expected_value: Some(expected_value),
        ..w("cas", json!({"seq": 5}), Some(version))
    };
    let mut altered = held.clone();
    altered["title"] = json!("not what is stored");
    for (wrong, says) in [
        (cas(altered, v), "does not hold the value expected"),
        (
            cas(json!({"seq": 4}), v),
            "does not hold the value expected",
        ),
        (cas(held.clone(), v + 1), "expected version"),
    ] {
        let err = b
            .state
            .transact(vec![wrong, w("cas-other", json!(1), None)], &meta)
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                StateError::ValueConflict { .. } | StateError::VersionConflict { .. }
            ) && err.to_string().contains(says)
                && err.to_string().contains("cas"),
            "should say {says}: {err}"
        );
        assert_eq!(
            engine_gateway::protocol::ErrorBody::from(err).code,
            "version_conflict",
            "callers handle it as the conflict it is"
        );
    }
    assert_eq!(
        b.state.get(&scope, "cas").await.unwrap().unwrap().value,
        held
    );
    assert!(b.state.get(&scope, "cas-other").await.unwrap().is_none());
    let v2 = b
        .state
        .transact(vec![cas(held.clone(), v)], &meta)
        .await
        .unwrap()[0];
    let now = b.state.get(&scope, "cas").await.unwrap().unwrap();
    assert_eq!((now.value, Some(now.version)), (json!({"seq": 5}), v2));
    // A value expected that nests too deep is refused before anything is written.
    let nested = (0..70).fold(json!(1), |v, _| json!([v]));
    let err = b
        .state
        .transact(vec![cas(nested, v2.unwrap_or(v))], &meta)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StateError::Invalid(m) if m.contains("expected_value") && m.contains("nests deeper")),
        "{err:?}"
    );
    // Only on a record that exists, at a version named.
    for version in [None, Some(0)] {
        let err = b
            .state
            .transact(
                vec![TxWrite {
                    expected_value: Some(json!(1)),
                    ..w("cas-new", json!(1), version)
                }],
                &meta,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StateError::Invalid(m) if m.contains("expected_value")),
            "{err:?}"
        );
    }

    // Refused before anything is written, naming what is wrong.
    let many: Vec<TxWrite> = (0..101)
        .map(|i| w(&format!("m{i}"), json!(i), None))
        .collect();
    let big = json!("x".repeat(1_000_000));
    let nested = (0..70).fold(json!(1), |v, _| json!([v]));
    for (writes, says) in [
        (Vec::new(), "at least one write"),
        (many, "at most 100"),
        (
            vec![w("d", json!(1), None), w("d", json!(2), None)],
            "written twice",
        ),
        (
            (0..4)
                .map(|i| w(&format!("big{i}"), big.clone(), None))
                .collect(),
            "bytes",
        ),
        (vec![w("e", nested, None)], "nests deeper"),
        (
            vec![TxWrite {
                scope: String::new(),
                ..w("f", json!(1), None)
            }],
            "write 0",
        ),
    ] {
        let err = b.state.transact(writes, &meta).await.unwrap_err();
        assert!(
            matches!(&err, StateError::Invalid(m) if m.contains(says)),
            "should say {says}: {err:?}"
        );
    }
    for key in ["m0", "d", "big0", "e"] {
        assert!(b.state.get(&scope, key).await.unwrap().is_none(), "{key}");
    }
}
