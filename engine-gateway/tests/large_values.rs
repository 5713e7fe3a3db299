//! Values over one DynamoDB item (400 KB; a large tool result, its text and its details)
//! are stored whole by every write and read back whole by every read, on the selected
//! backend. On DynamoDB they are stored apart (`bus_aws::spill`): the parts no record points
//! to any more are marked to expire, and the live ones are not.

use crate::common;
use engine_gateway::aws::state::DynamoState;

use engine_gateway::server::{self, BackendKind};
use engine_gateway::state::{ChangeKind, StateError, TxWrite, UpdateOp, WriteMeta};
use serde_json::{Value, json};
use std::time::Duration;

/// About 700 KB of JSON: multibyte text (parts split inside characters), held twice.
fn large(n: u64) -> Value {
    let text = format!("{n} é😀 \"quoted\" line\n").repeat(14_000);
    json!({"n": n, "text": text, "details": {"output": text}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_over_one_dynamodb_item_are_stored_whole_by_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    let b = server::backends(&opts).await.unwrap();
    let meta = WriteMeta::default();
    let scope = format!("large-{}", engine_gateway::trace::random_hex(4));
    assert!(large(1).to_string().len() > 600_000);

    // Unconditional, then conditional over it: each old value comes back whole.
    let first = b
        .state
        .set(&scope, "a", large(1), None, &meta)
        .await
        .unwrap();
    assert_eq!(first.old_value, None);
    let a = b.state.get(&scope, "a").await.unwrap().unwrap();
    assert_eq!((&a.value, a.version), (&large(1), first.version));
    let second = b
        .state
        .set(&scope, "a", large(2), Some(a.version), &meta)
        .await
        .unwrap();
    assert_eq!(second.old_value, Some(large(1)));
    let third = b
        .state
        .set(&scope, "a", large(3), None, &meta)
        .await
        .unwrap();
    assert_eq!(third.old_value, Some(large(2)));
    assert_eq!(third.version, second.version + 1);

    // An update of one field of a large value.
    let ops: Vec<UpdateOp> =
        vec![serde_json::from_value(json!({"type": "set", "path": "n", "value": 33})).unwrap()];
    let updated = b
        .state
        .update(&scope, "a", ops, Some(third.version), &meta)
        .await
        .unwrap();
    let mut want = large(3);
    want["n"] = json!(33);
    assert_eq!(updated.old_value, Some(large(3)));
    assert_eq!(b.state.get(&scope, "a").await.unwrap().unwrap().value, want);

    // A page of large and small values.
    b.state
        .set(&scope, "b", json!("small"), None, &meta)
        .await
        .unwrap();
    b.state
        .set(&scope, "c", large(4), Some(0), &meta)
        .await
        .unwrap();
    let (page, more) = b.state.list_page(&scope, None, None, 10).await.unwrap();
    let listed: Vec<(&str, &Value)> = page.iter().map(|e| (e.key.as_str(), &e.value)).collect();
    assert_eq!(
        listed,
        vec![("a", &want), ("b", &json!("small")), ("c", &large(4))]
    );
    assert!(!more);

    // A transaction: a compare-and-set on the large value's content, and a new large record.
    let at = b.state.get(&scope, "a").await.unwrap().unwrap().version;
    let mut wrong = large(3);
    wrong["n"] = json!(34);
    let cas = |expected: Value| TxWrite {
        expected_value: Some(expected),
        ..TxWrite::new(&scope, "a", large(5), Some(at))
    };
    let err = b
        .state
        .transact(
            vec![cas(wrong), TxWrite::new(&scope, "d", large(6), Some(0))],
            &meta,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::ValueConflict { .. }), "{err}");
    assert!(b.state.get(&scope, "d").await.unwrap().is_none());
    let versions = b
        .state
        .transact(
            vec![
                cas(want.clone()),
                TxWrite::new(&scope, "d", large(6), Some(0)),
            ],
            &meta,
        )
        .await
        .unwrap();
    let a = b.state.get(&scope, "a").await.unwrap().unwrap();
    assert_eq!((a.value, Some(a.version)), (large(5), versions[0]));
    assert_eq!(
        b.state.get(&scope, "d").await.unwrap().unwrap().value,
        large(6)
    );

    // Several at once, over large and small records alike (no old images: each record's
    // way of storing is guarded).
    b.state
        .set_many(
            vec![
                (scope.clone(), "e".into(), large(7)),
                (scope.clone(), "a".into(), json!("small again")),
                (scope.clone(), "b".into(), large(8)),
            ],
            &meta,
        )
        .await
        .unwrap();
    for (key, value) in [
        ("a", json!("small again")),
        ("b", large(8)),
        ("e", large(7)),
    ] {
        assert_eq!(
            b.state.get(&scope, key).await.unwrap().unwrap().value,
            value,
            "{key}"
        );
    }

    // Deleted: the old value whole.
    let gone = b.state.delete(&scope, "c", None, &meta).await.unwrap();
    assert_eq!(gone.old_value, Some(large(4)));
    assert!(b.state.get(&scope, "c").await.unwrap().is_none());

    // The change feed hands out a large value whole.
    let mut seen = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.is_none() && tokio::time::Instant::now() < deadline {
        let batch = b
            .changes
            .next_batch(100, Duration::from_millis(300))
            .await
            .unwrap();
        seen = batch
            .into_iter()
            .find(|r| r.scope == scope && r.key == "e" && r.kind == ChangeKind::Created);
    }
    assert_eq!(
        seen.expect("e's creation in the feed").new_value,
        Some(large(7))
    );

    if opts.backend == BackendKind::Aws {
        let left =
            a_writer_that_dies_at_any_step_leaves_no_part_unmarked(&opts.aws.prefix, &scope).await;
        let retired =
            parts_no_record_points_to_are_marked_to_expire(&opts.aws.prefix, &scope).await;
        for part_scope in &left {
            assert!(retired.contains(part_scope), "{part_scope} is marked");
        }
        let err = b
            .state
            .set(&scope, "f", json!("z".repeat(9 << 20)), None, &meta)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most") && err.contains("9437186"), "{err}");
        // A part changed behind the store's back is refused by name, not read as the value.
        corrupt_a_part_of(&opts.aws.prefix, &scope, "d").await;
        let err = b.state.get(&scope, "d").await.unwrap_err().to_string();
        assert!(err.contains("does not match its digest"), "{err}");
    }
}

/// The partition of the parts of `key`'s value, which must be stored apart.
async fn parts_scope_of(state: &DynamoState, scope: &str, key: &str) -> String {
    use aws_sdk_dynamodb::types::AttributeValue;
    let item = state.stored_item(scope, key).await.unwrap().unwrap();
    assert!(!item.contains_key("value"), "{key} is stored apart");
    let Some(AttributeValue::S(generation)) = item.get("pg") else {
        panic!("{key} names its parts: {item:?}");
    };
    format!("$parts/{generation}")
}

/// Flip one byte of the first part of `key`'s value (same length, still UTF-8).
async fn corrupt_a_part_of(prefix: &str, scope: &str, key: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let clients = engine_gateway::aws::AwsClients::from_env().await;
    let names = engine_gateway::aws::AwsNames::new(prefix);
    let (table, state) = (
        names.state_table(),
        DynamoState::new(clients.clone(), &names),
    );
    let part = (parts_scope_of(&state, scope, key).await, "0".to_string());
    let item = state.stored_item(&part.0, &part.1).await.unwrap();
    let Some(AttributeValue::B(bytes)) = item.as_ref().and_then(|i| i.get("b")) else {
        panic!("a part holds bytes");
    };
    let mut bytes = bytes.clone().into_inner();
    let at = bytes.iter().position(|b| *b == b'l').expect("a letter l");
    bytes[at] = b'L';
    clients
        .dynamodb
        .put_item()
        .table_name(&table)
        .item("scope", AttributeValue::S(part.0))
        .item("key", AttributeValue::S(part.1))
        .item("b", AttributeValue::B(bytes.into()))
        .send()
        .await
        .unwrap();
}

/// A writer that dies after writing its parts and before its record leaves them marked to
/// expire (they are born so). And every write that stores a value apart, replaces one or
/// deletes one makes no call after its transaction, which claims the new parts and marks the
/// old ones: a writer that dies once it committed leaves nothing to do. The partitions of
/// the parts left behind (to be found marked).
async fn a_writer_that_dies_at_any_step_leaves_no_part_unmarked(
    prefix: &str,
    scope: &str,
) -> Vec<String> {
    use aws_sdk_dynamodb::types::AttributeValue;
    use engine_gateway::aws::{api_calls, spill};
    use engine_gateway::state::StateStore;
    let clients = engine_gateway::aws::AwsClients::from_env().await;
    let names = engine_gateway::aws::AwsNames::new(prefix);
    let state = DynamoState::new(clients.clone(), &names);
    let meta = WriteMeta::default();

    // A transaction whose writes and parts pass DynamoDB's 100 items is refused by name
    // before anything is written.
    let mut writes: Vec<TxWrite> = (0..95)
        .map(|i| TxWrite::new(scope, &format!("many-{i}"), json!(i), Some(0)))
        .collect();
    writes.push(TxWrite::new(scope, "many-large-1", large(13), Some(0)));
    writes.push(TxWrite::new(scope, "many-large-2", large(14), Some(0)));
    let before = api_calls::snapshot();
    let err = state.transact(writes, &meta).await.unwrap_err();
    assert!(matches!(err, StateError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("at most 100"), "{err}");
    let calls = api_calls::since(&before);
    let writes: Vec<_> = calls
        .keys()
        .filter(|k| k.contains("PutItem") || k.contains("TransactWriteItems"))
        .collect();
    assert!(writes.is_empty(), "nothing written: {writes:?}");

    // Dies between its parts and its record.
    let body = spill::Body::of(&large(9)).unwrap();
    spill::write_parts(&clients.dynamodb, &names.state_table(), &body)
        .await
        .unwrap();
    let mut left = vec![format!("$parts/{}", body.parts().unwrap().generation)];

    // Each write: no call after its transaction, which names the parts' partitions.
    let after_commit = |what: &str, calls: std::collections::BTreeMap<String, u64>| {
        let late: Vec<_> = calls
            .keys()
            .filter(|k| !k.contains("TransactWriteItems") && k.contains("$parts/"))
            .filter(|k| !k.contains("PutItem") && !k.contains("GetItem"))
            .collect();
        assert!(
            late.is_empty(),
            "{what}: parts touched outside the transaction: {late:?}"
        );
        assert!(
            calls
                .keys()
                .any(|k| k.contains("TransactWriteItems") && k.contains("$parts/")),
            "{what}: the transaction claims or marks the parts: {calls:?}"
        );
    };
    let before = api_calls::snapshot();
    let first = state.set(scope, "g", large(10), None, &meta).await.unwrap();
    after_commit("a new record stored apart", api_calls::since(&before));
    left.push(parts_scope_of(&state, scope, "g").await);

    let before = api_calls::snapshot();
    let second = state.set(scope, "g", large(11), None, &meta).await.unwrap();
    after_commit("apart over apart", api_calls::since(&before));
    assert_eq!(second.old_value, Some(large(10)));
    assert_eq!(second.version, first.version + 1);
    left.push(parts_scope_of(&state, scope, "g").await);

    let before = api_calls::snapshot();
    let third = state
        .set(scope, "g", json!("small"), Some(second.version), &meta)
        .await
        .unwrap();
    after_commit("inline over apart", api_calls::since(&before));
    assert_eq!(third.old_value, Some(large(11)));

    let before = api_calls::snapshot();
    let fourth = state.set(scope, "g", large(12), None, &meta).await.unwrap();
    after_commit("apart over inline", api_calls::since(&before));
    assert_eq!(
        (fourth.old_value, fourth.version),
        (Some(json!("small")), third.version + 1)
    );
    left.push(parts_scope_of(&state, scope, "g").await);

    // A delete at a version that is not the record's is refused, whole.
    let err = state
        .delete(scope, "g", Some(third.version), &meta)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::VersionConflict { .. }), "{err}");
    let before = api_calls::snapshot();
    let gone = state
        .delete(scope, "g", Some(fourth.version), &meta)
        .await
        .unwrap();
    after_commit(
        "a delete of a record stored apart",
        api_calls::since(&before),
    );
    assert_eq!(gone.old_value, Some(large(12)));
    assert!(state.get(scope, "g").await.unwrap().is_none());

    // A pointer to parts changed behind the store's back: reads name it; a write over it and
    // a delete of it still go through (nothing to mark), rather than leave a record nobody
    // can write again.
    let corrupt = |key: &str| {
        clients
            .dynamodb
            .put_item()
            .table_name(names.state_table())
            .item("scope", AttributeValue::S(scope.into()))
            .item("key", AttributeValue::S(key.into()))
            .item("version", AttributeValue::N("5".into()))
            .item("pg", AttributeValue::S("not hex!".into()))
            .item("np", AttributeValue::N("3".into()))
            .send()
    };
    corrupt("h").await.unwrap();
    let err = state.get(scope, "h").await.unwrap_err().to_string();
    assert!(err.contains("corrupt parts `not hex!`"), "{err}");
    let over = state
        .set(scope, "h", json!("mended"), Some(5), &meta)
        .await
        .unwrap();
    assert_eq!((over.old_value, over.version), (Some(Value::Null), 6));
    assert_eq!(
        state.get(scope, "h").await.unwrap().unwrap().value,
        json!("mended")
    );
    corrupt("i").await.unwrap();
    let over = state.set(scope, "i", large(15), None, &meta).await.unwrap();
    assert_eq!(over.version, 6);
    left.push(parts_scope_of(&state, scope, "i").await);
    assert_eq!(
        state.get(scope, "i").await.unwrap().unwrap().value,
        large(15)
    );
    state.delete(scope, "i", None, &meta).await.unwrap();
    corrupt("j").await.unwrap();
    let gone = state.delete(scope, "j", Some(5), &meta).await.unwrap();
    assert_eq!(gone.version, 5);
    assert!(state.get(scope, "j").await.unwrap().is_none());
    left
}

/// Every part in the table is the live parts of `d`, `e` or `b` (unmarked) or marked to
/// expire about a day from now: the partitions of those.
async fn parts_no_record_points_to_are_marked_to_expire(
    prefix: &str,
    scope: &str,
) -> std::collections::BTreeSet<String> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let clients = engine_gateway::aws::AwsClients::from_env().await;
    let names = engine_gateway::aws::AwsNames::new(prefix);
    let (table, state) = (
        names.state_table(),
        DynamoState::new(clients.clone(), &names),
    );
    let ddb = &clients.dynamodb;
    let mut live = Vec::new();
    for key in ["b", "d", "e"] {
        live.push(parts_scope_of(&state, scope, key).await);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (mut live_parts, mut retired) = (0, std::collections::BTreeSet::new());
    let mut start = None;
    loop {
        let page = ddb
            .scan()
            .table_name(&table)
            .filter_expression("begins_with(#s, :p)")
            .expression_attribute_names("#s", "scope")
            .expression_attribute_values(":p", AttributeValue::S("$parts/".into()))
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .unwrap();
        for item in page.items() {
            let Some(AttributeValue::S(part_scope)) = item.get("scope") else {
                panic!("a part without its scope");
            };
            let expires = match item.get("expires") {
                Some(AttributeValue::N(n)) => Some(n.parse::<u64>().unwrap()),
                _ => None,
            };
            if live.contains(part_scope) {
                assert_eq!(expires, None, "a live part of {part_scope} is not marked");
                live_parts += 1;
            } else {
                let at = expires.unwrap_or_else(|| panic!("{part_scope} is marked to expire"));
                assert!(
                    at > now + 24 * 3600 && at < now + 26 * 3600,
                    "{at} vs {now}"
                );
                retired.insert(part_scope.clone());
            }
        }
        match page.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => break,
        }
    }
    assert!(live_parts >= 3 * 2, "{live_parts} live parts");
    // a: 1, 2, 3, 33 (its update), and the failed transaction's d; c: 4.
    assert!(retired.len() >= 6, "{retired:?}");
    retired
}
