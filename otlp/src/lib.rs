//! The OTLP exporter of `edgemark export --otlp`: each closed request of the region as
//! OpenTelemetry spans, sent to a collector over OTLP/HTTP with protobuf.
//!
//! `http://` and `https://` endpoints: https through rustls (the `ring`
//! provider), ALPN `http/1.1`, the collector's certificate always verified
//! for the URL's host (a name, also sent as SNI, or an IP address in the
//! certificate's subject alternative names), against the system's roots or
//! the CA file of `OTEL_EXPORTER_OTLP_CERTIFICATE`; mutual TLS with
//! `OTEL_EXPORTER_OTLP_CLIENT_KEY` and `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`
//! (each with its `TRACES_` form, which wins; see [`config`]). A failed
//! handshake is a failed post, retried, and counted apart as well
//! ([`Counts::tls_failures`](stats::Counts::tls_failures)).
//!
//! A request becomes one span `edgemark request` (the request's own span id,
//! its parent the context it began under) and, as its children, one span
//! per edge segment, named for the edge (`edgemark 0->1`), from its first
//! event to its last, each of the four boundaries a span event at its
//! absolute time: the request's wall-clock origin plus the elapsed time.
//! A value measured in a foreign clock domain (anywhere but the region's
//! `host_monotonic`) has no place on this host's time line: its event is
//! placed at the origin, and its relative time is kept in attributes.
//! Deltas are given only between two values of one domain, as
//! [`edgemark::snapshot::EdgeSegment::elapsed_between`] gives them; values of two
//! domains (and so of two hosts) are never subtracted.
//!
//! Two tasks share one thread and its single-threaded runtime, apart from
//! the `/metrics` server: the drain takes closed requests from the region's
//! ring as a registered reader ([`edgemark::ClosedReader`]), only as many as
//! the queue has room for, turns them into spans and queues them; the
//! sender posts batches of the queue, one at a time, and retries a failed
//! post with exponential backoff for [`RETRY_FOR`]. A request is
//! acknowledged to the region when the collector has accepted the post
//! that carried it, and given up (counted by reason) when the collector
//! refuses it, answers with a success too long to read
//! ([`client::MAX_ANSWER`]), or its retries run out. While the queue is full the drain
//! takes nothing: requests wait in the ring, and the ones the ring
//! overwrites meanwhile are counted by the closes that overwrite them. So a
//! collector that is down costs memory up to the bound and never blocks a
//! close, the drain or `/metrics` ([`Stats`], served under
//! `edgemark_otlp_...`, and the region's counters).
//!
//! At least once: on SIGTERM or SIGINT the exporter stops taking, sends
//! what it holds for at most [`FLUSH_DEADLINE`], then logs what is left and
//! exits, leaving that in the ring taken in its name; the next exporter on
//! the region adopts it and sends it, as it adopts what a killed exporter
//! left. A segment span's id is derived from the request's span id, edge
//! and segment ([`ClosedRequest::segment_span_id`](edgemark::trace::ClosedRequest::segment_span_id)), so a request sent
//! twice makes no second span where spans are keyed by id.

//!
//! The crate is laid out as the OpenTelemetry exporters are: [`config`]
//! (the variables, each beside its default), [`mapping`] (spans),
//! [`envelope`] (the export request), [`queue`], `client` (HTTP),
//! `send` (batches, retries, acknowledgment), `drain` (the ring),
//! [`follow`] (the region file) and [`stats`] (prometheus-client).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use edgemark::Recorder;
//! use edgemark_otlp::{Config, Exporter};
//!
//! let path = std::path::PathBuf::from("/dev/shm/pipeline.region");
//! let rec = Recorder::attach(&path)?;
//! let config = Config::new(Some("http://127.0.0.1:4318"), |k| std::env::var(k).ok())?;
//! let again = path.clone();
//! let exporter = Exporter::start(
//!     config,
//!     rec,
//!     path,
//!     Box::new(move || Recorder::attach(&again).map_err(Into::into)),
//!     None,
//!     None,
//! )?;
//! exporter.join();
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgemark::{ClosedReader, Recorder};

pub mod client;
pub mod config;
pub mod envelope;
pub mod follow;
pub mod mapping;
pub mod queue;
pub mod stats;

mod drain;
mod send;

pub use config::{Config, ConfigError};
pub use send::RETRY_FOR;
pub use stats::Stats;

use queue::{Queue, Queued};

/// How long the exporter goes on sending what it holds after SIGTERM or
/// SIGINT (or the end of its run) before it gives the rest back to the
/// ring for the next exporter.
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(5);

/// Attaches the region's path again (when another file took its place, or
/// a drain failed).
pub type Reattach =
    Box<dyn Fn() -> Result<Recorder, Box<dyn std::error::Error + Send + Sync>> + Send>;

/// Called with the signal's name when SIGTERM or SIGINT stopped the
/// exporter, after its flush.
pub type OnSignal = Box<dyn FnOnce(&'static str) + Send>;

/// Why [`Exporter::start`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The region cannot be read as a registered reader.
    Reader(edgemark::ReaderError),
    /// The exporter's runtime, signal handlers or thread could not start.
    Io(&'static str, std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Reader(e @ edgemark::ReaderError::NoRing) => {
                write!(f, "{e} (create it with --closed-entries above 0)")
            }
            StartError::Reader(e) => write!(f, "{e}"),
            StartError::Io(what, e) => write!(f, "cannot start the exporter's {what}: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// The running exporter: a thread with a single-threaded runtime, on which
/// the drain and the sender run.
#[derive(Debug)]
pub struct Exporter {
    stats: Arc<Stats>,
    thread: std::thread::JoinHandle<()>,
}

impl Exporter {
    /// Starts exporting the closed requests of `rec` (attached from `path`;
    /// `reattach` attaches that path again when the file there changes or
    /// the drain fails) for `run_for`, or until SIGTERM or SIGINT if
    /// `on_signal` is given: then it flushes for at most
    /// [`FLUSH_DEADLINE`] and calls `on_signal` with the signal's name.
    /// Fails if the region keeps no ring of closed requests, or its reader
    /// table is full.
    pub fn start(
        config: Config,
        rec: Recorder,
        path: PathBuf,
        reattach: Reattach,
        run_for: Option<Duration>,
        on_signal: Option<OnSignal>,
    ) -> Result<Exporter, StartError> {
        let reader = rec.closed_reader().map_err(StartError::Reader)?;
        let stats = Arc::new(Stats::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| StartError::Io("runtime", e))?;
        // Made here, on the caller's thread, so that a signal that comes
        // before the exporter's thread runs is already handled.
        let signals = match on_signal {
            Some(f) => {
                let _guard = runtime.enter();
                use tokio::signal::unix::{SignalKind, signal};
                let term = signal(SignalKind::terminate())
                    .map_err(|e| StartError::Io("SIGTERM handler", e))?;
                let int = signal(SignalKind::interrupt())
                    .map_err(|e| StartError::Io("SIGINT handler", e))?;
                Some((term, int, f))
            }
            None => None,
        };
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("otlp".to_owned())
            .spawn(move || {
                let config = Arc::new(config);
                let deadline = run_for.map(|d| Instant::now() + d);
                let (signals, on_signal) = match signals {
                    Some((t, i, f)) => (Some((t, i)), Some(f)),
                    None => (None, None),
                };
                let signalled = runtime.block_on(run(
                    config,
                    Arc::new(reader),
                    path,
                    reattach,
                    thread_stats,
                    deadline,
                    signals,
                ));
                if let (Some(name), Some(f)) = (signalled, on_signal) {
                    f(name);
                }
            })
            .map_err(|e| StartError::Io("thread", e))?;
        Ok(Exporter { stats, thread })
    }

    /// The counters, for `/metrics`.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Waits until the exporter has stopped (after its `run_for`, having
    /// sent what it could). False if its thread panicked.
    pub fn join(self) -> bool {
        self.thread.join().is_ok()
    }
}

/// What the drain and the sender share (on one thread).
pub(crate) struct Shared {
    pub(crate) queue: RefCell<Queue>,
    /// Spans of the batch being posted (or waiting to be retried).
    pub(crate) in_flight: std::cell::Cell<usize>,
    /// Told when spans are queued, and when the exporter stops.
    pub(crate) wake: tokio::sync::Notify,
    /// Told when the sender made room in the queue.
    pub(crate) room: tokio::sync::Notify,
    /// Set when the exporter stops taking: the sender sends what is queued
    /// until then, and leaves the rest.
    pub(crate) stop_by: std::cell::Cell<Option<Instant>>,
}

impl Shared {
    pub(crate) fn stopping(&self) -> bool {
        self.stop_by.get().is_some()
    }

    pub(crate) fn publish(&self, stats: &Stats) {
        let queued = (self.queue.borrow().spans + self.in_flight.get()) as u64;
        stats.update(|c| c.queued = queued);
    }
}

/// The signal streams the exporter stops on.
type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

/// Runs the exporter; the name of the signal that stopped it, if one did.
async fn run(
    config: Arc<Config>,
    reader: Arc<ClosedReader>,
    path: PathBuf,
    reattach: Reattach,
    stats: Arc<Stats>,
    deadline: Option<Instant>,
    signals: Option<Signals>,
) -> Option<&'static str> {
    let shared = Shared {
        queue: RefCell::new(Queue::default()),
        in_flight: std::cell::Cell::new(0),
        wake: tokio::sync::Notify::new(),
        room: tokio::sync::Notify::new(),
        stop_by: std::cell::Cell::new(None),
    };
    let signalled = std::cell::Cell::new(None);
    let watch = async {
        let Some((mut term, mut int)) = signals else {
            return std::future::pending::<()>().await;
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        signalled.set(Some(name));
        if !shared.stopping() {
            eprintln!(
                "edgemark: {name}: sending what is queued for at most {} s",
                FLUSH_DEADLINE.as_secs()
            );
            shared.stop_by.set(Some(Instant::now() + FLUSH_DEADLINE));
            shared.wake.notify_waiters();
            shared.room.notify_waiters();
        }
        std::future::pending::<()>().await
    };
    let work = async {
        tokio::join!(
            drain::drain_loop(&config, reader, &path, reattach, &stats, &shared, deadline),
            send::send_loop(&config, &stats, &shared),
        );
    };
    tokio::select! {
        _ = work => {}
        _ = watch => {}
    }
    // What the sender could not send by the deadline stays taken in the
    // ring: the next exporter on the region adopts it.
    let left: Vec<Queued> = shared.queue.borrow_mut().requests.drain(..).collect();
    if !left.is_empty() {
        let held = left.iter().filter(|q| q.reader.holds(q.claim)).count();
        eprintln!(
            "edgemark: {} closed requests not sent by the deadline: {held} left in the ring \
             for the next exporter on it, {} already overwritten there (lost, counted in the \
             region's closed_overwritten_taken)",
            left.len(),
            left.len() - held
        );
        stats.update(|c| c.left_unsent += left.len() as u64);
    }
    signalled.get()
}
