//! The demo's jitter: a small deterministic generator (SplitMix64), so a
//! seed replays the same simulated timings.

use std::time::Duration;

/// SplitMix64.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `base` milliseconds plus or minus `spread`, as a duration.
    pub(crate) fn ms(&mut self, base: f64, spread: f64) -> Duration {
        let v = base + spread * (2.0 * self.unit() - 1.0);
        Duration::from_secs_f64(v.max(0.05) / 1000.0)
    }
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}
