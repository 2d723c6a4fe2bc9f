//! The shared clock and the identity of the clock it belongs to (its boot
//! and time namespace). Processes and their liveness are in `process.rs`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
