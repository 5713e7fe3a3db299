//! The edge's limits and settings ([`EdgeConfig`]), shared by the WebSocket server and the
//! HTTP routes on its port.

use bus::access::Access;
use std::time::Duration;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:49134";
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const CLOSE_POLICY: u16 = 1008;

#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// The credentials `$connect` accepts (`Authorization: Bearer <token>` or
    /// `?token=<token>`) and the role each carries. None configured: nothing is asked.
    pub access: Access,
    pub max_message_bytes: usize,
    pub max_frame_bytes: usize,
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
    /// Origins (`scheme://host[:port]`) a browser may connect from besides the engine's own.
    /// A `$connect` that carries an `Origin` header from anywhere else is refused with 403,
    /// so a web page the user visits cannot drive the bus.
    pub allowed_origins: Vec<String>,
    /// A connection that has not finished its WebSocket handshake by then is closed.
    pub handshake_timeout: Duration,
    /// Most connections open at once; more are closed right after `accept`.
    pub max_connections: usize,
    /// Most of those that have not (yet) presented a valid credential in their request head:
    /// sign-in pages, assets, slow or hostile peers. Kept below `max_connections` so
    /// unauthenticated peers cannot lock out a credentialed client.
    pub max_unauthenticated: usize,
    /// Most bytes queued for one connection; a peer that falls this far behind has its
    /// queue dropped and is closed with 1008 (cut off if its socket takes nothing more).
    pub max_queued_bytes: usize,
    /// Where the admin token is, as the console's sign-in card says it (`None`: given to the
    /// engine with `--token` / `ENGINE_TOKEN`).
    pub token_file: Option<std::path::PathBuf>,
    /// How long a door's response waits for a parked call (`doors.approval_wait_secs`).
    pub door_approval_wait: Duration,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            access: Access::default(),
            max_message_bytes: 128 * 1024,
            max_frame_bytes: 32 * 1024,
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(2 * 3600),
            allowed_origins: Vec::new(),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_unauthenticated: 256,
            max_queued_bytes: 8 * 1024 * 1024,
            token_file: None,
            door_approval_wait: Duration::from_secs(300),
        }
    }
}
