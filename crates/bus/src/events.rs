//! Lambda event JSON for the emulated event-source mappings, in the shapes AWS documents:
//! SQS batches (`aws:sqs`) and DynamoDB stream batches (`aws:dynamodb`), plus the partial
//! batch failure answer (`ReportBatchItemFailures`). Tests deserialize every event with
//! `aws_lambda_events` so what a function sees here is what it sees in AWS.

use serde_json::{Map, Value, json};

use crate::queue::Delivery;
use crate::state::{ChangeKind, ChangeRecord};

pub const REGION: &str = "us-east-1";
pub const ACCOUNT: &str = "000000000000";

pub fn queue_arn(queue: &str) -> String {
    format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{queue}")
}

pub fn stream_arn(table: &str) -> String {
    format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}/stream/2026-01-01T00:00:00.000")
}

/// An SQS event with one record per delivery; `messageId` is the bus message id.
pub fn sqs_event(deliveries: &[Delivery], queue: &str) -> Value {
    let records: Vec<Value> = deliveries
        .iter()
        .map(|d| {
            let body = serde_json::to_string(&d.message).unwrap_or_default();
            let mut attributes = Map::new();
            attributes.insert(
                "ApproximateReceiveCount".into(),
                json!(d.attempt.to_string()),
            );
            attributes.insert(
                "SentTimestamp".into(),
                json!(d.message.enqueued_at_ms.to_string()),
            );
            attributes.insert("SenderId".into(), json!("engine-gateway"));
            attributes.insert(
                "ApproximateFirstReceiveTimestamp".into(),
                json!(bus_telemetry::trace::now_ms().to_string()),
            );
            if let Some(g) = &d.message.group {
                attributes.insert("MessageGroupId".into(), json!(g));
                attributes.insert(
                    "MessageDeduplicationId".into(),
                    json!(
                        d.message
                            .deduplication_id
                            .clone()
                            .unwrap_or_else(|| d.message.id.clone())
                    ),
                );
            }
            json!({
                "messageId": d.message.id,
                "receiptHandle": d.receipt,
                "body": body,
                "md5OfBody": md5_hex(&body),
                "attributes": attributes,
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn(queue),
                "awsRegion": REGION,
            })
        })
        .collect();
    json!({ "Records": records })
}

/// The MD5 of the body, as SQS reports it.
fn md5_hex(s: &str) -> String {
    use md5::{Digest, Md5};
    crate::hash::hex(&Md5::digest(s.as_bytes()))
}

fn image(scope: &str, key: &str, value: &Value, tp: Option<&str>, bg: Option<&str>) -> Value {
    let mut m = Map::new();
    m.insert("scope".into(), json!({"S": scope}));
    m.insert("key".into(), json!({"S": key}));
    m.insert("value".into(), json!({"S": value.to_string()}));
    let filled = crate::state::filled_fields(value);
    if !filled.is_empty() {
        m.insert(
            crate::state::FILLED_FIELDS_ATTRIBUTE.into(),
            json!({ "SS": filled }),
        );
    }
    if let Some(tp) = tp {
        m.insert("tp".into(), json!({"S": tp}));
    }
    if let Some(bg) = bg {
        m.insert("bg".into(), json!({"S": bg}));
    }
    Value::Object(m)
}

/// The sequence number a mapping reports failures by.
pub fn sequence_number(r: &ChangeRecord) -> String {
    match r.position.as_deref().and_then(|p| p.split_once('\u{1}')) {
        Some((_, seq)) => seq.to_string(),
        None => format!("{:021}", r.seq),
    }
}

/// A DynamoDB stream event (`NEW_AND_OLD_IMAGES`) for the state table.
pub fn dynamodb_event(records: &[ChangeRecord], table: &str) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|r| {
            let seq = sequence_number(r);
            let mut dynamodb = Map::new();
            dynamodb.insert("ApproximateCreationDateTime".into(), json!(bus_telemetry::trace::now_ms() / 1000));
            dynamodb.insert("Keys".into(), json!({"scope": {"S": r.scope}, "key": {"S": r.key}}));
            if let Some(v) = &r.new_value {
                dynamodb.insert("NewImage".into(), image(&r.scope, &r.key, v, r.traceparent.as_deref(), r.baggage.as_deref()));
            }
            if let Some(v) = &r.old_value {
                dynamodb.insert("OldImage".into(), image(&r.scope, &r.key, v, None, None));
            }
            dynamodb.insert("SequenceNumber".into(), json!(seq));
            dynamodb.insert("SizeBytes".into(), json!(r.new_value.as_ref().map(|v| v.to_string().len()).unwrap_or(0) + 32));
            dynamodb.insert("StreamViewType".into(), json!("NEW_AND_OLD_IMAGES"));
            json!({
                "eventID": format!("{:032x}", crate::hash::fnv(&seq)),
                "eventName": match r.kind { ChangeKind::Created => "INSERT", ChangeKind::Updated => "MODIFY", ChangeKind::Deleted => "REMOVE" },
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": REGION,
                "dynamodb": dynamodb,
                "eventSourceARN": stream_arn(table),
            })
        })
        .collect();
    json!({ "Records": records })
}

/// `{"batchItemFailures":[{"itemIdentifier":…}]}` → the identifiers. Anything else (no
/// field) means the whole batch succeeded, as AWS reads it.
pub fn batch_item_failures(response: &Value) -> Vec<String> {
    response
        .get("batchItemFailures")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| {
                    i.get("itemIdentifier")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::QueueMessage;

    fn delivery(id: &str, group: Option<&str>) -> Delivery {
        Delivery {
            message: QueueMessage {
                id: id.into(),
                queue: "turn-steps".into(),
                group: group.map(str::to_owned),
                function_id: Some("turn::provisioning".into()),
                data: json!({"session_id": "s1"}),
                traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
                baggage: None,
                deduplication_id: None,
                attempts: 0,
                enqueued_at_ms: 1,
                last_error: None,
            },
            receipt: format!("r-{id}"),
            attempt: 2,
        }
    }

    #[test]
    fn sqs_events_deserialize_as_aws_lambda_events() {
        let ev = sqs_event(
            &[delivery("m1", Some("s1")), delivery("m2", None)],
            "turn-steps",
        );
        let typed: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_value(ev.clone()).expect("SqsEvent");
        assert_eq!(typed.records.len(), 2);
        let r = &typed.records[0];
        assert_eq!(r.message_id.as_deref(), Some("m1"));
        assert_eq!(r.event_source.as_deref(), Some("aws:sqs"));
        assert_eq!(
            r.attributes.get("MessageGroupId").map(String::as_str),
            Some("s1")
        );
        assert_eq!(
            r.attributes
                .get("ApproximateReceiveCount")
                .map(String::as_str),
            Some("2")
        );
        let body: QueueMessage = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
        assert_eq!(body.function_id.as_deref(), Some("turn::provisioning"));
        // Round trip through the typed event keeps every field we send.
        assert_eq!(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
        let back = serde_json::to_value(&typed).unwrap();
        assert_eq!(
            back["Records"][0]["receiptHandle"],
            ev["Records"][0]["receiptHandle"]
        );
        assert_eq!(
            back["Records"][0]["eventSourceARN"],
            ev["Records"][0]["eventSourceARN"]
        );
    }

    #[test]
    fn dynamodb_events_deserialize_as_aws_lambda_events() {
        let rec = ChangeRecord {
            seq: 7,
            position: None,
            kind: ChangeKind::Updated,
            scope: "approvals".into(),
            key: "s1/c1".into(),
            old_value: Some(json!({"decision": null})),
            new_value: Some(json!({"decision": "allow"})),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            baggage: Some("iii.session.id=s1".into()),
        };
        let ev = dynamodb_event(&[rec], "harness-state");
        let typed: aws_lambda_events::event::dynamodb::Event =
            serde_json::from_value(ev.clone()).expect("dynamodb Event");
        assert_eq!(typed.records.len(), 1);
        let r = &typed.records[0];
        assert_eq!(r.event_name, "MODIFY");
        assert_eq!(
            r.change.sequence_number.as_deref(),
            Some("000000000000000000007")
        );
        assert_eq!(
            ev["Records"][0]["dynamodb"]["NewImage"]["value"]["S"],
            "{\"decision\":\"allow\"}"
        );
        assert_eq!(
            ev["Records"][0]["dynamodb"]["OldImage"]["value"]["S"],
            "{\"decision\":null}"
        );
    }

    #[test]
    fn committed_fixtures_round_trip() {
        let sqs: Value =
            serde_json::from_str(include_str!("../tests/fixtures/sqs-fifo-event.json")).unwrap();
        let typed: aws_lambda_events::event::sqs::SqsEvent = serde_json::from_value(sqs).unwrap();
        assert_eq!(
            typed.records[0]
                .attributes
                .get("MessageGroupId")
                .map(String::as_str),
            Some("session-1")
        );
        let ddb: Value =
            serde_json::from_str(include_str!("../tests/fixtures/dynamodb-stream-event.json"))
                .unwrap();
        let typed: aws_lambda_events::event::dynamodb::Event = serde_json::from_value(ddb).unwrap();
        assert_eq!(typed.records[0].event_name, "INSERT");
        let fails: Value =
            serde_json::from_str(include_str!("../tests/fixtures/sqs-batch-response.json"))
                .unwrap();
        assert_eq!(
            batch_item_failures(&fails),
            vec!["059f36b4-87a3-44ab-83d2-661975830a7d"]
        );
        let typed: aws_lambda_events::event::sqs::SqsBatchResponse =
            serde_json::from_value(fails).unwrap();
        assert_eq!(typed.batch_item_failures.len(), 1);
    }
}
