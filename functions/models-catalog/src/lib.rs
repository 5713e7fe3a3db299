//! The models catalog: what each provider's current models can do and cost.
//! `models::list {provider?, capability?}`, `models::get {provider, model_id}`,
//! `models::supports {provider, model_id, capability}` (`tools`, `vision`, `thinking`,
//! `thinking:low|medium|high|xhigh`, `cache`), and `models::cost {provider, model_id, usage}`.
//! The data is `catalog.json` (sources and dates inside), or the file `MODELS_CATALOG`.

use bus::builtins::{opt_str, req_str};
use harness_sdk::DefExt;
use harness_sdk::{ErrorBody, RegisterFunction, Worker};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

pub const BUILTIN: &str = include_str!("../catalog.json");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pricing {
    pub input_per_1m: f64,
    pub output_per_1m: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_1m: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_1m: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Model {
    pub id: String,
    pub provider: String,
    pub api: String,
    pub display_name: String,
    pub context_window: u64,
    pub max_output_tokens: u64,
    pub supports_tools: bool,
    pub supports_vision: bool,
    pub supports_thinking: bool,
    #[serde(default)]
    pub thinking_levels: Vec<String>,
    pub supports_cache: bool,
    pub pricing: Pricing,
}

/// Token counts of one completion (SPEC `usage`): `input` excludes cached tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache_read: u64,
    #[serde(default)]
    pub cache_write: u64,
}

impl Model {
    pub fn supports(&self, capability: &str) -> Result<bool, String> {
        Ok(match capability {
            "tools" => self.supports_tools,
            "vision" => self.supports_vision,
            "thinking" => self.supports_thinking,
            "cache" => self.supports_cache,
            c => match c.strip_prefix("thinking:") {
                Some(level @ ("low" | "medium" | "high" | "xhigh")) => {
                    self.supports_thinking && self.thinking_levels.iter().any(|l| l == level)
                }
                _ => {
                    return Err(format!(
                        "unknown capability `{capability}` (tools, vision, thinking, thinking:low|medium|high|xhigh, cache)"
                    ));
                }
            },
        })
    }

    /// USD for one completion; cached tokens at their own rates (or the input rate when the
    /// model publishes none).
    pub fn cost_usd(&self, u: &Usage) -> f64 {
        let p = &self.pricing;
        (u.input as f64 * p.input_per_1m
            + u.output as f64 * p.output_per_1m
            + u.cache_read as f64 * p.cache_read_per_1m.unwrap_or(p.input_per_1m)
            + u.cache_write as f64 * p.cache_write_per_1m.unwrap_or(p.input_per_1m))
            / 1_000_000.0
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Catalog {
    pub models: Vec<Model>,
    #[serde(default)]
    pub sources: Value,
}

impl Catalog {
    pub fn parse(text: &str) -> Result<Self, String> {
        let c: Catalog =
            serde_json::from_str(text).map_err(|e| format!("invalid models catalog: {e}"))?;
        for m in &c.models {
            if m.context_window == 0 || m.max_output_tokens == 0 {
                return Err(format!(
                    "model `{}/{}`: context_window and max_output_tokens must be positive",
                    m.provider, m.id
                ));
            }
        }
        Ok(c)
    }

    pub fn builtin() -> Self {
        // The built-in file is checked by the tests; an error here is a build defect.
        Self::parse(BUILTIN).unwrap_or(Catalog {
            models: Vec::new(),
            sources: Value::Null,
        })
    }

    pub fn get(&self, provider: &str, model_id: &str) -> Option<&Model> {
        self.models
            .iter()
            .find(|m| m.provider == provider && m.id == model_id)
    }
}

fn found(c: &Catalog, data: &Value) -> Result<Model, ErrorBody> {
    let (provider, model_id) = (req_str(data, "provider")?, req_str(data, "model_id")?);
    c.get(&provider, &model_id).cloned().ok_or_else(|| {
        ErrorBody::new(
            "not_found",
            format!("no model `{model_id}` for provider `{provider}`"),
        )
    })
}

/// `models::list`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListRequest {
    #[serde(default)]
    pub provider: Option<String>,
    /// `tools`, `vision`, `thinking`, `thinking:low|medium|high|xhigh`, `cache`.
    #[serde(default)]
    pub capability: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListAnswer {
    pub models: Vec<Model>,
}

/// `models::get`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct GetRequest {
    pub provider: String,
    pub model_id: String,
}

/// `models::supports`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SupportsRequest {
    pub provider: String,
    pub model_id: String,
    pub capability: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SupportsAnswer {
    pub supported: bool,
}

fn def(id: &str, description: &str, required: &[&str]) -> RegisterFunction {
    let mut d = RegisterFunction::new(id);
    d.description = Some(description.to_string());
    d.request_format = Some(json!({"type": "object", "required": required}));
    d
}

pub fn worker(catalog: Arc<Catalog>) -> Worker {
    let mut w = Worker::new("models-catalog");
    let c = catalog.clone();
    w.register_function(
        def(
            "models::list",
            "Models, optionally of one provider and/or with one capability.",
            &[],
        )
        .contract::<ListRequest, ListAnswer>(),
        move |_x, d: Value| {
            let c = c.clone();
            async move {
                let provider = opt_str(&d, "provider")?;
                let capability = opt_str(&d, "capability")?;
                let mut models = Vec::new();
                for m in &c.models {
                    if provider.as_deref().is_some_and(|p| p != m.provider) {
                        continue;
                    }
                    if let Some(cap) = &capability
                        && !m.supports(cap).map_err(ErrorBody::invalid)?
                    {
                        continue;
                    }
                    models.push(m.clone());
                }
                Ok(json!({ "models": models }))
            }
        },
    );
    let c = catalog.clone();
    w.register_function(
        def(
            "models::get",
            "One model, or null.",
            &["provider", "model_id"],
        )
        .contract::<GetRequest, Option<Model>>(),
        move |_x, d: Value| {
            let c = c.clone();
            async move {
                let (provider, model_id) = (req_str(&d, "provider")?, req_str(&d, "model_id")?);
                Ok(serde_json::to_value(c.get(&provider, &model_id)).unwrap_or(Value::Null))
            }
        },
    );
    let c = catalog.clone();
    w.register_function(
        def(
            "models::supports",
            "Whether a model has a capability.",
            &["provider", "model_id", "capability"],
        )
        .contract::<SupportsRequest, SupportsAnswer>(),
        move |_x, d: Value| {
            let c = c.clone();
            async move {
                let capability = req_str(&d, "capability")?;
                let model = found(&c, &d)?;
                Ok(json!({ "supported": model.supports(&capability).map_err(ErrorBody::invalid)? }))
            }
        },
    );
    w.register_function(
        def(
            "models::cost",
            "USD cost of a completion's usage {input, output, cache_read, cache_write}.",
            &["provider", "model_id", "usage"],
        ),
        move |_x, d: Value| {
            let c = catalog.clone();
            async move {
                let model = found(&c, &d)?;
                let usage: Usage =
                    serde_json::from_value(d.get("usage").cloned().unwrap_or(Value::Null))
                        .map_err(|e| ErrorBody::invalid(format!("invalid `usage`: {e}")))?;
                Ok(json!({ "cost_usd": model.cost_usd(&usage) }))
            }
        },
    );
    w
}
