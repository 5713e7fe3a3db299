//! aws-local: AWS as the project emulates it for dev and tests, where neither LocalStack nor
//! moto runs Lambda code or API Gateway v2. Never linked into a Lambda bootstrap.
//!
//! - [`lambda_host`]: the Lambda Runtime API, hosting `bootstrap` processes.
//! - [`apigw_ws`]: API Gateway WebSocket in front of a router Lambda.
//! - [`function_url`]: Lambda Function URLs, buffered and response-streaming.
//! - [`mappings`]: event-source mappings (SQS, DynamoDB Streams) with their filters
//!   ([`filter`]: Lambda's `FilterCriteria` rules).
//! - [`deployed`]: the whole deployed topology of `infra/template.yaml`, locally.
//! - [`colocate`]: that template with groups of workers sharing one Lambda (`harness.yaml`'s
//!   `lambda.colocate`).

pub mod apigw_ws;
pub mod colocate;
pub mod deployed;
pub mod filter;
pub mod function_url;
pub mod lambda_host;
pub mod mappings;
pub mod quick_ack;
