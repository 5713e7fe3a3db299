//! The cold-start baseline of `bench/aws.sh`: the smallest `lambda_runtime` function (it
//! answers its event), so each worker's start is compared with a bootstrap that does nothing.

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<Value, lambda_runtime::Error>(event.payload)
    }))
    .await
}
