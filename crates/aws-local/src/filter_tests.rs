//! The Lambda guide's rule table (invocation-eventfiltering.html, "Filter rule syntax"), each
//! example with a record it passes and one it drops, then the DynamoDB record shape the
//! stream router's filters see, and the refusals.

use super::*;
use serde_json::json;

fn passes(pattern: Value, record: Value) -> bool {
    FilterCriteria::parse(&[pattern.to_string()])
        .unwrap()
        .passes(&record)
}

#[test]
fn the_guides_rule_table() {
    // (rule, a record it passes, a record it drops)
    let table = [
        // Null
        (
            json!({"UserID": [null]}),
            json!({"UserID": null}),
            json!({"UserID": "u1"}),
        ),
        // Empty
        (
            json!({"LastName": [""]}),
            json!({"LastName": ""}),
            json!({"LastName": "Li"}),
        ),
        // Equals
        (
            json!({"Name": ["Alice"]}),
            json!({"Name": "Alice"}),
            json!({"Name": "alice"}),
        ),
        // Equals (ignore case)
        (
            json!({"Name": [{"equals-ignore-case": "alice"}]}),
            json!({"Name": "ALICE"}),
            json!({"Name": "Alicia"}),
        ),
        // And
        (
            json!({"Location": ["New York"], "Day": ["Monday"]}),
            json!({"Location": "New York", "Day": "Monday"}),
            json!({"Location": "New York", "Day": "Tuesday"}),
        ),
        // Or
        (
            json!({"PaymentType": ["Credit", "Debit"]}),
            json!({"PaymentType": "Debit"}),
            json!({"PaymentType": "Cash"}),
        ),
        // Or (multiple fields)
        (
            json!({"$or": [{"Location": ["New York"]}, {"Day": ["Monday"]}]}),
            json!({"Location": "Boston", "Day": "Monday"}),
            json!({"Location": "Boston", "Day": "Sunday"}),
        ),
        // Not
        (
            json!({"Weather": [{"anything-but": ["Raining"]}]}),
            json!({"Weather": "Sunny"}),
            json!({"Weather": "Raining"}),
        ),
        // Numeric (equals)
        (
            json!({"Price": [{"numeric": ["=", 100]}]}),
            json!({"Price": 100.0}),
            json!({"Price": 101}),
        ),
        // Numeric (range)
        (
            json!({"Price": [{"numeric": [">", 10, "<=", 20]}]}),
            json!({"Price": 20}),
            json!({"Price": 10}),
        ),
        // Exists
        (
            json!({"ProductName": [{"exists": true}]}),
            json!({"ProductName": "x"}),
            json!({"Product": "x"}),
        ),
        // Does not exist
        (
            json!({"ProductName": [{"exists": false}]}),
            json!({"Product": "x"}),
            json!({"ProductName": "x"}),
        ),
        // Begins with
        (
            json!({"Region": [{"prefix": "us-"}]}),
            json!({"Region": "us-east-1"}),
            json!({"Region": "eu-west-1"}),
        ),
        // Ends with
        (
            json!({"FileName": [{"suffix": ".png"}]}),
            json!({"FileName": "cat.png"}),
            json!({"FileName": "cat.jpg"}),
        ),
    ];
    for (rule, yes, no) in table {
        assert!(
            passes(rule.clone(), yes.clone()),
            "{rule} should pass {yes}"
        );
        assert!(!passes(rule.clone(), no.clone()), "{rule} should drop {no}");
    }
}

#[test]
fn a_list_in_the_record_matches_if_one_element_does() {
    let rule = json!({"tags": ["red"], "items": {"sku": [{"prefix": "A-"}]}});
    assert!(passes(
        rule.clone(),
        json!({"tags": ["blue", "red"], "items": [{"sku": "B-1"}, {"sku": "A-7"}]})
    ));
    assert!(!passes(
        rule,
        json!({"tags": ["blue"], "items": [{"sku": "A-7"}]})
    ));
}

#[test]
fn anything_but_and_other_rules_need_the_field() {
    for rule in [
        json!({"s": [{"anything-but": "x"}]}),
        json!({"s": [{"anything-but": {"prefix": "$"}}]}),
        json!({"s": [{"numeric": [">", 0]}]}),
        json!({"s": [null]}),
    ] {
        assert!(!passes(rule.clone(), json!({"other": 1})), "{rule}");
    }
    // Present, of another type: anything but the string named.
    assert!(passes(
        json!({"s": [{"anything-but": {"prefix": "init"}}]}),
        json!({"s": 12})
    ));
    assert!(passes(
        json!({"s": [{"anything-but": "initializing"}]}),
        json!({"s": null})
    ));
    // A nested field that is not there at all still satisfies `exists: false`.
    assert!(passes(json!({"a": {"b": [{"exists": false}]}}), json!({})));
}

#[test]
fn filters_are_alternatives_and_none_passes_everything() {
    let f = FilterCriteria::parse(&[
        json!({"k": ["a"]}).to_string(),
        json!({"k": ["b"]}).to_string(),
    ])
    .unwrap();
    assert!(f.passes(&json!({"k": "b"})));
    assert!(!f.passes(&json!({"k": "c"})));
    let none = FilterCriteria::parse::<String>(&[]).unwrap();
    assert!(none.is_empty() && none.passes(&json!({"anything": 1})));
}

/// The shape of a record on the state table's stream (`bus::events::dynamodb_event`), and
/// the router's filters in `infra/template.yaml`: the scopes state triggers watch pass; stored
/// stream items (pushed by their writer), the rest of the engine's `$` scopes and unwatched
/// scopes do not.
#[test]
fn dynamodb_records_by_key() {
    let record = |scope: &str, key: &str| {
        json!({
            "eventName": "MODIFY",
            "eventSource": "aws:dynamodb",
            "dynamodb": {
                "Keys": {"scope": {"S": scope}, "key": {"S": key}},
                "NewImage": {"scope": {"S": scope}, "key": {"S": key}, "value": {"S": "{}"}},
                "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        })
    };
    let f = FilterCriteria::parse(&[
        r#"{"dynamodb": {"Keys": {"scope": {"S": ["approvals"]}}}}"#,
        r#"{"dynamodb": {"Keys": {"scope": {"S": ["agent"]}, "key": {"S": [{"suffix": "/turn_state"}]}}, "NewImage": {"filled": {"SS": ["awaiting_approval"]}}}}"#,
        r#"{"dynamodb": {"Keys": {"scope": {"S": ["agent"]}, "key": {"S": [{"suffix": "/turn_state"}]}}, "OldImage": {"filled": {"SS": ["awaiting_approval"]}}}}"#,
    ])
    .unwrap();
    assert!(!f.passes(&record("$stream:agent::events", "s1")));
    assert!(f.passes(&record("approvals", "s1/c1")));
    // A turn record: only a save with parked calls before or after it (the `filled` set the
    // state adapter writes; `bus::events` builds the images the same way).
    let turn = |old: Value, new: Value| {
        let change = bus::state::ChangeRecord::updated("agent", "session/s1/turn_state", old, new);
        bus::events::dynamodb_event(&[change], "t")["Records"][0].clone()
    };
    let parked = json!({"state": "function_awaiting_approval", "awaiting_approval": [{"function_call_id": "c1"}]});
    let running = json!({"state": "function_execute", "awaiting_approval": null, "work": {"n": 1}});
    let emptied = json!({"state": "steering_check", "awaiting_approval": []});
    assert!(f.passes(&turn(running.clone(), parked.clone())));
    assert!(f.passes(&turn(parked.clone(), emptied.clone())));
    assert!(!f.passes(&turn(running.clone(), emptied.clone())));
    assert!(!f.passes(&turn(emptied, running)));
    assert!(!f.passes(&record("agent", "session/s1/turn_state")));
    assert!(!f.passes(&record("agent", "session/s1/checkpoint")));
    assert!(!f.passes(&record("session-entries", "s1/0001")));
    assert!(!f.passes(&record("$subscription", "c1")));
}

#[test]
fn bad_patterns_are_refused_with_the_filter_the_field_and_the_rule() {
    let err = |p: &str| {
        FilterCriteria::parse(&[r#"{"a": ["ok"]}"#, p])
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err("{"),
        "filter 1: not JSON: EOF while parsing an object at line 1 column 1"
    );
    assert_eq!(
        err("[1]"),
        "filter 1: at the top: a pattern is a JSON object"
    );
    assert!(err(r#"{"a": "x"}"#).starts_with("filter 1: at a: a field's rules are a list"));
    assert!(
        err(r#"{"a": {"b": [{"wildcard": "x*"}]}}"#)
            .starts_with("filter 1: at a.b: unknown or unsupported operator `wildcard`"),
    );
    assert!(err(r#"{"a": [{"prefix": 1}]}"#).contains("`prefix` takes a string, got a number"));
    assert!(err(r#"{"a": [{"numeric": [">", "x"]}]}"#).contains("compares with numbers"));
    assert!(err(r#"{"a": [{"numeric": [">", 1, ">", 2]}]}"#).contains("is a range"));
    assert!(err(r#"{"a": [{"exists": "yes"}]}"#).contains("`exists` takes true or false"));
    assert!(err(r#"{"a": [{"prefix": "x", "suffix": "y"}]}"#).contains("exactly one operator"));
    assert!(err(r#"{"$or": [{"a": ["x"]}]}"#).contains("at least two patterns"));
    assert!(err(r#"{"a": {}}"#).contains("an empty object"));
    assert!(err(r#"{"a": []}"#).contains("rule list is empty"));
    let deep = format!("{}[1]{}", r#"{"a":"#.repeat(40), "}".repeat(40));
    assert!(err(&deep).contains("nested more than 32 levels"));
    let long = format!(r#"{{"a": ["{}"]}}"#, "x".repeat(MAX_PATTERN_BYTES));
    assert!(err(&long).starts_with("filter 1: 4107 bytes"));
    let many: Vec<String> = (0..11).map(|i| format!(r#"{{"a": [{i}]}}"#)).collect();
    assert_eq!(
        FilterCriteria::parse(&many).unwrap_err().to_string(),
        "11 filters: a mapping takes at most 10"
    );
}
