//! The emulated Runtime API's end of a bootstrap's connection, acknowledging what it reads at
//! once. `lambda_runtime`'s client sends a streamed response's chunks without `TCP_NODELAY`:
//! a chunk written while the one before it is not acknowledged yet waits for that ACK, and
//! Linux delays an ACK up to 40 ms when it has nothing to send back (the end of a streamed
//! response, in some runs nearly every time). Lambda's own Runtime API does not add that
//! wait; this endpoint asks the kernel for an immediate ACK before each read (`TCP_QUICKACK`,
//! which the kernel does not keep on its own).

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A listener whose connections acknowledge at once ([`QuickAck`]), with `TCP_NODELAY` on
/// the answers.
pub struct QuickAckListener(pub TcpListener);

impl axum::serve::Listener for QuickAckListener {
    type Io = QuickAck;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (QuickAck(stream), addr);
                }
                // As axum's own listener: a failed accept (out of descriptors) is retried
                // after a moment, not a busy loop.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection that asks for an immediate ACK before each read.
pub struct QuickAck(TcpStream);

fn quick_ack(stream: &TcpStream) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor owned by `stream`, and a pointer to a c_int of the
    // length given; the call only sets an option.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        quick_ack(&self.0);
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
