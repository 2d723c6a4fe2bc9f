//! `export`: the region's metrics served on `/metrics`, and with `--otlp`
//! its closed requests sent as spans by the `edgemark-otlp` exporter,
//! stopped on SIGTERM or SIGINT.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use edgemark_otlp::{Exporter, FLUSH_DEADLINE, StartError, Stopper};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::attach::{attach_for_reading, named};
use crate::ops::LookTrust;
use crate::out::{self, outln};

/// Runs `export` on the region at `path`: serves `/metrics` on `listen`
/// (by default 127.0.0.1:9464 unless `otlp` is given), exports to the
/// collector at `otlp` (empty: the environment's), for `serve_for` or
/// until killed (with `--otlp`: until SIGTERM or SIGINT, which stop the
/// exporter after its flush).
pub(crate) fn export(
    path: &Path,
    listen: Option<String>,
    otlp: Option<String>,
    serve_for: Option<Duration>,
    trust: LookTrust,
) -> Result<()> {
    let rec = attach_for_reading(path)?;
    let listener = listener_for(listen, otlp.is_some())?;
    let exporter = match otlp {
        Some(url) => {
            let mut builder =
                Exporter::builder(path).allow_foreign_owner(trust.allow_foreign_owner);
            if !url.trim().is_empty() {
                builder = builder.with_endpoint(url);
            }
            if let Some(d) = serve_for {
                builder = builder.run_for(d);
            }
            // Caught before the exporter starts, so that a signal that
            // comes while it starts stops it too.
            let signals = Signals::catch()?;
            let e = builder.start().map_err(|e| start_error(path, e))?;
            signals.stop(e.stopper())?;
            outln!("sending closed requests as spans to {}", e.url());
            Some(e)
        }
        None => None,
    };
    if let Some(listener) = listener {
        outln!("serving http://{}/metrics", listener.local_addr()?);
        out::flush()?;
        // After a shrink found by a scrape, the next scrape attaches
        // again, once the file is whole.
        let again = path.to_owned();
        let mut source =
            crate::serve::Source::new(rec, path.to_owned(), move || attach_for_reading(&again));
        if let Some(e) = &exporter {
            source = source.with_otlp(e.stats());
        }
        crate::serve::serve(source, listener, serve_for)?;
    } else {
        out::flush()?;
    }
    if let Some(e) = exporter
        && !e.join()
    {
        anyhow::bail!("the OTLP exporter's thread panicked");
    }
    Ok(())
}

/// The `/metrics` listener of `export`: on `listen`, or by default on
/// 127.0.0.1:9464 unless the command exports with `--otlp` (then none).
pub(crate) fn listener_for(
    listen: Option<String>,
    otlp: bool,
) -> Result<Option<std::net::TcpListener>> {
    let listen = match (listen, otlp) {
        (Some(l), _) => Some(l),
        (None, false) => Some("127.0.0.1:9464".to_owned()),
        (None, true) => None,
    };
    listen
        .map(|l| {
            std::net::TcpListener::bind(l.as_str()).with_context(|| format!("cannot listen on {l}"))
        })
        .transpose()
}

/// Why the exporter did not start, in this command's terms: its options,
/// and the file named once.
fn start_error(path: &Path, e: StartError) -> anyhow::Error {
    match e {
        StartError::Config(e) if e.is_missing_endpoint() => anyhow!(
            "--otlp needs the collector's URL (for example http://127.0.0.1:4318), \
             or OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set"
        ),
        StartError::Config(e) => anyhow!(e),
        StartError::Attach(e) => named(path, e),
        StartError::Reader(e @ edgemark::ReaderError::NoRing) => anyhow!(
            "{}: {e} (create it with --closed-entries above 0)",
            path.display()
        ),
        other => anyhow!("{}: {other}", path.display()),
    }
}

/// SIGTERM and SIGINT, caught from when they are made.
pub(crate) struct Signals {
    runtime: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Catches SIGTERM and SIGINT from now on.
    pub(crate) fn catch() -> Result<Signals> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .context("cannot start the signal handler's runtime")?;
        let (term, int) = {
            let _in = runtime.enter();
            (
                signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
                signal(SignalKind::interrupt()).context("cannot catch SIGINT")?,
            )
        };
        Ok(Signals { runtime, term, int })
    }

    /// On the first of them, on a thread of its own: stops the exporter,
    /// waits while it sends what it holds (at most [`FLUSH_DEADLINE`]),
    /// says so and ends the process with status 0.
    fn stop(self, stopper: Stopper) -> Result<()> {
        self.then(move || {
            stopper.stop();
            stopper.wait();
        })
    }

    /// On the first of them, on a thread of its own: runs `stop` (which
    /// stops the exporters and waits while they send what they hold, at
    /// most [`FLUSH_DEADLINE`]), says so and ends the process with status 0.
    pub(crate) fn then(self, stop: impl FnOnce() + Send + 'static) -> Result<()> {
        let Signals {
            runtime,
            mut term,
            mut int,
        } = self;
        std::thread::Builder::new()
            .name("signals".to_owned())
            .spawn(move || {
                let name = runtime.block_on(async {
                    tokio::select! {
                        _ = term.recv() => "SIGTERM",
                        _ = int.recv() => "SIGINT",
                    }
                });
                eprintln!(
                    "edgemark: {name}: sending what is queued for at most {} s",
                    FLUSH_DEADLINE.as_secs()
                );
                stop();
                let _ = out::flush();
                eprintln!("edgemark: export stopped by {name}");
                std::process::exit(0)
            })
            .context("cannot start the signal handler's thread")?;
        Ok(())
    }
}
