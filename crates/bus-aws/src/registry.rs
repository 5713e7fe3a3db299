//! The function and connection registries in DynamoDB (`kind` = `function` | `connection` |
//! `queue`, `id`). In AWS the routing Lambda reads them; locally the engine writes through so
//! the table always says who serves what. Removal is owner-safe: conditional on the owner.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{AwsClients, AwsNames, err_code, err_text};
use bus::registry::Registry;

/// How long a function's record and the trigger list are reused. They change when a worker
/// is deployed or registered, not per call, and were read once per call (a tool call cost
/// about 22 registry reads in the deployed shape); a registration made by another process
/// (a function moved to another Lambda, a trigger added) takes effect there within this
/// time. Only what exists is kept: an unknown function is read again each time.
pub const DEPLOYED_TTL: Duration = Duration::from_secs(5);
/// Most function records kept at once (the cache starts over past it).
const MAX_CACHED: usize = 4096;
const CACHED_GETS: [&str; 1] = ["function"];
const CACHED_LISTS: [&str; 2] = ["trigger", "function"];

type Entry = (String, serde_json::Value);
type Listed = Vec<(String, String, serde_json::Value)>;

#[derive(Default)]
struct ReadCache {
    gets: HashMap<(String, String), (Instant, Entry)>,
    lists: HashMap<String, (Instant, Listed, String)>,
}

#[derive(Clone)]
pub struct DynamoRegistry {
    clients: AwsClients,
    table: String,
    cache: Arc<Mutex<ReadCache>>,
}

impl DynamoRegistry {
    pub fn new(clients: AwsClients, names: &AwsNames) -> Self {
        Self {
            clients,
            table: names.registry_table(),
            cache: Arc::default(),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, ReadCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This process's own writes are seen at once.
    fn forget(&self, kind: &str, id: &str) {
        let mut c = self.cache();
        c.gets.remove(&(kind.to_string(), id.to_string()));
        c.lists.remove(kind);
    }
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

impl DynamoRegistry {
    /// Every entry of one kind → `(id, owner, body)`.
    pub async fn list(
        &self,
        kind: &str,
    ) -> Result<Vec<(String, String, serde_json::Value)>, String> {
        Ok(self.list_versioned(kind).await?.0)
    }

    /// [`Self::list`] with a version of what it lists: a digest of every entry as stored
    /// (id, owner, body), so it moves whenever an entry is added, removed or rewritten with
    /// other content, and stays while nothing changed (`catalogue_version`, which the local
    /// engine counts, and which lets the skills and the agent's tool be derived once per
    /// catalogue rather than once per run).
    pub async fn list_versioned(&self, kind: &str) -> Result<(Listed, String), String> {
        let cached = CACHED_LISTS.contains(&kind);
        if cached
            && let Some((at, listed, version)) = self.cache().lists.get(kind)
            && at.elapsed() < DEPLOYED_TTL
        {
            return Ok((listed.clone(), version.clone()));
        }
        // Boxed: one async level fewer in every caller's future (engine-lambda's main hit
        // the compiler's query depth computing its layout).
        let (out, version) = Box::pin(self.list_uncached(kind)).await?;
        if cached {
            self.cache().lists.insert(
                kind.to_string(),
                (Instant::now(), out.clone(), version.clone()),
            );
        }
        Ok((out, version))
    }

    async fn list_uncached(&self, kind: &str) -> Result<(Listed, String), String> {
        use sha2::Digest;
        let mut out = Vec::new();
        // Each field length-prefixed, so no two listings digest the same bytes.
        let mut digest = sha2::Sha256::new();
        let mut start: Option<std::collections::HashMap<String, AttributeValue>> = None;
        loop {
            let resp = self
                .clients
                .dynamodb
                .query()
                .table_name(&self.table)
                .key_condition_expression("#k = :k")
                .expression_attribute_names("#k", "kind")
                .expression_attribute_values(":k", s(kind))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| err_text(&e))?;
            for item in resp.items() {
                let text = |f: &str| {
                    item.get(f)
                        .and_then(|v| v.as_s().ok())
                        .cloned()
                        .unwrap_or_default()
                };
                let (id, owner, body) = (text("id"), text("owner"), text("body"));
                for field in [&id, &owner, &body] {
                    digest.update((field.len() as u64).to_le_bytes());
                    digest.update(field.as_bytes());
                }
                let body = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
                out.push((id, owner, body));
            }
            match resp.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => {
                    let sum = digest.finalize();
                    return Ok((out, format!("r-{}", bus::hash::hex(&sum[..16]))));
                }
            }
        }
    }
}

#[async_trait]
impl Registry for DynamoRegistry {
    async fn put(
        &self,
        kind: &str,
        id: &str,
        owner: &str,
        body: serde_json::Value,
    ) -> Result<(), String> {
        self.forget(kind, id);
        self.clients
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .item("kind", s(kind))
            .item("id", s(id))
            .item("owner", s(owner))
            .item("body", s(&body.to_string()))
            .item(
                "updated_at_ms",
                AttributeValue::N(bus_telemetry::trace::now_ms().to_string()),
            )
            .send()
            .await
            .map_err(|e| err_text(&e))?;
        Ok(())
    }

    async fn remove(&self, kind: &str, id: &str, owner: &str) -> Result<bool, String> {
        self.forget(kind, id);
        match self
            .clients
            .dynamodb
            .delete_item()
            .table_name(&self.table)
            .key("kind", s(kind))
            .key("id", s(id))
            .condition_expression("#o = :o")
            .expression_attribute_names("#o", "owner")
            .expression_attribute_values(":o", s(owner))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if err_code(&e).as_deref() == Some("ConditionalCheckFailedException") => {
                Ok(false)
            }
            Err(e) => Err(err_text(&e)),
        }
    }

    async fn get(
        &self,
        kind: &str,
        id: &str,
    ) -> Result<Option<(String, serde_json::Value)>, String> {
        let key = (kind.to_string(), id.to_string());
        let cached = CACHED_GETS.contains(&kind);
        if cached
            && let Some((at, entry)) = self.cache().gets.get(&key)
            && at.elapsed() < DEPLOYED_TTL
        {
            return Ok(Some(entry.clone()));
        }
        let found = self.get_uncached(kind, id).await?;
        if cached && let Some(entry) = &found {
            let mut c = self.cache();
            if c.gets.len() >= MAX_CACHED {
                c.gets.clear();
            }
            c.gets.insert(key, (Instant::now(), entry.clone()));
        }
        Ok(found)
    }
}

impl DynamoRegistry {
    async fn get_uncached(&self, kind: &str, id: &str) -> Result<Option<Entry>, String> {
        let out = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key("kind", s(kind))
            .key("id", s(id))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| err_text(&e))?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let owner = match item.get("owner") {
            Some(AttributeValue::S(o)) => o.clone(),
            _ => String::new(),
        };
        let body = match item.get("body") {
            Some(AttributeValue::S(b)) => {
                serde_json::from_str(b).unwrap_or(serde_json::Value::Null)
            }
            _ => serde_json::Value::Null,
        };
        Ok(Some((owner, body)))
    }
}
