//! `Exporter`: the OTLP exporter of `edgemark-otlp` (the one `edgemark
//! export --otlp` runs) on a native thread of this process, for a server
//! that sends its region's closed requests itself. The thread never takes
//! the GIL: it reads the region file and posts on its own runtime, and its
//! notes go to standard error as the command's do (`edgemark: <note>`).
//! Which process of a server runs it is the Python side's choice
//! (`edgemark._export`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgemark_otlp::{Exporter, StartError, Stats, Stopper, FLUSH_DEADLINE};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// How much longer than the exporter's own flush deadline ``stop`` waits
/// for its thread: a post under way when the deadline passes ends at its
/// next await, which this bounds.
const STOP_SLACK: Duration = Duration::from_secs(2);

/// An exporter of the closed requests of one region file, running on a
/// thread of its own: at least once, every loss counted, as ``edgemark
/// export --otlp``.
///
/// ``Exporter.start(path, endpoint=None)`` reads the ``OTEL_*`` variables
/// (``endpoint``, when given, is the collector's base URL, as ``--otlp
/// URL``), attaches the file, registers as a reader of its ring and starts
/// sending. ``stop()`` stops it taking, waits while it sends what it holds
/// (at most ``FLUSH_DEADLINE`` seconds) and returns its counts; what it
/// could not send stays in the ring for the next exporter of the region.
#[pyclass(name = "Exporter", module = "edgemark._edgemark", frozen)]
pub(crate) struct PyExporter {
    url: String,
    stats: Arc<Stats>,
    stopper: Stopper,
    /// The running exporter until ``stop`` joined it.
    running: Mutex<Option<Exporter>>,
}

#[pymethods]
impl PyExporter {
    /// Starts an exporter of the region file at ``path``. Raises
    /// ``ValueError`` for a configuration that cannot be used (no
    /// endpoint, a URL that does not parse, a protocol other than
    /// ``http/protobuf``, a certificate file that holds none), ``OSError``
    /// when the file cannot be attached or read as a registered reader.
    #[staticmethod]
    #[pyo3(signature = (path, endpoint=None))]
    fn start(py: Python<'_>, path: PathBuf, endpoint: Option<String>) -> PyResult<PyExporter> {
        edgemark_cli::show_notes();
        let mut builder = Exporter::builder(&path);
        if let Some(e) = endpoint.filter(|e| !e.trim().is_empty()) {
            builder = builder.with_endpoint(e);
        }
        let exporter = py
            .detach(|| builder.start())
            .map_err(|e| start_error(&path, e))?;
        Ok(PyExporter {
            url: exporter.url().to_owned(),
            stats: exporter.stats(),
            stopper: exporter.stopper(),
            running: Mutex::new(Some(exporter)),
        })
    }

    /// The traces URL it posts to.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Whether its thread still runs (not stopped, not ended).
    fn running(&self) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.as_ref().is_some_and(|e| !e.is_finished())
    }

    /// Its counts now, as a dict: ``requests`` taken, ``exported``,
    /// ``queued``, ``adopted``, ``left_unsent``, ``failures``,
    /// ``tls_failures``, ``dropped_retries``, ``dropped_rejected``,
    /// ``torn_or_unwritten``, ``unsampled`` and ``up`` (the last post
    /// succeeded).
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counts(py, &self.stats)
    }

    /// Stops it: it takes no more, sends what it holds for at most
    /// ``FLUSH_DEADLINE`` seconds, then ends, leaving the rest in the ring
    /// for the next exporter. Waits for that without the GIL (at most a
    /// little longer than the deadline) and returns the counts. A second
    /// call returns the counts at once.
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let taken = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(exporter) = taken {
            self.stopper.stop();
            py.detach(|| {
                let by = Instant::now() + FLUSH_DEADLINE + STOP_SLACK;
                while !exporter.is_finished() && Instant::now() < by {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if exporter.is_finished() {
                    // Ended: the join returns at once.
                    let _ = exporter.join();
                }
                // Else the thread is left to end on its own: the process
                // is on its way out, and a stop must not hang it.
            });
        }
        counts(py, &self.stats)
    }
}

/// ``FLUSH_DEADLINE``: seconds a stopped exporter goes on sending.
pub(crate) fn flush_deadline_s() -> f64 {
    FLUSH_DEADLINE.as_secs_f64()
}

fn counts<'py>(py: Python<'py>, stats: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let c = stats.counts();
    let d = PyDict::new(py);
    for (k, v) in [
        ("requests", c.requests),
        ("exported", c.exported),
        ("queued", c.queued),
        ("adopted", c.adopted),
        ("left_unsent", c.left_unsent),
        ("failures", c.failures),
        ("tls_failures", c.tls_failures),
        ("dropped_retries", c.dropped_retries),
        ("dropped_rejected", c.dropped_rejected),
        ("torn_or_unwritten", c.torn_or_unwritten),
        ("unsampled", c.unsampled),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("up", c.up)?;
    Ok(d)
}

/// A configuration error as ``ValueError``, anything else as ``OSError``,
/// the file named once.
fn start_error(path: &Path, e: StartError) -> PyErr {
    match e {
        StartError::Config(e) => PyValueError::new_err(e.to_string()),
        other => PyOSError::new_err(format!("{}: {other}", path.display())),
    }
}
