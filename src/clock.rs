//! The shared clock and the identity of the clock it belongs to.

use std::sync::OnceLock;

/// `CLOCK_MONOTONIC` in nanoseconds.
///
/// On Linux this is a vDSO call: no system call, no allocation.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always
    // supported on the platforms edgemark builds for, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
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

/// The calling process's identity as a slot owner: its pid and its start
/// time in clock ticks since boot (field 22 of `/proc/<pid>/stat`), which
/// tells a reused pid from the original.
pub(crate) fn owner_identity() -> (u64, u64) {
    static CACHE: OnceLock<std::sync::Mutex<(u32, u64)>> = OnceLock::new();
    let pid = std::process::id();
    let cache = CACHE.get_or_init(|| std::sync::Mutex::new((0, 0)));
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.0 != pid {
        // A forked child has a new pid and start time.
        *c = (pid, process_start_ticks(pid).unwrap_or(0));
    }
    (u64::from(c.0), c.1)
}

/// A process's start time in clock ticks since boot, if it exists and has
/// not exited (a zombie counts as exited).
pub(crate) fn process_start_ticks(pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; fields
    // after the last ')' are plain: state is field 3, starttime field 22.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    rest.nth(18)?.parse().ok()
}

/// Whether the owner `(pid, start)` still runs: the pid exists and started
/// at the same time (a reused pid has a later start time).
pub(crate) fn owner_alive(pid: u64, start: u64) -> bool {
    u32::try_from(pid)
        .ok()
        .and_then(process_start_ticks)
        .is_some_and(|s| s == start)
}

/// Whether some process with this pid runs.
pub(crate) fn pid_alive(pid: u32) -> bool {
    process_start_ticks(pid).is_some()
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
    fn own_start_time_is_found_and_stable() {
        let (pid, start) = owner_identity();
        assert_eq!(pid, u64::from(std::process::id()));
        assert_eq!(process_start_ticks(std::process::id()), Some(start));
        assert_ne!(ClockIdentity::current().boot_id, 0);
        assert!(owner_alive(pid, start));
        assert!(!owner_alive(pid, start + 1), "a reused pid starts later");
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
    }
}
