//! The drain: takes closed requests from the region's ring through the
//! core's follower ([`edgemark::follow::RingFollower`]: attached again,
//! what exporters before it left adopted), as many as the queue has room
//! for, and turns them into queued spans.

use std::sync::Arc;
use std::time::Instant;

use edgemark::ClosedReader;
use edgemark::follow::{Look, RingFollower};
use edgemark::trace::ClosedRequest;

use crate::config::Config;
use crate::mapping::{Naming, request_spans};
use crate::queue::Queued;
use crate::shared::{FLUSH_DEADLINE, Shared};
use crate::stats::Stats;

/// Closed requests taken from the ring by one drain call.
const DRAIN_MAX: usize = 256;
/// The wait between two drains that found the ring empty.
const POLL: std::time::Duration = std::time::Duration::from_millis(50);
/// The W3C trace flag that says the trace is sampled.
const SAMPLED: u8 = 0x01;

/// Takes closed requests into the queue, as many as it has room for,
/// until the deadline or a stop. Following the file (attaching again,
/// adopting, giving up a stuck entry) is the core's [`RingFollower`]; this
/// maps, queues and says what the follower found.
pub(crate) async fn drain_loop(
    config: &Config,
    mut follower: RingFollower,
    stats: &Stats,
    shared: &Shared,
    deadline: Option<Instant>,
) {
    let path = follower.path().to_owned();
    let mut naming = follower.reader().map(|r| Naming::of(r.recorder()));
    let mut attached_once = follower.reader().is_some();
    let mut closed = Vec::with_capacity(DRAIN_MAX);
    loop {
        if shared.stopping() {
            return;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            shared.stop(Instant::now() + FLUSH_DEADLINE.min(config.timeout));
            return;
        }
        match follower.look_if_due() {
            Some(Look::Attached { .. }) => {
                if attached_once {
                    log::info!(
                        "{}: attached again; exporting its closed requests",
                        path.display()
                    );
                }
                attached_once = true;
                naming = follower.reader().map(|r| Naming::of(r.recorder()));
            }
            Some(Look::Failing {
                why,
                new: true,
                gone,
            }) => {
                if gone && follower.reader().is_some() {
                    log::warn!(
                        "OTLP export: {why}; what its ring still holds is sent, and a region \
                         there again is attached (looked for every second)"
                    );
                } else {
                    log::warn!("OTLP export: {why}; trying again every second");
                }
            }
            _ => {}
        }
        let mut took = 0;
        if let (Some(reader), Some(naming)) = (follower.reader().cloned(), naming.as_ref()) {
            // A burst: up to a few full drains, then let the sender run.
            for _ in 0..8 {
                // Only what the queue has room for: the rest waits in the
                // ring (and, if the ring overwrites it, is counted lost by
                // the close that overwrote it).
                let room = config
                    .queue
                    .saturating_sub(shared.queue.borrow().spans + shared.in_flight.get());
                let max = (room / naming.spans_per_request).min(DRAIN_MAX);
                closed.clear();
                let step = follower.take(max, &mut closed);
                if step.adopted > 0 {
                    log::info!(
                        "{}: {} closed requests that an exporter before this one \
                         took and did not send: sending them",
                        path.display(),
                        step.adopted
                    );
                    stats.update(|c| c.adopted += step.adopted as u64);
                }
                stats.update(|c| {
                    c.requests += step.taken as u64;
                    c.torn_or_unwritten += step.lost + u64::from(step.gave_up_pending);
                });
                if step.gave_up_pending {
                    log::warn!(
                        "{}: a closed request was not written within {} s (its closer died?): \
                         given up, counted as lost",
                        path.display(),
                        edgemark::follow::PENDING_GIVE_UP.as_secs()
                    );
                }
                if let Some(why) = &step.failed {
                    log::warn!("{why}; attaching again");
                }
                took += step.taken;
                queue_requests(&reader, naming, &closed, stats, shared);
                if step.failed.is_some() || max == 0 || step.taken < max {
                    break;
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
