//! The AWS backend: state in DynamoDB (Streams as the change feed), queues on SQS, provider
//! secrets in Secrets Manager, registries in DynamoDB. Configured by the standard AWS
//! environment (`AWS_ENDPOINT_URL`, `AWS_REGION`, credentials) plus a name prefix.

pub mod api_calls;
pub mod catalogue;
pub mod changes;
pub mod connections;
pub mod iam_calls;
pub mod invoke;
pub mod lambda_stream;
pub mod queues;
pub mod registry;
pub mod resources;
pub mod response_stream;
pub mod router_trace;
pub mod secrets;
pub mod spill;
pub mod state;

use aws_smithy_http_client::{Builder, tls};
use std::time::Duration;

/// Names of every resource, derived from one prefix (shared with `localstack/` and `infra/`).
#[derive(Debug, Clone)]
pub struct AwsNames {
    pub prefix: String,
}

impl AwsNames {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }
    pub fn state_table(&self) -> String {
        format!("{}state", self.prefix)
    }
    pub fn checkpoint_table(&self) -> String {
        format!("{}checkpoints", self.prefix)
    }
    pub fn registry_table(&self) -> String {
        format!("{}registry", self.prefix)
    }
    /// SQS queue name for a bus queue (SQS allows `[A-Za-z0-9_-]`, 80 characters, `.fifo`).
    pub fn queue_name(&self, queue: &str, fifo: bool, dlq: bool) -> String {
        let mut base: String = queue
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let suffix = match (dlq, fifo) {
            (true, true) => "-dlq.fifo",
            (true, false) => "-dlq",
            (false, true) => ".fifo",
            (false, false) => "",
        };
        let room = 80usize.saturating_sub(self.prefix.len() + suffix.len());
        if base.len() > room {
            // Keep names unique when truncating: a short hash of the full name.
            let h = fnv(queue);
            base.truncate(room.saturating_sub(9));
            base.push_str(&format!("-{h:08x}"));
        }
        format!("{}{base}{suffix}", self.prefix)
    }
    pub fn secret_name(&self, name: &str) -> String {
        format!("{}secrets/{name}", self.prefix)
    }
}

/// FNV-1a, for short stable names (kept here under its old path).
pub use bus::hash::fnv;

/// Clients built once (outside any handler), with the rustls/ring HTTPS client.
#[derive(Clone)]
pub struct AwsClients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub streams: aws_sdk_dynamodbstreams::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub secrets: aws_sdk_secretsmanager::Client,
    /// Lambda `Invoke` (`AWS_ENDPOINT_URL_LAMBDA` points it elsewhere, e.g. at the local
    /// Runtime API host's Invoke API).
    pub lambda: aws_sdk_lambda::Client,
    pub config: aws_config::SdkConfig,
}

impl AwsClients {
    pub async fn from_env() -> Self {
        Self::new(None).await
    }

    /// From the standard environment, with an optional endpoint that overrides
    /// `AWS_ENDPOINT_URL`.
    pub async fn new(endpoint_url: Option<&str>) -> Self {
        let http = https_client();
        let retry = aws_config::retry::RetryConfig::standard()
            .with_max_attempts(5)
            .with_initial_backoff(Duration::from_millis(50));
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .operation_attempt_timeout(Duration::from_secs(30))
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        Self::from_config(loader.load().await)
    }

    /// Clients for a configuration built elsewhere (tests give static credentials).
    pub fn from_config(cfg: aws_config::SdkConfig) -> Self {
        use api_calls::CountCalls;
        Self {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&cfg)
                    .interceptor(CountCalls)
                    .build(),
            ),
            streams: aws_sdk_dynamodbstreams::Client::from_conf(
                aws_sdk_dynamodbstreams::config::Builder::from(&cfg)
                    .interceptor(CountCalls)
                    .build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(&cfg)
                    .interceptor(CountCalls)
                    .build(),
            ),
            secrets: aws_sdk_secretsmanager::Client::from_conf(
                aws_sdk_secretsmanager::config::Builder::from(&cfg)
                    .interceptor(CountCalls)
                    .build(),
            ),
            lambda: lambda_client(&cfg, None),
            config: cfg,
        }
    }

    /// The same clients with Lambda `Invoke` sent to `endpoint` (the local Invoke API).
    pub fn with_lambda_endpoint(mut self, endpoint: &str) -> Self {
        self.lambda = lambda_client(&self.config, Some(endpoint));
        self
    }
}

/// The Lambda client: no SDK retries and no SDK attempt timeout. An `Invoke` whose answer
/// was lost may have run, so only [`router::invoke`] decides what is retried (what is known
/// not to have started), and each call's deadline comes from its caller.
pub fn lambda_client(
    cfg: &aws_config::SdkConfig,
    endpoint: Option<&str>,
) -> aws_sdk_lambda::Client {
    let mut conf = aws_sdk_lambda::config::Builder::from(cfg)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .interceptor(api_calls::CountCalls)
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .build(),
        );
    if let Some(url) = endpoint {
        conf = conf.endpoint_url(url);
    }
    aws_sdk_lambda::Client::from_conf(conf.build())
}

/// A readable message for an SDK error: the service's error code and message when there is
/// one, otherwise the whole error chain.
pub fn err_text<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> String
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
    match e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            format!(
                "{}: {}",
                err.code().unwrap_or("ServiceError"),
                err.message()
                    .map(str::to_owned)
                    .unwrap_or_else(|| err.to_string())
            )
        }
        other => format!("{}", DisplayErrorContext(other)),
    }
}

/// The service error code, when the error is a service error.
pub fn err_code<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> Option<String>
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata,
{
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    e.code().map(str::to_owned)
}

/// HTTPS client with rustls/ring, as every AWS client here uses.
pub fn https_client() -> aws_sdk_lambda::config::SharedHttpClient {
    bus_telemetry::ensure_crypto_provider();
    Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_valid_sqs_names() {
        let n = AwsNames::new("h-");
        assert_eq!(n.queue_name("turn-steps", true, false), "h-turn-steps.fifo");
        assert_eq!(
            n.queue_name("turn-steps", true, true),
            "h-turn-steps-dlq.fifo"
        );
        assert_eq!(n.queue_name("iii::durable", false, false), "h-iii--durable");
        let long = "x".repeat(200);
        let a = n.queue_name(&long, true, true);
        assert!(a.len() <= 80 && a.ends_with("-dlq.fifo"), "{a}");
        assert_ne!(
            n.queue_name(&format!("{long}a"), true, false),
            n.queue_name(&format!("{long}b"), true, false)
        );
    }
}
