//! The Lambda Runtime API, hosted by the engine for `bootstrap` processes it spawns: the same
//! binaries `cargo lambda build` deploys, run as AWS would run them. Each process gets its own
//! Runtime API endpoint (`AWS_LAMBDA_RUNTIME_API`), so an invocation is always tied to the
//! process running it: a process that dies mid-invocation fails that invocation as a function
//! error and is replaced on demand. The pool grows by spawning processes up to a limit.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};

#[derive(Debug, Clone)]
pub struct LambdaSpec {
    /// The function name (`AWS_LAMBDA_FUNCTION_NAME`).
    pub name: String,
    pub bootstrap: PathBuf,
    pub env: Vec<(String, String)>,
    pub max_processes: usize,
    pub timeout: Duration,
    pub memory_mb: u32,
}

impl LambdaSpec {
    pub fn new(name: &str, bootstrap: PathBuf) -> Self {
        Self {
            name: name.to_string(),
            bootstrap,
            env: Vec::new(),
            max_processes: 4,
            timeout: Duration::from_secs(60),
            memory_mb: 128,
        }
    }

    /// `name=path` as given on the command line.
    pub fn parse(arg: &str) -> Result<Self, String> {
        let (name, path) = arg
            .split_once('=')
            .ok_or_else(|| format!("`--lambda {arg}`: expected NAME=PATH_TO_BOOTSTRAP"))?;
        if name.is_empty() || path.is_empty() {
            return Err(format!("`--lambda {arg}`: expected NAME=PATH_TO_BOOTSTRAP"));
        }
        Ok(Self::new(name, PathBuf::from(path)))
    }
}

pub use bus::lambda::{LambdaError, describe_event};

/// What an invocation answered: a JSON response, or (a `bootstrap` in streaming response
/// mode) the response stream, piece by piece as it is written.
pub enum Answer {
    Json(Value),
    Stream(tokio::sync::mpsc::Receiver<bus_aws::lambda_stream::StreamPiece>),
}

/// Most a buffered response may hold (Lambda's limit for a synchronous invocation).
const MAX_RESPONSE_BYTES: usize = 6 << 20;

struct Job {
    request_id: String,
    payload: Vec<u8>,
    trace_id: String,
    deadline: Instant,
    reply: oneshot::Sender<Result<Answer, LambdaError>>,
}

struct Process {
    id: u64,
    current: Mutex<Option<Job>>,
    spawned: Instant,
    first_next: Mutex<Option<Duration>>,
    child_pid: Mutex<Option<u32>>,
}

pub struct LambdaFunction {
    pub spec: LambdaSpec,
    queue: Mutex<VecDeque<Job>>,
    work: Notify,
    processes: Mutex<Vec<Arc<Process>>>,
    idle: AtomicUsize,
    next_id: AtomicU64,
    /// Environment every process gets on top of the spec's (e.g. `ENGINE_URL`).
    extra_env: Vec<(String, String)>,
    cold_starts: Mutex<Vec<Duration>>,
    /// Invocations asked of this function (the figure AWS bills per request).
    invocations: AtomicU64,
    me: Weak<LambdaFunction>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LambdaFunction {
    pub fn new(spec: LambdaSpec, extra_env: Vec<(String, String)>) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            spec,
            queue: Mutex::new(VecDeque::new()),
            work: Notify::new(),
            processes: Mutex::new(Vec::new()),
            idle: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            extra_env,
            cold_starts: Mutex::new(Vec::new()),
            invocations: AtomicU64::new(0),
            me: me.clone(),
        })
    }

    /// Invoke with a JSON event; the answer is the function's JSON response. A streamed
    /// response is buffered whole, as Lambda's `Invoke` does for a streaming function.
    pub async fn invoke(&self, event: &Value) -> Result<Value, LambdaError> {
        match self.invoke_answer(event).await? {
            Answer::Json(v) => Ok(v),
            Answer::Stream(mut rx) => {
                let mut strip = bus_aws::lambda_stream::PreludeStripper::default();
                let mut body = Vec::new();
                while let Some(piece) = rx.recv().await {
                    body.extend_from_slice(&strip.feed(&piece?));
                    if body.len() > MAX_RESPONSE_BYTES {
                        return Err(LambdaError::Function {
                            error_type: "Runtime.ResponseSizeTooLarge".into(),
                            message: format!("the response is over {MAX_RESPONSE_BYTES} bytes"),
                        });
                    }
                }
                body.extend(strip.finish());
                Ok(serde_json::from_slice(&body)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned())))
            }
        }
    }

    /// Invoke and take the answer as the function gives it: JSON, or a response stream
    /// (what `InvokeWithResponseStream` serves).
    pub async fn invoke_answer(&self, event: &Value) -> Result<Answer, LambdaError> {
        self.invocations.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let request_id = uuid::Uuid::new_v4().to_string();
        let job = Job {
            request_id,
            payload: serde_json::to_vec(event).unwrap_or_default(),
            trace_id: format!(
                "Root=1-{:08x}-{};Sampled=1",
                bus_telemetry::trace::now_ms() / 1000,
                bus_telemetry::trace::random_hex(12)
            ),
            deadline: Instant::now() + self.spec.timeout,
            reply: tx,
        };
        lock(&self.queue).push_back(job);
        self.work.notify_one();
        if self.idle.load(Ordering::SeqCst) == 0
            && lock(&self.processes).len() < self.spec.max_processes
        {
            self.spawn_process().await?;
        }
        match tokio::time::timeout(self.spec.timeout + Duration::from_secs(1), rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(LambdaError::Crashed("invocation dropped".into())),
            Err(_) => Err(LambdaError::TimedOut(self.spec.timeout.as_millis())),
        }
    }

    pub fn process_count(&self) -> usize {
        lock(&self.processes).len()
    }

    /// How many invocations this function was asked for so far.
    pub fn invocations(&self) -> u64 {
        self.invocations.load(Ordering::Relaxed)
    }

    pub fn cold_starts(&self) -> Vec<Duration> {
        lock(&self.cold_starts).clone()
    }

    pub fn pids(&self) -> Vec<u32> {
        lock(&self.processes)
            .iter()
            .filter_map(|p| *lock(&p.child_pid))
            .collect()
    }

    /// Start one more `bootstrap` with its own Runtime API endpoint.
    pub async fn spawn_process(&self) -> Result<(), LambdaError> {
        let Some(me) = self.me.upgrade() else {
            return Err(LambdaError::Spawn("function dropped".into()));
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| LambdaError::Spawn(e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LambdaError::Spawn(e.to_string()))?;
        let process = Arc::new(Process {
            id: self.next_id.fetch_add(1, Ordering::SeqCst),
            current: Mutex::new(None),
            spawned: Instant::now(),
            first_next: Mutex::new(None),
            child_pid: Mutex::new(None),
        });
        let api = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post(invocation_error),
            )
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state((me.clone(), process.clone()));
        // The Runtime API's small responses must not wait for delayed ACKs (TCP_NODELAY),
        // nor a streamed response's chunks for this end's (`quick_ack`).
        let listener = crate::quick_ack::QuickAckListener(listener);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, api).await;
        });
        let mut cmd = tokio::process::Command::new(&self.spec.bootstrap);
        cmd.env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", &self.spec.name)
            .env(
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
                self.spec.memory_mb.to_string(),
            )
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/{}", self.spec.name),
            )
            .env(
                "AWS_LAMBDA_LOG_STREAM_NAME",
                format!("local/{}", process.id),
            )
            .env("AWS_EXECUTION_ENV", "AWS_Lambda_rust")
            // Credentials come from the environment here, as in Lambda: never from an instance
            // metadata endpoint, which a local process must not reach.
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("_HANDLER", "bootstrap")
            .envs(self.extra_env.iter().cloned())
            .envs(self.spec.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                server.abort();
                return Err(LambdaError::Spawn(format!(
                    "{}: {e}",
                    self.spec.bootstrap.display()
                )));
            }
        };
        *lock(&process.child_pid) = child.id();
        lock(&self.processes).push(process.clone());
        let weak = self.me.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            server.abort();
            let Some(f) = weak.upgrade() else { return };
            lock(&f.processes).retain(|p| p.id != process.id);
            let why = match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            };
            if let Some(job) = lock(&process.current).take() {
                tracing::warn!(function = %f.spec.name, request_id = %job.request_id, %why, "Lambda process died mid-invocation");
                let _ = job.reply.send(Err(LambdaError::Crashed(why)));
            }
            // Work may still be queued with no process left to take it.
            let orphaned = !lock(&f.queue).is_empty() && lock(&f.processes).is_empty();
            if orphaned {
                respawn(f).await;
            }
        });
        Ok(())
    }

    /// Kill every process (their in-flight invocations fail as crashed).
    pub fn shutdown(&self) {
        for p in lock(&self.processes).iter() {
            if let Some(pid) = *lock(&p.child_pid) {
                // SIGKILL: the runtime has nothing to flush that we would keep.
                kill_process(pid);
            }
        }
    }
}

/// Boxed (and explicitly `Send`) so the monitor task can start a replacement without an
/// infinitely recursive future type.
fn respawn(f: Arc<LambdaFunction>) -> futures_util::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        if let Err(e) = f.spawn_process().await {
            tracing::error!(function = %f.spec.name, error = %e, "could not replace the Lambda process");
        }
    })
}

/// SIGKILL one `bootstrap` process by pid (never 0 or 1).
fn kill_process(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid > 1 {
        // SAFETY: kill only sends a signal to the process we spawned.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

type ApiState = State<(Arc<LambdaFunction>, Arc<Process>)>;

async fn next(State((f, p)): ApiState) -> Response {
    {
        let mut first = lock(&p.first_next);
        if first.is_none() {
            let cold = p.spawned.elapsed();
            *first = Some(cold);
            lock(&f.cold_starts).push(cold);
        }
    }
    // Counted as idle while waiting; the guard also un-counts a process whose request is
    // dropped because it died while waiting.
    struct Idle<'a>(&'a AtomicUsize);
    impl Drop for Idle<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    f.idle.fetch_add(1, Ordering::SeqCst);
    let idle = Idle(&f.idle);
    let job = loop {
        let notified = f.work.notified();
        // Take the job and make it this process's current one in one step (no await between),
        // so a job is never lost between the queue and the process.
        let taken = {
            let mut q = lock(&f.queue);
            match q.pop_front() {
                Some(job) => {
                    let headers = (
                        job.request_id.clone(),
                        job.deadline,
                        job.trace_id.clone(),
                        job.payload.clone(),
                    );
                    *lock(&p.current) = Some(job);
                    Some(headers)
                }
                None => None,
            }
        };
        if let Some(h) = taken {
            break h;
        }
        notified.await;
    };
    drop(idle);
    if !lock(&f.queue).is_empty() {
        f.work.notify_one();
    }
    let (request_id, deadline, trace_id, payload) = job;
    let deadline_ms = bus_telemetry::trace::now_ms()
        + deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
    let mut headers = HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.insert(k, v);
        }
    };
    put("lambda-runtime-aws-request-id", request_id);
    put("lambda-runtime-deadline-ms", deadline_ms.to_string());
    put(
        "lambda-runtime-invoked-function-arn",
        format!(
            "arn:aws:lambda:{}:{}:function:{}",
            bus::events::REGION,
            bus::events::ACCOUNT,
            f.spec.name
        ),
    );
    put("lambda-runtime-trace-id", trace_id);
    put("content-type", "application/json".into());
    (StatusCode::OK, headers, payload).into_response()
}

fn take_current(p: &Process, id: &str) -> Option<Job> {
    let mut cur = lock(&p.current);
    if cur.as_ref().is_some_and(|j| j.request_id == id) {
        cur.take()
    } else {
        None
    }
}

async fn response(
    State((f, p)): ApiState,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> StatusCode {
    let Some(job) = take_current(&p, &id) else {
        return StatusCode::BAD_REQUEST;
    };
    if bus_aws::lambda_stream::is_streaming(&headers) {
        // The chunks reach the invoker as the function writes them, until the body ends or
        // the function's time is up.
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        if job.reply.send(Ok(Answer::Stream(rx))).is_ok() {
            bus_aws::lambda_stream::pump(body, tx, job.deadline, f.spec.timeout.as_millis()).await;
        }
        return StatusCode::ACCEPTED;
    }
    let body = match axum::body::to_bytes(body, MAX_RESPONSE_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let _ = job.reply.send(Err(LambdaError::Function {
                error_type: "Runtime.ResponseSizeTooLarge".into(),
                message: format!(
                    "the response could not be read (at most {MAX_RESPONSE_BYTES} bytes): {e}"
                ),
            }));
            return StatusCode::PAYLOAD_TOO_LARGE;
        }
    };
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let _ = job.reply.send(Ok(Answer::Json(value)));
    StatusCode::ACCEPTED
}

fn error_of(body: &[u8]) -> LambdaError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    LambdaError::Function {
        error_type: v
            .get("errorType")
            .and_then(Value::as_str)
            .unwrap_or("Unhandled")
            .to_string(),
        message: v
            .get("errorMessage")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
    }
}

async fn invocation_error(
    State((_, p)): ApiState,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> StatusCode {
    let Some(job) = take_current(&p, &id) else {
        return StatusCode::BAD_REQUEST;
    };
    let _ = job.reply.send(Err(error_of(&body)));
    StatusCode::ACCEPTED
}

async fn init_error(State((f, _)): ApiState, body: axum::body::Bytes) -> StatusCode {
    tracing::error!(function = %f.spec.name, error = %error_of(&body), "Lambda init failed");
    StatusCode::ACCEPTED
}

/// The engine runs these as its Lambda-backed functions (`Engine::attach_lambda`).
#[async_trait::async_trait]
impl bus::lambda::LambdaTarget for LambdaFunction {
    fn name(&self) -> &str {
        &self.spec.name
    }
    fn metadata(&self) -> Value {
        json!({"bootstrap": self.spec.bootstrap.display().to_string()})
    }
    async fn invoke(&self, event: &Value) -> Result<Value, LambdaError> {
        LambdaFunction::invoke(self, event).await
    }
    fn shutdown(&self) {
        LambdaFunction::shutdown(self)
    }
}

type InvokeFunctions = Arc<Vec<Arc<LambdaFunction>>>;

/// The function a request names and its JSON event, or the error response Lambda gives.
#[allow(clippy::result_large_err)]
fn invocation_of(
    functions: &InvokeFunctions,
    name: String,
    body: &[u8],
) -> Result<(Arc<LambdaFunction>, Value), Response> {
    // A name, a partial ARN or a full ARN (`…:function:NAME[:QUALIFIER]`).
    let name = match name.split_once(":function:") {
        Some((_, rest)) => rest.split(':').next().unwrap_or(rest).to_string(),
        None => name,
    };
    let refuse = |status: StatusCode, kind: &'static str, message: String| {
        let mut r = (
            status,
            axum::Json(json!({"Type": "User", "message": message})),
        )
            .into_response();
        r.headers_mut()
            .insert("x-amzn-errortype", HeaderValue::from_static(kind));
        r
    };
    let Some(f) = functions.iter().find(|f| f.spec.name == name) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "ResourceNotFoundException",
            format!("Function not found: {name}"),
        ));
    };
    let event = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| {
            refuse(
                StatusCode::BAD_REQUEST,
                "InvalidRequestContentException",
                format!("Could not parse request body into json: {e}"),
            )
        })?
    };
    Ok((f.clone(), event))
}

async fn invoke_api(
    State(functions): State<InvokeFunctions>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let (f, event) = match invocation_of(&functions, name, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    match f.invoke(&event).await {
        Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        // As Lambda reports a failed invocation: 200 with X-Amz-Function-Error.
        Err(e) => {
            let mut r = (
                StatusCode::OK,
                axum::Json(json!({"errorType": e.error_type(), "errorMessage": e.to_string()})),
            )
                .into_response();
            r.headers_mut().insert(
                "x-amz-function-error",
                HeaderValue::from_static("Unhandled"),
            );
            r
        }
    }
}

/// `InvokeWithResponseStream`: the answer as an event stream of `PayloadChunk`s ending in
/// `InvokeComplete` (which carries the error of a failed invocation).
async fn invoke_stream_api(
    State(functions): State<InvokeFunctions>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    use bus_aws::lambda_stream::{invoke_complete, payload_chunk};
    let (f, event) = match invocation_of(&functions, name, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        match f.invoke_answer(&event).await {
            Err(e) => {
                let _ = tx.send(Ok(invoke_complete(Some(&e)))).await;
            }
            Ok(Answer::Json(v)) => {
                let _ = tx
                    .send(Ok(payload_chunk(bytes::Bytes::from(v.to_string()))))
                    .await;
                let _ = tx.send(Ok(invoke_complete(None))).await;
            }
            Ok(Answer::Stream(mut pieces)) => {
                while let Some(piece) = pieces.recv().await {
                    match piece {
                        Ok(b) => {
                            if tx.send(Ok(payload_chunk(b))).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Ok(invoke_complete(Some(&e)))).await;
                            return;
                        }
                    }
                }
                let _ = tx.send(Ok(invoke_complete(None))).await;
            }
        }
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    });
    let mut r = Response::new(axum::body::Body::from_stream(events));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/vnd.amazon.eventstream"),
    );
    r.headers_mut().insert(
        "x-amz-executed-version",
        HeaderValue::from_static("$LATEST"),
    );
    r
}

/// The Lambda `Invoke` API (`POST /2015-03-31/functions/{name}/invocations`) and
/// `InvokeWithResponseStream` (`POST /2021-11-15/functions/{name}/response-streaming-invocations`) over local
/// functions, so the AWS SDK's Lambda client (`AWS_ENDPOINT_URL_LAMBDA`) reaches them as it
/// would reach deployed ones → the base URL.
pub async fn serve_invoke_api(
    functions: Vec<Arc<LambdaFunction>>,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    serve_invoke_api_on(listener, functions)
}

/// [`serve_invoke_api`] on a listener bound beforehand (so the functions' environment can
/// carry its address).
pub fn serve_invoke_api_on(
    listener: tokio::net::TcpListener,
    functions: Vec<Arc<LambdaFunction>>,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    let app = Router::new()
        .route("/2015-03-31/functions/{name}/invocations", post(invoke_api))
        .route(
            "/2021-11-15/functions/{name}/response-streaming-invocations",
            post(invoke_stream_api),
        )
        .with_state(Arc::new(functions));
    let url = format!("http://{}", listener.local_addr()?);
    // A response stream is many small writes: without TCP_NODELAY each one after the first
    // waits for the caller's delayed ACK (40 ms on Linux), which Lambda's service does not add.
    let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
        let _ = s.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}

/// What [`check_start`] saw of one bootstrap.
#[derive(Debug, Clone)]
pub struct StartCheck {
    pub name: String,
    /// Spawn → its first `GET /next`.
    pub cold_start: Duration,
    /// Spawn → the answer to the first invocation.
    pub first_answer: Duration,
    pub answer: Value,
}

/// Start `spec`'s bootstrap under a Runtime API of its own, invoke it once with `event`, and
/// kill it: proof that a built bootstrap initialises and serves (CI's Lambda stage, and the
/// cold-start figures of `bench/aws.sh`). A bootstrap that fails its init, exits or never asks
/// for work fails the check within `spec.timeout`.
pub async fn check_start(
    mut spec: LambdaSpec,
    env: Vec<(String, String)>,
    event: &Value,
) -> Result<StartCheck, LambdaError> {
    spec.max_processes = 1;
    let name = spec.name.clone();
    let started = Instant::now();
    let timeout = spec.timeout;
    let f = LambdaFunction::new(spec, env);
    f.spawn_process().await?;
    // Wait for the first `next` so that a bootstrap that exits during init is reported as such
    // (the pool would otherwise respawn it until the invocation times out).
    while f.cold_starts().is_empty() {
        if f.process_count() == 0 {
            return Err(LambdaError::Spawn(format!(
                "{name} exited before asking for work (its output is above)"
            )));
        }
        if started.elapsed() > timeout {
            f.shutdown();
            return Err(LambdaError::TimedOut(timeout.as_millis()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let answer = f.invoke(event).await;
    let first_answer = started.elapsed();
    f.shutdown();
    let answer = answer?;
    let cold_start = f.cold_starts().first().copied().unwrap_or(first_answer);
    Ok(StartCheck {
        name,
        cold_start,
        first_answer,
        answer,
    })
}
