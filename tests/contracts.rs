//! Every SPEC function ID documents itself: `engine::functions::list` gives a JSON Schema for
//! its request (and, for the workers' functions, its answer); and the answers the workers
//! give read back into the contract types those schemas come from.

use crate::common;

use common::*;
use scripted_model::Cassette;
use serde_json::{Value, json};

/// SPEC §1 and §3's function IDs, as the thick harness registers them.
const SPEC_IDS: &[&str] = &[
    "approval::list_pending",
    "approval::resolve",
    "auth::delete_token",
    "auth::get_token",
    "auth::list_providers",
    "auth::set_token",
    "auth::status",
    "budget::alert_set",
    "budget::check",
    "budget::create",
    "budget::delete",
    "budget::enforce",
    "budget::exempt",
    "budget::forecast",
    "budget::get",
    "budget::list",
    "budget::pause",
    "budget::record",
    "budget::reset",
    "budget::update",
    "budget::usage",
    "context-compaction::compact_now",
    "context-compaction::compact_session",
    "context-compaction::prune_tool_outputs",
    "directory::skills::download",
    "directory::skills::get",
    "directory::skills::index",
    "directory::skills::list",
    "engine::channels::create",
    "engine::durable::publish",
    "engine::functions::list",
    "engine::queue::redrive",
    "engine::traces::group_by",
    "engine::triggers::list",
    "engine::workers::list",
    "harness::trigger",
    "hook-fanout::publish_collect",
    "models::get",
    "models::list",
    "models::supports",
    "policy::check_permissions",
    "provider::anthropic::complete",
    "provider::anthropic::stream",
    "provider::kimi::complete",
    "provider::kimi::stream",
    "provider::lmstudio::complete",
    "provider::lmstudio::stream",
    "provider::openai::complete",
    "provider::openai::stream",
    "run::abort",
    "run::start",
    "session-inbox::drain",
    "session-inbox::peek",
    "session-inbox::push",
    "session-tree::append",
    "session-tree::append_batch",
    "session-tree::clone",
    "session-tree::compact",
    "session-tree::compactions",
    "session-tree::create",
    "session-tree::ensure",
    "session-tree::export_html",
    "session-tree::fork",
    "session-tree::list",
    "session-tree::messages",
    "session-tree::tree",
    "session-tree::update_part",
    "state::delete",
    "state::get",
    "state::list",
    "state::set",
    "state::update",
    "stream::list",
    "stream::send",
    "stream::set",
    "turn::get_state",
    "ui::subscribe",
    "ui::unsubscribe",
];

fn is_json_schema(v: &Value) -> bool {
    v.get("$schema").is_some()
        || (v["type"] == "object" && v["properties"].is_object())
        || v.get("oneOf").is_some()
        || v.get("anyOf").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spec_function_registers_json_schemas_for_its_request_and_answer() {
    let s = stack(PERMISSIONS).await;
    let functions = s.client.ctx().functions(true).await.unwrap();
    // The list comes in pages that each fit one deployed WebSocket message (128 KiB).
    let first = s
        .client
        .ctx()
        .trigger("engine::functions::list", json!({}))
        .await
        .unwrap();
    assert!(first.to_string().len() <= engine_gateway::paging::PAGE_BYTES + 1024);
    assert!(
        first["next"].is_string(),
        "the thick harness's schemas take more than one page"
    );
    let find = |id: &str| functions.iter().find(|f| f["function_id"] == id);
    let mut untyped = Vec::new();
    for id in SPEC_IDS {
        let f = find(id).unwrap_or_else(|| panic!("{id} is registered by the thick harness"));
        let typed = f.get("request_format").is_some_and(is_json_schema);
        if !typed {
            untyped.push(*id);
        }
    }
    // A few schemas say what a caller must send.
    let policy = find("policy::check_permissions").unwrap();
    assert_eq!(policy["request_format"]["required"], json!(["function_id"]));
    assert!(
        policy["response_format"]
            .to_string()
            .contains("needs_approval"),
        "{}",
        policy["response_format"]
    );
    assert!(
        untyped.is_empty(),
        "SPEC function IDs without a JSON Schema: {untyped:?}"
    );
    // Every worker function (the engine's own are hand-written schemas) has schemars ones.
    for id in SPEC_IDS {
        if ["engine::", "state::", "stream::"]
            .iter()
            .any(|p| id.starts_with(p))
        {
            continue;
        }
        let f = find(id).unwrap();
        for field in ["request_format", "response_format"] {
            assert!(
                f[field].get("$schema").is_some(),
                "{id}: {field} is a schemars schema: {}",
                f[field]
            );
        }
    }
}

/// What the workers answer reads back into the types their schemas were made from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_read_back_into_their_contract_types() {
    use llm_budget::types as b;
    use session_worker::types as t;
    let s = stack(PERMISSIONS).await;
    let ctx = s.composition.workers[0].ctx();
    async fn call<T: serde::de::DeserializeOwned>(
        ctx: &harness_sdk::Ctx,
        id: &str,
        req: Value,
    ) -> T {
        let v = ctx
            .trigger(id, req)
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        harness_sdk::contracts::parse(id, v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
    }
    let created: b::CreateAnswer = call(
        &ctx,
        "budget::create",
        json!({"budget_id": "c1", "ceiling_usd": 2.5, "period": "week", "agent_id": "a"}),
    )
    .await;
    assert_eq!(created.budget.period, "week");
    let _: b::BudgetView = call(&ctx, "budget::get", json!({"budget_id": "c1"})).await;
    let _: b::BudgetView = call(
        &ctx,
        "budget::update",
        json!({"budget_id": "c1", "patch": {"ceiling_usd": 3}}),
    )
    .await;
    let _: b::ListAnswer = call(&ctx, "budget::list", json!({})).await;
    let rec: b::RecordAnswer = call(
        &ctx,
        "budget::record",
        json!({"budget_id": "c1", "cost_usd": 0.5}),
    )
    .await;
    assert_eq!(rec.spent_usd, 0.5);
    let _: b::CheckAnswer = call(&ctx, "budget::check", json!({"budget_id": "c1"})).await;
    let _: b::AlertAnswer = call(
        &ctx,
        "budget::alert_set",
        json!({"budget_id": "c1", "threshold_pct": 0.5, "callback_function_id": "example::echo"}),
    )
    .await;
    let _: b::UsageAnswer = call(&ctx, "budget::usage", json!({"budget_id": "c1"})).await;
    let _: b::ForecastAnswer = call(&ctx, "budget::forecast", json!({"budget_id": "c1"})).await;
    let _: b::EnforceAnswer = call(
        &ctx,
        "budget::enforce",
        json!({"budget_id": "c1", "enforced": false}),
    )
    .await;
    let _: b::ExemptAnswer = call(
        &ctx,
        "budget::exempt",
        json!({"budget_id": "c1", "principal_id": "p", "reason": "demo"}),
    )
    .await;
    let _: b::PauseAnswer = call(
        &ctx,
        "budget::pause",
        json!({"budget_id": "c1", "paused": true}),
    )
    .await;
    let _: b::BudgetView = call(&ctx, "budget::reset", json!({"budget_id": "c1"})).await;
    let _: b::DeleteAnswer = call(&ctx, "budget::delete", json!({"budget_id": "c1"})).await;

    let _: t::SessionAnswer = call(
        &ctx,
        "session-tree::create",
        json!({"session_id": "k1", "title": "t"}),
    )
    .await;
    let _: t::SessionAnswer = call(&ctx, "session-tree::ensure", json!({"session_id": "k1"})).await;
    let one: t::StoredEntry = call(&ctx, "session-tree::append", json!({"session_id": "k1", "entry": {"type": "message", "id": "e1", "message": {"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}}})).await;
    assert!(one.created);
    let batch: t::AppendBatchAnswer = call(&ctx, "session-tree::append_batch", json!({"session_id": "k1", "entries": [{"type": "message", "id": "e2", "message": {"role": "user", "content": [{"type": "text", "text": "more"}], "timestamp": 2}}]})).await;
    assert_eq!(batch.leaf_id.as_deref(), Some("e2"));
    let _: harness_sdk::contracts::session_tree::MessagesAnswer =
        call(&ctx, "session-tree::messages", json!({"session_id": "k1"})).await;
    let _: t::StoredEntry = call(
        &ctx,
        "session-tree::compact",
        json!({"session_id": "k1", "summary": "s", "tail_start_id": "e2", "tokens_before": 10}),
    )
    .await;
    let _: t::CompactionsAnswer = call(
        &ctx,
        "session-tree::compactions",
        json!({"session_id": "k1"}),
    )
    .await;
    let tree: t::TreeAnswer = call(&ctx, "session-tree::tree", json!({"session_id": "k1"})).await;
    assert!(tree.entries.len() >= 3);
    let _: t::ForkAnswer = call(
        &ctx,
        "session-tree::fork",
        json!({"source_session_id": "k1", "from_entry_id": "e2", "new_session_id": "k2"}),
    )
    .await;
    let _: t::ForkAnswer = call(
        &ctx,
        "session-tree::clone",
        json!({"source_session_id": "k1", "new_session_id": "k3"}),
    )
    .await;
    let _: t::ListAnswer = call(&ctx, "session-tree::list", json!({})).await;
    let _: t::ExportAnswer = call(
        &ctx,
        "session-tree::export_html",
        json!({"session_id": "k1"}),
    )
    .await;
    let _: t::UpdatePartAnswer = call(&ctx, "session-tree::update_part", json!({"session_id": "k1", "entry_id": "e1", "part_index": 0, "part": {"type": "text", "text": "hello"}})).await;
    let _: harness_sdk::contracts::inbox::PushAnswer = call(
        &ctx,
        "session-inbox::push",
        json!({"name": "steering", "session_id": "k1", "item": "go"}),
    )
    .await;
    let _: harness_sdk::contracts::inbox::ItemsAnswer = call(
        &ctx,
        "session-inbox::peek",
        json!({"name": "steering", "session_id": "k1"}),
    )
    .await;
    let _: harness_sdk::contracts::inbox::ItemsAnswer = call(
        &ctx,
        "session-inbox::drain",
        json!({"name": "steering", "session_id": "k1"}),
    )
    .await;

    let _: models_catalog::ListAnswer =
        call(&ctx, "models::list", json!({"provider": "anthropic"})).await;
    let m: Option<models_catalog::Model> = call(
        &ctx,
        "models::get",
        json!({"provider": "anthropic", "model_id": "claude-sonnet-5-5"}),
    )
    .await;
    assert!(m.is_some());
    let _: models_catalog::SupportsAnswer = call(
        &ctx,
        "models::supports",
        json!({"provider": "anthropic", "model_id": "claude-sonnet-5-5", "capability": "tools"}),
    )
    .await;
    let _: directory::types::ListAnswer = call(&ctx, "directory::skills::list", json!({})).await;
    let _: directory::types::IndexAnswer = call(&ctx, "directory::skills::index", json!({})).await;
    // A wrong type is refused by the field's name, never read as "all".
    for bad in [json!({"ids": 7}), json!({"ids": [7]}), json!({"ids": "x"})] {
        let e = ctx
            .trigger("directory::skills::index", bad.clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("ids"), "{bad}: {e}");
    }
    let _: directory::types::Skill = call(
        &ctx,
        "directory::skills::get",
        json!({"id": "iii://models-catalog/models::get"}),
    )
    .await;
    let _: directory::types::DownloadAnswer = call(
        &ctx,
        "directory::skills::download",
        json!({"id": "iii://models-catalog"}),
    )
    .await;
    use harness_sdk::contracts::auth as a;
    let _: a::SetTokenAnswer = call(
        &ctx,
        "auth::set_token",
        json!({"provider": "kimi", "type": "api_key", "key": "sk-k"}),
    )
    .await;
    let st: a::Status = call(&ctx, "auth::status", json!({"provider": "kimi"})).await;
    assert!(st.configured);
    let _: a::ListProvidersAnswer = call(&ctx, "auth::list_providers", json!({})).await;
    let tok: a::GetTokenAnswer = call(&ctx, "auth::get_token", json!({"provider": "kimi"})).await;
    assert_eq!(tok.unwrap().secret(), "sk-k");
    let _: a::DeleteTokenAnswer =
        call(&ctx, "auth::delete_token", json!({"provider": "kimi"})).await;
    let _: harness_sdk::contracts::approval::ListPendingAnswer =
        call(&ctx, "approval::list_pending", json!({})).await;
    let _: turn_orchestrator::types::RunAbortAnswer =
        call(&ctx, "run::abort", json!({"session_id": "nobody"})).await;
    let _: Option<turn_orchestrator::types::TurnStateView> =
        call(&ctx, "turn::get_state", json!({"session_id": "nobody"})).await;
}

/// What every run start derives from the catalogue (the skills download, the skills index,
/// the `agent_trigger` tool) is kept while the catalogue is the same, and picks up a function
/// registered since: the engine's `catalogue_version` moves with every registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skills_download_sees_a_function_registered_since_the_last_one() {
    let s = stack(PERMISSIONS).await;
    let ctx = s.composition.workers[0].ctx();
    let version = |page: &Value| page["catalogue_version"].as_str().unwrap().to_string();
    let one = json!({"formats": false, "limit": 1});
    let page = ctx
        .trigger("engine::functions::list", one.clone())
        .await
        .unwrap();
    assert_eq!(page["functions"].as_array().unwrap().len(), 1, "{page}");
    assert!(page["next"].is_string(), "{page}");
    let before = version(&page);
    let all = json!({"id": "iii://iii-directory/index"});
    let first = ctx
        .trigger("directory::skills::download", all.clone())
        .await
        .unwrap();
    let again = ctx
        .trigger("directory::skills::download", all.clone())
        .await
        .unwrap();
    assert_eq!(first["ids"], again["ids"]);
    let index = ctx
        .trigger("directory::skills::index", json!({}))
        .await
        .unwrap();
    assert_eq!(
        index,
        ctx.trigger("directory::skills::index", json!({}))
            .await
            .unwrap()
    );
    assert!(!index["body"].as_str().unwrap().contains("late::hello"));
    s.model.load(Cassette {
        turns: vec![text("one"), text("two")],
        ..Default::default()
    });
    let tool_of = |sid: &'static str| {
        let ctx = ctx.clone();
        async move {
            let prompt = ctx
                .state_get("agent", &format!("session/{sid}/prompt"))
                .await
                .unwrap();
            prompt["tools"][0]["description"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    start(&ctx, "cat-1", None).await;
    wait_state(&ctx, "cat-1", "stopped").await;
    assert!(!tool_of("cat-1").await.contains("late::hello"));
    assert_eq!(
        version(
            &ctx.trigger("engine::functions::list", one.clone())
                .await
                .unwrap()
        ),
        before,
        "a run changes no registration"
    );
    let mut late = harness_sdk::Worker::new("late");
    late.register_function(
        harness_sdk::def("late::hello", "Registered after the first download."),
        |_c, _d| async { Ok(json!({"hi": true})) },
    );
    let _late = harness_sdk::run_embedded(late, &s.srv.engine).unwrap();
    assert_ne!(
        version(&ctx.trigger("engine::functions::list", one).await.unwrap()),
        before
    );
    let index = ctx
        .trigger("directory::skills::index", json!({}))
        .await
        .unwrap();
    assert!(
        index["body"].as_str().unwrap().contains("late::hello"),
        "{index}"
    );
    start(&ctx, "cat-2", None).await;
    wait_state(&ctx, "cat-2", "stopped").await;
    assert!(tool_of("cat-2").await.contains("late::hello"));
    let third = ctx
        .trigger("directory::skills::download", all)
        .await
        .unwrap();
    let ids: Vec<&str> = third["ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(ids.contains(&"iii://late/late::hello"), "{ids:?}");
    assert_eq!(
        third["downloaded"].as_u64(),
        first["downloaded"].as_u64().map(|n| n + 1)
    );
    let skill = ctx
        .trigger(
            "directory::skills::get",
            json!({"id": "iii://late/late::hello"}),
        )
        .await
        .unwrap();
    assert!(
        skill["body"]
            .as_str()
            .unwrap()
            .contains("Registered after the first download."),
        "{skill}"
    );
}
