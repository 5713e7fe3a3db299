//! Every AWS resource the backend needs, created idempotently (`engine-gateway provision`, and
//! the `localstack/` scripts through it). The same list is what `infra/` must declare.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableStatus,
};
use serde::Serialize;
use std::time::Duration;

use super::{AwsClients, AwsNames, err_code, err_text};
use bus::queue::QueueConfig;

#[derive(Debug, Clone, Serialize)]
pub struct TableSpec {
    pub name: String,
    pub hash_key: &'static str,
    pub range_key: Option<&'static str>,
    pub stream: bool,
    /// The attribute DynamoDB's TTL deletes items by (epoch seconds), if any.
    pub expires: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueueSpec {
    #[serde(flatten)]
    pub config: QueueConfig,
    /// The SQS names the backend uses for it.
    pub sqs_name: String,
    pub dlq_name: String,
    /// Redrive policy: `max_retries` + 1.
    pub max_receive_count: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub prefix: String,
    pub tables: Vec<TableSpec>,
    pub queues: Vec<QueueSpec>,
    pub secrets: Vec<String>,
}

/// The turn-step queue of the durable turn (SPEC: FIFO, grouped by `session_id`).
pub const TURN_STEPS_QUEUE: &str = "turn-steps";
pub const PROVIDERS: &[&str] = &["anthropic", "openai", "kimi", "lmstudio"];
/// Secrets besides the providers': the Slack app's, and the token clients present at `$connect`.
pub const EXTRA_SECRETS: &[&str] = &[
    "slack/signing_secret",
    "slack/bot_token",
    "engine/token",
    // The deployed harness's iii-permissions.yaml; `{}` means the shipped rules.
    "harness/permissions",
];
pub const TURN_STEP_VISIBILITY_MS: u64 = 360_000;

pub fn manifest(names: &AwsNames) -> Manifest {
    let queue = |config: QueueConfig| {
        let fifo = config.kind == bus::queue::QueueKind::Fifo;
        QueueSpec {
            sqs_name: names.queue_name(&config.name, fifo, false),
            dlq_name: names.queue_name(&config.name, fifo, true),
            max_receive_count: config.max_retries + 1,
            config,
        }
    };
    Manifest {
        prefix: names.prefix.clone(),
        tables: vec![
            TableSpec {
                name: names.state_table(),
                hash_key: "scope",
                range_key: Some("key"),
                stream: true,
                // Parts of large values no record points to any more (`spill`).
                expires: Some(crate::spill::EXPIRES),
            },
            TableSpec {
                name: names.checkpoint_table(),
                hash_key: "id",
                range_key: None,
                stream: false,
                expires: None,
            },
            TableSpec {
                name: names.registry_table(),
                hash_key: "kind",
                range_key: Some("id"),
                stream: false,
                expires: None,
            },
        ],
        queues: vec![
            queue({
                // Longer than the orchestrator's step timeout (a model call may take 300 s):
                // SQS must not hand a running step to a second consumer, and a Lambda event
                // source mapping requires it.
                let mut c = QueueConfig::fifo(TURN_STEPS_QUEUE, "session_id");
                c.visibility_timeout_ms = TURN_STEP_VISIBILITY_MS;
                c.concurrency = 16;
                c
            }),
            queue(QueueConfig::standard(bus::engine::DURABLE_QUEUE)),
        ],
        secrets: PROVIDERS
            .iter()
            .map(|p| format!("providers/{p}"))
            .chain(EXTRA_SECRETS.iter().map(|s| s.to_string()))
            .map(|s| names.secret_name(&s))
            .collect(),
    }
}

pub async fn ensure_table(clients: &AwsClients, spec: &TableSpec) -> anyhow::Result<()> {
    let ddb = &clients.dynamodb;
    match ddb.describe_table().table_name(&spec.name).send().await {
        Ok(_) => {}
        Err(e) if err_code(&e).as_deref() == Some("ResourceNotFoundException") => {
            let mut req = ddb
                .create_table()
                .table_name(&spec.name)
                .billing_mode(BillingMode::PayPerRequest)
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(spec.hash_key)
                        .attribute_type(ScalarAttributeType::S)
                        .build()?,
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(spec.hash_key)
                        .key_type(KeyType::Hash)
                        .build()?,
                );
            if let Some(range) = spec.range_key {
                req = req
                    .attribute_definitions(
                        AttributeDefinition::builder()
                            .attribute_name(range)
                            .attribute_type(ScalarAttributeType::S)
                            .build()?,
                    )
                    .key_schema(
                        KeySchemaElement::builder()
                            .attribute_name(range)
                            .key_type(KeyType::Range)
                            .build()?,
                    );
            }
            if spec.stream {
                req = req.stream_specification(
                    StreamSpecification::builder()
                        .stream_enabled(true)
                        .stream_view_type(StreamViewType::NewAndOldImages)
                        .build()?,
                );
            }
            match req.send().await {
                Ok(_) => {}
                Err(e) if err_code(&e).as_deref() == Some("ResourceInUseException") => {}
                Err(e) => anyhow::bail!("create table {}: {}", spec.name, err_text(&e)),
            }
        }
        Err(e) => anyhow::bail!("describe table {}: {}", spec.name, err_text(&e)),
    }
    for _ in 0..120 {
        let d = ddb
            .describe_table()
            .table_name(&spec.name)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("describe table {}: {}", spec.name, err_text(&e)))?;
        if d.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return ensure_expiry(clients, spec).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    anyhow::bail!("table {} did not become ACTIVE", spec.name)
}

/// Turn on the table's TTL on `spec.expires` (a table made before it had none).
async fn ensure_expiry(clients: &AwsClients, spec: &TableSpec) -> anyhow::Result<()> {
    use aws_sdk_dynamodb::types::{TimeToLiveSpecification, TimeToLiveStatus};
    let Some(attribute) = spec.expires else {
        return Ok(());
    };
    let ddb = &clients.dynamodb;
    let now = ddb
        .describe_time_to_live()
        .table_name(&spec.name)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("describe TTL of {}: {}", spec.name, err_text(&e)))?;
    let on = now.time_to_live_description().is_some_and(|d| {
        d.attribute_name() == Some(attribute)
            && matches!(
                d.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            )
    });
    if on {
        return Ok(());
    }
    ddb.update_time_to_live()
        .table_name(&spec.name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(attribute)
                .enabled(true)
                .build()?,
        )
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("turn on TTL of {}: {}", spec.name, err_text(&e)))?;
    Ok(())
}

pub async fn ensure_secret(clients: &AwsClients, name: &str) -> anyhow::Result<()> {
    match clients
        .secrets
        .describe_secret()
        .secret_id(name)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if err_code(&e).as_deref() == Some("ResourceNotFoundException") => {
            match clients
                .secrets
                .create_secret()
                .name(name)
                .secret_string("{}")
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if err_code(&e).as_deref() == Some("ResourceExistsException") => Ok(()),
                Err(e) => anyhow::bail!("create secret {name}: {}", err_text(&e)),
            }
        }
        Err(e) => anyhow::bail!("describe secret {name}: {}", err_text(&e)),
    }
}

/// Create every table (with streams), queue (with DLQ) and secret. Idempotent.
pub async fn ensure_all(clients: &AwsClients, names: &AwsNames) -> anyhow::Result<Manifest> {
    let m = manifest(names);
    for t in &m.tables {
        ensure_table(clients, t).await?;
    }
    let queues = super::queues::SqsQueues::new(clients.clone(), names.clone());
    for q in &m.queues {
        use bus::queue::QueueBackend;
        queues
            .declare(&q.config)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for s in &m.secrets {
        ensure_secret(clients, s).await?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `localstack/resources.json` (read by the Docker init hook, and the reference for
    /// `infra/`) must say exactly what the code provisions.
    #[test]
    fn committed_manifest_matches_the_code() {
        let committed: serde_json::Value =
            serde_json::from_str(include_str!("../../../localstack/resources.json"))
                .expect("valid JSON");
        let code = serde_json::to_value(manifest(&AwsNames::new("harness-"))).expect("manifest");
        assert_eq!(
            committed, code,
            "localstack/resources.json is stale: regenerate it with `engine-gateway provision --dry-run`"
        );
    }
}
