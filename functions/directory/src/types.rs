//! Wire contracts of `directory::skills::*`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `directory::skills::get`, `directory::skills::download`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SkillRequest {
    /// `iii://<worker>/<function>` (get), `iii://<worker>` (download), or
    /// `iii://iii-directory/index`.
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Skill {
    pub id: String,
    pub worker: String,
    pub function_id: String,
    /// Markdown: what it does, request and response shapes, error codes, usage.
    pub body: String,
}

/// `directory::skills::list`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListRequest {
    /// `iii://<worker>` or `<worker>`.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SkillEntry {
    pub id: String,
    pub worker: String,
    pub function_id: String,
    pub description: String,
    /// Registered now (else: cached from an earlier download).
    pub live: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListAnswer {
    pub skills: Vec<SkillEntry>,
}

/// `directory::skills::index {ids?}`: the namespaces these skill ids cover
/// (`iii://<worker>`, or `iii://iii-directory/index` for all); absent: all.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct IndexRequest {
    #[serde(default)]
    pub ids: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct IndexAnswer {
    /// One line per namespace with its functions.
    pub body: String,
    pub namespaces: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DownloadAnswer {
    pub downloaded: u64,
    pub ids: Vec<String>,
}
