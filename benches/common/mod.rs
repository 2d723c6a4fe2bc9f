//! What the benches share: the environment variable that selects a child
//! role when a bench binary re-executes itself, the eight first writes of
//! one request, the directory regions are made in, and the time-stamp
//! counter ([`tsc`]).

#![allow(dead_code, unreachable_pub)]

pub mod tsc;

use edgemark::{Edge, Event, Mark};

/// Selects a child role when a bench binary is re-executed.
pub const ROLE: &str = "EDGEMARK_BENCH_ROLE";

/// Two edges times four events: the first writes one request can take.
pub const MARKS_PER_REQUEST: usize = 8;

/// The default region's edges.
pub const EDGES: [Edge; 2] = [Edge::new(0, 1), Edge::new(1, 2)];

/// The eight first writes of one request: both edges, all four events, the
/// producer event with a chunk sequence.
pub fn marks() -> [Mark; MARKS_PER_REQUEST] {
    std::array::from_fn(|i| {
        let mark = Mark::new(EDGES[i / 4], Event::ALL[i % 4]);
        if i % 4 == 0 { mark.chunk_seq(3) } else { mark }
    })
}

/// A fresh directory for a bench's regions on the memory-backed filesystem
/// (where production regions live), removed when dropped.
pub fn region_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(edgemark::default_dir()).expect("a region directory")
}
