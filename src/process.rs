//! Processes as the region sees them: thread ids (the holders of control
//! locks), process liveness and start times (the owners of requests), and
//! the pid namespace that decides whether a pid found in the region can be
//! judged at all.

use rustix::io::Errno;
use rustix::process::Pid;

use crate::report::Owner;

/// The calling process's identity as a slot owner: its pid and its start
/// time in clock ticks since boot (field 22 of `/proc/<pid>/stat`), which
/// tells a reused pid from the original; 0 when `/proc` cannot say (then a
/// reclaim never judges the owner dead by start time).
///
/// Cached per process in two atomics, not behind a lock: a child forked
/// while another thread was here must not inherit a held lock. The cache is
/// process-local, not region state, hence the facade's process-local
/// atomics.
pub(crate) fn owner_identity() -> Owner {
    use crate::sync::Ordering;
    use crate::sync::local::AtomicU64;
    static PID: AtomicU64 = AtomicU64::new(0);
    static START: AtomicU64 = AtomicU64::new(0);
    let pid = u64::from(std::process::id());
    // Acquire: pairs with the Release store of PID below, after START.
    if PID.load(Ordering::Acquire) == pid {
        return Owner {
            pid,
            start_ticks: START.load(Ordering::Relaxed),
        };
    }
    // A first call, or a forked child (a new pid): read it afresh. Threads
    // racing here compute the same values.
    let start = process_start_ticks(pid as u32).unwrap_or(0);
    START.store(start, Ordering::Relaxed);
    PID.store(pid, Ordering::Release);
    Owner {
        pid,
        start_ticks: start,
    }
}

/// The calling thread's id (`gettid`): what a locked head word names, so
/// that two threads of one process are told apart. Linux thread ids are
/// pids (below 2^22), so 24 bits hold any.
pub(crate) fn thread_id() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// The inode of this process's pid namespace (`/proc/self/ns/pid`), or 0.
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// What `/proc/<pid>/stat` says of a process.
struct ProcStat {
    /// The state letter (`R`, `S`, `Z`...).
    state: char,
    /// The start time in clock ticks since boot.
    start_ticks: u64,
}

/// The state letter and start time of a process, if `/proc` shows it.
fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; fields
    // after the last ')' are plain: state is field 3, starttime field 22.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some(ProcStat {
        state,
        start_ticks: rest.nth(18)?.parse().ok()?,
    })
}

/// A process's start time in clock ticks since boot, if `/proc` shows it.
pub(crate) fn process_start_ticks(pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    proc_stat(pid).map(|s| s.start_ticks)
}

/// Whether some process (or thread: `kill` takes a thread id too) with this
/// id runs. Only a definite "no such process" counts as dead: `kill(pid, 0)` failing with `ESRCH`, or a zombie
/// with no live thread left. A process this one may not signal (`EPERM`) or
/// cannot see in `/proc` (`hidepid`) is alive.
pub(crate) fn pid_alive(pid: u32) -> bool {
    // No pid is above i32::MAX; 0 would name our process group. So `p` is
    // positive and names one process.
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    // `kill(p, 0)`: sends nothing, only checks that the pid exists and may
    // be signalled.
    if let Err(e) = rustix::process::test_kill_process(p) {
        return e != Errno::SRCH;
    }
    // A zombie has exited but not been reaped. A thread-group leader that
    // exited while other threads run also shows `Z`, so count its threads.
    match proc_stat(pid) {
        Some(ProcStat {
            state: 'Z' | 'X', ..
        }) => live_threads(pid).is_some_and(|n| n > 1),
        _ => true,
    }
}

fn live_threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// Whether the owner `(pid, start)` still runs: the pid is alive and, where
/// both start times are known, started at the same time (a reused pid has a
/// later start time). Start times are only comparable within one time
/// namespace (`/proc` shows them shifted by the reader's boot-time offset),
/// so callers pass 0 for `start` when they do not share the region's clock.
pub(crate) fn owner_alive(pid: u64, start: u64) -> bool {
    let Ok(pid) = u32::try_from(pid) else {
        return false;
    };
    if !pid_alive(pid) {
        return false;
    }
    match (start, process_start_ticks(pid)) {
        (0, _) | (_, None) => true,
        (want, Some(now)) => want == now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_found_and_stable() {
        let Owner {
            pid,
            start_ticks: start,
        } = owner_identity();
        assert_eq!(pid, u64::from(std::process::id()));
        assert_eq!(process_start_ticks(std::process::id()), Some(start));
        assert!(owner_alive(pid, start));
        assert!(!owner_alive(pid, start + 1), "a reused pid starts later");
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
        assert!(pid_alive(1), "init exists and EPERM would still mean alive");
        assert!(
            owner_alive(pid, 0),
            "an unknown start time never proves reuse"
        );
    }
}
