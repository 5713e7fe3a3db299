//! Which browser origins may reach the bus: the one comparison the edge, the HTTP API and the
//! deployed router make.

use std::net::SocketAddr;

/// The origins a page served by the engine itself would send: its listening address, and the
/// loopback names when it listens on loopback. (Not the `Host` header: a DNS-rebound page
/// sends a matching `Host` and `Origin` of its own name.)
pub fn own_origins(local: SocketAddr) -> Vec<String> {
    let port = local.port();
    let mut hosts = vec![match local.ip() {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    }];
    if local.ip().is_loopback() || local.ip().is_unspecified() {
        hosts.extend(["localhost".into(), "127.0.0.1".into(), "[::1]".into()]);
    }
    hosts
        .iter()
        .flat_map(|h| [format!("http://{h}:{port}"), format!("https://{h}:{port}")])
        .collect()
}

/// Whether `origin` is one of `allowed` (a trailing `/` and letter case aside): the one
/// comparison the edge, the HTTP API and the deployed router make.
pub fn origin_listed<'a>(origin: &str, allowed: impl IntoIterator<Item = &'a String>) -> bool {
    let origin = origin.trim_end_matches('/');
    allowed
        .into_iter()
        .any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(origin))
}
