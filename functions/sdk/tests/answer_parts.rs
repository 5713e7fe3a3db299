//! The remote client through an engine that answers in parts, as the deployed WebSocket API
//! does for an answer over 128 KB (`invocationresultpart`, PROTOCOL.md). The engine here is a
//! socket that plays the router's side of a call, so every hostile part can be sent; the
//! real router's parts reach this client in `tests/deployed/large.rs`.

use futures_util::{SinkExt, StreamExt};
use harness_sdk::{RemoteOptions, connect_client};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// The parts (as `index, count, text` objects) that `case` answers the call `id` with.
fn parts_for(case: &str, id: &str) -> Vec<Value> {
    let whole = |id: &str| {
        json!({"type": "invocationresult", "invocation_id": id, "function_id": "big::read",
               "result": {"text": "\"quoted\\\" é ".repeat(30_000)}})
        .to_string()
    };
    let part = |index: Value, count: Value, text: Value| json!({"index": index, "count": count, "text": text});
    match case {
        "three, the last first" => {
            let w = whole(id);
            let cut = |a: usize, b: usize| w.get(a..b).map(str::to_owned).unwrap_or_default();
            // Cut on character boundaries (the text is not all ASCII).
            let mut at: Vec<usize> = [w.len() / 3, 2 * w.len() / 3].to_vec();
            for a in &mut at {
                while !w.is_char_boundary(*a) {
                    *a += 1;
                }
            }
            vec![
                part(json!(2), json!(3), json!(cut(at[1], w.len()))),
                part(json!(0), json!(3), json!(cut(0, at[0]))),
                part(json!(1), json!(3), json!(cut(at[0], at[1]))),
            ]
        }
        "a count of 0" => vec![part(json!(0), json!(0), json!(whole(id)))],
        "a count over 128" => vec![part(json!(0), json!(129), json!(whole(id)))],
        "an index past the count" => vec![part(json!(3), json!(2), json!(whole(id)))],
        "an index that is text" => vec![part(json!("0"), json!(1), json!(whole(id)))],
        "text that is a number" => vec![part(json!(0), json!(1), json!(12))],
        "a count that changes" => vec![
            part(json!(0), json!(3), json!("{")),
            part(json!(1), json!(2), json!("}")),
        ],
        "a part sent twice" => vec![
            part(json!(0), json!(2), json!("{")),
            part(json!(0), json!(2), json!("{")),
        ],
        "parts that join into no JSON" => vec![
            part(json!(0), json!(2), json!("{\"type\":")),
            part(json!(1), json!(2), json!("nothing")),
        ],
        "another call's answer" => vec![part(json!(0), json!(1), json!(whole("someone-else")))],
        "another message" => vec![part(json!(0), json!(1), json!("{\"type\":\"ping\"}"))],
        other => panic!("no case {other}"),
    }
}

/// Plays the router: answers `ping`, and each call (which must ask for parts) with the parts
/// its `data.case` names.
async fn engine(listener: TcpListener) {
    while let Ok((socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(socket).await else {
                return;
            };
            while let Some(Ok(Message::Text(t))) = ws.next().await {
                let m: Value = serde_json::from_str(&t).unwrap();
                let reply: Vec<Value> = match m["type"].as_str() {
                    Some("ping") => vec![json!({"type": "pong"})],
                    Some("invokefunction") if m["invocation_id"].is_string() => {
                        let id = m["invocation_id"].as_str().unwrap();
                        if m["accept_parts"] != true {
                            vec![
                                json!({"type": "invocationresult", "invocation_id": id, "function_id": m["function_id"],
                                        "error": {"code": "payload_too_large", "message": "the call did not ask for parts"}}),
                            ]
                        } else {
                            parts_for(m["data"]["case"].as_str().unwrap(), id)
                                .into_iter()
                                .map(|mut p| {
                                    p["type"] = json!("invocationresultpart");
                                    p["invocation_id"] = json!(id);
                                    p
                                })
                                .collect()
                        }
                    }
                    _ => vec![],
                };
                for r in reply {
                    if ws.send(Message::text(r.to_string())).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_parts_is_joined_and_a_part_that_cannot_be_one_fails_its_call_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(engine(listener));
    let mut client = connect_client("parts", RemoteOptions::new(&url)).await;
    let ctx = client.ctx();
    let call = |case: &'static str| {
        let ctx = ctx.clone();
        async move {
            let started = Instant::now();
            // The call's own timeout is the client's default, 30 s.
            let r = ctx.trigger("big::read", json!({"case": case})).await;
            (r, started.elapsed())
        }
    };

    let (whole, _) = call("three, the last first").await;
    let whole = whole.expect("three parts in any order join into the answer");
    assert_eq!(
        whole["text"].as_str().unwrap().len(),
        "\"quoted\\\" é ".len() * 30_000
    );

    for (case, says) in [
        ("a count of 0", "a part's count 0 is not from 1 to 128"),
        (
            "a count over 128",
            "a part's count 129 is not from 1 to 128",
        ),
        (
            "an index past the count",
            "a part's index 3 is not from 0 to 1",
        ),
        ("an index that is text", "a part is malformed"),
        ("text that is a number", "a part is malformed"),
        (
            "a count that changes",
            "part 1 says 2 parts where an earlier one said 3",
        ),
        ("a part sent twice", "part 0 came twice"),
        (
            "parts that join into no JSON",
            "do not join into this call's invocationresult",
        ),
        (
            "another call's answer",
            "do not join into this call's invocationresult",
        ),
        (
            "another message",
            "do not join into this call's invocationresult",
        ),
    ] {
        let (r, took) = call(case).await;
        let e = r.expect_err(case).to_string();
        assert!(
            e.contains("the answer came in parts, and ") && e.contains(says),
            "{case}: {e}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{case}: failed at once, not at the timeout ({took:?})"
        );
    }

    // The connection lived through all of it.
    let (again, _) = call("three, the last first").await;
    again.expect("answers in parts after the hostile ones");
    client.stop();
}
