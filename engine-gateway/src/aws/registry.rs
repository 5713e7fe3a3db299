//! The function and connection registries in DynamoDB (`kind` = `function` | `connection` |
//! `queue`, `id`). In AWS the routing Lambda reads them; locally the engine writes through so
//! the table always says who serves what. Removal is owner-safe: conditional on the owner.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;

use super::{AwsClients, AwsNames, err_code, err_text};
use crate::registry::Registry;

#[derive(Clone)]
pub struct DynamoRegistry {
    clients: AwsClients,
    table: String,
}

impl DynamoRegistry {
    pub fn new(clients: AwsClients, names: &AwsNames) -> Self {
        Self {
            clients,
            table: names.registry_table(),
        }
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
        let mut out = Vec::new();
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
                let body = serde_json::from_str(&text("body")).unwrap_or(serde_json::Value::Null);
                out.push((text("id"), text("owner"), body));
            }
            match resp.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(out),
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
                AttributeValue::N(crate::trace::now_ms().to_string()),
            )
            .send()
            .await
            .map_err(|e| err_text(&e))?;
        Ok(())
    }

    async fn remove(&self, kind: &str, id: &str, owner: &str) -> Result<bool, String> {
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
