//! `provisioning`: default skills, the system prompt and tools, the model's metadata, the
//! budgets, and the session's history with this run's messages.

use crate::prelude::*;

pub(crate) async fn provisioning(
    ctx: &Ctx,
    rec: &mut Record,
    req: &RunRequest,
) -> StepResult<Outcome> {
    // None of these needs another, and each is a call (a run's start waited for them one by
    // one): the skills' index and the working directory for the prompt, the model's metadata,
    // the tool listing the catalogue and the budgets, beside the append of this run's
    // messages at the session's current leaf (with the history read in the same call). The
    // append is idempotent (its entry ids are the run's), so a step that fails on something
    // else after it and runs again does not store the messages twice.
    let sid = rec.session_id.clone();
    let messages = req.messages.clone();
    let appended = async {
        match rec.tree {
            true => append_history_continuing(ctx, rec, messages, "u").await,
            false => Ok(()),
        }
    };
    let (index_text, workdir, model_meta, tool, budgets, appended) = tokio::join!(
        skills_index(ctx, req),
        workdir(ctx, &sid),
        best_effort(
            ctx,
            "models::get",
            json!({"provider": req.provider, "model_id": req.model}),
        ),
        catalogue_tool(ctx),
        budgets(ctx, req),
        appended,
    );
    appended?;
    rec.model_meta = model_meta.filter(|v| !v.is_null());
    rec.budget_ids = budgets;
    let system_prompt = Some(match &req.system_prompt {
        Some(verbatim) => verbatim.clone(),
        None => prompt::system_prompt(
            req.mode.as_deref().unwrap_or("agent"),
            index_text.as_deref(),
            workdir.as_deref(),
        ),
    });
    let run_prompt = Prompt {
        run_key: rec.run_key.clone(),
        system_prompt,
        tools: vec![tool?],
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
    Ok(Outcome::Provisioned)
}

/// The index of the run's default skills, downloaded first (best effort: the directory
/// worker may not run). The index covers the skills the run asked for (SPEC: the default
/// skills' index), not every namespace on the bus; none asked, no index.
async fn skills_index(ctx: &Ctx, req: &RunRequest) -> Option<String> {
    let skills: Vec<String> = match &req.system_default_skills {
        Some(ids) => ids.clone(),
        None => DEFAULT_SKILLS.iter().map(|s| s.to_string()).collect(),
    };
    if skills.is_empty() {
        return None;
    }
    // Each skill's download is its own; the index waits for them all.
    futures_util::future::join_all(
        skills
            .iter()
            .map(|id| best_effort(ctx, "directory::skills::download", json!({ "id": id }))),
    )
    .await;
    let index = best_effort(ctx, "directory::skills::index", json!({"ids": skills})).await?;
    index["body"]
        .as_str()
        .or(index["index"].as_str())
        .map(str::to_owned)
}

/// The session's working directory and sandbox, made now (best effort: the tools worker may
/// not run, and makes it on the first call anyway); the prompt names where it is.
async fn workdir(ctx: &Ctx, session_id: &str) -> Option<String> {
    let provisioned = best_effort(ctx, "shell::provision", json!({"session_id": session_id})).await;
    match provisioned.and_then(|v| v["workdir"].as_str().map(str::to_owned)) {
        Some(w) => Some(w),
        None => best_effort(ctx, "shell::sandbox", json!({}))
            .await
            .and_then(|v| v["workdir"].as_str().map(str::to_owned)),
    }
}

/// The budgets of the run: the one it names, and those governing its workspace or agent.
async fn budgets(ctx: &Ctx, req: &RunRequest) -> Vec<String> {
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
    budgets
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
