//! The upstream recorder's cases, in one process (see `tests/common`).

#[macro_use]
mod common;

upstream_case_tests!(common::InProcess::new());
