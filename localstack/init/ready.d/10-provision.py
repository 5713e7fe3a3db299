"""LocalStack init hook (Docker): create the harness resources listed in resources.json.

Runs inside the LocalStack container when it is ready. Idempotent, like
`engine-gateway provision`, which is what resources.json describes.
"""
import json

import boto3

MANIFEST = "/etc/localstack/harness/resources.json"
KW = dict(endpoint_url="http://localhost:4566", region_name="us-east-1",
          aws_access_key_id="test", aws_secret_access_key="test")

m = json.load(open(MANIFEST))
ddb, sqs, sm = boto3.client("dynamodb", **KW), boto3.client("sqs", **KW), boto3.client("secretsmanager", **KW)

existing = set(ddb.list_tables()["TableNames"])
for t in m["tables"]:
    if t["name"] in existing:
        continue
    keys = [(t["hash_key"], "HASH")] + ([(t["range_key"], "RANGE")] if t["range_key"] else [])
    args = dict(TableName=t["name"], BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k, _ in keys],
                KeySchema=[{"AttributeName": k, "KeyType": kt} for k, kt in keys])
    if t["stream"]:
        args["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}
    ddb.create_table(**args)
    if t.get("expires"):
        ddb.get_waiter("table_exists").wait(TableName=t["name"])
        ddb.update_time_to_live(TableName=t["name"], TimeToLiveSpecification={
            "AttributeName": t["expires"], "Enabled": True})

for q in m["queues"]:
    fifo = q["type"] == "fifo"
    base = {"FifoQueue": "true"} if fifo else {}
    dlq = sqs.create_queue(QueueName=q["dlq_name"], Attributes={**base, "MessageRetentionPeriod": "1209600"})
    arn = sqs.get_queue_attributes(QueueUrl=dlq["QueueUrl"], AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.create_queue(QueueName=q["sqs_name"], Attributes={
        **base,
        "VisibilityTimeout": str(max(1, -(-q["visibility_timeout_ms"] // 1000))),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": q["max_receive_count"]}),
    })

for name in m["secrets"]:
    try:
        sm.create_secret(Name=name, SecretString="{}")
    except sm.exceptions.ResourceExistsException:
        pass
print("harness resources ready:", len(m["tables"]), "tables,", len(m["queues"]), "queues,", len(m["secrets"]), "secrets")
