//! Calling functions that Lambdas serve: `Invoke` with the bus envelope, the registry lookup
//! that finds a function's Lambda, and registering a deployed worker Lambda (it is asked to
//! describe itself, `{"describe": true}`, and its functions and state triggers are written to
//! the registry, which is how the router and the other Lambdas find it). Shared by the router
//! Lambda, the doors Lambda, workers calling each other directly, and the local tooling.

use crate::registry::DynamoRegistry;
use crate::{AwsClients, AwsNames};
use aws_sdk_lambda::primitives::Blob;
use bus::access::Principal;
use bus::protocol::{ErrorBody, codes};
use bus::registry::Registry;
use serde_json::{Value, json};

/// Invoke a Lambda with a JSON event → its JSON answer.
///
/// Retried only when Lambda says the invocation did not start (throttled, or the function
/// not ready yet), at most 3 times with backoff. Anything else (a lost answer, a service
/// error, a timeout) may have run the handler and is returned as is: the caller decides,
/// and a step is idempotent per `function_call_id` when it retries.
pub async fn invoke(
    clients: &AwsClients,
    function_name: &str,
    event: &Value,
) -> Result<Value, ErrorBody> {
    let payload = serde_json::to_vec(event).unwrap_or_default();
    let mut pause = std::time::Duration::from_millis(100);
    let mut attempt = 1u32;
    let out = loop {
        match clients
            .lambda
            .invoke()
            .function_name(function_name)
            .payload(Blob::new(payload.clone()))
            .send()
            .await
        {
            Ok(out) => break out,
            Err(e) if attempt < 3 && not_started(&e) => {
                tracing::debug!(function_name, attempt, error = %crate::err_text(&e), "invoke did not start; retrying");
                tokio::time::sleep(pause).await;
                pause *= 4;
                attempt += 1;
            }
            Err(e) => {
                return Err(ErrorBody::new(
                    codes::INVOCATION_ERROR,
                    format!("invoke {function_name}: {}", crate::err_text(&e)),
                ));
            }
        }
    };
    let body: Value = out
        .payload()
        .map(|p| serde_json::from_slice(p.as_ref()).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    if let Some(kind) = out.function_error() {
        return Err(ErrorBody::new(
            codes::INVOCATION_ERROR,
            format!(
                "{function_name} failed ({kind}): {}",
                body["errorMessage"].as_str().unwrap_or(&body.to_string())
            ),
        ));
    }
    Ok(body)
}

/// Lambda refused the invocation before running anything.
fn not_started<R>(
    e: &aws_sdk_lambda::error::SdkError<aws_sdk_lambda::operation::invoke::InvokeError, R>,
) -> bool {
    e.as_service_error().is_some_and(|s| {
        s.is_too_many_requests_exception()
            || s.is_resource_not_ready_exception()
            || s.is_ec2_throttled_exception()
    })
}

/// Whether a state trigger's `config` takes a change of `scope`/`key`: `*` globs, as the
/// engine and the SDK match them; engine-reserved (`$`) scopes reach no trigger.
pub fn state_trigger_picks(config: &Value, record: &Value) -> bool {
    state_trigger_picks_with(config, record, None)
}

/// [`state_trigger_picks`], with the images' values (old, new) already read where the
/// record's value was stored apart (`spill::json_record_values`).
pub fn state_trigger_picks_with(
    config: &Value,
    record: &Value,
    read: Option<&(Option<Value>, Option<Value>)>,
) -> bool {
    let keys = &record["dynamodb"]["Keys"];
    let scope = keys["scope"]["S"].as_str().unwrap_or("");
    let key = keys["key"]["S"].as_str().unwrap_or("");
    if scope.starts_with('$') {
        return false;
    }
    let changed = config["changed"].as_str();
    // The images hold the value as JSON text (aws/state.rs); read only for a `changed` filter.
    let image = |name: &str| -> Option<Value> {
        changed?;
        if let Some((old, new)) = read {
            return if name == "OldImage" { old } else { new }.clone();
        }
        serde_json::from_str(record["dynamodb"][name]["value"]["S"].as_str()?).ok()
    };
    bus::engine::state_trigger_takes(
        config["scope"].as_str(),
        config["key"].as_str(),
        changed,
        (scope, key),
        image("OldImage").as_ref(),
        image("NewImage").as_ref(),
    )
}

/// The registry's record of `function_id` (its owner and body), if any.
pub async fn function_record(
    registry: &DynamoRegistry,
    function_id: &str,
) -> Result<Option<(String, Value)>, ErrorBody> {
    registry
        .get("function", function_id)
        .await
        .map_err(|e| ErrorBody::new("storage_error", format!("registry: {e}")))
}

/// The Lambda a function record names, or why none does.
pub fn lambda_named(
    record: Option<&(String, Value)>,
    function_id: &str,
) -> Result<String, ErrorBody> {
    record
        .and_then(|(_, b)| b["lambda"].as_str().map(str::to_owned))
        .ok_or_else(|| {
            ErrorBody::new(
                codes::FUNCTION_NOT_FOUND,
                format!(
                    "no Lambda serves `{function_id}` (deployed workers are found through `engine-gateway register-lambda`)"
                ),
            )
        })
}

/// The bus envelope a worker's Lambda answers (`harness_sdk::lambda`).
pub fn envelope(
    function_id: &str,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
) -> Value {
    json!({"function_id": function_id, "data": data, "traceparent": traceparent, "baggage": baggage})
}

/// Call a function that a Lambda serves: registry lookup, then `Invoke` with the envelope.
pub async fn call_function(
    clients: &AwsClients,
    registry: &DynamoRegistry,
    function_id: &str,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
) -> Result<Value, ErrorBody> {
    call_function_as(
        clients,
        registry,
        &Principal::admin(),
        function_id,
        data,
        traceparent,
        baggage,
    )
    .await
}

/// [`call_function`] on behalf of a connection's principal: a client reaches only functions
/// registered public, never an agent tool.
pub async fn call_function_as(
    clients: &AwsClients,
    registry: &DynamoRegistry,
    principal: &Principal,
    function_id: &str,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
) -> Result<Value, ErrorBody> {
    if crate::catalogue::FUNCTIONS.contains(&function_id) {
        principal.may_call(function_id, false)?;
        if let Some(answer) = crate::catalogue::answer(registry, function_id, &data).await {
            return answer;
        }
    }
    let target = function_record(registry, function_id).await?;
    let public = target
        .as_ref()
        .is_some_and(|(_, b)| bus::access::is_public(b.get("metadata")));
    principal.may_call(function_id, public)?;
    let lambda = lambda_named(target.as_ref(), function_id)?;
    let answer = invoke(
        clients,
        &lambda,
        &envelope(function_id, data, traceparent, baggage),
    )
    .await?;
    if let Some(err) = answer.get("error").filter(|e| !e.is_null()) {
        return Err(serde_json::from_value(err.clone())
            .unwrap_or_else(|_| ErrorBody::new(codes::INVOCATION_ERROR, err.to_string())));
    }
    Ok(answer.get("result").cloned().unwrap_or(Value::Null))
}

/// Ask a deployed worker Lambda what it serves and record it in the registry → the function
/// ids and state trigger ids written, and what each state trigger watches (`watches`: its id
/// and config, for a check that the stream's filters let those changes through).
pub async fn register_lambda(
    clients: &AwsClients,
    names: &AwsNames,
    function_name: &str,
) -> anyhow::Result<Value> {
    let registry = DynamoRegistry::new(clients.clone(), names);
    let described = invoke(clients, function_name, &json!({"describe": true}))
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let owner = format!("lambda:{function_name}");
    let mut functions = Vec::new();
    for f in described["functions"].as_array().into_iter().flatten() {
        let Some(id) = f["id"].as_str() else { continue };
        bus::protocol::check_not_reserved(id)
            .map_err(|e| anyhow::anyhow!("{function_name}: {}", e.message))?;
        let mut body = f.clone();
        body["target"] = json!("lambda");
        body["lambda"] = json!(function_name);
        registry
            .put("function", id, &owner, body)
            .await
            .map_err(anyhow::Error::msg)?;
        functions.push(id.to_string());
    }
    let (mut triggers, mut watches) = (Vec::new(), Vec::new());
    for t in described["triggers"].as_array().into_iter().flatten() {
        // Queue triggers are event source mappings (infra/); state triggers are routed here.
        if t["trigger_type"] != "state" {
            continue;
        }
        let Some(id) = t["id"].as_str() else { continue };
        let mut body = t.clone();
        body["lambda"] = json!(function_name);
        registry
            .put("trigger", id, &owner, body)
            .await
            .map_err(anyhow::Error::msg)?;
        triggers.push(id.to_string());
        watches.push(json!({"trigger": id, "config": t["config"]}));
    }
    Ok(
        json!({"lambda": function_name, "functions": functions, "state_triggers": triggers, "watches": watches}),
    )
}
