//! edgemark beside the tools a user would pick instead, for the peers bench
//! (`benches/peers.rs`): the LTTng-UST tracepoints of `tp/` behind safe
//! calls, and an LTTng session that the bench creates and destroys.
//!
//! This crate is a workspace member of its own so that the peers'
//! dependencies never reach the library crate.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod lttng;
