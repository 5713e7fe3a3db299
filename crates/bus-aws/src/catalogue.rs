//! The engine's catalogue functions as deployed in AWS, where no engine process holds the
//! registrations: `engine::functions::list`, `engine::triggers::list` and
//! `engine::workers::list` are answered from the registry table that `register-lambda`
//! fills, in the shapes the local engine answers with, so hooks, skills and the
//! orchestrator's tool catalogue see the same thing in both shapes. (Queue triggers are
//! event-source mappings in the template, not registry entries; the trigger list holds the
//! state triggers.)

use super::registry::DynamoRegistry;
use bus::protocol::ErrorBody;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The ids answered here.
pub const FUNCTIONS: &[&str] = &[
    "engine::functions::list",
    "engine::triggers::list",
    "engine::workers::list",
];

fn storage(e: String) -> ErrorBody {
    ErrorBody::new("storage_error", format!("registry: {e}"))
}

/// `Some(answer)` when `function_id` is a catalogue function.
pub async fn answer(
    registry: &DynamoRegistry,
    function_id: &str,
    data: &Value,
) -> Option<Result<Value, ErrorBody>> {
    match function_id {
        "engine::functions::list" => Some(functions(registry, data).await),
        "engine::triggers::list" => Some(triggers(registry).await),
        "engine::workers::list" => Some(workers(registry).await),
        _ => None,
    }
}

async fn functions(registry: &DynamoRegistry, data: &Value) -> Result<Value, ErrorBody> {
    let (listed, version) = registry.list_versioned("function").await.map_err(storage)?;
    let mut out: Vec<Value> = listed
        .into_iter()
        .map(|(id, owner, body)| {
            json!({
                "function_id": id,
                "description": body["description"],
                "request_format": body["request_format"],
                "response_format": body["response_format"],
                "metadata": body["metadata"],
                "worker_id": owner,
            })
        })
        .collect();
    out.sort_by(|a, b| a["function_id"].as_str().cmp(&b["function_id"].as_str()));
    let mut page = bus::paging::functions_page(out, data)?;
    // The local engine's field, here a digest of the registry's function entries.
    page["catalogue_version"] = json!(version);
    Ok(page)
}

async fn triggers(registry: &DynamoRegistry) -> Result<Value, ErrorBody> {
    let mut out: Vec<Value> = registry
        .list("trigger")
        .await
        .map_err(storage)?
        .into_iter()
        .map(|(id, owner, body)| {
            json!({
                "id": id,
                "trigger_type": body["trigger_type"],
                "function_id": body["function_id"],
                "config": body["config"],
                "worker_id": owner,
            })
        })
        .collect();
    out.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Ok(json!({ "triggers": out }))
}

/// One worker per deployed Lambda (the owner `lambda:<name>` of its registrations).
async fn workers(registry: &DynamoRegistry) -> Result<Value, ErrorBody> {
    let mut by_owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, owner, _) in registry.list("function").await.map_err(storage)? {
        by_owner.entry(owner).or_default().push(id);
    }
    let out: Vec<Value> = by_owner
        .into_iter()
        .map(|(owner, mut fns)| {
            fns.sort();
            json!({
                "worker_id": owner,
                "kind": "lambda",
                "name": owner.strip_prefix("lambda:").unwrap_or(&owner),
                "functions": fns,
            })
        })
        .collect();
    Ok(json!({ "workers": out }))
}
