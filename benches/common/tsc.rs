//! The time-stamp counter, read the two ways the benches need: as a counter
//! region's record reads it ([`read`]), and fenced on both sides to bracket
//! one call ([`Ticks`]). Elsewhere than on x86_64 there is no counter and
//! both fall back to a clock.

use std::time::{Duration, Instant};

/// The time-stamp counter as a counter region's record reads it
/// (`lfence; rdtsc`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read() -> u64 {
    // SAFETY: `lfence` and `rdtsc` exist on every x86_64 processor and touch
    // no memory.
    unsafe {
        std::arch::x86_64::_mm_lfence();
        std::arch::x86_64::_rdtsc()
    }
}

/// Elsewhere there is no counter: the monotonic clock instead.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn read() -> u64 {
    edgemark::clock::monotonic_ns()
}

/// A cheap, serialised time source for bracketing single calls.
#[derive(Debug)]
pub struct Ticks {
    /// Ticks per nanosecond.
    pub per_ns: f64,
    #[cfg(not(target_arch = "x86_64"))]
    base: Instant,
}

impl Ticks {
    /// Measures the tick rate against `Instant` over 50 ms.
    pub fn calibrate() -> Ticks {
        let mut t = Ticks {
            per_ns: 1.0,
            #[cfg(not(target_arch = "x86_64"))]
            base: Instant::now(),
        };
        let (i0, t0) = (Instant::now(), t.now());
        while i0.elapsed() < Duration::from_millis(50) {
            std::hint::spin_loop();
        }
        let (t1, ns) = (t.now(), i0.elapsed().as_nanos() as f64);
        t.per_ns = (t1 - t0) as f64 / ns;
        t
    }

    /// The counter, fenced on both sides.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub fn now(&self) -> u64 {
        use std::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: `lfence` and `rdtsc` exist on every x86_64 processor and
        // touch no memory; the fences keep the read from moving across the
        // measured call.
        unsafe {
            _mm_lfence();
            let t = _rdtsc();
            _mm_lfence();
            t
        }
    }

    /// Nanoseconds since calibration.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}
