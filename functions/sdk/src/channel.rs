//! Channel ends as a worker sees them: in process (the engine's hub) or over a WebSocket.

use ::bus::channels::{ChannelFrame, ChannelHub, ChannelRef};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use std::sync::LazyLock;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::error::BusError;

/// The writer ends of this process's response streams (a Lambda answering an invocation in
/// streaming mode), held by the engine's channel hub under the caller's channel id and key:
/// opening such a ref writes into the response, whatever the bus (see
/// `bus_aws::response_stream`).
static RESPONSE_STREAMS: LazyLock<ChannelHub> = LazyLock::new(ChannelHub::default);

/// Make `channel` write into a response stream (until it is taken or forgotten).
pub(crate) fn register_response_stream(channel: &ChannelRef, tx: mpsc::Sender<ChannelFrame>) {
    RESPONSE_STREAMS.adopt_writer(channel, tx);
}

/// The writer for `channel` if it is one of this process's response streams (once).
pub(crate) fn take_response_stream(channel: &ChannelRef) -> Option<ChannelWriter> {
    RESPONSE_STREAMS
        .attach_writer(&channel.channel_id, &channel.access_key)
        .ok()
        .map(ChannelWriter::Local)
}

/// The invocation ended: a stream its function never opened is closed.
pub(crate) fn forget_response_stream(channel_id: &str) {
    RESPONSE_STREAMS.remove(channel_id);
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub enum ChannelWriter {
    Local(mpsc::Sender<ChannelFrame>),
    Remote(Box<(SplitSink<Ws, WsMessage>, SplitStream<Ws>)>),
}

fn closed(e: impl std::fmt::Display) -> BusError {
    BusError::InvocationStopped(format!("channel closed: {e}"))
}

impl ChannelWriter {
    pub async fn send(&mut self, frame: ChannelFrame) -> Result<(), BusError> {
        match self {
            ChannelWriter::Local(tx) => tx.send(frame).await.map_err(closed),
            ChannelWriter::Remote(ends) => {
                let sink = &mut ends.0;
                let msg = match frame {
                    ChannelFrame::Text(t) => WsMessage::text(t),
                    ChannelFrame::Binary(b) => WsMessage::binary(b),
                };
                sink.send(msg).await.map_err(closed)
            }
        }
    }

    pub async fn send_text(&mut self, text: impl Into<String>) -> Result<(), BusError> {
        self.send(ChannelFrame::Text(text.into())).await
    }

    /// End the stream: the reader sees the end after every frame sent before.
    pub async fn close(self) -> Result<(), BusError> {
        match self {
            ChannelWriter::Local(tx) => {
                drop(tx);
                Ok(())
            }
            ChannelWriter::Remote(ends) => {
                let (mut sink, mut stream) = *ends;
                sink.send(WsMessage::Close(None)).await.map_err(closed)?;
                // Wait for the engine's close so every frame is through before we return.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                    while let Some(Ok(m)) = stream.next().await {
                        if matches!(m, WsMessage::Close(_)) {
                            break;
                        }
                    }
                })
                .await;
                Ok(())
            }
        }
    }
}

pub enum ChannelReader {
    Local(mpsc::Receiver<ChannelFrame>),
    Remote(Box<Ws>),
}

impl ChannelReader {
    /// The next frame, or `None` once the writer closed.
    pub async fn next(&mut self) -> Option<ChannelFrame> {
        match self {
            ChannelReader::Local(rx) => rx.recv().await,
            ChannelReader::Remote(ws) => loop {
                match ws.next().await? {
                    Ok(WsMessage::Text(t)) => {
                        return Some(ChannelFrame::Text(t.as_str().to_string()));
                    }
                    Ok(WsMessage::Binary(b)) => return Some(ChannelFrame::Binary(b.to_vec())),
                    Ok(WsMessage::Close(_)) | Err(_) => return None,
                    Ok(_) => continue,
                }
            },
        }
    }
}
