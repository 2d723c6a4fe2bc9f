//! `edgemark demo`: a simulated three-stage pipeline (edges 0:1 and 1:2, in
//! the manner of thinker, talker and code2wav) recording into one region
//! from real worker processes.
//!
//! The orchestrator (this process) creates the region, starts one worker
//! process per stage, begins requests at a target concurrency and hands each
//! worker the request's token inside its dispatch message (a line on the
//! worker's standard input). Stage workers pass chunks to the next stage
//! over Unix datagram sockets (the "connector"); each worker has a receive
//! thread, an engine thread and a send thread, and records the four events
//! from whichever thread observes them. Nothing is sent back to the
//! orchestrator except "request done". The orchestrator closes every request
//! (completed or aborted) and summarises the final snapshots.
//!
//! - [`rng`]: the simulated timings' random numbers;
//! - [`wire`]: dispatch lines, report lines and connector chunks;
//! - [`orchestrator`]: the demo process itself;
//! - [`worker`]: a stage worker process and its threads;
//! - [`timers`]: the worker engine's timer heap;
//! - [`summary`](mod@summary): the printed table.

mod orchestrator;
mod rng;
mod summary;
mod timers;
mod wire;
mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgemark::Snapshot;

pub(crate) use orchestrator::run;
pub(crate) use summary::summary;
pub(crate) use worker::stage_worker;

/// Stages of the demo pipeline.
pub(crate) const STAGES: u32 = 3;

/// Options of `edgemark demo` (but `--html`, which the command writes
/// after the run), as clap parses them.
#[derive(clap::Args, Debug)]
pub(crate) struct DemoOptions {
    /// Requests to run.
    #[arg(long, default_value_t = 600, value_parser = crate::ops::parse_count::<u32>, allow_negative_numbers = true)]
    pub(crate) requests: u32,
    /// Requests open at once.
    #[arg(long, default_value_t = 12, value_parser = crate::ops::parse_count::<u32>, allow_negative_numbers = true)]
    pub(crate) concurrency: u32,
    /// Write each final snapshot to FILE, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Keep the region file (for `edgemark inspect`).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Seed of the simulated timings.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
}

/// The result of a demo run.
#[derive(Debug)]
pub(crate) struct DemoResult {
    /// The region's event names, in schema order.
    pub(crate) events: Vec<String>,
    /// Each request's final snapshot, and whether it was aborted.
    pub(crate) finals: Vec<(Snapshot, bool)>,
    /// The stage workers' record outcomes by name.
    pub(crate) outcomes: BTreeMap<String, u64>,
    /// The region file, if kept.
    pub(crate) region: Option<PathBuf>,
    pub(crate) elapsed: Duration,
    pub(crate) counters: edgemark::report::Counters,
}

/// Where stage `stage` receives its chunks.
fn socket_path(dir: &Path, stage: u32) -> PathBuf {
    dir.join(format!("stage{stage}.sock"))
}
