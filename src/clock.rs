//! The region's shared clock: its kind, the identity of the clock it
//! belongs to (a boot and a time namespace), and `CLOCK_MONOTONIC` as
//! edgemark reads it.

use std::sync::OnceLock;

/// `CLOCK_MONOTONIC` in nanoseconds.
///
/// On Linux this is a vDSO call: no system call, no allocation. (rustix
/// calls the vDSO directly; it measures as fast as libc's `clock_gettime`.)
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Nanoseconds since the Unix epoch, for the header's creation time only
/// (never exposed in snapshots).
pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Which `CLOCK_MONOTONIC` a process sees: its boot and its time namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockIdentity {
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`), as 128 bits.
    pub boot_id: u128,
    /// The inode of `/proc/self/ns/time`, or 0 where the kernel has no time
    /// namespaces.
    pub time_namespace: u64,
}

impl ClockIdentity {
    /// The identity of the calling process's clock (read once per process).
    pub fn current() -> ClockIdentity {
        static ID: OnceLock<ClockIdentity> = OnceLock::new();
        *ID.get_or_init(|| ClockIdentity {
            boot_id: read_boot_id().unwrap_or(0),
            time_namespace: time_namespace().unwrap_or(0),
        })
    }
}

fn read_boot_id() -> Option<u128> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok()
}

fn time_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/time")
        .ok()
        .map(|m| m.ino())
}

/// The kind of a region's shared clock, and its header word (H_CLOCK_KIND):
/// what the clock-reading
/// [`Recorder::record`](crate::Recorder::record) reads. A region has exactly
/// one; its `host_monotonic` domain holds values of that clock only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Clock {
    /// `CLOCK_MONOTONIC` through the vDSO (the default).
    #[default]
    Monotonic,
    /// The x86_64 time-stamp counter, read with `lfence; rdtsc` and
    /// converted with a rate calibrated against `CLOCK_MONOTONIC` when the
    /// region was created. Only where the kernel itself trusts the counter
    /// (its clocksource is `tsc`, and the CPU has `constant_tsc` and
    /// `nonstop_tsc`); elsewhere a region asked for it is created with
    /// [`Clock::Monotonic`] instead. See `docs/design.md`, "The counter
    /// clock".
    Counter,
}

impl Clock {
    /// The clock-kind word of the header.
    pub(crate) fn word(self) -> u64 {
        match self {
            Clock::Monotonic => 0,
            Clock::Counter => 1,
        }
    }

    /// The kind a header word names, if any.
    pub(crate) fn from_word(w: u64) -> Option<Clock> {
        match w {
            0 => Some(Clock::Monotonic),
            1 => Some(Clock::Counter),
            _ => None,
        }
    }

    /// `"monotonic"` or `"counter"`.
    pub fn name(self) -> &'static str {
        match self {
            Clock::Monotonic => "monotonic",
            Clock::Counter => "counter",
        }
    }
}

impl std::fmt::Display for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Clock {
    type Err = String;
    fn from_str(s: &str) -> Result<Clock, String> {
        match s {
            "monotonic" => Ok(Clock::Monotonic),
            "counter" => Ok(Clock::Counter),
            _ => Err(format!(
                "unknown clock {s:?}; expected \"monotonic\" or \"counter\""
            )),
        }
    }
}

/// The environment variable that makes a process distrust the counter (set
/// to `1`): regions it creates use `CLOCK_MONOTONIC`, and in counter regions
/// it attaches its clock-reading records answer
/// [`Outcome::ClockMismatch`](crate::Outcome::ClockMismatch).
pub const DISTRUST_COUNTER_ENV: &str = "EDGEMARK_DISTRUST_COUNTER";

/// Fixed-point bits of a counter rate: a rate word holds counter ticks per
/// `2^RATE_BITS` nanoseconds.
pub(crate) const RATE_BITS: u32 = 32;

/// How far (in parts per million) the rate a process measures at attach may
/// differ from the region's stored rate before the process stops trusting
/// the counter. `docs/design.md` ("Clocks") argues the figure: up to 500 ppm
/// of NTP slew in each of the two calibrations, plus their own error.
pub(crate) const RATE_TOLERANCE_PPM: u64 = 1200;

/// Why the counter cannot serve as this process's shared clock, or `None`
/// if it can: the kernel's clocksource is `tsc` and the CPU flags include
/// `constant_tsc` and `nonstop_tsc`, on x86_64, and
/// [`DISTRUST_COUNTER_ENV`] is not set. Read once per process.
pub(crate) fn counter_untrusted() -> Option<&'static str> {
    static WHY: OnceLock<Option<&'static str>> = OnceLock::new();
    *WHY.get_or_init(|| {
        if std::env::var_os(DISTRUST_COUNTER_ENV).is_some_and(|v| v == "1") {
            return Some("the environment asks not to trust it");
        }
        if !cfg!(all(target_arch = "x86_64", not(edgemark_loom))) {
            return Some("this build has no time-stamp counter clock");
        }
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        judge_counter(&source, &cpuinfo)
    })
}

/// The kernel's and the CPU's word on the counter: why it is not trusted,
/// or `None`.
pub(crate) fn judge_counter(clocksource: &str, cpuinfo: &str) -> Option<&'static str> {
    if clocksource.trim() != "tsc" {
        return Some("the kernel's clocksource is not tsc");
    }
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    if !has("constant_tsc") || !has("nonstop_tsc") {
        return Some("the CPU lacks constant_tsc or nonstop_tsc");
    }
    None
}

/// The time-stamp counter, ordered after every earlier load (the origin's,
/// in `record`): `lfence; rdtsc`, as the kernel's vDSO reads it for
/// `CLOCK_MONOTONIC`. 0 where there is no counter (never called there: no
/// region's counter is trusted in such a build).
#[inline]
pub(crate) fn counter() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(edgemark_loom)))]
    {
        // SAFETY: `lfence` and `rdtsc` are part of x86_64 (SSE2 is in its
        // baseline); they read no memory and have no precondition. `lfence`
        // keeps `rdtsc` from executing before earlier loads complete, so a
        // reading taken after a request's origin was loaded is not earlier
        // than that origin (see `docs/design.md`, "Clocks").
        unsafe {
            core::arch::x86_64::_mm_lfence();
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(edgemark_loom))))]
    {
        0
    }
}

/// One pair of readings: the counter between two `CLOCK_MONOTONIC`
/// readings taken less than 2 µs apart, stamped with their midpoint.
/// Retries a pair that a preemption stretched; `None` after many tries.
fn pair() -> Option<(u64, u64)> {
    for _ in 0..1000 {
        let before = monotonic_ns();
        let ticks = counter();
        let after = monotonic_ns();
        if after.wrapping_sub(before) < 2_000 {
            return Some((before + (after - before) / 2, ticks));
        }
    }
    None
}

/// Calibrates the counter against `CLOCK_MONOTONIC`: `rounds` rounds of
/// `round_ns` nanoseconds each, each round a rate from two bracketed pairs;
/// the median round's rate, in ticks per `2^RATE_BITS` ns. `None` if no
/// clean reading could be had or the counter does not advance.
pub(crate) fn calibrate(rounds: usize, round_ns: u64) -> Option<u64> {
    let mut rates = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (ns0, t0) = pair()?;
        while monotonic_ns().wrapping_sub(ns0) < round_ns {
            std::hint::spin_loop();
        }
        let (ns1, t1) = pair()?;
        let (dns, dt) = (ns1.checked_sub(ns0)?, t1.checked_sub(t0)?);
        if dns == 0 || dt == 0 {
            return None;
        }
        let rate = (u128::from(dt) << RATE_BITS) / u128::from(dns);
        rates.push(u64::try_from(rate).ok()?);
    }
    rates.sort_unstable();
    rates.get(rates.len() / 2).copied().filter(|&r| r > 0)
}

/// Whether two rates agree within [`RATE_TOLERANCE_PPM`].
pub(crate) fn rates_agree(stored: u64, measured: u64) -> bool {
    let diff = u128::from(stored.abs_diff(measured));
    diff * 1_000_000 <= u128::from(stored) * u128::from(RATE_TOLERANCE_PPM)
}

/// Converts counter ticks to microseconds with a multiply and a shift:
/// `us = ticks * mult >> 64`, with `mult` from [`CounterScale::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CounterScale {
    /// `floor(2^(64 + RATE_BITS) / (1000 * rate))`: microseconds per tick,
    /// scaled by 2^64.
    mult: u64,
}

impl CounterScale {
    /// The scale of a rate of `rate` ticks per `2^RATE_BITS` ns; `None` for
    /// a rate so small (under one tick per µs) that it cannot be real.
    pub(crate) fn new(rate: u64) -> Option<CounterScale> {
        let per_us = u128::from(rate) * 1000;
        if per_us < 1 << RATE_BITS {
            return None;
        }
        let mult = (1u128 << (64 + RATE_BITS)) / per_us;
        Some(CounterScale {
            mult: u64::try_from(mult).ok()?,
        })
    }

    /// Microseconds in `ticks` counter ticks (rounded down).
    #[inline]
    pub(crate) fn micros(self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.mult)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_kind_round_trips_through_its_header_word_and_its_name() {
        for kind in [Clock::Monotonic, Clock::Counter] {
            assert_eq!(Clock::from_word(kind.word()), Some(kind));
            assert_eq!(kind.name().parse::<Clock>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(Clock::from_word(2), None);
        assert!("tsc".parse::<Clock>().is_err());
        assert_eq!(Clock::default(), Clock::Monotonic);
    }

    /// The exact microseconds in `ticks` at `rate` ticks per 2^32 ns.
    fn exact_us(ticks: u64, rate: u64) -> f64 {
        ticks as f64 * (1u64 << 32) as f64 / rate as f64 / 1000.0
    }

    #[test]
    fn fixed_point_conversion_matches_the_exact_one() {
        // 1 GHz, 2.1 GHz, 3.6 GHz and an odd 2.893 GHz counter.
        for ghz in [1.0, 2.1, 3.6, 2.893_456_7] {
            let rate = (ghz * (1u64 << 32) as f64).round() as u64;
            let scale = CounterScale::new(rate).unwrap();
            for ticks in [0, 1, 999, 1_000_000, 3_600_000_000, 1 << 40, 1 << 50] {
                let exact = exact_us(ticks, rate);
                let got = scale.micros(ticks) as f64;
                // Rounded down, and off by at most one µs plus a relative
                // error of 2^-30 from the truncated multiplier.
                assert!(got <= exact + 1e-6, "{ghz} GHz, {ticks} ticks");
                assert!(
                    exact - got < 1.0 + exact * 1e-9,
                    "{ghz} GHz, {ticks}: {got} vs {exact}"
                );
            }
        }
        let scale = CounterScale::new(3 << 32).unwrap();
        assert_eq!(scale.micros(3_000), 0, "999.99.. ns is not yet a µs");
        assert_eq!(scale.micros(3_003), 1);
        assert_eq!(scale.micros(3_000_000_000_003), 1_000_000_000);
    }

    #[test]
    fn impossible_rates_have_no_scale() {
        assert_eq!(CounterScale::new(0), None);
        assert_eq!(CounterScale::new((1 << 32) / 1000 - 1), None);
        assert!(CounterScale::new(u64::MAX).is_some());
    }

    #[test]
    fn rates_agree_within_the_tolerance_only() {
        let r = 3 << 32;
        assert!(rates_agree(r, r));
        assert!(rates_agree(r, r + r / 1_000_000 * 1_100));
        assert!(rates_agree(r, r - r / 1_000_000 * 1_100));
        assert!(!rates_agree(r, r + r / 1_000_000 * 1_300));
        assert!(!rates_agree(r, r / 2));
    }

    #[test]
    fn the_counter_is_trusted_only_as_the_kernel_trusts_it() {
        let good = "processor: 0\nflags\t\t: fpu tsc constant_tsc rep_good nonstop_tsc\n";
        assert_eq!(judge_counter("tsc\n", good), None);
        assert!(judge_counter("hpet\n", good).is_some());
        assert!(judge_counter("kvm-clock\n", good).is_some());
        assert!(judge_counter("tsc\n", "flags\t: fpu tsc constant_tsc\n").is_some());
        assert!(judge_counter("tsc\n", "flags\t: nonstop_tsc\n").is_some());
        assert!(judge_counter("tsc", "").is_some());
    }

    #[test]
    fn calibration_finds_the_counter_rate_where_it_is_trusted() {
        if let Some(why) = counter_untrusted() {
            eprintln!("skipped: the counter is not trusted here ({why})");
            return;
        }
        let a = calibrate(3, 5_000_000).unwrap();
        let b = calibrate(2, 5_000_000).unwrap();
        assert!(rates_agree(a, b), "{a} vs {b}");
        // Every x86_64 counter of this century runs between 0.5 and 10 GHz.
        assert!(a > (1 << 31) && a < 10 << 32, "{a}");
    }

    #[test]
    fn monotonic_clock_does_not_go_back() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
        assert!(a > 0);
    }

    #[test]
    fn own_clock_identity_names_the_boot() {
        assert_ne!(ClockIdentity::current().boot_id, 0);
    }
}
