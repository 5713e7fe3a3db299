//! The auth-credentials worker: provider credentials, stored first (the secrets port: a 0600
//! file when embedded, Secrets Manager on AWS), then the provider's environment variable.
//! Secrets leave only through `auth::get_token`; `auth::status` and `auth::list_providers`
//! say whether and where, never what.

pub mod types;

use bus::builtins::req_str;
use bus::secrets::SecretStore;
use harness_sdk::contracts::auth;
use harness_sdk::{ErrorBody, RegisterFunction, Worker};
use serde_json::{Value, json};
use std::sync::Arc;
use types::{Source, Token};

/// Known providers and their environment variables; any other provider `p` reads `P_API_KEY`.
pub const PROVIDERS: &[(&str, &str)] = &[
    ("anthropic", "ANTHROPIC_API_KEY"),
    ("openai", "OPENAI_API_KEY"),
    ("kimi", "MOONSHOT_API_KEY"),
    ("lmstudio", "LMSTUDIO_API_KEY"),
];

pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

pub struct Auth {
    store: Arc<dyn SecretStore>,
    env: EnvLookup,
}

fn storage(e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new("storage_error", e.to_string())
}

pub fn env_var_for(provider: &str) -> String {
    PROVIDERS
        .iter()
        .find(|(p, _)| *p == provider)
        .map(|(_, v)| v.to_string())
        .unwrap_or_else(|| {
            format!(
                "{}_API_KEY",
                provider.to_ascii_uppercase().replace(['-', '/'], "_")
            )
        })
}

fn secret_name(provider: &str) -> String {
    format!("providers/{provider}")
}

fn provider_of(data: &Value) -> Result<String, ErrorBody> {
    let p = req_str(data, "provider")?;
    // `/` groups names (`mcp/issues`: an MCP server's key), never at an end or doubled, so
    // a name is one secret's path and no other's.
    if p.is_empty()
        || p.len() > 64
        || p.starts_with('/')
        || p.ends_with('/')
        || p.contains("//")
        || !p.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'/'
        })
    {
        return Err(ErrorBody::invalid(format!(
            "`provider` must be 1-64 characters of [a-z0-9_-/] (no `/` at an end or doubled), got `{p}`"
        )));
    }
    Ok(p)
}

impl Auth {
    pub fn new(store: Arc<dyn SecretStore>, env: EnvLookup) -> Arc<Self> {
        Arc::new(Self { store, env })
    }

    /// The process environment as the fallback.
    pub fn process_env() -> EnvLookup {
        Arc::new(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    async fn stored(&self, provider: &str) -> Result<Option<Token>, ErrorBody> {
        match self
            .store
            .get(&secret_name(provider))
            .await
            .map_err(storage)?
        {
            // An empty object is a provisioned placeholder, not a credential.
            Some(text) if text.trim() != "{}" && !text.trim().is_empty() => {
                serde_json::from_str(&text).map(Some).map_err(|_| {
                    storage(format!(
                        "the stored credential of `{provider}` is unreadable"
                    ))
                })
            }
            _ => Ok(None),
        }
    }

    pub async fn token(&self, provider: &str) -> Result<(Option<Token>, Source), ErrorBody> {
        if let Some(t) = self.stored(provider).await? {
            return Ok((Some(t), Source::Stored));
        }
        match (self.env)(&env_var_for(provider)) {
            Some(key) => Ok((Some(Token::ApiKey { key }), Source::Env)),
            None => Ok((None, Source::None)),
        }
    }

    pub async fn set(&self, provider: &str, data: &Value) -> Result<(), ErrorBody> {
        let token: Token = match data.get("type").and_then(Value::as_str) {
            None if data.get("key").is_some() => Token::ApiKey {
                key: req_str(data, "key")?,
            },
            _ => {
                let mut t = data.clone();
                if let Some(o) = t.as_object_mut() {
                    o.remove("provider");
                }
                serde_json::from_value(t).map_err(|e| {
                    ErrorBody::invalid(format!(
                        "a token is {{type: \"api_key\", key}} or {{type: \"oauth\", access_token, refresh_token?, expires_at?}}: {e}"
                    ))
                })?
            }
        };
        let empty = match &token {
            Token::ApiKey { key } => key.is_empty(),
            Token::Oauth { access_token, .. } => access_token.is_empty(),
        };
        if empty {
            return Err(ErrorBody::invalid("the token is empty"));
        }
        let body = serde_json::to_string(&token).map_err(storage)?;
        self.store
            .put(&secret_name(provider), &body)
            .await
            .map_err(storage)
    }

    pub async fn status(&self, provider: &str) -> Result<Value, ErrorBody> {
        let (token, source) = self.token(provider).await?;
        let mut out =
            json!({"provider": provider, "configured": token.is_some(), "source": source});
        if let Some(Token::Oauth {
            expires_at: Some(at),
            ..
        }) = token
        {
            out["expires_at"] = json!(at);
            out["expired"] = json!(at <= bus_telemetry::trace::now_ms());
        }
        Ok(out)
    }
}

fn def(id: &str, description: &str, required: &[&str]) -> RegisterFunction {
    let mut d = RegisterFunction::new(id);
    d.description = Some(description.to_string());
    d.request_format = Some(
        json!({"type": "object", "required": required, "properties": {"provider": {"type": "string"}}}),
    );
    d
}

pub fn worker(auth: Arc<Auth>) -> Worker {
    let mut w = Worker::new("auth-credentials");
    let a = auth.clone();
    w.register_function(
        harness_sdk::DefExt::contract::<auth::GetTokenRequest, auth::GetTokenAnswer>(def(
            "auth::get_token",
            "The provider's credential: stored first, then its environment variable; null if none.",
            &["provider"],
        )
        .not_for_the_agent()),
        move |_c, d: Value| {
            let a = a.clone();
            async move {
                let provider = provider_of(&d)?;
                let (token, _) = a.token(&provider).await?;
                Ok(serde_json::to_value(token).unwrap_or(Value::Null))
            }
        },
    );
    let a = auth.clone();
    w.register_function(
        harness_sdk::DefExt::contract::<auth::SetTokenRequest, auth::SetTokenAnswer>(def("auth::set_token", "Store a provider credential: {provider, type: api_key, key} or {provider, type: oauth, access_token, refresh_token?, expires_at?}.", &["provider"])
        .not_for_the_agent()),
        move |_c, d: Value| {
            let a = a.clone();
            async move {
                let provider = provider_of(&d)?;
                a.set(&provider, &d).await?;
                Ok(json!({"ok": true, "provider": provider}))
            }
        },
    );
    let a = auth.clone();
    w.register_function(
        harness_sdk::DefExt::contract::<auth::ProviderRequest, auth::DeleteTokenAnswer>(
            def(
                "auth::delete_token",
                "Remove a stored credential (the environment variable, if any, still applies).",
                &["provider"],
            )
            .not_for_the_agent(),
        ),
        move |_c, d: Value| {
            let a = a.clone();
            async move {
                let provider = provider_of(&d)?;
                let deleted = a
                    .store
                    .delete(&secret_name(&provider))
                    .await
                    .map_err(storage)?;
                Ok(json!({"deleted": deleted, "provider": provider}))
            }
        },
    );
    let a = auth.clone();
    w.register_function(
        harness_sdk::DefExt::contract::<auth::ProviderRequest, auth::Status>(def(
            "auth::status",
            "Whether a provider is configured and from where (never the secret).",
            &["provider"],
        )),
        move |_c, d: Value| {
            let a = a.clone();
            async move { a.status(&provider_of(&d)?).await }
        },
    );
    w.register_function(
        harness_sdk::DefExt::contract::<auth::ListProvidersRequest, auth::ListProvidersAnswer>(
            def(
                "auth::list_providers",
                "Known and stored providers with their status.",
                &[],
            ),
        ),
        move |_c, _d: Value| {
            let a = auth.clone();
            async move {
                let mut names: Vec<String> = PROVIDERS.iter().map(|(p, _)| p.to_string()).collect();
                for stored in a.store.list().await.map_err(storage)? {
                    if let Some(p) = stored.strip_prefix("providers/")
                        && !names.iter().any(|n| n == p)
                    {
                        names.push(p.to_string());
                    }
                }
                let mut providers = Vec::new();
                for p in names {
                    providers.push(a.status(&p).await?);
                }
                Ok(json!({ "providers": providers }))
            }
        },
    );
    w
}
