//! Who is calling, and what a role may do: every backend (the WebSocket engine, the embedded
//! one, the AWS router) asks the same [`Principal`] the same questions before it registers,
//! calls or subscribes. [`crate::access`] decides which credential is which principal.

use crate::protocol::{ErrorBody, codes};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Worker,
    Client,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Worker => "worker",
            Role::Client => "client",
        }
    }
}

/// Namespaces of the agent's tools: reached through the orchestrator's policy gate, never
/// called by a client directly, whatever their registration says.
pub const AGENT_TOOL_NAMESPACES: &[&str] = &["shell::", "fs::"];

/// The streams a client may subscribe to.
pub const CLIENT_STREAMS: &[&str] = &["agent::events"];

pub use crate::protocol::{AGENT_FLAG, PUBLIC_FLAG};

/// Whether a registration's metadata keeps the function from the agent.
pub fn is_not_for_the_agent(metadata: Option<&Value>) -> bool {
    metadata
        .and_then(|m| m.get(AGENT_FLAG))
        .and_then(Value::as_bool)
        == Some(false)
}

/// Whether a registration's metadata marks it public.
pub fn is_public(metadata: Option<&Value>) -> bool {
    metadata
        .and_then(|m| m.get(PUBLIC_FLAG))
        .and_then(Value::as_bool)
        == Some(true)
}

/// An authenticated connection: a name for logs, a role, and (workers) granted namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// Namespaces without the `::` (`policy`, `shell`).
    pub namespaces: Vec<String>,
    /// A client that sees and decides for every session (`sessions: all`: an operator).
    pub sessions_all: bool,
}

/// The baggage entry that says on whose behalf a call is made (`<role>:<name>`, role one of
/// `admin`, `worker`, `operator`, `client`). The engine writes it for every call a client
/// makes (whatever the client sent) and for any call that comes without one; workers pass it
/// on, so a turn's steps act for whoever started the run.
pub const ACTING_BAGGAGE: &str = "iii.principal";

/// Who a call is made for, as read from [`ACTING_BAGGAGE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acting {
    pub role: String,
    pub name: String,
}

impl Acting {
    pub fn parse(value: &str) -> Option<Acting> {
        let (role, name) = value.split_once(':')?;
        matches!(role, "admin" | "worker" | "operator" | "client").then(|| Acting {
            role: role.to_string(),
            name: name.to_string(),
        })
    }

    /// What the baggage carries.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.role, self.name)
    }

    /// Admin, workers and operators see every session; a client only its own.
    pub fn sees_all(&self) -> bool {
        self.role != "client"
    }

    /// Whether this is the owner recorded as `owner` (`{name, role}`).
    pub fn is(&self, owner: &Value) -> bool {
        let role = match owner["role"].as_str() {
            Some("operator") => "client",
            Some(r) => r,
            None => return false,
        };
        let mine = if self.role == "operator" {
            "client"
        } else {
            self.role.as_str()
        };
        owner["name"].as_str() == Some(self.name.as_str()) && role == mine
    }

    /// The owner record a session started by this caller gets.
    pub fn owner_record(&self) -> Value {
        serde_json::json!({"name": self.name, "role": self.role})
    }

    /// Whether this caller may see a session owned by `owner` (`null`: no recorded owner,
    /// which only those who see all may see).
    pub fn may_see(&self, owner: &Value) -> bool {
        self.sees_all() || self.is(owner)
    }
}

/// Who `trace`'s call is made for; `None` when nobody said (an in-process caller of the
/// harness itself, trusted).
pub fn acting(trace: &bus_telemetry::trace::TraceContext) -> Option<Acting> {
    trace.baggage_get(ACTING_BAGGAGE).and_then(Acting::parse)
}

fn namespace_of(id: &str) -> &str {
    id.split_once("::").map(|(ns, _)| ns).unwrap_or(id)
}

fn forbidden(message: String) -> ErrorBody {
    ErrorBody::new(codes::FORBIDDEN, message)
}

impl Principal {
    pub fn admin() -> Self {
        Principal {
            name: "admin".into(),
            role: Role::Admin,
            namespaces: Vec::new(),
            sessions_all: false,
        }
    }

    /// Who this credential acts as on a call.
    pub fn acting(&self) -> Acting {
        let role = match self.role {
            Role::Client if self.sessions_all => "operator",
            r => r.as_str(),
        };
        Acting {
            role: role.to_string(),
            name: self.name.clone(),
        }
    }

    /// [`Principal::stamp`] on a `baggage` header.
    pub fn stamp_baggage(&self, baggage: Option<&str>) -> Option<String> {
        let mut trace = bus_telemetry::trace::TraceContext::default();
        if let Some(b) = baggage {
            trace.baggage = bus_telemetry::telemetry::extract_baggage(b);
        }
        self.stamp(trace).baggage_header()
    }

    /// The trace context a call by this credential goes on with: a client's own identity,
    /// whatever it sent; anyone else's passes on who it acts for, or says itself.
    pub fn stamp(
        &self,
        mut trace: bus_telemetry::trace::TraceContext,
    ) -> bus_telemetry::trace::TraceContext {
        let keep = self.role != Role::Client && acting(&trace).is_some();
        if !keep {
            trace = trace.with_baggage(ACTING_BAGGAGE, &self.acting().encode());
        }
        trace
    }

    fn label(&self) -> String {
        format!("{} `{}`", self.role.as_str(), self.name)
    }

    fn granted(&self, id: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Worker => {
                let ns = namespace_of(id);
                id.contains("::") && self.namespaces.iter().any(|g| g == ns)
            }
            Role::Client => false,
        }
    }

    /// May this credential register (or replace) function `id`? `what` names the kind for
    /// the error (`function`, `trigger`).
    pub fn may_register(&self, what: &str, id: &str) -> Result<(), ErrorBody> {
        if self.granted(id) {
            return Ok(());
        }
        Err(forbidden(match self.role {
            Role::Client => format!(
                "{} may not register {what}s (`{id}`): clients only call public functions",
                self.label()
            ),
            _ => format!(
                "{} is not granted namespace `{}` and may not register {what} `{id}`",
                self.label(),
                namespace_of(id)
            ),
        }))
    }

    /// May this credential call `function_id`, registered public or not?
    pub fn may_call(&self, function_id: &str, public: bool) -> Result<(), ErrorBody> {
        if self.role != Role::Client {
            return Ok(());
        }
        if AGENT_TOOL_NAMESPACES
            .iter()
            .any(|ns| function_id.starts_with(ns))
        {
            return Err(forbidden(format!(
                "`{function_id}` is an agent tool: {} may not call it (tools run through the orchestrator's policy gate)",
                self.label()
            )));
        }
        if public {
            return Ok(());
        }
        Err(forbidden(format!(
            "`{function_id}` is not public: {} may call only functions registered as public",
            self.label()
        )))
    }

    /// May this credential subscribe to `stream_name`?
    pub fn may_subscribe(&self, stream_name: &str) -> Result<(), ErrorBody> {
        if self.role != Role::Client || CLIENT_STREAMS.contains(&stream_name) {
            return Ok(());
        }
        Err(forbidden(format!(
            "{} may subscribe only to {}, not `{stream_name}`",
            self.label(),
            CLIENT_STREAMS.join(", ")
        )))
    }
}
