//! Channels: a one-shot pipe between two workers for streaming frames (provider tokens).
//! `engine::channels::create` hands out a writer and a reader ref; each end is attached once,
//! over `/ws/channels/{id}?key=…&dir=read|write` or in process. The writer closing ends the
//! stream; a channel whose ends are not both attached within the TTL expires.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub const DEFAULT_BUFFER: usize = 64;
pub const MAX_BUFFER: usize = 4096;
pub const UNATTACHED_TTL: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq)]
pub enum ChannelFrame {
    Text(String),
    Binary(Vec<u8>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Read,
    Write,
}

impl Direction {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelRef {
    pub channel_id: String,
    pub access_key: String,
    pub direction: Direction,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ChannelError {
    #[error("channel `{0}` does not exist or has expired")]
    NotFound(String),
    #[error("wrong access key for channel `{0}`")]
    Forbidden(String),
    #[error("the {1:?} end of channel `{0}` is already attached")]
    AlreadyAttached(String, Direction),
}

struct Slot {
    write_key: String,
    read_key: String,
    created: Instant,
    tx: Option<mpsc::Sender<ChannelFrame>>,
    rx: Option<mpsc::Receiver<ChannelFrame>>,
}

#[derive(Default)]
pub struct ChannelHub {
    slots: Mutex<HashMap<String, Slot>>,
}

impl ChannelHub {
    pub fn create(&self, buffer_size: Option<usize>) -> (ChannelRef, ChannelRef) {
        let buffer = buffer_size.unwrap_or(DEFAULT_BUFFER).clamp(1, MAX_BUFFER);
        let (tx, rx) = mpsc::channel(buffer);
        let id = uuid::Uuid::new_v4().to_string();
        let write_key = bus_telemetry::trace::random_hex(16);
        let read_key = bus_telemetry::trace::random_hex(16);
        let slot = Slot {
            write_key: write_key.clone(),
            read_key: read_key.clone(),
            created: Instant::now(),
            tx: Some(tx),
            rx: Some(rx),
        };
        self.lock().insert(id.clone(), slot);
        (
            ChannelRef {
                channel_id: id.clone(),
                access_key: write_key,
                direction: Direction::Write,
            },
            ChannelRef {
                channel_id: id,
                access_key: read_key,
                direction: Direction::Read,
            },
        )
    }

    /// Hold `tx` as the writer end of `channel`, a channel created elsewhere whose writer is
    /// in this process (a Lambda answering in streaming mode): `attach_writer` with its key
    /// takes it, once. There is no reader end here.
    pub fn adopt_writer(&self, channel: &ChannelRef, tx: mpsc::Sender<ChannelFrame>) {
        self.lock().insert(
            channel.channel_id.clone(),
            Slot {
                write_key: channel.access_key.clone(),
                read_key: String::new(),
                created: Instant::now(),
                tx: Some(tx),
                rx: None,
            },
        );
    }

    /// Drop a channel, attached or not → whether it was there.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Check an attach request without taking the end (the edge checks before upgrading).
    pub fn check(&self, id: &str, key: &str, dir: Direction) -> Result<(), ChannelError> {
        let slots = self.lock();
        let slot = slots
            .get(id)
            .ok_or_else(|| ChannelError::NotFound(id.to_string()))?;
        let (expected, free) = match dir {
            Direction::Write => (&slot.write_key, slot.tx.is_some()),
            Direction::Read => (&slot.read_key, slot.rx.is_some()),
        };
        if !constant_time_eq(expected.as_bytes(), key.as_bytes()) {
            return Err(ChannelError::Forbidden(id.to_string()));
        }
        if !free {
            return Err(ChannelError::AlreadyAttached(id.to_string(), dir));
        }
        Ok(())
    }

    pub fn attach_writer(
        &self,
        id: &str,
        key: &str,
    ) -> Result<mpsc::Sender<ChannelFrame>, ChannelError> {
        self.check(id, key, Direction::Write)?;
        let mut slots = self.lock();
        let slot = slots
            .get_mut(id)
            .ok_or_else(|| ChannelError::NotFound(id.to_string()))?;
        let tx = slot
            .tx
            .take()
            .ok_or_else(|| ChannelError::AlreadyAttached(id.to_string(), Direction::Write))?;
        if slot.rx.is_none() {
            slots.remove(id);
        }
        Ok(tx)
    }

    pub fn attach_reader(
        &self,
        id: &str,
        key: &str,
    ) -> Result<mpsc::Receiver<ChannelFrame>, ChannelError> {
        self.check(id, key, Direction::Read)?;
        let mut slots = self.lock();
        let slot = slots
            .get_mut(id)
            .ok_or_else(|| ChannelError::NotFound(id.to_string()))?;
        let rx = slot
            .rx
            .take()
            .ok_or_else(|| ChannelError::AlreadyAttached(id.to_string(), Direction::Read))?;
        if slot.tx.is_none() {
            slots.remove(id);
        }
        Ok(rx)
    }

    /// Drop channels that were not fully attached within `ttl`.
    pub fn sweep(&self, ttl: Duration) -> usize {
        let mut slots = self.lock();
        let before = slots.len();
        slots.retain(|_, s| s.created.elapsed() < ttl);
        before - slots.len()
    }

    pub fn open_count(&self) -> usize {
        self.lock().len()
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_adopted_writer_is_taken_once_with_its_key() {
        let hub = ChannelHub::default();
        let r = ChannelRef {
            channel_id: "c".into(),
            access_key: "k".into(),
            direction: Direction::Write,
        };
        let (tx, mut rx) = mpsc::channel(1);
        hub.adopt_writer(&r, tx);
        assert_eq!(
            hub.attach_writer("c", "wrong").unwrap_err(),
            ChannelError::Forbidden("c".into())
        );
        assert!(matches!(
            hub.attach_reader("c", ""),
            Err(ChannelError::AlreadyAttached(..))
        ));
        let tx = hub.attach_writer("c", "k").unwrap();
        assert_eq!(hub.open_count(), 0, "taken: gone from the hub");
        tx.send(ChannelFrame::Text("a".into())).await.unwrap();
        assert_eq!(rx.recv().await, Some(ChannelFrame::Text("a".into())));
        let (tx, _rx) = mpsc::channel(1);
        hub.adopt_writer(&r, tx);
        assert!(hub.remove("c") && !hub.remove("c"));
    }

    #[tokio::test]
    async fn ends_attach_once_and_writer_close_ends_stream() {
        let hub = ChannelHub::default();
        let (w, r) = hub.create(Some(2));
        assert_eq!(
            hub.attach_writer(&w.channel_id, &r.access_key).unwrap_err(),
            ChannelError::Forbidden(w.channel_id.clone())
        );
        let tx = hub.attach_writer(&w.channel_id, &w.access_key).unwrap();
        assert!(matches!(
            hub.attach_writer(&w.channel_id, &w.access_key),
            Err(ChannelError::AlreadyAttached(..))
        ));
        let mut rx = hub.attach_reader(&r.channel_id, &r.access_key).unwrap();
        tx.send(ChannelFrame::Text("a".into())).await.unwrap();
        drop(tx);
        assert_eq!(rx.recv().await, Some(ChannelFrame::Text("a".into())));
        assert_eq!(rx.recv().await, None);
        assert_eq!(hub.open_count(), 0);
    }

    #[test]
    fn unattached_channels_expire() {
        let hub = ChannelHub::default();
        let (w, _) = hub.create(None);
        assert_eq!(hub.sweep(Duration::ZERO), 1);
        assert!(matches!(
            hub.attach_writer(&w.channel_id, &w.access_key),
            Err(ChannelError::NotFound(_))
        ));
    }
}
