//! What each AWS call asks IAM for: its action and the resource's ARN, as AWS authorises it
//! (a `TransactWriteItems` is the put, update, delete or condition check of each item; an
//! `InvokeWithResponseStream` is `lambda:InvokeFunction`; a `PostToConnection` is
//! `execute-api:ManageConnections` on the connection's path). Recorded per process next to
//! the call counts (`api_calls`), so `infra/iam_check.py` can check every call the deployed
//! tests made against the role the template gives that function.

use std::collections::BTreeSet;
use std::sync::Mutex;

type Input<'a> = &'a aws_smithy_runtime_api::client::interceptors::context::Input;

static SEEN: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());

/// `field` of the operation input, whichever of these input types it is (`None`: none of
/// them, or the field unset).
macro_rules! field_of {
    ($input:expr, $field:ident: $($ty:ty),+ $(,)?) => {
        None$(.or_else(|| $input.downcast_ref::<$ty>().and_then(|i| i.$field.clone())))+
    };
}

fn region() -> String {
    std::env::var("AWS_REGION").unwrap_or_else(|_| bus::events::REGION.to_string())
}

fn arn(service: &str, rest: &str) -> String {
    format!(
        "arn:aws:{service}:{}:{}:{rest}",
        region(),
        bus::events::ACCOUNT
    )
}

/// A resource the SDK names by name or by ARN → its ARN (`kind` as the ARN spells it:
/// `table/`, `secret:`, `function:`).
fn named(service: &str, kind: &str, name: &str) -> String {
    if name.starts_with("arn:") {
        name.to_string()
    } else {
        arn(service, &format!("{kind}{name}"))
    }
}

fn table(name: &str) -> String {
    named("dynamodb", "table/", name)
}

/// A queue URL (`…/<account>/<name>`) → its ARN.
fn queue(url: &str) -> String {
    let mut parts = url.trim_end_matches('/').rsplit('/');
    let name = parts.next().unwrap_or(url);
    let account = parts.next().unwrap_or(bus::events::ACCOUNT);
    format!("arn:aws:sqs:{}:{account}:{name}", region())
}

fn secret(id: &str) -> String {
    named("secretsmanager", "secret:", id)
}

fn function(name: &str) -> String {
    named("lambda", "function:", name)
}

/// `execute-api` ARN of a connection: the API id and stage from the management endpoint
/// this process posts to (`https://<api>.execute-api.<region>.amazonaws.com/<stage>`; a local
/// endpoint's API is `local`, as the local deployed shape resolves the template).
fn connection(method: &str, id: &str) -> String {
    let endpoint = std::env::var("WS_MANAGEMENT_ENDPOINT").unwrap_or_default();
    let url = url::Url::parse(&endpoint).ok();
    let host = url.as_ref().and_then(|u| u.host_str().map(str::to_owned));
    let api = host
        .as_deref()
        .filter(|h| h.contains(".execute-api."))
        .and_then(|h| h.split('.').next())
        .unwrap_or("local")
        .to_string();
    let stage = url
        .as_ref()
        .and_then(|u| u.path_segments()?.next().map(str::to_owned))
        .unwrap_or_default();
    arn(
        "execute-api",
        &format!("{api}/{stage}/{method}/@connections/{id}"),
    )
}

/// The IAM requests of one call (`service` as the SDK names it, `op` its operation).
pub fn requests(service: &str, op: &str, input: Input<'_>) -> Vec<(String, String)> {
    let one = |action: String, resource: String| vec![(action, resource)];
    match service {
        "DynamoDB" => dynamodb(op, input),
        "DynamoDB Streams" => {
            use aws_sdk_dynamodbstreams::operation::{
                describe_stream::DescribeStreamInput, get_records::GetRecordsInput,
                get_shard_iterator::GetShardIteratorInput,
            };
            let stream = if let Some(i) = input.downcast_ref::<DescribeStreamInput>() {
                i.stream_arn.clone()
            } else if let Some(i) = input.downcast_ref::<GetShardIteratorInput>() {
                i.stream_arn.clone()
            } else if input.downcast_ref::<GetRecordsInput>().is_some() {
                // The iterator stands for the stream; AWS authorises it on the stream's ARN,
                // which the iterator does not name: the table's streams.
                Some(arn("dynamodb", "table/*/stream/*"))
            } else {
                None
            };
            one(
                format!("dynamodb:{op}"),
                stream.unwrap_or_else(|| "*".into()),
            )
        }
        "SQS" => {
            use aws_sdk_sqs::operation::{
                change_message_visibility::ChangeMessageVisibilityInput,
                change_message_visibility_batch::ChangeMessageVisibilityBatchInput,
                delete_message::DeleteMessageInput, delete_message_batch::DeleteMessageBatchInput,
                get_queue_attributes::GetQueueAttributesInput, get_queue_url::GetQueueUrlInput,
                receive_message::ReceiveMessageInput, send_message::SendMessageInput,
                send_message_batch::SendMessageBatchInput,
                set_queue_attributes::SetQueueAttributesInput,
            };
            let action = match op {
                "SendMessageBatch" => "SendMessage",
                "DeleteMessageBatch" => "DeleteMessage",
                "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
                other => other,
            };
            let url: Option<String> = field_of!(
                input,
                queue_url: SendMessageInput,
                SendMessageBatchInput,
                ReceiveMessageInput,
                DeleteMessageInput,
                DeleteMessageBatchInput,
                ChangeMessageVisibilityInput,
                ChangeMessageVisibilityBatchInput,
                GetQueueAttributesInput,
                SetQueueAttributesInput,
            );
            let resource = match url {
                Some(u) => queue(&u),
                None => match input.downcast_ref::<GetQueueUrlInput>() {
                    Some(i) => queue(i.queue_name.as_deref().unwrap_or("*")),
                    None => "*".into(),
                },
            };
            one(format!("sqs:{action}"), resource)
        }
        "Secrets Manager" => {
            use aws_sdk_secretsmanager::operation::{
                create_secret::CreateSecretInput, delete_secret::DeleteSecretInput,
                describe_secret::DescribeSecretInput, get_secret_value::GetSecretValueInput,
                put_secret_value::PutSecretValueInput, update_secret::UpdateSecretInput,
            };
            let id: Option<String> = field_of!(
                input,
                secret_id: GetSecretValueInput,
                PutSecretValueInput,
                DescribeSecretInput,
                UpdateSecretInput,
                DeleteSecretInput,
            )
            .or_else(|| field_of!(input, name: CreateSecretInput));
            one(
                format!("secretsmanager:{op}"),
                id.map_or_else(|| "*".into(), |id| secret(&id)),
            )
        }
        "Lambda" => {
            use aws_sdk_lambda::operation::{
                invoke::InvokeInput, invoke_with_response_stream::InvokeWithResponseStreamInput,
            };
            let name: Option<String> = field_of!(
                input,
                function_name: InvokeInput,
                InvokeWithResponseStreamInput
            );
            let action = match op {
                "Invoke" | "InvokeWithResponseStream" => "InvokeFunction",
                other => other,
            };
            one(
                format!("lambda:{action}"),
                name.map_or_else(|| "*".into(), |n| function(&n)),
            )
        }
        "ApiGatewayManagementApi" => {
            use aws_sdk_apigatewaymanagement::operation::{
                delete_connection::DeleteConnectionInput, get_connection::GetConnectionInput,
                post_to_connection::PostToConnectionInput,
            };
            let (method, id) = if let Some(i) = input.downcast_ref::<PostToConnectionInput>() {
                ("POST", i.connection_id.clone())
            } else if let Some(i) = input.downcast_ref::<GetConnectionInput>() {
                ("GET", i.connection_id.clone())
            } else if let Some(i) = input.downcast_ref::<DeleteConnectionInput>() {
                ("DELETE", i.connection_id.clone())
            } else {
                ("*", None)
            };
            one(
                "execute-api:ManageConnections".into(),
                connection(method, id.as_deref().unwrap_or("*")),
            )
        }
        other => one(
            format!("{}:{op}", other.to_ascii_lowercase().replace(' ', "")),
            "*".into(),
        ),
    }
}

fn dynamodb(op: &str, input: Input<'_>) -> Vec<(String, String)> {
    use aws_sdk_dynamodb::operation::{
        batch_get_item::BatchGetItemInput, batch_write_item::BatchWriteItemInput,
        delete_item::DeleteItemInput, describe_table::DescribeTableInput, get_item::GetItemInput,
        put_item::PutItemInput, query::QueryInput, scan::ScanInput,
        transact_get_items::TransactGetItemsInput, transact_write_items::TransactWriteItemsInput,
        update_item::UpdateItemInput,
    };
    let action = format!("dynamodb:{op}");
    let one = |t: Option<&str>| vec![(action.clone(), t.map_or_else(|| "*".into(), table))];
    let named: Option<String> = field_of!(
        input,
        table_name: GetItemInput,
        PutItemInput,
        UpdateItemInput,
        DeleteItemInput,
        DescribeTableInput,
        ScanInput,
    );
    if let Some(t) = named {
        one(Some(&t))
    } else if let Some(i) = input.downcast_ref::<QueryInput>() {
        let t = i
            .table_name
            .as_deref()
            .map(table)
            .unwrap_or_else(|| "*".into());
        let r = match &i.index_name {
            Some(ix) => format!("{t}/index/{ix}"),
            None => t,
        };
        vec![(action, r)]
    } else if let Some(i) = input.downcast_ref::<BatchGetItemInput>() {
        let tables = i.request_items.iter().flat_map(|m| m.keys());
        tables.map(|t| (action.clone(), table(t))).collect()
    } else if let Some(i) = input.downcast_ref::<BatchWriteItemInput>() {
        let tables = i.request_items.iter().flat_map(|m| m.keys());
        tables.map(|t| (action.clone(), table(t))).collect()
    } else if let Some(i) = input.downcast_ref::<TransactWriteItemsInput>() {
        let mut out = Vec::new();
        for t in i.transact_items.as_deref().unwrap_or_default() {
            let (act, name) = if let Some(u) = &t.update {
                ("UpdateItem", u.table_name.as_str())
            } else if let Some(p) = &t.put {
                ("PutItem", p.table_name.as_str())
            } else if let Some(d) = &t.delete {
                ("DeleteItem", d.table_name.as_str())
            } else if let Some(c) = &t.condition_check {
                ("ConditionCheckItem", c.table_name.as_str())
            } else {
                continue;
            };
            out.push((format!("dynamodb:{act}"), table(name)));
        }
        out
    } else if let Some(i) = input.downcast_ref::<TransactGetItemsInput>() {
        let gets = i.transact_items.as_deref().unwrap_or_default();
        gets.iter()
            .filter_map(|t| t.get.as_ref())
            .map(|g| ("dynamodb:GetItem".to_string(), table(&g.table_name)))
            .collect()
    } else {
        one(None)
    }
}

/// Note one call's IAM requests (kept once each: what was asked, not how often).
pub fn note(service: &str, op: &str, input: Input<'_>) {
    let asked = requests(service, op, input);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    seen.extend(asked);
}

/// This process's record: its Lambda function's name (none in the test host) and every
/// (action, resource) asked so far.
pub fn record() -> serde_json::Value {
    let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    serde_json::json!({
        "function": std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok(),
        "calls": seen.iter().map(|(a, r)| serde_json::json!({"action": a, "resource": r})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_runtime_api::client::interceptors::context::Input as SdkInput;

    #[test]
    fn a_transaction_asks_for_each_items_own_action_and_an_invoke_for_invoke_function() {
        use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};
        let put = Put::builder()
            .table_name("p-state")
            .item(
                "scope",
                aws_sdk_dynamodb::types::AttributeValue::S("agent".into()),
            )
            .build()
            .unwrap();
        let update = Update::builder()
            .table_name("p-checkpoints")
            .key("id", aws_sdk_dynamodb::types::AttributeValue::S("x".into()))
            .update_expression("SET a = :a")
            .build()
            .unwrap();
        let tx =
            aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput::builder()
                .transact_items(TransactWriteItem::builder().put(put).build())
                .transact_items(TransactWriteItem::builder().update(update).build())
                .build()
                .unwrap();
        let asked = requests("DynamoDB", "TransactWriteItems", &SdkInput::erase(tx));
        let acct = bus::events::ACCOUNT;
        assert_eq!(
            asked,
            [
                (
                    "dynamodb:PutItem".to_string(),
                    format!("arn:aws:dynamodb:{}:{acct}:table/p-state", region())
                ),
                (
                    "dynamodb:UpdateItem".to_string(),
                    format!("arn:aws:dynamodb:{}:{acct}:table/p-checkpoints", region())
                ),
            ]
        );
        let invoke = aws_sdk_lambda::operation::invoke_with_response_stream::InvokeWithResponseStreamInput::builder()
            .function_name("p-tools")
            .build()
            .unwrap();
        assert_eq!(
            requests(
                "Lambda",
                "InvokeWithResponseStream",
                &SdkInput::erase(invoke)
            ),
            [(
                "lambda:InvokeFunction".to_string(),
                format!("arn:aws:lambda:{}:{acct}:function:p-tools", region())
            )]
        );
        let scan = aws_sdk_dynamodb::operation::scan::ScanInput::builder()
            .table_name("p-registry")
            .build()
            .unwrap();
        assert_eq!(
            requests("DynamoDB", "Scan", &SdkInput::erase(scan)),
            [(
                "dynamodb:Scan".to_string(),
                format!("arn:aws:dynamodb:{}:{acct}:table/p-registry", region())
            )]
        );
        let created =
            aws_sdk_secretsmanager::operation::create_secret::CreateSecretInput::builder()
                .name("p-secrets/providers/x")
                .build()
                .unwrap();
        assert_eq!(
            requests("Secrets Manager", "CreateSecret", &SdkInput::erase(created)),
            [(
                "secretsmanager:CreateSecret".to_string(),
                format!(
                    "arn:aws:secretsmanager:{}:{acct}:secret:p-secrets/providers/x",
                    region()
                )
            )]
        );
        let send = aws_sdk_sqs::operation::send_message::SendMessageInput::builder()
            .queue_url("http://localhost:4566/000000000000/p-turn-steps.fifo")
            .message_body("{}")
            .build()
            .unwrap();
        assert_eq!(
            requests("SQS", "SendMessage", &SdkInput::erase(send)),
            [(
                "sqs:SendMessage".to_string(),
                format!("arn:aws:sqs:{}:{acct}:p-turn-steps.fifo", region())
            )]
        );
    }
}
