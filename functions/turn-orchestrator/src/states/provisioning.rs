//! `provisioning`: default skills, the system prompt and tools, the model's metadata, the
//! budgets, and the session's history with this run's messages.

use crate::prelude::*;

pub(crate) async fn provisioning(
    ctx: &Ctx,
    rec: &mut Record,
    req: &RunRequest,
) -> StepResult<Outcome> {
    // Default skills, best effort (the directory worker may not run).
    let skills: Vec<String> = match &req.system_default_skills {
        Some(ids) => ids.clone(),
        None => DEFAULT_SKILLS.iter().map(|s| s.to_string()).collect(),
    };
    for id in &skills {
        let _ = best_effort(ctx, "directory::skills::download", json!({ "id": id })).await;
    }
    // The index covers the skills the run asked for (SPEC: the default skills' index), not
    // every namespace on the bus; none asked, no index.
    let index = match skills.is_empty() {
        true => None,
        false => best_effort(ctx, "directory::skills::index", json!({"ids": skills})).await,
    };
    let index_text = index
        .as_ref()
        .and_then(|v| v["body"].as_str().or(v["index"].as_str()))
        .map(str::to_owned);
    // The session's working directory and sandbox, made now (best effort: the tools worker
    // may not run, and makes it on the first call anyway); the prompt names where it is.
    let provisioned = best_effort(
        ctx,
        "shell::provision",
        json!({"session_id": rec.session_id}),
    )
    .await;
    let workdir = match provisioned.and_then(|v| v["workdir"].as_str().map(str::to_owned)) {
        Some(w) => Some(w),
        None => best_effort(ctx, "shell::sandbox", json!({}))
            .await
            .and_then(|v| v["workdir"].as_str().map(str::to_owned)),
    };
    let system_prompt = Some(match &req.system_prompt {
        Some(verbatim) => verbatim.clone(),
        None => prompt::system_prompt(
            req.mode.as_deref().unwrap_or("agent"),
            index_text.as_deref(),
            workdir.as_deref(),
        ),
    });
    rec.model_meta = best_effort(
        ctx,
        "models::get",
        json!({"provider": req.provider, "model_id": req.model}),
    )
    .await
    .filter(|v| !v.is_null());
    let run_prompt = Prompt {
        run_key: rec.run_key.clone(),
        system_prompt,
        tools: vec![catalogue_tool(ctx).await?],
    };
    ctx.state_set(
        SCOPE,
        &prompt_key(&rec.session_id),
        serde_json::to_value(&run_prompt).map_err(|e| StepError::Fatal(e.to_string()))?,
    )
    .await?;
    let run_prompt = Arc::new(run_prompt);
    let _ = CACHE.try_with(|c| {
        c.update_run(&rec.session_id, rec, |r| {
            r.prompt = Some(run_prompt.clone())
        })
    });
    // Budgets: the one named, and those governing this workspace/agent.
    let mut budgets: Vec<String> = req.budget_id.iter().cloned().collect();
    if (req.workspace_id.is_some() || req.agent_id.is_some())
        && let Some(v) = best_effort(
            ctx,
            "budget::list",
            json!({"workspace_id": req.workspace_id, "agent_id": req.agent_id}),
        )
        .await
    {
        for b in v["budgets"].as_array().into_iter().flatten() {
            if let Some(id) = b["budget_id"].as_str()
                && !budgets.iter().any(|x| x == id)
            {
                budgets.push(id.to_string());
            }
        }
    }
    rec.budget_ids = budgets;
    // This run's messages at the session's current leaf, the history read in the same call.
    if rec.tree {
        append_history_continuing(ctx, rec, req.messages.clone(), "u").await?;
    }
    Ok(Outcome::Provisioned)
}

/// The `agent_trigger` tool listing the catalogue: built again only when the engine's
/// `catalogue_version` changed since this instance last built it (an engine that gives none:
/// every run).
async fn catalogue_tool(ctx: &Ctx) -> StepResult<harness_sdk::messages::ToolSpec> {
    let version = ctx.catalogue_version().await;
    if let Some(v) = &version
        && let Ok(Some(tool)) = CACHE.try_with(|c| {
            c.tool
                .lock()
                .ok()
                .and_then(|t| t.as_ref().filter(|(k, _)| k == v).map(|(_, t)| t.clone()))
        })
    {
        return Ok(tool);
    }
    // Ids and descriptions are all the tool's description needs.
    let catalogue = json!({"functions": ctx.functions(false).await?});
    let tool = prompt::agent_trigger_tool(&catalogue);
    if let Some(v) = version {
        let _ = CACHE.try_with(|c| {
            if let Ok(mut t) = c.tool.lock() {
                *t = Some((v, tool.clone()));
            }
        });
    }
    Ok(tool)
}
