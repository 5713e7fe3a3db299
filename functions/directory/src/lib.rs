//! directory (SPEC §3): `directory::skills::get|list|index|download`.
//!
//! A skill is the page an agent reads before it first calls a function: what it does, the
//! request and response shapes, its error codes and usage notes. Every skill is generated
//! from what the function registered (description, `request_format`, `response_format`,
//! `metadata.errors`, `metadata.notes`), so it cannot drift from the code. Ids are
//! `iii://<worker>/<function>`; a namespace is `iii://<worker>`, and `iii://iii-directory/index`
//! stands for all of them. `download` caches a namespace's skills in state (scope `skills`),
//! so they are served even while their worker is away.

pub mod types;

use bus::builtins::req_str;
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, Worker, def};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub const SCOPE: &str = "skills";
pub const INDEX_ID: &str = "iii://iii-directory/index";
const PREFIX: &str = "iii://";

/// One function as the catalogue describes it, with its worker's name.
#[derive(Debug, Clone)]
pub struct Skill {
    pub id: String,
    pub worker: String,
    pub function_id: String,
    pub description: String,
    pub body: String,
}

fn storage(e: BusError) -> ErrorBody {
    ErrorBody::new("storage", format!("skill storage failed: {e}"))
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// The skill page of one catalogue entry.
pub fn render(skill_id: &str, worker: &str, f: &Value) -> String {
    let id = f["function_id"].as_str().unwrap_or("?");
    let mut s = format!("# {id}\n\nWorker `{worker}` · skill `{skill_id}`\n\n");
    s.push_str(
        f["description"]
            .as_str()
            .unwrap_or("(no description registered)"),
    );
    s.push_str("\n\n## Request\n");
    match f.get("request_format").filter(|v| !v.is_null()) {
        Some(r) => s.push_str(&format!("```json\n{}\n```\n", pretty(r))),
        None => s.push_str("Not declared by the function.\n"),
    }
    s.push_str("\n## Response\n");
    match f.get("response_format").filter(|v| !v.is_null()) {
        Some(r) => s.push_str(&format!("```json\n{}\n```\n", pretty(r))),
        None => s.push_str("Not declared by the function.\n"),
    }
    s.push_str("\n## Errors\n");
    match f["metadata"]["errors"].as_array().filter(|a| !a.is_empty()) {
        Some(errors) => {
            for e in errors {
                s.push_str(&format!(
                    "- `{}`: {}\n",
                    e["code"].as_str().unwrap_or("?"),
                    e["when"].as_str().unwrap_or("")
                ));
            }
        }
        None => s.push_str("No function-specific codes declared; bus errors (`function_not_found`, `timeout`, `invalid_message`) apply.\n"),
    }
    s.push_str("\n## Usage\n");
    if let Some(notes) = f["metadata"]["notes"].as_str() {
        s.push_str(notes);
        s.push('\n');
    }
    s.push_str(&format!(
        "Call it with the `agent_trigger` tool: {{\"function\": \"{id}\", \"payload\": {{…the request above…}}}}.\n"
    ));
    s
}

/// Every live function as a skill.
pub async fn live_skills(ctx: &Ctx) -> Result<Vec<Skill>, BusError> {
    live_skills_with(ctx, true).await
}

/// `bodies`: rendered with the functions' schemas; without, only ids and descriptions (what a
/// listing needs: the schemas of the whole catalogue are hundreds of kilobytes).
async fn live_skills_with(ctx: &Ctx, bodies: bool) -> Result<Vec<Skill>, BusError> {
    let fns = ctx.functions(bodies).await?;
    let workers = ctx.trigger("engine::workers::list", json!({})).await?;
    let names: HashMap<String, String> = workers["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            Some((
                w["worker_id"].as_str()?.to_string(),
                w["name"].as_str().filter(|n| !n.is_empty())?.to_string(),
            ))
        })
        .collect();
    let mut out = Vec::new();
    for f in &fns {
        let Some(fid) = f["function_id"].as_str() else {
            continue;
        };
        let worker = f["worker_id"]
            .as_str()
            .and_then(|w| names.get(w).cloned())
            // The engine's own functions, or an owner without a name: the id's namespace.
            .unwrap_or_else(|| fid.split("::").next().unwrap_or(fid).to_string());
        let id = format!("{PREFIX}{worker}/{fid}");
        out.push(Skill {
            body: if bodies {
                render(&id, &worker, f)
            } else {
                String::new()
            },
            id,
            worker,
            function_id: fid.to_string(),
            description: f["description"].as_str().unwrap_or("").to_string(),
        });
    }
    Ok(out)
}

fn skill_json(s: &Skill) -> Value {
    json!({"id": s.id, "worker": s.worker, "function_id": s.function_id, "description": s.description, "body": s.body})
}

/// Skills cached by `download`.
async fn cached(ctx: &Ctx) -> Result<Vec<Value>, ErrorBody> {
    let v = ctx.state_list(SCOPE, None).await.map_err(storage)?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["value"].clone())
        .collect())
}

fn namespace_of(id: &str) -> Option<&str> {
    let rest = id.strip_prefix(PREFIX)?;
    Some(rest.split('/').next().unwrap_or(rest))
}

async fn get(memo: Arc<Downloads>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = req_str(&data, "id")?;
    if id == INDEX_ID {
        return index(memo, ctx, json!({})).await.map(|mut v| {
            v["id"] = json!(INDEX_ID);
            v
        });
    }
    if !id.starts_with(PREFIX) {
        return Err(ErrorBody::invalid(format!(
            "skill ids look like iii://<worker>/<function>, not `{id}`"
        )));
    }
    let live = live_skills(&ctx).await.map_err(storage)?;
    // Also accept iii://<anything>/<function id> when the worker part is wrong but the function exists.
    let function_part = id
        .strip_prefix(PREFIX)
        .and_then(|r| r.split_once('/'))
        .map(|(_, f)| f);
    if let Some(s) = live.iter().find(|s| s.id == id).or_else(|| {
        live.iter()
            .find(|s| Some(s.function_id.as_str()) == function_part)
    }) {
        return Ok(skill_json(s));
    }
    let v = ctx.state_get(SCOPE, &id).await.map_err(storage)?;
    if !v.is_null() {
        let mut v = v;
        v["cached"] = json!(true);
        return Ok(v);
    }
    Err(ErrorBody::new(
        "not_found",
        format!("no skill `{id}`: see directory::skills::list for the ids"),
    ))
}

async fn list(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let ns = data["namespace"]
        .as_str()
        .map(|n| namespace_of(n).unwrap_or(n).to_string());
    let mut by_id: BTreeMap<String, Value> = BTreeMap::new();
    for c in cached(&ctx).await? {
        if let Some(id) = c["id"].as_str() {
            by_id.insert(id.to_string(), json!({"id": id, "worker": c["worker"], "function_id": c["function_id"], "description": c["description"], "live": false}));
        }
    }
    for s in live_skills_with(&ctx, false).await.map_err(storage)? {
        by_id.insert(s.id.clone(), json!({"id": s.id, "worker": s.worker, "function_id": s.function_id, "description": s.description, "live": true}));
    }
    let skills: Vec<Value> = by_id
        .into_values()
        .filter(|s| ns.as_deref().is_none_or(|n| s["worker"] == n))
        .collect();
    Ok(json!({"skills": skills}))
}

/// A compact index for the system prompt: one line per namespace. Every run's provisioning
/// asks for it: while the catalogue is the same, the last one is answered again (reading the
/// cached skills, bodies and all, was most of a run's start).
async fn index(memo: Arc<Downloads>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let req: types::IndexRequest = match data {
        Value::Null => types::IndexRequest { ids: None },
        data => harness_sdk::contracts::parse("directory::skills::index", data)
            .map_err(ErrorBody::invalid)?,
    };
    let all = index_all(memo, &ctx).await?;
    match req.ids {
        Some(ids) if !ids.iter().any(|i| i == INDEX_ID) => Ok(index_of(&all, &ids)),
        _ => Ok(all),
    }
}

/// The index cut to the namespaces `ids` name (`iii://<worker>` or a skill in it).
fn index_of(all: &Value, ids: &[String]) -> Value {
    let wanted: Vec<&str> = ids.iter().filter_map(|i| namespace_of(i)).collect();
    let body = all["body"].as_str().unwrap_or_default();
    let mut lines = body.lines();
    let mut out = lines.next().map(|h| format!("{h}\n")).unwrap_or_default();
    let mut namespaces = Vec::new();
    for line in lines {
        let ns = line
            .strip_prefix("- iii://")
            .and_then(|l| l.split_once(':'))
            .map(|(w, _)| w);
        if let Some(ns) = ns.filter(|ns| wanted.contains(ns)) {
            out.push_str(line);
            out.push('\n');
            namespaces.push(ns.to_string());
        }
    }
    if namespaces.is_empty() {
        out.clear();
    }
    json!({"body": out, "namespaces": namespaces})
}

async fn index_all(memo: Arc<Downloads>, ctx: &Ctx) -> Result<Value, ErrorBody> {
    let key = catalogue_key(ctx).await.map_err(storage)?;
    if let Some(key) = &key
        && let Ok(last) = memo.index.lock()
        && let Some((k, v)) = last.as_ref()
        && k == key
    {
        return Ok(v.clone());
    }
    let out = index_now(ctx).await?;
    if let Some(key) = key
        && let Ok(mut last) = memo.index.lock()
    {
        *last = Some((key, out.clone()));
    }
    Ok(out)
}

async fn index_now(ctx: &Ctx) -> Result<Value, ErrorBody> {
    let listed = list(ctx.clone(), json!({})).await?;
    let mut by_worker: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in listed["skills"].as_array().into_iter().flatten() {
        by_worker
            .entry(s["worker"].as_str().unwrap_or("?").to_string())
            .or_default()
            .push(s["function_id"].as_str().unwrap_or("?").to_string());
    }
    let mut body = String::from(
        "Skills: fetch one with directory::skills::get {\"id\": \"iii://<worker>/<function>\"}.\n",
    );
    for (worker, fns) in &by_worker {
        body.push_str(&format!("- iii://{worker}: {}\n", fns.join(", ")));
    }
    Ok(json!({"body": body, "namespaces": by_worker.keys().collect::<Vec<_>>()}))
}

/// What this worker last derived from the catalogue, with the catalogue it was derived from:
/// the last download (its skill ids) and the last index. Every run's provisioning downloads
/// the defaults and asks for the index; while the catalogue is the same, there is nothing to
/// render, compare, write or list.
#[derive(Default)]
pub struct Downloads {
    last: std::sync::Mutex<Option<LastDownload>>,
    index: std::sync::Mutex<Option<(CatalogueKey, Value)>>,
}

struct LastDownload {
    id: String,
    catalogue: CatalogueKey,
    ids: Vec<String>,
}

/// Which catalogue something was derived from: the engine's `catalogue_version`, or where
/// it gives none, every function's id, owner, registration time and description.
#[derive(Debug, Clone, PartialEq)]
enum CatalogueKey {
    Version(String),
    Print(Vec<Value>),
}

/// The catalogue's key now; `None`: it cannot be compared (the deployed catalogue has no
/// version and no registration times), so nothing is kept.
async fn catalogue_key(ctx: &Ctx) -> Result<Option<CatalogueKey>, BusError> {
    if let Some(v) = ctx.catalogue_version().await {
        return Ok(Some(CatalogueKey::Version(v)));
    }
    let print: Vec<Value> = ctx
        .functions(false)
        .await?
        .into_iter()
        .map(|f| {
            json!([
                f["function_id"],
                f["worker_id"],
                f["registered_at_ms"],
                f["description"]
            ])
        })
        .collect();
    Ok(print
        .iter()
        .all(|f| f[2].is_u64())
        .then_some(CatalogueKey::Print(print)))
}

async fn download(memo: Arc<Downloads>, ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = req_str(&data, "id")?;
    let key = catalogue_key(&ctx).await.map_err(storage)?;
    if let Some(key) = &key
        && let Ok(last) = memo.last.lock()
        && let Some(l) = last.as_ref()
        && l.id == id
        && &l.catalogue == key
    {
        return Ok(json!({"id": id, "downloaded": l.ids.len(), "ids": l.ids}));
    }
    let out = download_now(&ctx, &id).await?;
    // What was cached changed: the index is derived again.
    if let Ok(mut index) = memo.index.lock() {
        *index = None;
    }
    if let Some(key) = key
        && let Ok(mut last) = memo.last.lock()
    {
        let ids: Vec<String> = serde_json::from_value(out["ids"].clone()).unwrap_or_default();
        *last = Some(LastDownload {
            id,
            catalogue: key,
            ids,
        });
    }
    Ok(out)
}

async fn download_now(ctx: &Ctx, id: &str) -> Result<Value, ErrorBody> {
    let id = id.to_string();
    let all = id == INDEX_ID;
    let ns = if all {
        None
    } else {
        Some(
            namespace_of(&id)
                .ok_or_else(|| {
                    ErrorBody::invalid(format!("a namespace looks like iii://<worker>, not `{id}`"))
                })?
                .to_string(),
        )
    };
    // Only what changed is written: every run's provisioning downloads the defaults.
    let cached: HashMap<String, Value> = cached(ctx)
        .await?
        .into_iter()
        .filter_map(|v| Some((v["id"].as_str()?.to_string(), v)))
        .collect();
    let mut ids = Vec::new();
    for s in live_skills(ctx).await.map_err(storage)? {
        if ns.as_deref().is_some_and(|n| n != s.worker) {
            continue;
        }
        let value = skill_json(&s);
        if cached.get(&s.id) != Some(&value) {
            ctx.state_set(SCOPE, &s.id, value).await.map_err(storage)?;
        }
        ids.push(s.id);
    }
    Ok(json!({"id": id, "downloaded": ids.len(), "ids": ids}))
}

pub fn worker() -> Worker {
    let errs: &[(&str, &str)] = &[
        ("not_found", "no such skill"),
        (
            "invalid_message",
            "the id is not an iii:// skill or namespace id",
        ),
        ("storage", "the state store failed"),
    ];
    let mut w = Worker::new("directory");
    let memo = Arc::new(Downloads::default());
    w.register_function(
        def("directory::skills::get", "A function's skill: what it does, request and response shapes, error codes, usage. Read it before first use.")
            .contract::<types::SkillRequest, types::Skill>()
            .errors(errs),
        {
            let memo = memo.clone();
            move |ctx, data| get(memo.clone(), ctx, data)
        },
    );
    w.register_function(
        def(
            "directory::skills::list",
            "Every skill id (live and cached), optionally of one namespace.",
        )
        .contract::<types::ListRequest, types::ListAnswer>()
        .errors(errs),
        list,
    );
    w.register_function(
        def(
            "directory::skills::index",
            "One line per namespace with its functions (what the system prompt includes).",
        )
        .contract::<types::IndexRequest, types::IndexAnswer>()
        .errors(errs),
        {
            let memo = memo.clone();
            move |ctx, data| index(memo.clone(), ctx, data)
        },
    );
    w.register_function(
        def(
            "directory::skills::download",
            "Cache a namespace's skills (iii://<worker>, or iii://iii-directory/index for all).",
        )
        .contract::<types::SkillRequest, types::DownloadAnswer>()
        .errors(errs),
        move |ctx, data| download(memo.clone(), ctx, data),
    );
    w
}
