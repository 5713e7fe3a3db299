//! What a door needs of the bus, behind one port, so the same four doors serve on the
//! engine's own port (the engine in process: [`EngineDoors`]) and from the doors Lambda of the
//! deployed shape (the registry, `Invoke`, and a WebSocket of the caller's for the session's
//! events: `bus_aws::doors`).

use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

use super::Following;
use crate::http::{ApiError, Caller};
use bus::access::{Access, Principal};
use bus::engine::Engine;

/// The bus as the doors use it.
#[async_trait::async_trait]
pub trait DoorBus: Send + Sync {
    /// Who presents `token` (as `$connect` checks it); `None` is refused (401).
    async fn authenticate(&self, token: Option<&str>) -> Option<Principal>;

    /// Call `function_id` as `caller`: refused as it would be over a WebSocket.
    async fn call(
        &self,
        caller: &Caller,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError>;

    /// Call `function_id` as the door itself, not as its caller (reading the models'
    /// catalogue, which is no act of the caller's on the bus).
    async fn call_as_door(
        &self,
        trace: &bus_telemetry::trace::TraceContext,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError>;

    /// Follow session `sid`'s `agent::events` as `caller`, from now on (subscribed before
    /// this returns, so a turn started after it misses nothing). `door` names the follower.
    async fn follow(&self, caller: &Caller, sid: &str, door: &str) -> Result<Following, ApiError>;

    /// Every registered function as `engine::functions::list` lists it (the public agent
    /// card picks the agent's tools from it).
    async fn functions(&self) -> Vec<Value>;

    /// Export the spans of the calls made so far (the doors Lambda does before its answer
    /// ends: a frozen Lambda exports nothing).
    async fn flush_telemetry(&self) {}

    /// Remember which session an MCP `tools/call` follows (`None`: forget it), where another
    /// instance of the door can find it: a `notifications/cancelled` may reach another Lambda
    /// than the call it cancels. The engine's port keeps them in memory only.
    async fn remember_call(&self, _key: &str, _sid: Option<&str>) {}

    /// Mark a call another instance remembered as cancelled → its session (to abort).
    async fn cancel_remembered_call(&self, _key: &str) -> Option<String> {
        None
    }

    /// Whether another instance marked this call cancelled (it may have come while the
    /// call's turn was starting, before there was a turn to abort).
    async fn call_was_cancelled(&self, _key: &str) -> bool {
        false
    }
}

/// What every door shares, in either shape: the bus, and the edge's checks and bounds
/// (cheap to clone: a router's state).
#[derive(Clone)]
pub struct Doors {
    pub bus: Arc<dyn DoorBus>,
    /// Origins a browser may call from (the engine's own and `--allowed-origins`).
    pub origins: Arc<[String]>,
    /// Largest request body accepted (the bus's message limit).
    pub max_body_bytes: usize,
    /// A request body must have arrived whole by then (408, and the connection closes).
    pub body_deadline: Duration,
    /// How long a door's response waits for a parked call to be decided before it ends,
    /// naming the call and how to decide it (`doors.approval_wait_secs`).
    pub approval_wait: Duration,
    /// The MCP door's calls that follow a turn (so a cancellation finds its turn).
    pub(crate) mcp_calls: Arc<super::mcp::Calls>,
}

impl Doors {
    pub fn new(bus: Arc<dyn DoorBus>, origins: Vec<String>) -> Self {
        // The engine's own defaults (`EdgeConfig`): a message's limit, a handshake's deadline.
        let edge = crate::config::EdgeConfig::default();
        Self {
            bus,
            origins: origins.into(),
            max_body_bytes: edge.max_message_bytes,
            body_deadline: edge.handshake_timeout,
            approval_wait: Duration::from_secs(300),
            mcp_calls: Default::default(),
        }
    }

    /// Call a function on the bus as `caller`.
    pub async fn call(
        &self,
        caller: &Caller,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError> {
        self.bus.call(caller, function_id, data).await
    }
}

/// The engine in this process: calls are its invocations, a follower is a connection of the
/// caller's subscribed to the session's group.
pub struct EngineDoors {
    pub engine: Arc<Engine>,
    pub access: Access,
    /// Most bytes queued for one follower before it is closed.
    pub max_queued_bytes: usize,
}

#[async_trait::async_trait]
impl DoorBus for EngineDoors {
    async fn authenticate(&self, token: Option<&str>) -> Option<Principal> {
        self.access.authenticate(token)
    }

    async fn call(
        &self,
        caller: &Caller,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError> {
        caller
            .principal
            .may_call(function_id, self.engine.is_public(function_id))?;
        Ok(self
            .engine
            .invoke(function_id, data, &caller.trace, None, None)
            .await?)
    }

    async fn call_as_door(
        &self,
        trace: &bus_telemetry::trace::TraceContext,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError> {
        Ok(self
            .engine
            .invoke(function_id, data, trace, None, None)
            .await?)
    }

    async fn follow(&self, caller: &Caller, sid: &str, door: &str) -> Result<Following, ApiError> {
        Following::start(
            &self.engine,
            self.max_queued_bytes,
            caller,
            sid,
            &format!("http:{door}"),
            format!("{door} door, session {sid}"),
        )
    }

    async fn functions(&self) -> Vec<Value> {
        self.engine.function_entries(false)
    }
}
