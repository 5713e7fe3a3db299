//! Following an A2A task: to where it settles (`SendMessage`), or as Server-Sent Events of
//! `StreamResponse`s (`SendStreamingMessage`, `SubscribeToTask`).

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::a2a::{Begun, TaskView, view_of, view_with_answer};
use super::{KEEP_ALIVE, Reader, Step, TURN_LIMIT, rpc_result};
use crate::http::{Caller, Doors};

/// What following a task sends, in order.
enum Update {
    Status(TaskView),
    /// A piece of the answer (`first` opens the artifact).
    Text {
        delta: String,
        first: bool,
    },
    /// A call decided or done, as a working status message.
    Note(String),
    KeepAlive,
}

/// Follow a begun task until it settles (answered, waiting for input, cancelled, failed).
async fn follow(
    state: &Doors,
    caller: &Caller,
    begun: &mut Begun,
    tx: &mpsc::Sender<Update>,
) -> TaskView {
    let mut reader = Reader::default();
    let mut text = String::new();
    // The latest whole assistant message's text: the task's answer when it completes.
    let (mut message, mut answer) = (String::new(), String::new());
    let deadline = tokio::time::Instant::now() + TURN_LIMIT;
    loop {
        let next = tokio::select! {
            ev = begun.events.next() => ev,
            _ = tokio::time::sleep(KEEP_ALIVE) => {
                let _ = tx.send(Update::KeepAlive).await;
                if tokio::time::Instant::now() < deadline {
                    continue;
                }
                None
            }
        };
        let Some(data) = next else {
            // The subscription ended (or the turn ran too long): the task is as it stands.
            return view_of(state, caller, &begun.id).await.unwrap_or(TaskView {
                id: begun.id.clone(),
                sid: begun.sid.clone(),
                state: "TASK_STATE_WORKING",
                text,
                pending: Vec::new(),
                note: None,
            });
        };
        for step in reader.read(&data) {
            match step {
                Step::Text(t) => {
                    let first = text.is_empty();
                    text.push_str(&t);
                    message.push_str(&t);
                    let _ = tx.send(Update::Text { delta: t, first }).await;
                }
                Step::CallStarted {
                    function_id,
                    decision,
                    parked: false,
                    ..
                } => {
                    let _ = tx
                        .send(Update::Note(format!("{function_id}: {decision}")))
                        .await;
                }
                Step::CallEnded {
                    function_id,
                    is_error,
                    ..
                } => {
                    let _ = tx
                        .send(Update::Note(format!(
                            "{function_id} {}",
                            if is_error { "failed" } else { "done" }
                        )))
                        .await;
                }
                Step::MessageDone { .. } => answer = std::mem::take(&mut message),
                Step::Parked | Step::Finished | Step::Stopped(_) | Step::Failed(_) => {
                    let known = (!answer.is_empty()).then(|| answer.clone());
                    let view = view_with_answer(state, caller, &begun.id, known).await;
                    if let Ok(mut v) = view
                        && v.state != "TASK_STATE_WORKING"
                    {
                        if v.state == "TASK_STATE_COMPLETED" && v.text.is_empty() {
                            v.text = text.clone();
                        }
                        return v;
                    }
                }
                _ => {}
            }
        }
    }
}

/// `SendMessage`: the task when it settles (or at once, with `returnImmediately`).
pub(super) async fn run_blocking(
    state: &Doors,
    caller: &Caller,
    mut begun: Begun,
    blocking: bool,
) -> Value {
    if let Some(v) = begun.settled.take() {
        return v.task();
    }
    if !blocking {
        return TaskView {
            id: begun.id.clone(),
            sid: begun.sid.clone(),
            state: "TASK_STATE_WORKING",
            text: String::new(),
            pending: Vec::new(),
            note: None,
        }
        .task();
    }
    let (tx, mut rx) = mpsc::channel(64);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let view = follow(state, caller, &mut begun, &tx).await;
    drop(tx);
    let _ = drain.await;
    view.task()
}

/// `SendStreamingMessage` / `SubscribeToTask`: Server-Sent Events of `StreamResponse`s: the
/// task, then status and artifact updates, ending with the state the client must act on.
pub(super) fn stream(state: Doors, caller: Caller, id: Value, mut begun: Begun) -> Response {
    let (bytes_tx, bytes_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let frame = |result: Value| Bytes::from(format!("data: {}\n\n", rpc_result(&id, result)));
        let (task, sid) = (begun.id.clone(), begun.sid.clone());
        let status_update = |v: &TaskView| json!({"statusUpdate": {"taskId": task, "contextId": sid, "status": v.status()}});
        if let Some(v) = begun.settled.take() {
            let _ = bytes_tx.send(frame(json!({"task": v.task()}))).await;
            return;
        }
        let working = TaskView {
            id: task.clone(),
            sid: sid.clone(),
            state: "TASK_STATE_WORKING",
            text: String::new(),
            pending: Vec::new(),
            note: None,
        };
        if bytes_tx
            .send(frame(json!({"task": working.task()})))
            .await
            .is_err()
        {
            return;
        }
        let (tx, mut rx) = mpsc::channel::<Update>(64);
        let follower = {
            let state = state.clone();
            tokio::spawn(async move {
                let v = follow(&state, &caller, &mut begun, &tx).await;
                let _ = tx.send(Update::Status(v)).await;
            })
        };
        let mut opened = false;
        while let Some(u) = rx.recv().await {
            let out = match u {
                Update::KeepAlive => Bytes::from_static(b": keep-alive\n\n"),
                Update::Note(n) => {
                    let v = TaskView {
                        id: task.clone(),
                        sid: sid.clone(),
                        state: "TASK_STATE_WORKING",
                        text: String::new(),
                        pending: Vec::new(),
                        note: Some(n),
                    };
                    frame(status_update(&v))
                }
                Update::Text { delta, first } => {
                    opened = true;
                    frame(
                        json!({"artifactUpdate": {"taskId": task, "contextId": sid, "artifact": {"artifactId": "answer", "name": "answer", "parts": [{"text": delta}]}, "append": !first, "lastChunk": false}}),
                    )
                }
                Update::Status(v) => {
                    let mut out = Vec::new();
                    if opened {
                        out.extend_from_slice(&frame(json!({"artifactUpdate": {"taskId": task, "contextId": sid, "artifact": {"artifactId": "answer", "name": "answer", "parts": [{"text": ""}]}, "append": true, "lastChunk": true}})));
                    }
                    out.extend_from_slice(&frame(status_update(&v)));
                    Bytes::from(out)
                }
            };
            if bytes_tx.send(out).await.is_err() {
                // The client went; the task goes on (GetTask or SubscribeToTask find it).
                follower.abort();
                return;
            }
        }
    });
    super::sse_response(bytes_rx)
}
