//! The session store through a real engine (embedded, or the AWS backend with
//! `HARNESS_TEST_BACKEND=aws`): idempotent appends, branches and the leaf, fork (with the
//! summary root past 50 entries), clone, compaction in the context, the HTML export, parts,
//! errors, and the inbox under concurrent pushes and drains.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{Ctx, RemoteOptions, connect_client, run_embedded};
use serde_json::{Value, json};

fn user(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1})
}

fn texts(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"][0]["text"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A real engine (the selected backend) with the session worker and a client on it.
struct Store {
    _dir: tempfile::TempDir,
    srv: server::RunningServer,
    _worker: harness_sdk::WorkerHandle,
    client: harness_sdk::WorkerHandle,
}

async fn store() -> Store {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_tests(dir.path().join("data")))
        .await
        .unwrap();
    let worker = run_embedded(session_worker::worker(), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    Store {
        _dir: dir,
        srv,
        _worker: worker,
        client,
    }
}

async fn append(ctx: &Ctx, sid: &str, id: &str, parent: Option<&str>, text: &str) -> Value {
    let mut req =
        json!({"session_id": sid, "entry": {"type": "message", "id": id, "message": user(text)}});
    if let Some(p) = parent {
        req["parent_id"] = json!(p);
    }
    ctx.trigger("session-tree::append", req).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_branches_forks_clones_and_compactions() {
    let client_store = store().await;
    let client = &client_store.client;
    let ctx = client.ctx();

    // Errors name what is wrong.
    let e = ctx
        .trigger(
            "session-tree::append",
            json!({"session_id": "nope", "message": user("x")}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found");
    let e = ctx
        .trigger("session-tree::ensure", json!({"session_id": "a/b"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_message");
    assert!(e.message().contains("session_id"), "{e}");

    let created = ctx
        .trigger(
            "session-tree::create",
            json!({"session_id": "s1", "title": "first"}),
        )
        .await
        .unwrap();
    assert_eq!(created["created"], true);
    let e = ctx
        .trigger("session-tree::create", json!({"session_id": "s1"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "already_exists");
    assert_eq!(
        ctx.trigger("session-tree::ensure", json!({"session_id": "s1"}))
            .await
            .unwrap()["created"],
        false
    );

    // A chain; re-appending an id returns the stored entry, nothing new.
    append(&ctx, "s1", "e1", None, "one").await;
    append(&ctx, "s1", "e2", Some("e1"), "two").await;
    let again = append(
        &ctx,
        "s1",
        "e2",
        Some("e1"),
        "TWO (retried with other content)",
    )
    .await;
    assert_eq!(again["created"], false);
    assert_eq!(again["entry"]["message"]["content"][0]["text"], "two");
    // No parent: after the current leaf.
    append(&ctx, "s1", "e3", None, "three").await;
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert_eq!(texts(&m), ["one", "two", "three"]);
    assert_eq!(m["leaf_id"], "e3");
    let e = ctx
        .trigger(
            "session-tree::append",
            json!({"session_id": "s1", "parent_id": "ghost", "message": user("x")}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "entry_not_found");

    // An older parent starts a branch, which becomes the leaf; the old branch stays readable.
    append(&ctx, "s1", "b1", Some("e1"), "branch").await;
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert_eq!(texts(&m), ["one", "branch"]);
    let old = ctx
        .trigger(
            "session-tree::messages",
            json!({"session_id": "s1", "leaf_id": "e3"}),
        )
        .await
        .unwrap();
    assert_eq!(texts(&old), ["one", "two", "three"]);
    let tree = ctx
        .trigger("session-tree::tree", json!({"session_id": "s1"}))
        .await
        .unwrap();
    let e1 = tree["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "e1")
        .unwrap();
    assert_eq!(e1["children"], json!(["e2", "b1"]));

    // A batch is a chain.
    let batch = ctx.trigger("session-tree::append_batch", json!({"session_id": "s1", "parent_id": "e3", "entries": [{"id": "e4", "message": user("four")}, {"id": "e5", "message": user("five")}]})).await.unwrap();
    assert_eq!(batch["leaf_id"], "e5");
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert_eq!(texts(&m), ["one", "two", "three", "four", "five"]);

    // Compaction: summary + tail from `tail_start_id`.
    let c = ctx.trigger("session-tree::compact", json!({"session_id": "s1", "summary": "## Goal\ncount", "tail_start_id": "e4", "tokens_before": 99})).await.unwrap();
    append(&ctx, "s1", "e6", None, "six").await;
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1"}))
        .await
        .unwrap();
    let t = texts(&m);
    assert!(t[0].contains("## Goal\ncount"), "{t:?}");
    assert_eq!(&t[1..], ["four", "five", "six"]);
    assert_eq!(m["entry_ids"][0], c["entry_id"]);
    let cs = ctx
        .trigger("session-tree::compactions", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert_eq!(cs["compactions"].as_array().unwrap().len(), 1);

    // update_part replaces one block; out of range is a clear error.
    ctx.trigger("session-tree::update_part", json!({"session_id": "s1", "entry_id": "e5", "part_index": 0, "part": {"type": "text", "text": "FIVE"}})).await.unwrap();
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert!(texts(&m).contains(&"FIVE".to_string()));
    let e = ctx.trigger("session-tree::update_part", json!({"session_id": "s1", "entry_id": "e5", "part_index": 7, "part": {"type": "text", "text": "x"}})).await.unwrap_err();
    assert!(e.message().contains("out of range"), "{e}");

    // Fork from an older entry: the path up to it, source untouched.
    let f = ctx
        .trigger(
            "session-tree::fork",
            json!({"source_session_id": "s1", "from_entry_id": "e2", "new_session_id": "s1-fork"}),
        )
        .await
        .unwrap();
    assert_eq!(f["copied"], 2);
    let fm = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1-fork"}))
        .await
        .unwrap();
    assert_eq!(texts(&fm), ["one", "two"]);
    append(&ctx, "s1-fork", "f1", None, "fork only").await;
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert!(!texts(&m).contains(&"fork only".to_string()));

    // Clone copies every branch.
    let cl = ctx
        .trigger(
            "session-tree::clone",
            json!({"source_session_id": "s1", "new_session_id": "s1-clone"}),
        )
        .await
        .unwrap();
    let src = ctx
        .trigger("session-tree::tree", json!({"session_id": "s1"}))
        .await
        .unwrap();
    assert_eq!(
        cl["copied"].as_u64().unwrap() as usize,
        src["entries"].as_array().unwrap().len()
    );
    assert_eq!(cl["leaf_id"], src["leaf_id"]);
    let old = ctx
        .trigger(
            "session-tree::messages",
            json!({"session_id": "s1-clone", "leaf_id": "b1"}),
        )
        .await
        .unwrap();
    assert_eq!(texts(&old), ["one", "branch"]);

    // Past 50 entries a fork copies the last 50 under one branch_summary root.
    ctx.trigger("session-tree::create", json!({"session_id": "long"}))
        .await
        .unwrap();
    let entries: Vec<Value> = (0..60)
        .map(|i| json!({"id": format!("l{i}"), "message": user(&format!("msg {i}"))}))
        .collect();
    ctx.trigger(
        "session-tree::append_batch",
        json!({"session_id": "long", "parent_id": null, "entries": entries}),
    )
    .await
    .unwrap();
    let f = ctx
        .trigger(
            "session-tree::fork",
            json!({"source_session_id": "long", "from_entry_id": "l59"}),
        )
        .await
        .unwrap();
    assert_eq!(f["summarized"], 10);
    assert_eq!(f["copied"], 51);
    let fm = ctx
        .trigger(
            "session-tree::messages",
            json!({"session_id": f["session_id"]}),
        )
        .await
        .unwrap();
    let t = texts(&fm);
    assert_eq!(t.len(), 51);
    assert!(
        t[0].contains("msg 0") && t[0].contains("msg 9") && !t[0].contains("msg 10"),
        "{}",
        t[0]
    );
    assert_eq!(t[1], "msg 10");
    assert_eq!(fm["messages"][0]["custom_type"], "branch_summary");

    // A readable page of one branch, escaped.
    append(&ctx, "s1", "x1", None, "<b>bold</b> & more").await;
    let html = ctx
        .trigger("session-tree::export_html", json!({"session_id": "s1"}))
        .await
        .unwrap();
    let html = html["html"].as_str().unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("&lt;b&gt;bold&lt;/b&gt; &amp; more"));
    assert!(html.contains("compaction"));

    let list = ctx.trigger("session-tree::list", json!({})).await.unwrap();
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    for id in ["s1", "s1-fork", "s1-clone", "long"] {
        assert!(ids.contains(&id), "{ids:?}");
    }
}

/// An append after the entry this process appended last skips its reads (the session
/// worker's memo); whatever else writes the session's index, or another store with the same
/// session id, sends it down the checked path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_keep_their_order_whoever_else_writes_the_session() {
    let seq = |v: &Value| v["entry"]["seq"].as_u64().unwrap();
    let client_store = store().await;
    let client = &client_store.client;
    let ctx = client.ctx();
    ctx.trigger("session-tree::ensure", json!({"session_id": "m"}))
        .await
        .unwrap();
    let mut root = json!({"session_id": "m", "parent_id": null, "entry": {"type": "message", "id": "e1", "message": user("one")}});
    let e1 = ctx
        .trigger("session-tree::append", root.take())
        .await
        .unwrap();
    let e2 = append(&ctx, "m", "e2", Some("e1"), "two").await;
    assert_eq!(seq(&e2), seq(&e1) + 1);
    // Another writer reserves seq numbers (as another process's append would).
    ctx.trigger(
        "state::update",
        json!({"scope": "session-index", "key": "m", "ops": [{"type": "increment", "path": "seq", "by": 5}]}),
    )
    .await
    .unwrap();
    let e3 = append(&ctx, "m", "e3", Some("e2"), "three").await;
    assert_eq!(seq(&e3), seq(&e2) + 6, "{e3}");
    let e4 = append(&ctx, "m", "e4", Some("e3"), "four").await;
    assert_eq!(seq(&e4), seq(&e3) + 1);
    let e = ctx
        .trigger(
            "session-tree::append",
            json!({"session_id": "m", "parent_id": "ghost", "message": user("x")}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "entry_not_found", "{e}");
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "m"}))
        .await
        .unwrap();
    assert_eq!(texts(&m), ["one", "two", "three", "four"]);
    // After an entry this process did not append last (as a second instance of the worker
    // finds every parent): the index and the parent are read, then one conditional write.
    let e5 = append(&ctx, "m", "e5", Some("e2"), "five").await;
    assert_eq!(seq(&e5), seq(&e4) + 1, "{e5}");
    assert_eq!(e5["created"], true, "{e5}");
    let e6 = append(&ctx, "m", "e6", Some("e3"), "six").await;
    assert_eq!(seq(&e6), seq(&e5) + 1, "{e6}");
    let branch = ctx
        .trigger(
            "session-tree::messages",
            json!({"session_id": "m", "leaf_id": "e5"}),
        )
        .await
        .unwrap();
    assert_eq!(texts(&branch), ["one", "two", "five"]);
    // Sent again, it creates nothing and answers what is stored.
    let again = append(&ctx, "m", "e5", Some("e2"), "five").await;
    assert_eq!(again["created"], false, "{again}");
    assert_eq!(seq(&again), seq(&e5));

    // A second store in this process with a session of the same id: the memo of the first
    // proves nothing there.
    let client2_store = store().await;
    let client2 = &client2_store.client;
    let ctx2 = client2.ctx();
    ctx2.trigger("session-tree::ensure", json!({"session_id": "m"}))
        .await
        .unwrap();
    let e = ctx2
        .trigger(
            "session-tree::append",
            json!({"session_id": "m", "parent_id": "e4", "message": user("x")}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "entry_not_found", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_loses_and_duplicates_nothing_under_concurrency() {
    let client_store = store().await;
    let client = &client_store.client;
    let ctx = client.ctx();

    let p = ctx
        .trigger(
            "session-inbox::push",
            json!({"name": "steering", "session_id": "s", "item": "first"}),
        )
        .await
        .unwrap();
    assert_eq!(p["depth"], 1);
    let peek = ctx
        .trigger(
            "session-inbox::peek",
            json!({"name": "steering", "session_id": "s"}),
        )
        .await
        .unwrap();
    assert_eq!(peek["items"], json!(["first"]));
    let d = ctx
        .trigger(
            "session-inbox::drain",
            json!({"name": "steering", "session_id": "s", "max": 0}),
        )
        .await
        .unwrap();
    assert_eq!(d["items"], json!([]));
    let d = ctx
        .trigger(
            "session-inbox::drain",
            json!({"name": "steering", "session_id": "s"}),
        )
        .await
        .unwrap();
    assert_eq!(d["items"], json!(["first"]));
    let e = ctx
        .trigger(
            "session-inbox::push",
            json!({"name": "steering", "session_id": "s"}),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("item"), "{e}");

    // 4 pushers × 25 items while 2 drainers take batches of at most 3.
    let mut tasks = Vec::new();
    for p in 0..4 {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                ctx.trigger(
                    "session-inbox::push",
                    json!({"name": "followup", "session_id": "c", "item": format!("{p}-{i}")}),
                )
                .await
                .unwrap();
            }
            Vec::new()
        }));
    }
    for _ in 0..2 {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..40 {
                let d = ctx
                    .trigger(
                        "session-inbox::drain",
                        json!({"name": "followup", "session_id": "c", "max": 3}),
                    )
                    .await
                    .unwrap();
                got.extend(
                    d["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_string()),
                );
            }
            got
        }));
    }
    let mut all: Vec<String> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let rest = ctx
        .trigger(
            "session-inbox::drain",
            json!({"name": "followup", "session_id": "c"}),
        )
        .await
        .unwrap();
    all.extend(
        rest["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string()),
    );
    all.sort();
    let mut expected: Vec<String> = (0..4)
        .flat_map(|p| (0..25).map(move |i| format!("{p}-{i}")))
        .collect();
    expected.sort();
    assert_eq!(all, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peek_finds_the_first_inbox_with_items_among_several() {
    let client_store = store().await;
    let ctx = client_store.client.ctx();
    let peek = |names: Value| {
        let ctx = ctx.clone();
        async move {
            ctx.trigger(
                "session-inbox::peek",
                json!({"name": "steering", "session_id": "pk", "names": names}),
            )
            .await
        }
    };
    // All empty: no items, and the answer says no inbox had any.
    let r = peek(json!(["steering", "followup"])).await.unwrap();
    assert_eq!(r, json!({"items": [], "name": null}));
    for (name, item) in [("followup", "later"), ("other", "elsewhere")] {
        ctx.trigger(
            "session-inbox::push",
            json!({"name": name, "session_id": "pk", "item": item}),
        )
        .await
        .unwrap();
    }
    // Another session's inbox with a name that starts the same is not this session's.
    ctx.trigger(
        "session-inbox::push",
        json!({"name": "steering", "session_id": "pk2", "item": "not mine"}),
    )
    .await
    .unwrap();
    let r = peek(json!(["steering", "followup"])).await.unwrap();
    assert_eq!(r, json!({"items": ["later"], "name": "followup"}));
    ctx.trigger(
        "session-inbox::push",
        json!({"name": "steering", "session_id": "pk", "item": "now"}),
    )
    .await
    .unwrap();
    let r = peek(json!(["steering", "followup"])).await.unwrap();
    assert_eq!(
        r,
        json!({"items": ["now"], "name": "steering"}),
        "in the order named"
    );
    // Peeking changes nothing.
    let r = peek(json!(["followup"])).await.unwrap();
    assert_eq!(r["items"], json!(["later"]));
    // Hostile lists are refused, naming the field.
    let many: Vec<String> = (0..9).map(|i| format!("n{i}")).collect();
    for names in [
        json!([]),
        json!("steering"),
        json!([1]),
        json!(["a/b"]),
        json!(many),
    ] {
        let e = peek(names.clone()).await.unwrap_err();
        assert_eq!(e.code(), "invalid_message", "{names}: {e}");
        assert!(e.message().contains("names"), "{names}: {e}");
    }
}

/// `session-tree::append_batch` with `peek_inboxes`: the entries are stored, then the inboxes
/// read as `session-inbox::peek` with `names` reads them (the steering check's call, saved);
/// without the field the answer has no `inbox`; a bad list is refused before anything is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_can_peek_the_inboxes_beside_storing() {
    let client_store = store().await;
    let ctx = client_store.client.ctx();
    let append = |id: &str, peek: Option<Value>| {
        let ctx = ctx.clone();
        let mut req = json!({
            "session_id": "ap",
            "entries": [{"id": id, "message": {"role": "user", "content": [{"type": "text", "text": id}], "timestamp": 1}}],
        });
        if let Some(p) = peek {
            req["peek_inboxes"] = p;
        }
        async move { ctx.trigger("session-tree::append_batch", req).await }
    };
    ctx.trigger("session-tree::create", json!({"session_id": "ap"}))
        .await
        .unwrap();
    let r = append("e1", None).await.unwrap();
    assert!(r.get("inbox").is_none(), "{r}");
    let r = append("e2", Some(json!(["steering", "followup"])))
        .await
        .unwrap();
    assert_eq!(r["entry_ids"], json!(["e2"]));
    assert_eq!(r["inbox"], json!({"items": [], "name": null}));
    ctx.trigger(
        "session-inbox::push",
        json!({"name": "followup", "session_id": "ap", "item": "later"}),
    )
    .await
    .unwrap();
    let r = append("e3", Some(json!(["steering", "followup"])))
        .await
        .unwrap();
    assert_eq!(r["inbox"], json!({"items": ["later"], "name": "followup"}));
    // Hostile lists are refused by name, and nothing is appended.
    for names in [json!([]), json!("steering"), json!(["a/b"])] {
        let e = append("e4", Some(names.clone())).await.unwrap_err();
        assert_eq!(e.code(), "invalid_message", "{names}: {e}");
        assert!(e.message().contains("names"), "{names}: {e}");
    }
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "ap"}))
        .await
        .unwrap();
    assert_eq!(m["entry_ids"], json!(["e1", "e2", "e3"]));
}

/// `with_messages`: the append answers the model context at its new leaf, as
/// `session-tree::messages` would, the first time and when it runs again (a retried step,
/// whose entries exist: no message twice); without `parent_id` the entries go to the current
/// leaf; a compaction in the context is applied; a non-boolean is refused, nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_can_answer_the_history_it_continues() {
    let client_store = store().await;
    let ctx = client_store.client.ctx();
    let batch = |ids: &[&str], extra: Value| {
        let ctx = ctx.clone();
        let entries: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "message": user(id)}))
            .collect();
        let mut req = json!({"session_id": "wm", "entries": entries});
        for (k, v) in extra.as_object().into_iter().flatten() {
            req[k] = v.clone();
        }
        async move { ctx.trigger("session-tree::append_batch", req).await }
    };
    let messages = |leaf: Option<&str>| {
        let ctx = ctx.clone();
        let req = json!({"session_id": "wm", "leaf_id": leaf});
        async move { ctx.trigger("session-tree::messages", req).await.unwrap() }
    };
    ctx.trigger("session-tree::create", json!({"session_id": "wm"}))
        .await
        .unwrap();
    // An empty session: the entries start a root, and the context is theirs.
    let r = batch(&["u1", "u2"], json!({"with_messages": true}))
        .await
        .unwrap();
    assert_eq!(r["messages"], messages(None).await, "{r}");
    assert_eq!(texts(&r["messages"]), ["u1", "u2"]);
    assert_eq!(r["messages"]["leaf_id"], "u2");
    // At the current leaf, without naming it.
    let r = batch(&["u3"], json!({"with_messages": true}))
        .await
        .unwrap();
    assert_eq!(r["messages"], messages(None).await);
    assert_eq!(texts(&r["messages"]), ["u1", "u2", "u3"]);
    assert_eq!(r["messages"]["path_length"], 3);
    // The same append again (a retried step): the stored entry, not a second copy.
    let again = batch(&["u3"], json!({"with_messages": true}))
        .await
        .unwrap();
    assert_eq!(again["entries"][0]["created"], false, "{again}");
    assert_eq!(texts(&again["messages"]), ["u1", "u2", "u3"]);
    // A named parent (a branch): the context of the branch.
    let r = batch(&["b1"], json!({"with_messages": true, "parent_id": "u1"}))
        .await
        .unwrap();
    assert_eq!(r["messages"], messages(Some("b1")).await);
    assert_eq!(texts(&r["messages"]), ["u1", "b1"]);
    // After a compaction, the summary stands for what it replaced.
    ctx.trigger(
        "session-tree::append",
        json!({"session_id": "wm", "parent_id": "u3", "entry": {"type": "compaction", "id": "c1", "summary": "earlier", "tail_start_id": "u3", "tokens_before": 10}}),
    )
    .await
    .unwrap();
    let r = batch(&["u4"], json!({"with_messages": true, "parent_id": "c1"}))
        .await
        .unwrap();
    assert_eq!(r["messages"], messages(Some("u4")).await);
    assert_eq!(r["messages"]["entry_ids"], json!(["c1", "u3", "u4"]));
    // Without the flag, no history; a bad flag is refused by name and stores nothing.
    let r = batch(&["u5"], json!({"parent_id": "u4"})).await.unwrap();
    assert!(r.get("messages").is_none(), "{r}");
    for bad in [json!("yes"), json!(1), json!({})] {
        let e = batch(
            &["u6"],
            json!({"with_messages": bad.clone(), "parent_id": "u5"}),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), "invalid_message", "{bad}: {e}");
        assert!(e.message().contains("with_messages"), "{bad}: {e}");
    }
    let last = messages(None).await;
    assert_eq!(last["leaf_id"], "u5", "{last}");
}

/// An append that hands back the index its caller was last answered (`index_seen`) is written
/// on it by an instance that does not remember the session, without reading the index or the
/// parent; a stale, altered or forged one is checked by the transaction and the append reads
/// as without it; a malformed one is refused by name and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_on_the_index_its_caller_was_answered_reads_nothing_and_trusts_nothing() {
    let client_store = store().await;
    let ctx = client_store.client.ctx();
    let batch = |id: &str, parent: &str, seen: Option<Value>| {
        let ctx = ctx.clone();
        let mut req = json!({"session_id": "ix", "parent_id": parent, "entries": [{"id": id, "message": user(id)}]});
        if let Some(seen) = seen {
            req["index_seen"] = seen;
        }
        async move { ctx.trigger("session-tree::append_batch", req).await }
    };
    let seq = |r: &Value| r["entries"][0]["entry"]["seq"].as_u64().unwrap();
    ctx.trigger(
        "session-tree::create",
        json!({"session_id": "ix", "title": "mine"}),
    )
    .await
    .unwrap();
    ctx.trigger(
        "session-tree::append",
        json!({"session_id": "ix", "parent_id": null, "entry": {"type": "message", "id": "a", "message": user("a")}}),
    )
    .await
    .unwrap();
    // Written in one transaction with its entry: the answer carries the index, which names it.
    let b = batch("b", "a", None).await.unwrap();
    let index_b = b["index"].clone();
    assert_eq!(index_b["value"]["last_entry"], "b", "{b}");
    assert_eq!(index_b["value"]["title"], "mine");
    assert!(index_b["version"].as_u64().is_some(), "{b}");

    // Another instance (nothing remembered) with the index handed back: the parent is not
    // read. The test takes the parent away behind the store's back to show it: the read
    // would have refused the append.
    session_worker::forget_remembered("ix");
    let b_entry = ctx
        .trigger(
            "state::get",
            json!({"scope": "session-entries", "key": "ix/b"}),
        )
        .await
        .unwrap();
    ctx.trigger(
        "state::delete",
        json!({"scope": "session-entries", "key": "ix/b"}),
    )
    .await
    .unwrap();
    let c = batch("c", "b", Some(index_b.clone())).await.unwrap();
    assert_eq!(c["entries"][0]["created"], true, "{c}");
    assert_eq!(seq(&c), seq(&b) + 1);
    let index_c = c["index"].clone();
    assert_eq!(index_c["value"]["last_entry"], "c");
    assert_eq!(index_c["value"]["seq"], seq(&c));
    ctx.trigger(
        "state::set",
        json!({"scope": "session-entries", "key": "ix/b", "value": b_entry}),
    )
    .await
    .unwrap();

    // A stale index (written since): its transaction fails, and the append reads and goes on.
    session_worker::forget_remembered("ix");
    let branch = batch("d", "b", Some(index_b.clone())).await.unwrap();
    assert_eq!(branch["entries"][0]["created"], true, "{branch}");
    assert_eq!(seq(&branch), seq(&c) + 1, "{branch}");

    // An altered one (its title changed, at the version that is stored): the transaction
    // requires the stored value, so nothing of the caller's copy is written.
    session_worker::forget_remembered("ix");
    let mut altered = branch["index"].clone();
    altered["value"]["title"] = json!("not mine");
    let e = batch("e", "d", Some(altered)).await.unwrap();
    assert_eq!(seq(&e), seq(&branch) + 1, "{e}");
    assert_eq!(e["index"]["value"]["title"], "mine", "{e}");
    let meta = ctx
        .trigger("session-tree::ensure", json!({"session_id": "ix"}))
        .await
        .unwrap();
    assert_eq!(meta["session"]["title"], "mine", "{meta}");

    // One whose `seq` would overflow when the new entries are counted on it: not written on,
    // no panic; the append reads and goes on.
    session_worker::forget_remembered("ix");
    let mut huge = e["index"].clone();
    huge["value"]["seq"] = json!(u64::MAX);
    let e2 = batch("e2", "e", Some(huge)).await.unwrap();
    assert_eq!(seq(&e2), seq(&e) + 1, "{e2}");
    let mut after_e2 = e2["index"].clone();

    // A forged one naming a parent that does not exist: refused as without it.
    session_worker::forget_remembered("ix");
    let mut forged = after_e2.take();
    forged["value"]["last_entry"] = json!("ghost");
    let err = batch("f", "ghost", Some(forged)).await.unwrap_err();
    assert_eq!(err.code(), "entry_not_found", "{err}");

    // Malformed: refused by name, nothing stored.
    for bad in [
        json!("yes"),
        json!({"value": {}}),
        json!({"value": [], "version": 3}),
        json!({"value": {}, "version": 0}),
        // Deeper, or larger, than any index an append answers.
        json!({"value": {"n": (0..70).fold(json!(1), |v, _| json!([v]))}, "version": 3}),
        json!({"value": {"title": "x".repeat(5000)}, "version": 3}),
    ] {
        let err = batch("g", "e2", Some(bad.clone())).await.unwrap_err();
        assert_eq!(err.code(), "invalid_message", "{bad}: {err}");
        assert!(err.message().contains("index_seen"), "{bad}: {err}");
    }
    let m = ctx
        .trigger("session-tree::messages", json!({"session_id": "ix"}))
        .await
        .unwrap();
    assert_eq!(texts(&m), ["a", "b", "d", "e", "e2"], "{m}");
}

/// A run's first append (`with_messages`, at the current leaf) with the index
/// `session-tree::ensure` answered at the run's start (`index_seen`), on an instance that
/// remembers nothing: the session and its entries are read beside each other, then one
/// transaction; the index is neither read nor allocated on its own. On a new session and on
/// one with a history alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_first_append_on_the_index_ensure_answered_is_one_transaction() {
    use futures_util::FutureExt;
    use std::sync::{Arc, Mutex};
    let s = store().await;
    // Another session worker (the last registration wins), whose calls are noted.
    let calls = Arc::new(Mutex::new(Vec::<String>::new()));
    let noted = calls.clone();
    let _watched =
        harness_sdk::run_embedded_through(session_worker::worker(), &s.srv.engine, |bus| {
            harness_sdk::bus::Watched::around(
                bus,
                Arc::new(move |function_id, _| {
                    noted.lock().unwrap().push(function_id.to_string());
                    async {}.boxed()
                }),
            )
        })
        .unwrap();
    let ctx = s.client.ctx();
    let first_append_to = |sid: &'static str, id: &'static str, seen: Value| {
        let ctx = ctx.clone();
        let calls = calls.clone();
        async move {
            session_worker::forget_remembered(sid);
            calls.lock().unwrap().clear();
            let r = ctx
                .trigger(
                    "session-tree::append_batch",
                    json!({"session_id": sid, "entries": [{"id": id, "message": user(id)}], "with_messages": true, "index_seen": seen}),
                )
                .await
                .unwrap();
            let mut made = calls.lock().unwrap().clone();
            made.sort();
            (r, made)
        }
    };
    let first_append = |id: &'static str, seen: Value| first_append_to("run", id, seen);
    let one_transaction = ["state::get", "state::list", "state::transact"];
    for (run, id, before) in [(1, "u1", vec![]), (2, "u2", vec!["u1"])] {
        let ensured = ctx
            .trigger("session-tree::ensure", json!({"session_id": "run"}))
            .await
            .unwrap();
        assert_eq!(ensured["created"], run == 1, "{ensured}");
        assert!(ensured["index"]["version"].as_u64().is_some(), "{ensured}");
        assert_eq!(ensured["index"]["value"]["session_id"], "run", "{ensured}");
        let (r, made) = first_append(id, ensured["index"].clone()).await;
        assert_eq!(made, one_transaction, "run {run}: {r}");
        let mut expected = before.clone();
        expected.push(id);
        assert_eq!(texts(&r["messages"]), expected, "{r}");
        assert_eq!(r["index"]["value"]["last_entry"], id, "{r}");
    }
    // A stale index (the session was appended to since): the transaction on it fails, and
    // the append reads and goes on, at the leaf.
    let stale = ctx
        .trigger("session-tree::ensure", json!({"session_id": "run"}))
        .await
        .unwrap()["index"]
        .clone();
    ctx.trigger(
        "session-tree::append",
        json!({"session_id": "run", "entry": {"type": "message", "id": "x", "message": user("x")}}),
    )
    .await
    .unwrap();
    let (r, made) = first_append("u3", stale).await;
    assert_ne!(made, one_transaction, "{r}");
    assert_eq!(texts(&r["messages"]), ["u1", "u2", "x", "u3"], "{r}");

    // An altered index (another title, at the version stored) on a new session's first
    // append, a new root: the transaction requires the stored value, so nothing of the
    // caller's copy is written; the append reads and goes on.
    let mut altered = ctx
        .trigger("session-tree::ensure", json!({"session_id": "fresh"}))
        .await
        .unwrap()["index"]
        .clone();
    altered["value"]["title"] = json!("not mine");
    let (r, made) = first_append_to("fresh", "f1", altered).await;
    assert_ne!(made, one_transaction, "{r}");
    assert_eq!(texts(&r["messages"]), ["f1"], "{r}");
    let stored = ctx
        .trigger("session-tree::ensure", json!({"session_id": "fresh"}))
        .await
        .unwrap();
    assert_ne!(stored["session"]["title"], "not mine", "{stored}");
    assert_eq!(stored["index"]["value"]["last_entry"], "f1", "{stored}");
}

/// `session-tree::list` in pages: newest first, `total` and `next_offset`, every session once
/// across the pages; a bad `limit` or `offset` is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_list_pages_and_refuses_bad_pages() {
    let s = store().await;
    let ctx = s.client.ctx();
    for i in 0..7 {
        let sid = format!("p{i}");
        ctx.trigger("session-tree::ensure", json!({"session_id": sid}))
            .await
            .unwrap();
        append(&ctx, &sid, "e1", None, "hi").await;
        // Distinct update times, so "newest first" has one answer.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let page = ctx
            .trigger("session-tree::list", json!({"limit": 3, "offset": offset}))
            .await
            .unwrap();
        assert_eq!(page["total"], 7);
        let ids: Vec<String> = page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap().to_string())
            .collect();
        assert!(ids.len() <= 3);
        seen.extend(ids);
        match page["next_offset"].as_u64() {
            Some(n) => offset = n,
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 7, "every session once: {seen:?}");
    assert_eq!(seen[0], "p6", "newest first: {seen:?}");
    let beyond = ctx
        .trigger("session-tree::list", json!({"limit": 3, "offset": 100}))
        .await
        .unwrap();
    assert_eq!(beyond["sessions"].as_array().map(Vec::len), Some(0));
    for (bad, field) in [
        (json!({"limit": 0}), "limit"),
        (json!({"limit": 501}), "limit"),
        (json!({"limit": "3"}), "limit"),
        (json!({"limit": 3, "offset": -1}), "offset"),
        (json!({"offset": [1]}), "offset"),
    ] {
        let e = ctx
            .trigger("session-tree::list", bad.clone())
            .await
            .unwrap_err();
        assert!(e.to_string().contains(field), "{bad}: {e}");
    }
}
