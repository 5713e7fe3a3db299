//! experiment: the floor broker with inline writes (the reader writes the frame straight to
//! the destination socket when it can), to size what a task hop per direction costs.
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio_tungstenite::{accept_async, tungstenite::Message};

type W = Arc<Mutex<OwnedWriteHalf>>;
#[derive(Default)]
struct Routes { fns: HashMap<String, W>, pending: HashMap<String, W> }

struct ReadOnly(OwnedReadHalf, Option<W>);
impl AsyncRead for ReadOnly {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> { Pin::new(&mut self.0).poll_read(cx, buf) }
}
impl AsyncWrite for ReadOnly {
    // the handshake's answer goes out here; frames after it are written by `send`
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        let w = self.1.as_ref().unwrap(); let g = w.lock().unwrap();
        let mut off = 0; while off < b.len() { match g.try_write(&b[off..]) { Ok(n) => off += n, Err(_) => std::thread::yield_now() } }
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> { Poll::Ready(Ok(())) }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> { Poll::Ready(Ok(())) }
}

fn send(w: &W, payload: &str) {
    let mut f = Vec::with_capacity(payload.len() + 10);
    f.push(0x81);
    let n = payload.len();
    if n < 126 { f.push(n as u8) } else if n < 65536 { f.push(126); f.extend_from_slice(&(n as u16).to_be_bytes()) } else { f.push(127); f.extend_from_slice(&(n as u64).to_be_bytes()) }
    f.extend_from_slice(payload.as_bytes());
    let g = w.lock().unwrap();
    let mut off = 0; while off < f.len() { match g.try_write(&f[off..]) { Ok(k) => off += k, Err(_) => std::thread::yield_now() } }
}

#[tokio::main]
async fn main() {
    let addr = std::env::args().nth(1).unwrap_or("127.0.0.1:49200".into());
    let l = TcpListener::bind(&addr).await.unwrap();
    let routes = Arc::new(Mutex::new(Routes::default()));
    loop {
        let (s, _) = l.accept().await.unwrap();
        let _ = s.set_nodelay(true);
        let routes = routes.clone();
        tokio::spawn(async move {
            let (r, w) = s.into_split();
            let w: W = Arc::new(Mutex::new(w));
            let ws = match accept_async(ReadOnly(r, Some(w.clone()))).await { Ok(x) => x, Err(_) => return };
            let (_sink, mut stream) = ws.split();
            while let Some(Ok(m)) = stream.next().await {
                let Message::Text(t) = m else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&t) else { continue };
                match v["type"].as_str() {
                    Some("registerfunction") => { routes.lock().unwrap().fns.insert(v["id"].as_str().unwrap_or("").to_string(), w.clone()); }
                    Some("invokefunction") => {
                        let target = { let mut r = routes.lock().unwrap();
                            if let Some(iid) = v["invocation_id"].as_str() { r.pending.insert(iid.to_string(), w.clone()); }
                            r.fns.get(v["function_id"].as_str().unwrap_or("")).cloned() };
                        if let Some(t2) = target { send(&t2, &t); }
                    }
                    Some("invocationresult") => {
                        let iid = v["invocation_id"].as_str().unwrap_or("").to_string();
                        let c = routes.lock().unwrap().pending.remove(&iid);
                        if let Some(c) = c { send(&c, &t); }
                    }
                    _ => {}
                }
            }
        });
    }
}
