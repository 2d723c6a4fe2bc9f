//! The drain: takes closed requests from the region's ring as a
//! registered reader, as many as the queue has room for, adopts what
//! exporters before it left, and turns them into queued spans.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgemark::ClosedReader;
use edgemark::trace::ClosedRequest;

use crate::config::Config;
use crate::follow::file_identity;
use crate::mapping::{Naming, request_spans};
use crate::queue::Queued;
use crate::region::RegionFile;
use crate::shared::{FLUSH_DEADLINE, Shared};
use crate::stats::Stats;

/// Closed requests taken from the ring by one drain call.
const DRAIN_MAX: usize = 256;
/// How often the drain looks for requests that exporters which died (or
/// stopped before sending them) left taken in the ring.
const ADOPT_EVERY: Duration = Duration::from_secs(5);
/// How long a ring entry may stay claimed and unwritten before the drain
/// judges its closer dead and gives it up.
const PENDING_GIVE_UP: Duration = Duration::from_secs(5);
/// The wait between two drains that found the ring empty.
const POLL: Duration = Duration::from_millis(50);
/// The W3C trace flag that says the trace is sampled.
const SAMPLED: u8 = 0x01;

/// Takes closed requests into the queue, as many as it has room for,
/// until the deadline or a stop.
pub(crate) async fn drain_loop(
    config: &Config,
    mut reader: Arc<ClosedReader>,
    file: &RegionFile,
    stats: &Stats,
    shared: &Shared,
    deadline: Option<Instant>,
) {
    let path = file.path();
    let mut naming = Naming::of(reader.recorder());
    let mut id = file_identity(path).ok();
    let mut checked = Instant::now();
    let mut failing: Option<String> = None;
    // The ring entry a drain found still being written, and since when.
    let mut pending: Option<(u64, Instant)> = None;
    let mut closed = Vec::with_capacity(DRAIN_MAX);
    // Adopt at once what an exporter before this one left.
    let mut adopted_at: Option<Instant> = None;
    loop {
        if shared.stopping() {
            return;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            shared.stop(Instant::now() + FLUSH_DEADLINE.min(config.timeout));
            return;
        }
        // Another file at the path, or a drain that failed: attach again.
        if failing.is_some() || checked.elapsed() >= Duration::from_secs(1) {
            checked = Instant::now();
            let now = file_identity(path).ok();
            if failing.is_some() || (now.is_some() && now != id) {
                let attached = file.attach().map_err(|e| file.describe(&e)).and_then(|r| {
                    r.closed_reader()
                        .map_err(|e| format!("cannot export closed requests: {e}"))
                });
                match attached {
                    Ok(r) => {
                        if failing.take().is_some() || now != id {
                            log::info!(
                                "{}: attached again; exporting its closed requests",
                                path.display()
                            );
                        }
                        reader = Arc::new(r);
                        naming = Naming::of(reader.recorder());
                        id = now;
                        adopted_at = None;
                        pending = None;
                    }
                    Err(why) => {
                        if failing.as_deref() != Some(why.as_str()) {
                            log::warn!("OTLP export: {why}; trying again every second");
                        }
                        failing = Some(why);
                    }
                }
            }
        }
        let mut took = 0;
        if failing.is_none() {
            if adopted_at.is_none_or(|t| t.elapsed() >= ADOPT_EVERY) {
                adopted_at = Some(Instant::now());
                closed.clear();
                let n = reader.adopt(&mut closed);
                if n > 0 {
                    log::info!(
                        "{}: {n} closed requests that an exporter before this one \
                         took and did not send: sending them",
                        path.display()
                    );
                    stats.update(|c| c.adopted += n as u64);
                    queue_requests(&reader, &naming, &closed, stats, shared);
                }
            }
            // A burst: up to a few full drains, then let the sender run.
            for _ in 0..8 {
                // Only what the queue has room for: the rest waits in the
                // ring (and, if the ring overwrites it, is counted lost by
                // the close that overwrote it).
                let room = config
                    .queue
                    .saturating_sub(shared.queue.borrow().spans + shared.in_flight.get());
                let max = (room / naming.spans_per_request).min(DRAIN_MAX);
                if max == 0 {
                    break;
                }
                closed.clear();
                match reader.take(max, &mut closed) {
                    Ok(d) => {
                        stats.update(|c| {
                            c.requests += d.taken as u64;
                            c.torn_or_unwritten += d.lost;
                        });
                        took += d.taken;
                        // A close that began writing its entry and has not
                        // published it holds the drain; after
                        // PENDING_GIVE_UP its closer is judged dead and the
                        // entry given up (counted as lost).
                        pending = match (d.pending, pending) {
                            (None, _) => None,
                            (Some(claim), Some((held, since))) if held == claim => {
                                if since.elapsed() < PENDING_GIVE_UP {
                                    Some((held, since))
                                } else {
                                    if reader.skip(claim) {
                                        stats.update(|c| c.torn_or_unwritten += 1);
                                        log::warn!(
                                            "{}: a closed request was not written \
                                             within {} s (its closer died?): given up, counted as lost",
                                            path.display(),
                                            PENDING_GIVE_UP.as_secs()
                                        );
                                    }
                                    None
                                }
                            }
                            (Some(claim), _) => Some((claim, Instant::now())),
                        };
                        queue_requests(&reader, &naming, &closed, stats, shared);
                        if d.taken < max {
                            break;
                        }
                    }
                    Err(e) => {
                        let why = format!("cannot drain closed requests: {e}");
                        log::warn!("{}: {why}; attaching again", path.display());
                        failing = Some(why);
                        break;
                    }
                }
            }
        }
        if took == 0 {
            let mut sleep = POLL;
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(Instant::now()));
            }
            // Woken early when the sender makes room, or to stop.
            let _ = tokio::time::timeout(sleep, shared.room.notified()).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

/// Turns taken requests into queued spans; an unsampled one is
/// acknowledged at once (there is nothing to send).
pub(crate) fn queue_requests(
    reader: &Arc<ClosedReader>,
    naming: &Naming,
    closed: &[ClosedRequest],
    stats: &Stats,
    shared: &Shared,
) {
    for c in closed {
        if c.trace_flags() & SAMPLED == 0 {
            stats.update(|c| c.unsampled += 1);
            reader.acknowledge(c.claim());
            continue;
        }
        let mut spans = Vec::with_capacity(1 + c.snapshot().segments().len());
        request_spans(c, naming, &mut spans);
        shared.queue.borrow_mut().push(Queued {
            reader: Arc::clone(reader),
            claim: c.claim(),
            spans,
        });
    }
    shared.publish(stats);
    shared.wake.notify_one();
}
