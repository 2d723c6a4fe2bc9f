//! `export`: the region's metrics served on `/metrics`, and with `--otlp`
//! its closed requests sent as spans by the `edgemark-otlp` exporter.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::attach::{attach_clockless, attach_for_reading};
use crate::ops::{LookTrust, Trust};
use crate::out::{self, outln};

/// Runs `export` on the region at `path`: serves `/metrics` on `listen`
/// (by default 127.0.0.1:9464 unless `otlp` is given), exports to the
/// collector at `otlp` (empty: the environment's), for `serve_for` or
/// until killed.
pub(crate) fn export(
    path: &Path,
    listen: Option<String>,
    otlp: Option<String>,
    serve_for: Option<Duration>,
    trust: LookTrust,
) -> Result<()> {
    let rec = attach_for_reading(path)?;
    let listen = match (listen, &otlp) {
        (Some(l), _) => Some(l),
        (None, None) => Some("127.0.0.1:9464".to_owned()),
        (None, Some(_)) => None,
    };
    let listener = listen
        .map(|l| {
            std::net::TcpListener::bind(l.as_str()).with_context(|| format!("cannot listen on {l}"))
        })
        .transpose()?;
    let exporter = match otlp {
        Some(url) => {
            let config = edgemark_otlp::Config::new(Some(url.as_str()), |k| std::env::var(k).ok())?;
            for w in config.warnings() {
                eprintln!("edgemark: {w}");
            }
            let trust = Trust {
                allow_foreign_owner: trust.allow_foreign_owner,
            };
            let drainer = attach_clockless(path, trust)?;
            let again = path.to_owned();
            let e = edgemark_otlp::Exporter::start(
                config.clone(),
                drainer,
                path.to_owned(),
                Box::new(move || attach_clockless(&again, trust).map_err(Into::into)),
                serve_for,
                Some(Box::new(|signal| {
                    eprintln!("edgemark: export stopped by {signal}");
                    std::process::exit(0)
                })),
            )
            .with_context(|| format!("{}", path.display()))?;
            outln!("sending closed requests as spans to {}", config.url);
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
