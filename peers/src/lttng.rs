//! LTTng-UST: the tracepoints of `tp/tp.h` and a tracing session.
//!
//! The probes are linked statically into every binary of this package and
//! register with the session daemon when the process starts (if one runs;
//! otherwise they wait for one, see `LTTNG_UST_REGISTER_TIMEOUT`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod ffi {
    extern "C" {
        pub(super) fn edgemark_peers_tp_id(id: u64);
        pub(super) fn edgemark_peers_tp_id_ts(id: u64, ts: u64);
        pub(super) fn edgemark_peers_tp_disabled(id: u64);
        pub(super) fn edgemark_peers_tp_id_enabled() -> i32;
        pub(super) fn edgemark_peers_tp_id_ts_enabled() -> i32;
        pub(super) fn edgemark_peers_tp_disabled_enabled() -> i32;
    }
}

/// The tracepoint `edgemark_peers:id`: one integer; LTTng stamps the time.
#[inline]
pub fn id(id: u64) {
    // SAFETY: a C function of `tp/tp.c` that takes an integer by value and
    // touches only LTTng-UST's own state, which is thread-safe.
    unsafe { ffi::edgemark_peers_tp_id(id) }
}

/// The tracepoint `edgemark_peers:id_ts`: an integer and a timestamp the
/// caller read.
#[inline]
pub fn id_ts(id: u64, ts: u64) {
    // SAFETY: as in `id`: integers by value, LTTng-UST's thread-safe state.
    unsafe { ffi::edgemark_peers_tp_id_ts(id, ts) }
}

/// The tracepoint `edgemark_peers:disabled`, which the bench's session
/// never enables.
#[inline]
pub fn disabled(id: u64) {
    // SAFETY: as in `id`: an integer by value, LTTng-UST's thread-safe state.
    unsafe { ffi::edgemark_peers_tp_disabled(id) }
}

/// Which of the three tracepoints a session has enabled in this process:
/// `(id, id_ts, disabled)`.
pub fn enabled() -> (bool, bool, bool) {
    // SAFETY: the three functions only read the tracepoints' state flags.
    unsafe {
        (
            ffi::edgemark_peers_tp_id_enabled() != 0,
            ffi::edgemark_peers_tp_id_ts_enabled() != 0,
            ffi::edgemark_peers_tp_disabled_enabled() != 0,
        )
    }
}

/// What can keep a session from running.
#[derive(Debug)]
pub struct SessionError(pub String);

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SessionError {}

fn lttng(args: &[&str]) -> Result<Output, SessionError> {
    let out = Command::new("lttng").args(args).output().map_err(|e| {
        SessionError(format!(
            "lttng {}: {e} (is lttng-tools installed?)",
            args.join(" ")
        ))
    })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(SessionError(format!(
            "lttng {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// Starts a session daemon for this user if none runs; returns the file
/// holding its pid if it started one.
fn ensure_sessiond(dir: &Path) -> Result<Option<PathBuf>, SessionError> {
    if Command::new("lttng")
        .arg("list")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(None);
    }
    let pidfile = dir.join("lttng-sessiond.pid");
    let status = Command::new("lttng-sessiond")
        .arg("--daemonize")
        .arg("--pidfile")
        .arg(&pidfile)
        .status()
        .map_err(|e| SessionError(format!("lttng-sessiond: {e} (is lttng-tools installed?)")))?;
    if !status.success() {
        return Err(SessionError(format!(
            "lttng-sessiond --daemonize: {status}"
        )));
    }
    Ok(Some(pidfile))
}

/// A tracing session of this process's user space: per-user buffers,
/// discard mode, its trace written under `dir`, with `edgemark_peers:id`
/// and `edgemark_peers:id_ts` enabled (and `edgemark_peers:disabled` not).
/// Dropping it destroys the session; the trace stays under `dir`.
#[derive(Debug)]
pub struct Session {
    name: String,
    output: PathBuf,
    destroyed: bool,
    /// The pid file of the session daemon this session started, which
    /// dropping the session stops; `None` if one was already running.
    started_daemon: Option<PathBuf>,
}

/// What a session saw: events in the trace it wrote, and events the tracer
/// discarded because a buffer was full.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// `edgemark_peers:id` and `edgemark_peers:id_ts` events in the trace.
    pub recorded: u64,
    /// Events discarded by the channel (full buffers).
    pub discarded: u64,
}

impl Session {
    /// Starts the daemon if needed, creates and starts the session, and
    /// waits (at most `wait`) until this process's tracepoints are enabled.
    ///
    /// The channel keeps at most `tracefile_mib` MiB per stream on disk
    /// (two files of half that, rotated), so that a long run does not fill
    /// the memory-backed filesystem; events in rotated-out files are gone
    /// from the trace but were recorded.
    pub fn start(dir: &Path, tracefile_mib: u64, wait: Duration) -> Result<Session, SessionError> {
        let started_daemon = ensure_sessiond(dir)?;
        let name = format!("edgemark-peers-{}", std::process::id());
        let output = dir.join(&name);
        let out = output
            .to_str()
            .ok_or_else(|| SessionError("non-UTF-8 path".into()))?;
        lttng(&["create", &name, "--output", out])?;
        let session = Session {
            name,
            output,
            destroyed: false,
            started_daemon,
        };
        let half = format!("{}", (tracefile_mib / 2).max(1) * 1024 * 1024);
        lttng(&[
            "enable-channel",
            "--userspace",
            "--session",
            &session.name,
            "--buffers-uid",
            "--discard",
            "--subbuf-size",
            "4M",
            "--num-subbuf",
            "4",
            "--tracefile-size",
            &half,
            "--tracefile-count",
            "2",
            "peers",
        ])?;
        lttng(&[
            "enable-event",
            "--userspace",
            "--session",
            &session.name,
            "--channel",
            "peers",
            "edgemark_peers:id,edgemark_peers:id_ts",
        ])?;
        lttng(&["start", &session.name])?;
        let deadline = Instant::now() + wait;
        loop {
            let (a, b, _) = enabled();
            if a && b {
                break;
            }
            if Instant::now() > deadline {
                return Err(SessionError(
                    "the session started but this process's tracepoints stayed disabled \
                     (was the binary linked with -z nostart-stop-gc?)"
                        .into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(session)
    }

    /// Where the trace is written.
    pub fn output(&self) -> &Path {
        &self.output
    }

    /// Stops the session (flushing its buffers) and counts what it saw:
    /// the events in the trace with `babeltrace2`, the discarded ones from
    /// the session's statistics.
    pub fn stop_and_count(&self) -> Result<Counts, SessionError> {
        lttng(&["stop", &self.name])?;
        let list = lttng(&["list", &self.name])?;
        let text = String::from_utf8_lossy(&list.stdout);
        let discarded = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Discarded events:"))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum();
        // The counter sink prints a count per message type, "N Event messages"
        // among them, instead of every event.
        let out = Command::new("babeltrace2")
            .arg(&self.output)
            .args(["--component", "sink.utils.counter"])
            .output()
            .map_err(|e| SessionError(format!("babeltrace2: {e} (is babeltrace2 installed?)")))?;
        if !out.status.success() {
            return Err(SessionError(format!(
                "babeltrace2 {}: {}",
                self.output.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        // It also prints running counts every 10,000 messages: the last
        // count is the total.
        let recorded = text
            .lines()
            .filter_map(|l| l.trim().strip_suffix(" Event messages"))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .next_back()
            .unwrap_or(0);
        Ok(Counts {
            recorded,
            discarded,
        })
    }

    /// Whether the session started the session daemon (and stops it when
    /// destroyed).
    pub fn started_daemon(&self) -> bool {
        self.started_daemon.is_some()
    }

    /// Destroys the session, and stops the session daemon if the session
    /// started it (also done on drop).
    pub fn destroy(mut self) -> Result<(), SessionError> {
        self.destroyed = true;
        let destroyed = lttng(&["destroy", &self.name]).map(drop);
        self.stop_daemon();
        destroyed
    }

    fn stop_daemon(&mut self) {
        let Some(pidfile) = self.started_daemon.take() else {
            return;
        };
        let pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|p| *p > 1) {
            // The daemon this session started, by the pid it wrote; it
            // stops its consumer daemons with it.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            // Wait (a few seconds at most) until it has exited, so that its
            // shutdown does not run beside what the caller measures next.
            // A zombie (nobody reaps it in some containers) has exited.
            let stat = PathBuf::from(format!("/proc/{pid}/stat"));
            let running = || {
                std::fs::read_to_string(&stat).is_ok_and(|s| {
                    s.rsplit(')')
                        .next()
                        .is_some_and(|r| !r.trim_start().starts_with('Z'))
                })
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while running() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.destroyed {
            let _ = lttng(&["destroy", &self.name]);
        }
        self.stop_daemon();
    }
}
