//! The engine thread's timer heap: steps due at an instant, taken in order
//! of time and then of scheduling.

use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use edgemark::Token;

use super::wire::Chunk;

/// A step the engine thread performs when it is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Stage 0: emit chunk `n` (heartbeats and the terminal marker included).
    Emit { token: Token, n: u32 },
    /// Stages 1 and 2: produce output for an admitted chunk.
    Produce { chunk: Chunk },
}

#[derive(Debug, PartialEq, Eq)]
struct Due(Instant, u64, Step);

impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // A min-heap on time, then insertion order.
        (o.0, o.1).cmp(&(self.0, self.1))
    }
}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// Steps waiting for their time, shared by the threads that schedule them
/// and the one that performs them.
#[derive(Debug, Default)]
pub(super) struct Timers {
    /// The heap, and the count of steps scheduled so far.
    queue: Mutex<(BinaryHeap<Due>, u64)>,
    wake: Condvar,
}

impl Timers {
    /// Schedules `step` to be due `after` from now.
    pub(super) fn schedule(&self, after: Duration, step: Step) {
        let mut q = self.queue.lock().expect("queue");
        q.1 += 1;
        let n = q.1;
        q.0.push(Due(Instant::now() + after, n, step));
        self.wake.notify_one();
    }

    /// Waits for the earliest step to be due and takes it.
    pub(super) fn next(&self) -> Step {
        let mut q = self.queue.lock().expect("queue");
        loop {
            let now = Instant::now();
            match q.0.peek() {
                Some(Due(at, _, _)) if *at <= now => return q.0.pop().expect("peeked").2,
                Some(Due(at, _, _)) => {
                    let wait = *at - now;
                    q = self.wake.wait_timeout(q, wait).expect("queue").0;
                }
                None => q = self.wake.wait(q).expect("queue"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_come_out_by_time_then_by_scheduling_order() {
        let t: Token = "em1.0000000000000001.0.1".parse().unwrap();
        let timers = Timers::default();
        let later = Duration::from_millis(30);
        timers.schedule(later, Step::Emit { token: t, n: 2 });
        timers.schedule(Duration::ZERO, Step::Emit { token: t, n: 0 });
        timers.schedule(Duration::ZERO, Step::Emit { token: t, n: 1 });
        let order: Vec<Step> = (0..3).map(|_| timers.next()).collect();
        assert_eq!(order, [0, 1, 2].map(|n| Step::Emit { token: t, n }),);
    }
}
