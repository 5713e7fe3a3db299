//! Every provider worker against the scripted model server over HTTP, through a real engine
//! with the real auth and models workers: streamed thinking, text and tool calls in the
//! SPEC's event order, usage and cost, history conversion per dialect, and every failure
//! mode (401, 429 with retry-after, context overflow, 5xx, malformed and cut streams) ending
//! in a clear error event, with the channel always closed.

use auth_credentials::Auth;
use engine_gateway::secrets::FileSecrets;
use engine_gateway::server::{self, RunningServer, ServeOptions};
use harness_sdk::{ChannelFrame, Ctx, RemoteOptions, WorkerHandle, connect_client, run_embedded};
use provider_core::Dialect;
use scripted_model::{Cassette, ScriptedModel, ToolCall, Turn, TurnUsage};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Case {
    name: &'static str,
    model: &'static str,
    priced: bool,
}

const CASES: &[Case] = &[
    Case {
        name: "anthropic",
        model: "claude-sonnet-5-5",
        priced: true,
    },
    Case {
        name: "openai",
        model: "gpt-5.4-mini",
        priced: true,
    },
    Case {
        name: "kimi",
        model: "kimi-k2.5",
        priced: true,
    },
    Case {
        name: "lmstudio",
        model: "openai/gpt-oss-20b",
        priced: false,
    },
];

#[path = "support/in_process_model.rs"]
mod in_process_model;
use in_process_model::InProcessModel;

struct Rig {
    _dir: tempfile::TempDir,
    _srv: RunningServer,
    _workers: Vec<WorkerHandle>,
    client: WorkerHandle,
    model: ScriptedModel,
}

fn dialect(name: &str, base: &str) -> Arc<dyn Dialect> {
    match name {
        "anthropic" => Arc::new(provider_anthropic::Anthropic {
            base_url: base.to_string(),
        }),
        other => Arc::new(provider_openai::OpenAiDialect {
            name: other.to_string(),
            base_url: format!("{base}/v1"),
            key_optional: other == "lmstudio",
        }),
    }
}

async fn rig(name: &str, env: &[(&str, &str)]) -> Rig {
    rig_on(name, env, false).await
}

/// [`rig`], with the provider's requests going to the model in process when `in_process`.
async fn rig_on(name: &str, env: &[(&str, &str)], in_process: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::default();
    let base = model.serve().await.unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().join("data")))
        .await
        .unwrap();
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let auth = Auth::new(
        Arc::new(FileSecrets::new(dir.path().join("secrets.json"))),
        Arc::new(move |k| env.get(k).cloned()),
    );
    let workers = vec![
        run_embedded(auth_credentials::worker(auth), &srv.engine).unwrap(),
        run_embedded(
            models_catalog::worker(Arc::new(models_catalog::Catalog::builtin())),
            &srv.engine,
        )
        .unwrap(),
        run_embedded(
            if name == provider_bedrock::NAME {
                // The SDK's standard settings, pointed at the scripted model's ConverseStream.
                // SAFETY: set before the client is built; one test per process (nextest).
                unsafe {
                    std::env::set_var("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", &base);
                    std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDTEST");
                    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test-secret");
                    std::env::set_var("AWS_REGION", "us-east-1");
                }
                provider_bedrock::worker()
            } else if in_process {
                provider_core::worker_with_transport(
                    dialect(name, &base),
                    Arc::new(InProcessModel(model.router())),
                )
            } else {
                provider_core::worker(dialect(name, &base))
            },
            &srv.engine,
        )
        .unwrap(),
    ];
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    Rig {
        _dir: dir,
        _srv: srv,
        _workers: workers,
        client,
        model,
    }
}

const KEYS: &[(&str, &str)] = &[
    ("ANTHROPIC_API_KEY", "sk-test"),
    ("OPENAI_API_KEY", "sk-test"),
    ("MOONSHOT_API_KEY", "sk-test"),
];

/// Call `provider::<name>::stream` with a fresh channel; every frame, and the call's answer.
async fn stream(ctx: &Ctx, name: &str, model: &str, messages: Value) -> (Vec<Value>, Value) {
    stream_with(ctx, name, model, messages, false).await
}

/// [`stream`], with the history attached beside the payload when `attached` (as the
/// orchestrator sends it) instead of in it.
async fn stream_with(
    ctx: &Ctx,
    name: &str,
    model: &str,
    messages: Value,
    attached: bool,
) -> (Vec<Value>, Value) {
    let (writer, reader) = ctx.create_channel(Some(8)).await.unwrap();
    let mut r = ctx.open_reader(&reader).await.unwrap();
    let collect = tokio::spawn(async move {
        let mut frames = Vec::new();
        while let Some(f) = r.next().await {
            if let ChannelFrame::Text(t) = f {
                frames
                    .push(serde_json::from_str::<Value>(&t).expect("each frame is one JSON event"));
            }
        }
        frames
    });
    let mut payload = json!({
        "writer_ref": writer,
        "model": model,
        "system_prompt": "You are a test.",
        "tools": [{"name": "agent_trigger", "description": "Call a function", "parameters": {"type": "object"}}],
    });
    let fid = format!("provider::{name}::stream");
    let answer = if attached {
        let messages: Vec<harness_sdk::messages::AgentMessage> =
            serde_json::from_value(messages).unwrap();
        let attachment = harness_sdk::contracts::provider::messages_attachment(Arc::new(messages));
        ctx.trigger_attached(&fid, payload, attachment, Duration::from_secs(30))
            .await
    } else {
        payload["messages"] = messages;
        ctx.trigger(&fid, payload).await
    }
    .unwrap();
    let frames = tokio::time::timeout(Duration::from_secs(10), collect)
        .await
        .expect("the writer is closed")
        .unwrap();
    (frames, answer)
}

fn history() -> Value {
    json!([
        {"role": "user", "content": [{"type": "text", "text": "list the files"}], "timestamp": 1},
        {"role": "assistant", "content": [{"type": "text", "text": "Listing."}, {"type": "function_call", "id": "c0", "function_id": "agent_trigger", "arguments": {"function": "fs::list", "payload": {}}}], "stop_reason": "function_call", "model": "m", "provider": "p", "timestamp": 2},
        {"role": "function_result", "function_call_id": "c0", "function_id": "fs::list", "content": [{"type": "text", "text": "a.txt"}], "details": {}, "is_error": false, "timestamp": 3},
    ])
}

fn full_turn() -> Turn {
    Turn {
        thinking: Some("Let me think about this carefully.".into()),
        text: Some("Reading the file now.".into()),
        tool_calls: vec![ToolCall {
            id: "call_1".into(),
            name: "agent_trigger".into(),
            arguments: json!({"function": "fs::read", "payload": {"path": "a.txt"}}),
        }],
        usage: TurnUsage {
            input: 1200,
            output: 80,
            cache_read: 1000,
            cache_write: 0,
        },
        chunk_size: Some(5),
        ..Default::default()
    }
}

fn types(frames: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in frames {
        let t = f["type"].as_str().unwrap_or("?").to_string();
        // Collapse runs of deltas: the order of kinds is what the SPEC fixes.
        if t.ends_with("_delta") && out.last() == Some(&t) {
            continue;
        }
        out.push(t);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_stream_thinking_text_and_calls_in_order() {
    for case in CASES {
        let rig = rig(case.name, KEYS).await;
        rig.model.load(Cassette {
            turns: vec![full_turn()],
            ..Default::default()
        });
        let (frames, answer) = stream(&rig.client.ctx(), case.name, case.model, history()).await;
        assert_eq!(
            answer["stop_reason"], "function_call",
            "{}: {answer}",
            case.name
        );
        assert_eq!(
            types(&frames),
            vec![
                "start",
                "thinking_start",
                "thinking_delta",
                "thinking_end",
                "text_start",
                "text_delta",
                "text_end",
                "functioncall_start",
                "functioncall_delta",
                "functioncall_end",
                "usage",
                "stop",
                "done"
            ],
            "{}",
            case.name
        );
        let done = &frames.last().unwrap()["message"];
        assert_eq!(done["role"], "assistant");
        assert_eq!(done["content"][0]["type"], "thinking");
        assert_eq!(
            done["content"][0]["text"],
            "Let me think about this carefully."
        );
        // Anthropic signs thinking (and needs the signature back); the OpenAI dialect has none.
        let signature = if case.name == "anthropic" {
            json!("sig-scripted")
        } else {
            Value::Null
        };
        assert_eq!(done["content"][0]["signature"], signature, "{}", case.name);
        assert_eq!(
            done["content"][1],
            json!({"type": "text", "text": "Reading the file now."})
        );
        assert_eq!(
            done["content"][2],
            json!({"type": "function_call", "id": "call_1", "function_id": "agent_trigger", "arguments": {"function": "fs::read", "payload": {"path": "a.txt"}}})
        );
        assert_eq!(done["usage"]["output"], 80, "{}", case.name);
        assert_eq!(done["usage"]["cache_read"], 1000, "{}", case.name);
        assert_eq!(
            done["usage"]["input"], 1200,
            "{}: input excludes cached tokens",
            case.name
        );
        let cost = done["usage"]["cost_usd"].as_f64().unwrap();
        assert_eq!(cost > 0.0, case.priced, "{}: cost {cost}", case.name);
        assert_eq!(done["provider"], case.name);
        // Each progress event carries the partial message so far.
        let mid = frames.iter().find(|f| f["type"] == "text_delta").unwrap();
        assert_eq!(mid["partial"]["role"], "assistant");

        // The history went upstream in the dialect's own shape.
        let sent = &rig.model.requests()[0]["body"];
        assert_eq!(sent["stream"], true);
        if case.name == "anthropic" {
            // Prompt caching: breakpoints after the system prompt, the tools and the latest
            // message.
            assert_eq!(
                sent["system"],
                json!([{"type": "text", "text": "You are a test.", "cache_control": {"type": "ephemeral"}}])
            );
            assert_eq!(sent["messages"][1]["content"][1]["type"], "tool_use");
            assert_eq!(
                sent["messages"][2]["content"][0],
                json!({"type": "tool_result", "tool_use_id": "c0", "content": "a.txt", "is_error": false, "cache_control": {"type": "ephemeral"}})
            );
            assert_eq!(sent["tools"][0]["input_schema"], json!({"type": "object"}));
            assert_eq!(
                sent["tools"][0]["cache_control"],
                json!({"type": "ephemeral"})
            );
        } else {
            assert_eq!(
                sent["messages"][0],
                json!({"role": "system", "content": "You are a test."})
            );
            assert_eq!(
                sent["messages"][2]["tool_calls"][0]["function"]["name"],
                "agent_trigger"
            );
            assert_eq!(
                sent["messages"][3],
                json!({"role": "tool", "tool_call_id": "c0", "content": "a.txt"})
            );
            assert_eq!(sent["stream_options"]["include_usage"], true);
        }
    }
}

/// The orchestrator hands the history to a provider in its process beside the payload, not
/// as JSON in it: every dialect sends the model the same request either way (images too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_history_goes_upstream_as_the_same_request() {
    let mut history = history();
    history.as_array_mut().unwrap().push(json!(
        {"role": "user", "content": [{"type": "text", "text": "and this?"}, {"type": "image", "mime": "image/png", "data": "iVBORw0KGgo="}], "timestamp": 4}
    ));
    for case in CASES {
        let rig = rig(case.name, KEYS).await;
        rig.model.load(Cassette {
            turns: vec![full_turn(), full_turn()],
            ..Default::default()
        });
        // In process: an embedded worker's context calls the embedded provider.
        let caller = run_embedded(harness_sdk::Worker::new("caller"), &rig._srv.engine).unwrap();
        let (_, by_json) = stream(&rig.client.ctx(), case.name, case.model, history.clone()).await;
        let (frames, attached) =
            stream_with(&caller.ctx(), case.name, case.model, history.clone(), true).await;
        assert_eq!(by_json, attached, "{}", case.name);
        assert_eq!(frames.last().unwrap()["type"], "done", "{}", case.name);
        let sent = rig.model.requests();
        assert_eq!(sent.len(), 2, "{}", case.name);
        assert_eq!(sent[0]["body"], sent[1]["body"], "{}", case.name);
        assert!(
            sent[1]["body"]["messages"].as_array().unwrap().len() >= 3,
            "{}: the conversation went upstream: {}",
            case.name,
            sent[1]["body"]
        );
    }
}

/// The benchmark's in-process model: the provider sends the same request and streams the
/// same frames as over the network, and an upstream error maps to the same error event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_in_process_gets_the_same_request_and_answers_the_same_frames() {
    for case in CASES {
        let mut seen = Vec::new();
        for in_process in [false, true] {
            let rig = rig_on(case.name, KEYS, in_process).await;
            let refused = || Turn {
                http_status: Some(401),
                error_message: Some("invalid x-api-key".into()),
                ..Default::default()
            };
            rig.model.load(Cassette {
                // Refused with the reused key, and again with the one asked anew.
                turns: vec![full_turn(), refused(), refused()],
                ..Default::default()
            });
            let ctx = rig.client.ctx();
            let (frames, answer) = stream(&ctx, case.name, case.model, history()).await;
            let (failed, _) = stream(&ctx, case.name, case.model, history()).await;
            let error = failed.last().unwrap()["error"].clone();
            assert_eq!(
                error["error_kind"], "auth_expired",
                "{}: {error}",
                case.name
            );
            let sent = rig.model.requests();
            assert_eq!(sent.len(), 3, "{}", case.name);
            let done = frames.last().unwrap()["message"]["content"].clone();
            seen.push((types(&frames), answer, done, sent[0]["body"].clone()));
        }
        assert_eq!(
            seen[0], seen[1],
            "{}: over the network, then in process",
            case.name
        );
    }
}

async fn error_case(name: &str, model: &str, turn: Turn) -> (Value, Duration) {
    let rig = rig(name, KEYS).await;
    rig.model.load(Cassette {
        turns: vec![turn],
        ..Default::default()
    });
    let t0 = Instant::now();
    let (frames, answer) = stream(
        &rig.client.ctx(),
        name,
        model,
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]),
    )
    .await;
    assert_eq!(answer["stop_reason"], "error", "{name}: {answer}");
    let last = frames.last().unwrap().clone();
    assert_eq!(
        last["type"], "error",
        "{name}: the stream ends in an error event"
    );
    let stop = frames.iter().find(|f| f["type"] == "stop").unwrap();
    assert_eq!(stop["stop_reason"], "error");
    (last["error"].clone(), t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_end_in_clear_error_events() {
    for case in CASES {
        let (n, m) = (case.name, case.model);
        let status = |s: u16, msg: &str| Turn {
            http_status: Some(s),
            error_message: Some(msg.into()),
            ..Default::default()
        };
        let (e, _) = error_case(n, m, status(401, "invalid x-api-key")).await;
        assert_eq!(e["error_kind"], "auth_expired", "{n}: {e}");
        assert!(
            e["error_message"].as_str().unwrap().contains("401"),
            "{n}: {e}"
        );
        let (e, _) = error_case(
            n,
            m,
            Turn {
                retry_after: Some(60),
                ..status(429, "slow down")
            },
        )
        .await;
        assert_eq!(
            e["error_kind"], "rate_limited",
            "{n}: retry-after beyond the bound is reported"
        );
        let (e, _) = error_case(
            n,
            m,
            status(400, "prompt is too long: context window exceeded"),
        )
        .await;
        assert_eq!(e["error_kind"], "context_overflow", "{n}: {e}");
        let (e, _) = error_case(n, m, status(503, "unavailable")).await;
        assert_eq!(e["error_kind"], "transient", "{n}: {e}");
        for broken in ["bad_json", "truncate", "stream_error"] {
            let turn = Turn {
                text: Some("partial answer that breaks".into()),
                malformed: Some(broken.into()),
                ..Default::default()
            };
            let (e, _) = error_case(n, m, turn).await;
            assert_eq!(e["error_kind"], "transient", "{n} {broken}: {e}");
            assert_eq!(
                e["content"][0]["type"], "text",
                "{n} {broken}: what arrived is kept"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_then_the_stream_succeeds() {
    let rig = rig("openai", KEYS).await;
    let limited = Turn {
        http_status: Some(429),
        retry_after: Some(1),
        error_message: Some("rate limited".into()),
        ..Default::default()
    };
    rig.model.load(Cassette {
        turns: vec![
            limited,
            Turn {
                text: Some("ok".into()),
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    let t0 = Instant::now();
    let (frames, answer) = stream(&rig.client.ctx(), "openai", "gpt-5.4", json!([])).await;
    assert_eq!(answer["stop_reason"], "end");
    assert!(
        t0.elapsed() >= Duration::from_millis(950),
        "waited for retry-after"
    );
    assert_eq!(frames.last().unwrap()["type"], "done");
    assert_eq!(rig.model.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_come_from_auth_and_lmstudio_needs_none() {
    // No key at all: a hosted provider fails closed as auth_missing, naming itself; LM Studio
    // goes ahead.
    let rig = rig("kimi", &[]).await;
    rig.model.load(Cassette {
        turns: vec![Turn {
            text: Some("hi".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let (frames, _) = stream(&rig.client.ctx(), "kimi", "kimi-k2.5", json!([])).await;
    let last = frames.last().unwrap();
    assert_eq!(last["error"]["error_kind"], "auth_missing");
    assert!(
        last["error"]["error_message"]
            .as_str()
            .is_some_and(|m| m.contains("`kimi`")),
        "{last}"
    );
    assert!(
        rig.model.requests().is_empty(),
        "nothing was sent without credentials"
    );
    let rig = rig_lm().await;
    rig.model.load(Cassette {
        turns: vec![Turn {
            text: Some("local".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let (frames, _) = stream(
        &rig.client.ctx(),
        "lmstudio",
        "openai/gpt-oss-20b",
        json!([]),
    )
    .await;
    assert_eq!(frames.last().unwrap()["type"], "done");
    // A stored token is sent, and the server checks it.
    let rig = rig_with_key().await;
    rig.model.load(Cassette {
        turns: vec![Turn {
            text: Some("authorised".into()),
            ..Default::default()
        }],
        require_api_key: Some("sk-stored".into()),
        ..Default::default()
    });
    rig.client
        .ctx()
        .trigger(
            "auth::set_token",
            json!({"provider": "anthropic", "type": "api_key", "key": "sk-stored"}),
        )
        .await
        .unwrap();
    let (frames, _) = stream(
        &rig.client.ctx(),
        "anthropic",
        "claude-haiku-5-5",
        json!([]),
    )
    .await;
    assert_eq!(
        frames.last().unwrap()["type"],
        "done",
        "{:?}",
        frames.last()
    );
}

/// A provider process reuses the credential `auth::get_token` gave it (one ask per
/// `TOKEN_TTL`, not one per model call): a key stored meanwhile is not used yet. When the
/// upstream refuses the reused key (rotated there), the provider asks again at once and the
/// call goes through with the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_reuses_its_credential_and_asks_again_when_refused() {
    for case in CASES
        .iter()
        .filter(|c| ["anthropic", "openai"].contains(&c.name))
    {
        let rig = rig(case.name, KEYS).await;
        let ok = || Turn {
            text: Some("fine".into()),
            ..Default::default()
        };
        rig.model.load(Cassette {
            turns: vec![ok(), ok()],
            require_api_key: Some("sk-test".into()),
            ..Default::default()
        });
        let ctx = rig.client.ctx();
        let messages =
            json!([{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]);
        let (frames, _) = stream(&ctx, case.name, case.model, messages.clone()).await;
        assert_eq!(frames.last().unwrap()["type"], "done", "{}", case.name);
        ctx.trigger(
            "auth::set_token",
            json!({"provider": case.name, "type": "api_key", "key": "sk-rotated"}),
        )
        .await
        .unwrap();
        // Still the reused key: the model, which wants sk-test, answers.
        let (frames, _) = stream(&ctx, case.name, case.model, messages.clone()).await;
        assert_eq!(
            frames.last().unwrap()["type"],
            "done",
            "{}: {frames:?}",
            case.name
        );
        assert_eq!(rig.model.requests().len(), 2, "{}", case.name);
        // Rotated upstream: the reused key is refused once, the stored one goes through.
        rig.model.load(Cassette {
            turns: vec![ok()],
            require_api_key: Some("sk-rotated".into()),
            ..Default::default()
        });
        let before = rig.model.requests().len();
        let (frames, answer) = stream(&ctx, case.name, case.model, messages.clone()).await;
        assert_eq!(
            frames.last().unwrap()["type"],
            "done",
            "{}: {answer}",
            case.name
        );
        assert_eq!(
            rig.model.requests().len() - before,
            2,
            "{}: refused, then through",
            case.name
        );
    }
}

async fn rig_lm() -> Rig {
    rig("lmstudio", &[]).await
}

async fn rig_with_key() -> Rig {
    rig("anthropic", &[("ANTHROPIC_API_KEY", "sk-env-ignored")]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_answers_the_final_message() {
    for case in CASES {
        let rig = rig(case.name, KEYS).await;
        rig.model.load(Cassette {
            turns: vec![full_turn()],
            ..Default::default()
        });
        let m = rig
            .client
            .ctx()
            .trigger(
                &format!("provider::{}::complete", case.name),
                json!({"model": case.model, "messages": []}),
            )
            .await
            .unwrap();
        assert_eq!(m["role"], "assistant");
        assert_eq!(m["stop_reason"], "function_call", "{}: {m}", case.name);
        assert_eq!(m["content"][2]["arguments"]["payload"]["path"], "a.txt");
    }
}

/// A model's pricing is read from `models::get` once and reused (`PRICE_TTL`): every
/// completion is still priced the same, with one catalog call instead of one per completion.
/// "Not in the catalog" is an answer too, kept as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_price_is_read_once_and_reused() {
    let rig = rig("openai", KEYS).await;
    let catalog_calls = |rig: &Rig| {
        rig._srv
            .engine
            .spans
            .snapshot()
            .iter()
            .filter(|s| s.name == "models::get" && s.service == "engine")
            .count()
    };
    let mut costs = Vec::new();
    for _ in 0..3 {
        rig.model.load(Cassette {
            turns: vec![full_turn()],
            ..Default::default()
        });
        let (frames, _) = stream(&rig.client.ctx(), "openai", "gpt-5.4-mini", history()).await;
        let done = &frames.last().unwrap()["message"];
        costs.push(done["usage"]["cost_usd"].as_f64().unwrap());
    }
    assert!(costs[0] > 0.0, "priced: {costs:?}");
    assert!(
        costs.iter().all(|c| *c == costs[0]),
        "same price: {costs:?}"
    );
    assert_eq!(
        catalog_calls(&rig),
        1,
        "one models::get for three completions"
    );

    for _ in 0..2 {
        rig.model.load(Cassette {
            turns: vec![full_turn()],
            ..Default::default()
        });
        let (frames, _) =
            stream(&rig.client.ctx(), "openai", "not-in-the-catalog", history()).await;
        let done = &frames.last().unwrap()["message"];
        assert_eq!(done["usage"]["cost_usd"], 0.0, "unknown model: no price");
    }
    assert_eq!(
        catalog_calls(&rig),
        2,
        "an unknown model is asked about once too"
    );
}

const BEDROCK_MODEL: &str = "anthropic.claude-haiku-4-5-20251001-v1:0";

/// Bedrock through the AWS SDK against the scripted model's ConverseStream (event-stream
/// frames with their CRCs): thinking with its signature, text, a tool call, usage with cache
/// reads, the price from the catalogue, and the history (an image, a failed call's result)
/// sent in Converse's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_streams_thinking_text_and_a_call_and_sends_converse() {
    let rig = rig("bedrock", &[]).await;
    rig.model.load(Cassette {
        turns: vec![full_turn()],
        ..Default::default()
    });
    let mut history = history();
    history[2]["is_error"] = json!(true);
    history.as_array_mut().unwrap().push(json!(
        {"role": "user", "content": [{"type": "text", "text": "and this?"}, {"type": "image", "mime": "image/png", "data": "iVBORw0KGgo="}], "timestamp": 4}
    ));
    let (frames, answer) = stream(&rig.client.ctx(), "bedrock", BEDROCK_MODEL, history).await;
    assert_eq!(answer["stop_reason"], "function_call", "{answer}");
    assert_eq!(
        types(&frames),
        vec![
            "start",
            "thinking_start",
            "thinking_delta",
            "thinking_end",
            "text_start",
            "text_delta",
            "text_end",
            "functioncall_start",
            "functioncall_delta",
            "functioncall_end",
            "usage",
            "stop",
            "done"
        ]
    );
    let done = &frames.last().unwrap()["message"];
    assert_eq!(
        done["content"][0]["text"],
        "Let me think about this carefully."
    );
    assert_eq!(done["content"][0]["signature"], "sig-scripted");
    assert_eq!(
        done["content"][1],
        json!({"type": "text", "text": "Reading the file now."})
    );
    assert_eq!(
        done["content"][2],
        json!({"type": "function_call", "id": "call_1", "function_id": "agent_trigger", "arguments": {"function": "fs::read", "payload": {"path": "a.txt"}}})
    );
    assert_eq!(done["usage"]["input"], 1200);
    assert_eq!(done["usage"]["output"], 80);
    assert_eq!(done["usage"]["cache_read"], 1000);
    assert!(
        done["usage"]["cost_usd"].as_f64().unwrap() > 0.0,
        "priced from the catalogue"
    );
    assert_eq!(done["provider"], "bedrock");
    // The request, as the SDK sent it to the model's ConverseStream path.
    let req = &rig.model.requests()[0];
    assert_eq!(
        req["path"], "/model/anthropic.claude-haiku-4-5-20251001-v1:0/converse-stream",
        "the scripted server files it under its dialect"
    );
    let sent = &req["body"];
    // A Claude model on Bedrock caches: cache points after the system prompt, the tools and
    // the latest message (the request says nothing of caching, so the provider's default).
    assert_eq!(
        sent["system"],
        json!([{"text": "You are a test."}, {"cachePoint": {"type": "default"}}])
    );
    assert_eq!(
        sent["toolConfig"]["tools"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        &json!({"cachePoint": {"type": "default"}})
    );
    assert_eq!(
        sent["messages"][2]["content"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        &json!({"cachePoint": {"type": "default"}})
    );
    assert_eq!(sent["messages"][0]["role"], "user");
    assert_eq!(
        sent["messages"][1]["content"][1]["toolUse"]["toolUseId"],
        "c0"
    );
    assert_eq!(
        sent["messages"][1]["content"][1]["toolUse"]["input"]["function"],
        "fs::list"
    );
    let result = &sent["messages"][2]["content"][0]["toolResult"];
    assert_eq!(result["toolUseId"], "c0");
    assert_eq!(result["status"], "error", "a failed call says so");
    assert_eq!(result["content"][0]["text"], "a.txt");
    // The next user message joins the result's turn (Converse alternates roles), image and all.
    assert_eq!(sent["messages"][2]["content"][1]["text"], "and this?");
    assert_eq!(sent["messages"][2]["content"][2]["image"]["format"], "png");
    assert_eq!(
        sent["toolConfig"]["tools"][0]["toolSpec"]["name"],
        "agent_trigger"
    );
    assert_eq!(sent["inferenceConfig"]["maxTokens"], 4096);
}

async fn bedrock_error(turns: Vec<Turn>) -> (Value, usize) {
    let rig = rig("bedrock", &[]).await;
    rig.model.load(Cassette {
        turns,
        repeat_last: true,
        ..Default::default()
    });
    let (frames, answer) = stream(
        &rig.client.ctx(),
        "bedrock",
        BEDROCK_MODEL,
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]),
    )
    .await;
    assert_eq!(answer["stop_reason"], "error", "{answer}");
    let last = frames.last().unwrap().clone();
    assert_eq!(last["type"], "error", "the stream ends in an error event");
    (last["error"].clone(), rig.model.requests().len())
}

/// Throttling is retried with the SDK's back-off until it succeeds; what cannot succeed is
/// said once, with what to do; a broken stream (cut in a frame, a bad CRC, a 20 MiB frame, an
/// exception frame) ends in a clear error, what arrived kept; an unknown event is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_errors_are_classified_and_a_broken_stream_is_a_clear_error() {
    let status = |s: u16, msg: &str| Turn {
        http_status: Some(s),
        error_message: Some(msg.into()),
        ..Default::default()
    };
    // Throttled once, then an answer: one call, the answer.
    let throttled = rig("bedrock", &[]).await;
    throttled.model.load(Cassette {
        turns: vec![
            status(429, "Too many requests"),
            text_turn("after the wait"),
        ],
        ..Default::default()
    });
    let (frames, answer) = stream(
        &throttled.client.ctx(),
        "bedrock",
        BEDROCK_MODEL,
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]),
    )
    .await;
    assert_eq!(answer["stop_reason"], "end", "{answer}");
    assert_eq!(
        frames.last().unwrap()["message"]["content"][0]["text"],
        "after the wait"
    );
    assert_eq!(throttled.model.requests().len(), 2, "retried once");

    let (e, calls) = bedrock_error(vec![status(429, "Too many requests")]).await;
    assert_eq!(e["error_kind"], "rate_limited", "{e}");
    assert!(calls > 1, "throttling is retried");
    let (e, calls) = bedrock_error(vec![status(400, "messages.0: bad field")]).await;
    assert_eq!(e["error_kind"], "permanent", "{e}");
    assert!(
        e["error_message"]
            .as_str()
            .unwrap()
            .contains("ValidationException: messages.0: bad field"),
        "{e}"
    );
    assert_eq!(calls, 1, "a validation error is not retried");
    let (e, _) = bedrock_error(vec![status(400, "Input is too long for requested model.")]).await;
    assert_eq!(e["error_kind"], "context_overflow", "{e}");
    let (e, _) = bedrock_error(vec![status(403, "You don't have access to the model")]).await;
    assert!(
        e["error_message"]
            .as_str()
            .unwrap()
            .contains("request access to the model in the Bedrock console"),
        "{e}"
    );
    let (e, _) = bedrock_error(vec![status(503, "unavailable")]).await;
    assert_eq!(e["error_kind"], "transient", "{e}");
    for broken in ["truncate", "bad_crc", "huge_frame", "stream_error"] {
        let (e, _) = bedrock_error(vec![Turn {
            text: Some("partial answer that breaks".into()),
            malformed: Some(broken.into()),
            ..Default::default()
        }])
        .await;
        let expected = if broken == "stream_error" {
            "rate_limited"
        } else {
            "transient"
        };
        assert_eq!(e["error_kind"], expected, "{broken}: {e}");
        assert_eq!(
            e["content"][0]["type"], "text",
            "{broken}: what arrived is kept: {e}"
        );
    }
    // An event type the API may add later is skipped.
    let later = rig("bedrock", &[]).await;
    later.model.load(Cassette {
        turns: vec![Turn {
            text: Some("goes on after an unknown event".into()),
            malformed: Some("unknown_event".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let (frames, answer) = stream(
        &later.client.ctx(),
        "bedrock",
        BEDROCK_MODEL,
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1}]),
    )
    .await;
    assert_eq!(answer["stop_reason"], "end", "{answer}");
    assert_eq!(
        frames.last().unwrap()["message"]["content"][0]["text"],
        "goes on after an unknown event"
    );
}

fn text_turn(t: &str) -> Turn {
    Turn {
        text: Some(t.into()),
        usage: TurnUsage {
            input: 10,
            output: 3,
            ..Default::default()
        },
        ..Default::default()
    }
}
