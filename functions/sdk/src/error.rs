use ::bus::protocol::{ErrorBody, codes};

/// A failed bus call, typed by the engine's error codes (SPEC §1).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BusError {
    #[error("function_not_found: {0}")]
    FunctionNotFound(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("invocation_stopped: {0}")]
    InvocationStopped(String),
    #[error("forbidden: {0}")]
    Forbidden(String),
    #[error("invalid_message: {0}")]
    InvalidMessage(String),
    #[error("enqueue_error: {0}")]
    EnqueueError(String),
    #[error("version_conflict: {0}")]
    VersionConflict(String),
    #[error("not connected to the engine: {0}")]
    Disconnected(String),
    /// Any other code, including a handler's own error codes.
    #[error("{code}: {message}")]
    Other { code: String, message: String },
}

impl BusError {
    pub fn code(&self) -> &str {
        match self {
            BusError::FunctionNotFound(_) => codes::FUNCTION_NOT_FOUND,
            BusError::Timeout(_) => codes::TIMEOUT,
            BusError::InvocationStopped(_) => codes::INVOCATION_STOPPED,
            BusError::Forbidden(_) => codes::FORBIDDEN,
            BusError::InvalidMessage(_) => codes::INVALID_MESSAGE,
            BusError::EnqueueError(_) => codes::ENQUEUE_ERROR,
            BusError::VersionConflict(_) => codes::VERSION_CONFLICT,
            BusError::Disconnected(_) => codes::INVOCATION_STOPPED,
            BusError::Other { code, .. } => code,
        }
    }

    pub fn message(&self) -> String {
        match self {
            BusError::Other { message, .. } => message.clone(),
            BusError::FunctionNotFound(m)
            | BusError::Timeout(m)
            | BusError::InvocationStopped(m)
            | BusError::Forbidden(m)
            | BusError::InvalidMessage(m)
            | BusError::EnqueueError(m)
            | BusError::VersionConflict(m)
            | BusError::Disconnected(m) => m.clone(),
        }
    }
}

impl From<ErrorBody> for BusError {
    fn from(e: ErrorBody) -> Self {
        let m = e.message;
        match e.code.as_str() {
            codes::FUNCTION_NOT_FOUND => BusError::FunctionNotFound(m),
            codes::TIMEOUT => BusError::Timeout(m),
            codes::INVOCATION_STOPPED => BusError::InvocationStopped(m),
            codes::FORBIDDEN => BusError::Forbidden(m),
            codes::INVALID_MESSAGE => BusError::InvalidMessage(m),
            codes::ENQUEUE_ERROR => BusError::EnqueueError(m),
            codes::VERSION_CONFLICT => BusError::VersionConflict(m),
            _ => BusError::Other {
                code: e.code,
                message: m,
            },
        }
    }
}

impl From<BusError> for ErrorBody {
    fn from(e: BusError) -> Self {
        ErrorBody::new(e.code(), e.message())
    }
}
