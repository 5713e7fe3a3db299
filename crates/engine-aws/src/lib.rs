//! engine-aws: the engine as deployed in AWS.
//!
//! - [`router`]: the router Lambda behind the API Gateway WebSocket API, and the state-trigger
//!   router behind DynamoDB Streams (the `engine-lambda` bootstrap).
//! - [`doors`], [`url_http`]: the standard doors behind a Function URL in response-streaming
//!   mode (the `doors-lambda` bootstrap).

pub mod doors;
pub mod router;
pub mod url_http;
