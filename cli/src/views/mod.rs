//! Views of a region and of collected snapshots: the live terminal view
//! (`edgemark top`) and the self-contained latency page (`--html`).
//!
//! Everything here reads through the library's public API only: region
//! histograms and counters for `top`, snapshot JSON for the page.

pub(crate) mod data;
pub(crate) mod html;
pub(crate) mod top;
