//! loom models (see docs/loom.md).
#![cfg(edgemark_loom)]
