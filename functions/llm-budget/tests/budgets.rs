//! Budgets through real engines (embedded, or two engines sharing one DynamoDB table with
//! `HARNESS_TEST_BACKEND=aws`): concurrent records from several workers sum exactly, an alert
//! fires once, and all 14 functions behave.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{Ctx, RemoteOptions, Worker, WorkerHandle, connect_client, run_embedded};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn alert_counter(count: Arc<AtomicUsize>) -> Worker {
    Worker::new("alerts").function(
        "test::budget_alert",
        "counts alerts",
        move |_ctx, data: Value| {
            let count = count.clone();
            async move {
                assert_eq!(data["payload"], json!({"note": "half"}));
                count.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"ok": true}))
            }
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_records_from_several_workers_sum_exactly_and_alert_once() {
    let dir = tempfile::tempdir().unwrap();
    let first = ServeOptions::for_tests(dir.path().join("a"));
    let aws = matches!(first.backend, server::BackendKind::Aws);
    // On AWS a second engine (its own budget worker) shares the table: two writers that only
    // meet in DynamoDB's conditional writes.
    let mut options = vec![first.clone()];
    if aws {
        let mut second = first.clone();
        second.data_dir = dir.path().join("b");
        options.push(second);
    }
    let alerts = Arc::new(AtomicUsize::new(0));
    let mut servers = Vec::new();
    let mut handles: Vec<WorkerHandle> = Vec::new();
    let mut ctxs: Vec<Ctx> = Vec::new();
    for o in &options {
        let srv = server::start(o).await.unwrap();
        handles.push(run_embedded(llm_budget::worker(), &srv.engine).unwrap());
        handles.push(run_embedded(alert_counter(alerts.clone()), &srv.engine).unwrap());
        let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
        ctxs.push(client.ctx());
        handles.push(client);
        servers.push(srv);
    }
    let ctx = ctxs[0].clone();
    let b = ctx
        .trigger(
            "budget::create",
            json!({"ceiling_usd": 50.0, "period": "day", "workspace_id": "ws"}),
        )
        .await
        .unwrap();
    let id = b["budget_id"].as_str().unwrap().to_string();
    ctx.trigger("budget::alert_set", json!({"budget_id": id, "threshold_pct": 0.5, "callback_function_id": "test::budget_alert", "callback_payload": {"note": "half"}})).await.unwrap();

    // 8 tasks × 25 records of $0.185, alternating between the engines: $37.00.
    let mut tasks = Vec::new();
    for t in 0..8 {
        let ctx = ctxs[t % ctxs.len()].clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                ctx.trigger(
                    "budget::record",
                    json!({"budget_id": id, "cost_usd": 0.185}),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got = ctx
        .trigger("budget::get", json!({"budget_id": id}))
        .await
        .unwrap();
    assert_eq!(got["spent_usd"], json!(37.0), "{got}");
    assert_eq!(got["window"]["records"], 200);
    assert_eq!(
        alerts.load(Ordering::SeqCst),
        1,
        "the 50% alert fires exactly once"
    );

    let c = ctx
        .trigger(
            "budget::check",
            json!({"budget_id": id, "estimated_cost_usd": 20.0}),
        )
        .await
        .unwrap();
    assert_eq!(c["allowed"], false);
    assert_eq!(c["reason"], "ceiling_exceeded");
    let c = ctx
        .trigger("budget::check", json!({"budget_id": id}))
        .await
        .unwrap();
    assert_eq!(c["allowed"], true);
    assert_eq!(c["remaining_usd"], json!(13.0));
    drop(handles);
    for s in servers {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fourteen_functions() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_tests(dir.path().join("data")))
        .await
        .unwrap();
    let _w = run_embedded(llm_budget::worker(), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();

    // Bad input names the field.
    for (req, field) in [
        (json!({"ceiling_usd": 0, "period": "day"}), "ceiling_usd"),
        (json!({"ceiling_usd": 5, "period": "year"}), "period"),
    ] {
        let e = ctx.trigger("budget::create", req).await.unwrap_err();
        assert!(e.message().contains(field), "{e}");
    }
    let e = ctx
        .trigger("budget::get", json!({"budget_id": "ghost"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found");

    let b = ctx.trigger("budget::create", json!({"budget_id": "team", "ceiling_usd": 10.0, "period": "week", "workspace_id": "ws", "agent_id": "bot", "name": "team"})).await.unwrap();
    assert_eq!(b["budget"]["period"], "week");
    let w = &b["budget"]["window"];
    assert_eq!(
        (w["end_ms"].as_u64().unwrap() - w["start_ms"].as_u64().unwrap()) / 86_400_000,
        7
    );
    // Weeks start on Monday: 1970-01-05 was one; every window start is a multiple of 7 days after it.
    assert_eq!((w["start_ms"].as_u64().unwrap() / 86_400_000 - 4) % 7, 0);
    ctx.trigger("budget::create", json!({"budget_id": "other", "ceiling_usd": 1.0, "period": "month", "workspace_id": "elsewhere"})).await.unwrap();
    let l = ctx
        .trigger(
            "budget::list",
            json!({"workspace_id": "ws", "agent_id": "bot"}),
        )
        .await
        .unwrap();
    assert_eq!(l["budgets"].as_array().unwrap().len(), 1);
    assert_eq!(
        ctx.trigger("budget::list", json!({})).await.unwrap()["budgets"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let r = ctx
        .trigger(
            "budget::record",
            json!({"budget_id": "team", "cost_usd": 4.0}),
        )
        .await
        .unwrap();
    assert_eq!(r["spent_usd"], json!(4.0));
    let f = ctx
        .trigger("budget::forecast", json!({"budget_id": "team"}))
        .await
        .unwrap();
    assert!(f["projected_month_usd"].as_f64().unwrap() > 4.0, "{f}");
    assert!(f.get("on_track").is_some() && f.get("days_until_breach").is_some());

    let u = ctx
        .trigger(
            "budget::update",
            json!({"budget_id": "team", "patch": {"ceiling_usd": 5.0}}),
        )
        .await
        .unwrap();
    assert_eq!(u["ceiling_usd"], json!(5.0));
    let e = ctx
        .trigger(
            "budget::update",
            json!({"budget_id": "team", "patch": {"spent": 0}}),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("patch.spent"), "{e}");

    ctx.trigger(
        "budget::record",
        json!({"budget_id": "team", "cost_usd": 2.0}),
    )
    .await
    .unwrap();
    let c = ctx
        .trigger(
            "budget::check",
            json!({"budget_id": "team", "principal_id": "bot"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (c["allowed"].clone(), c["reason"].clone()),
        (json!(false), json!("ceiling_exceeded"))
    );
    ctx.trigger(
        "budget::exempt",
        json!({"budget_id": "team", "principal_id": "bot", "reason": "demo day"}),
    )
    .await
    .unwrap();
    let c = ctx
        .trigger(
            "budget::check",
            json!({"budget_id": "team", "principal_id": "bot"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (c["allowed"].clone(), c["reason"].clone()),
        (json!(true), json!("exempt"))
    );
    let c = ctx
        .trigger(
            "budget::check",
            json!({"budget_id": "team", "principal_id": "someone-else"}),
        )
        .await
        .unwrap();
    assert_eq!(c["allowed"], false);
    ctx.trigger(
        "budget::enforce",
        json!({"budget_id": "team", "enforced": false}),
    )
    .await
    .unwrap();
    let c = ctx
        .trigger("budget::check", json!({"budget_id": "team"}))
        .await
        .unwrap();
    assert_eq!(
        (c["allowed"].clone(), c["reason"].clone()),
        (json!(true), json!("not_enforced"))
    );
    ctx.trigger(
        "budget::pause",
        json!({"budget_id": "team", "paused": true}),
    )
    .await
    .unwrap();
    let c = ctx
        .trigger("budget::check", json!({"budget_id": "team"}))
        .await
        .unwrap();
    assert_eq!(
        (c["allowed"].clone(), c["reason"].clone()),
        (json!(false), json!("paused"))
    );
    ctx.trigger(
        "budget::pause",
        json!({"budget_id": "team", "paused": false}),
    )
    .await
    .unwrap();
    ctx.trigger(
        "budget::enforce",
        json!({"budget_id": "team", "enforced": true}),
    )
    .await
    .unwrap();

    let usage = ctx
        .trigger("budget::usage", json!({"budget_id": "team"}))
        .await
        .unwrap();
    assert_eq!(usage["window"]["spent_usd"], json!(6.0));
    assert_eq!(usage["window"]["records"], 2);
    ctx.trigger("budget::reset", json!({"budget_id": "team"}))
        .await
        .unwrap();
    let c = ctx
        .trigger(
            "budget::check",
            json!({"budget_id": "team", "principal_id": "someone-else"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (c["allowed"].clone(), c["remaining_usd"].clone()),
        (json!(true), json!(5.0))
    );
    let d = ctx
        .trigger("budget::delete", json!({"budget_id": "team"}))
        .await
        .unwrap();
    assert_eq!(d["deleted"], true);
    assert_eq!(
        ctx.trigger("budget::get", json!({"budget_id": "team"}))
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
}
