//! The registry port: who serves which function, which connections are open. The engine's
//! router is in memory; a registry makes it visible outside the process (DynamoDB in AWS).

use async_trait::async_trait;
use serde_json::Value;

#[async_trait]
pub trait Registry: Send + Sync {
    async fn put(&self, kind: &str, id: &str, owner: &str, body: Value) -> Result<(), String>;
    /// Remove only if `owner` still owns the entry.
    async fn remove(&self, kind: &str, id: &str, owner: &str) -> Result<bool, String>;
    async fn get(&self, kind: &str, id: &str) -> Result<Option<(String, Value)>, String>;
}
