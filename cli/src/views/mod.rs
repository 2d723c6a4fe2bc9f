//! Views of a region and of collected snapshots: the live terminal view
//! (`edgemark top`) and the self-contained latency page (`--html`).
//!
//! Everything here reads through the library's public API only: region
//! histograms and counters for `top`; for the page, snapshots (the demo's,
//! through their accessors) or their JSON lines (`report`), collected into
//! one form whose values are the core's `Observed`.

pub(crate) mod data;
pub(crate) mod html;
pub(crate) mod top;
