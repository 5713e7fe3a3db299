//! The port for functions run as Lambdas: the engine hands them batches of queue messages and
//! state changes as AWS event-source mappings would (`Engine::attach_lambda`). The local
//! Runtime API host (`aws-local`) implements it; the engine never starts a process itself.

use serde_json::{Value, json};

/// A function run as a Lambda, as the engine calls it.
#[async_trait::async_trait]
pub trait LambdaTarget: Send + Sync {
    /// The function name (`AWS_LAMBDA_FUNCTION_NAME`).
    fn name(&self) -> &str;
    /// What the engine shows of it in `engine::workers::list`.
    fn metadata(&self) -> Value;
    /// One invocation with a JSON event → its JSON answer.
    async fn invoke(&self, event: &Value) -> Result<Value, LambdaError>;
    /// Stop its processes (the engine is shutting down).
    fn shutdown(&self);
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LambdaError {
    /// The function reported an error through `/invocation/{id}/error`.
    #[error("function error {error_type}: {message}")]
    Function { error_type: String, message: String },
    #[error("the Lambda process exited during the invocation ({0})")]
    Crashed(String),
    #[error("Task timed out after {0} ms")]
    TimedOut(u128),
    #[error("could not start the Lambda process: {0}")]
    Spawn(String),
}

impl LambdaError {
    /// The error type Lambda reports for it (`X-Amz-Function-Error` bodies, `ErrorCode`).
    pub fn error_type(&self) -> String {
        match self {
            LambdaError::Function { error_type, .. } => error_type.clone(),
            LambdaError::TimedOut(_) => "Sandbox.Timedout".into(),
            _ => "Runtime.ExitError".into(),
        }
    }
}

/// What a worker's Lambda answers to `{"describe": true}` (its registrations).
pub fn describe_event() -> Value {
    json!({ "describe": true })
}
