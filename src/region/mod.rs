//! Creating, attaching and validating regions.
//!
//! This layer only produces a validated slice of atomic words (from a shared
//! mapping or from the heap) plus the geometry and schema read from its
//! header; the protocol runs over that slice, and the recorder builds itself
//! from the two. `header.rs` is the header codec, `map.rs` the storage
//! (files, sealed memory files, mappings, heap copies), `error.rs` the
//! errors.

mod error;
mod header;
mod map;

pub use error::{AttachError, CreateError, SweepError};
pub(crate) use header::{Header, mark_mixed_pid_namespaces, mixed_pid_namespaces, new_header};
pub(crate) use map::{Access, FileOwner, Opened, Storage, create_in_memory, open_copy};
#[cfg(not(edgemark_loom))]
pub(crate) use map::{create_file, create_sealed, open_file};
