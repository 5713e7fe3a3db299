//! Every SPEC function ID documents itself: `engine::functions::list` gives a JSON Schema for
//! its request and its answer. The ones still described by a loose shape are listed below,
//! and the list may only shrink (a function that gains a schema must leave it).

mod common;

use common::*;
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

/// Typed with a schemars contract (`harness_sdk::contracts`): request and answer.
const CONTRACTS: &[&str] = &[
    "approval::list_pending",
    "approval::resolve",
    "auth::get_token",
    "budget::check",
    "context-compaction::compact_now",
    "hook-fanout::publish_collect",
    "policy::check_permissions",
    "run::abort",
    "run::start",
    "session-tree::messages",
    "turn::get_state",
    "harness::trigger",
    "ui::subscribe",
    "ui::unsubscribe",
];

/// Still described by a loose shape (issue 14: to be typed). The test fails when one of them
/// gains a schema (take it off the list) or when a function not on it has none.
const NOT_YET_TYPED: &[&str] = &[
    "budget::alert_set",
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
    "context-compaction::compact_session",
    "context-compaction::prune_tool_outputs",
    "directory::skills::download",
    "directory::skills::get",
    "directory::skills::index",
    "directory::skills::list",
    "models::get",
    "models::list",
    "models::supports",
    "provider::anthropic::complete",
    "provider::kimi::complete",
    "provider::lmstudio::complete",
    "provider::openai::complete",
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
    "session-tree::tree",
    "session-tree::update_part",
];

fn is_json_schema(v: &Value) -> bool {
    v.get("$schema").is_some()
        || (v["type"] == "object" && v["properties"].is_object())
        || v.get("oneOf").is_some()
        || v.get("anyOf").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spec_function_registers_its_schemas_or_is_on_the_shrinking_list() {
    let s = stack(PERMISSIONS).await;
    let list = s
        .client
        .ctx()
        .trigger("engine::functions::list", json!({}))
        .await
        .unwrap();
    let functions = list["functions"].as_array().unwrap();
    let find = |id: &str| functions.iter().find(|f| f["function_id"] == id);
    let mut untyped = Vec::new();
    for id in SPEC_IDS {
        let f = find(id).unwrap_or_else(|| panic!("{id} is registered by the thick harness"));
        let typed = f.get("request_format").is_some_and(is_json_schema);
        if !typed {
            untyped.push(*id);
        }
    }
    for id in CONTRACTS {
        let f = find(id).unwrap();
        for field in ["request_format", "response_format"] {
            assert!(
                f[field].get("$schema").is_some(),
                "{id}: {field} is a schemars schema: {}",
                f[field]
            );
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
    assert_eq!(
        untyped, NOT_YET_TYPED,
        "the SPEC function IDs without a JSON Schema changed: take a newly typed one off NOT_YET_TYPED, give a new one a schema"
    );
}
