//! What the drain and the sender share: the queue of spans to send, the
//! batch in flight, the wake-ups between the two tasks, and the time by
//! which a stopping exporter gives up sending. Both run on the exporter's
//! one thread, so this is plain cells, no locks.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::queue::Queue;
use crate::stats::Stats;

/// How long the exporter goes on sending what it holds once it is stopped
/// ([`Stopper::stop`](crate::Stopper::stop)) or its run ends
/// ([`ExporterBuilder::run_for`](crate::ExporterBuilder::run_for)), before
/// it gives the rest back to the ring for the next exporter.
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(5);

/// The state of one running exporter, shared by its drain and its sender.
pub(crate) struct Shared {
    pub(crate) queue: RefCell<Queue>,
    /// Spans of the batch being posted (or waiting to be retried).
    pub(crate) in_flight: Cell<usize>,
    /// Told when spans are queued, and when the exporter stops.
    pub(crate) wake: Notify,
    /// Told when the sender made room in the queue.
    pub(crate) room: Notify,
    /// Set when the exporter stops taking: the sender sends what is queued
    /// until then, and leaves the rest.
    pub(crate) stop_by: Cell<Option<Instant>>,
}

impl Shared {
    /// Nothing queued, nothing in flight, not stopping.
    pub(crate) fn new() -> Shared {
        Shared {
            queue: RefCell::new(Queue::default()),
            in_flight: Cell::new(0),
            wake: Notify::new(),
            room: Notify::new(),
            stop_by: Cell::new(None),
        }
    }

    /// Whether the exporter has stopped taking.
    pub(crate) fn stopping(&self) -> bool {
        self.stop_by.get().is_some()
    }

    /// Stops taking: the sender sends what is queued until `by`, then
    /// leaves the rest. A second call changes nothing.
    pub(crate) fn stop(&self, by: Instant) {
        if self.stopping() {
            return;
        }
        self.stop_by.set(Some(by));
        self.wake.notify_waiters();
        self.room.notify_waiters();
    }

    /// Publishes the spans waiting (queued and in flight) to the counters.
    pub(crate) fn publish(&self, stats: &Stats) {
        let queued = (self.queue.borrow().spans + self.in_flight.get()) as u64;
        stats.update(|c| c.queued = queued);
    }
}
