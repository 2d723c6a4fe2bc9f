//! The upstream design the record path is measured against: first
//! observations kept in a map, either in the request's own state behind a
//! mutex ([`UpstreamRequest`]) or in an owner's state that observations are
//! sent to ([`Owner`]; an owner thread here, an owner process in
//! [`crate::uds`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hint::black_box;
use std::sync::Mutex;
use std::thread::JoinHandle;

use edgemark::clock::monotonic_ns;

use crate::common::{EDGES, MARKS_PER_REQUEST};

/// What an observation is keyed by: from, to, segment, event.
pub(crate) type Key = (u32, u32, u32, u8);
/// What it keeps: the timestamp (or elapsed time) and the chunk sequence.
type Value = (u64, Option<u64>);

/// The eight keys of one request's first writes, in the order of
/// [`marks`](crate::common::marks), with the chunk sequence each carries.
pub(crate) type Keys = [(Key, Option<u64>); MARKS_PER_REQUEST];

/// The keys of one request's first writes.
pub(crate) fn keys() -> Keys {
    std::array::from_fn(|i| {
        let e = EDGES[i / 4];
        let chunk = (i % 4 == 0).then_some(3);
        ((e.from, e.to, 0, (i % 4) as u8), chunk)
    })
}

/// One request's state in the upstream design: the origin and a
/// mutex-guarded map of first observations, created empty when the request
/// begins.
pub(crate) struct UpstreamRequest {
    origin_ns: u64,
    edges: Mutex<HashMap<Key, Value>>,
}

impl UpstreamRequest {
    pub(crate) fn new() -> UpstreamRequest {
        UpstreamRequest {
            origin_ns: monotonic_ns(),
            edges: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the clock and keeps the observation if it is the first for its
    /// key.
    #[inline(always)]
    pub(crate) fn record(&self, key: Key, chunk: Option<u64>) -> bool {
        let elapsed = monotonic_ns().saturating_sub(self.origin_ns);
        let mut map = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        match map.entry(key) {
            Entry::Vacant(v) => {
                v.insert((elapsed, chunk));
                true
            }
            Entry::Occupied(_) => false,
        }
    }
}

/// One observation as a worker would send it to the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Observation {
    pub(crate) token: u128,
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) segment: u32,
    pub(crate) event: u8,
    pub(crate) chunk_seq: Option<u64>,
    pub(crate) at_ns: u64,
}

impl Observation {
    /// Observation `i` of the request `request`, stamped now.
    #[inline(always)]
    pub(crate) fn now(request: u128, keys: &Keys, i: usize) -> Observation {
        let ((from, to, segment, event), chunk_seq) = keys[i % MARKS_PER_REQUEST];
        Observation {
            token: request,
            from,
            to,
            segment,
            event,
            chunk_seq,
            at_ns: monotonic_ns(),
        }
    }
}

/// The owner's state: per request, a map of first observations.
#[derive(Default)]
pub(crate) struct OwnerState(HashMap<u128, HashMap<Key, Value>>);

impl OwnerState {
    /// First write wins.
    pub(crate) fn apply(&mut self, o: &Observation) -> bool {
        let request = self.0.entry(o.token).or_default();
        match request.entry((o.from, o.to, o.segment, o.event)) {
            Entry::Vacant(v) => {
                v.insert((o.at_ns, o.chunk_seq));
                true
            }
            Entry::Occupied(_) => false,
        }
    }

    /// Closes every request.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Whoever owns the requests' state, reached by sending it observations.
pub(crate) trait Owner {
    /// Sends one observation; blocks while the owner's queue is full.
    fn send(&self, o: &Observation) -> bool;

    /// Waits until the owner has applied everything sent, then has it close
    /// every request.
    fn flush(&self);
}

/// The capacity of an owner thread's channel: the sender blocks when it is
/// full.
const CHANNEL_CAPACITY: usize = 1024;

enum ToOwner {
    Observation(Observation),
    /// Closes every request so far and acknowledges.
    Flush(crossbeam_channel::Sender<()>),
}

/// An owner thread fed by a bounded channel.
pub(crate) struct ChannelOwner {
    tx: Option<crossbeam_channel::Sender<ToOwner>>,
    thread: Option<JoinHandle<()>>,
}

impl ChannelOwner {
    pub(crate) fn spawn() -> ChannelOwner {
        let (tx, rx) = crossbeam_channel::bounded::<ToOwner>(CHANNEL_CAPACITY);
        let thread = std::thread::spawn(move || {
            let mut state = OwnerState::default();
            for msg in rx {
                match msg {
                    ToOwner::Observation(o) => {
                        black_box(state.apply(&o));
                    }
                    ToOwner::Flush(ack) => {
                        state.clear();
                        let _ = ack.send(());
                    }
                }
            }
        });
        ChannelOwner {
            tx: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Owner for ChannelOwner {
    #[inline(always)]
    fn send(&self, o: &Observation) -> bool {
        self.tx
            .as_ref()
            .is_some_and(|tx| tx.send(ToOwner::Observation(*o)).is_ok())
    }

    fn flush(&self) {
        let (ack, done) = crossbeam_channel::bounded(1);
        let tx = self.tx.as_ref().expect("owner running");
        tx.send(ToOwner::Flush(ack)).expect("owner running");
        done.recv().expect("owner acknowledges");
    }
}

impl Drop for ChannelOwner {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
