//! The MCP reference servers the tests run (installed by scripts/test.sh): server-everything
//! from npm, and the Python of `HARNESS_MCP_PYTHON` (the official SDK, mcp-server-time).

use std::path::PathBuf;
use std::time::Duration;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn everything_js() -> String {
    let p =
        repo().join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test.sh (or `npm ci --prefix tests/mcp`)",
        p.display()
    );
    p.display().to_string()
}

pub fn python() -> String {
    let p = std::env::var("HARNESS_MCP_PYTHON").unwrap_or_else(|_| {
        panic!("HARNESS_MCP_PYTHON is not set: run scripts/test.sh (it makes a venv with the pinned `mcp` and `mcp-server-time`)")
    });
    assert!(
        std::path::Path::new(&p).exists(),
        "HARNESS_MCP_PYTHON={p} does not exist"
    );
    p
}

pub fn server_script(name: &str) -> String {
    repo()
        .join("tests/mcp/servers")
        .join(name)
        .display()
        .to_string()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// server-everything over streamable HTTP on a port of its own (killed on drop).
pub struct HttpEverything {
    pub child: std::process::Child,
    pub url: String,
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn http_everything() -> HttpEverything {
    let port = free_port();
    let child = std::process::Command::new("node")
        .arg(everything_js())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("node");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything (HTTP) never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    HttpEverything {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}
