//! TEMPORARY: the library's trace API (`edgemark::trace`) as this branch
//! expects it, until it lands; removed when it does. It drains nothing.

#![allow(dead_code)]

use edgemark::{Recorder, Snapshot, Token};

/// A request that was closed, as the region's ring of closed requests holds
/// it.
#[derive(Debug, Clone)]
pub(crate) struct ClosedRequest {
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    span_id: [u8; 8],
    flags: u8,
    origin: u64,
    closed: u64,
    snapshot: Snapshot,
    token: Token,
}

impl ClosedRequest {
    pub(crate) fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }
    pub(crate) fn parent_span_id(&self) -> Option<[u8; 8]> {
        self.parent
    }
    pub(crate) fn span_id(&self) -> [u8; 8] {
        self.span_id
    }
    pub(crate) fn trace_flags(&self) -> u8 {
        self.flags
    }
    pub(crate) fn origin_unix_ns(&self) -> u64 {
        self.origin
    }
    pub(crate) fn closed_unix_ns(&self) -> u64 {
        self.closed
    }
    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }
    pub(crate) fn token(&self) -> Token {
        self.token
    }
}

/// What one drain took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    pub(crate) taken: usize,
    pub(crate) lost: u64,
}

/// The drain of the ring of closed requests.
pub(crate) trait DrainClosed {
    fn drain_closed(
        &self,
        max: usize,
        out: &mut Vec<ClosedRequest>,
    ) -> Result<Drained, edgemark::AttachError>;
}

impl DrainClosed for Recorder {
    fn drain_closed(
        &self,
        _max: usize,
        _out: &mut Vec<ClosedRequest>,
    ) -> Result<Drained, edgemark::AttachError> {
        Ok(Drained { taken: 0, lost: 0 })
    }
}
