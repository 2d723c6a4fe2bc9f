//! The `edgemark` command: create, inspect and drive regions from a shell.

mod demo;
mod ops;
mod out;
mod serve;
mod views;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use edgemark::report::{METRICS, MetricKind, MetricValue};
use edgemark::{Edge, Recorder, Viewer};

use crate::ops::{LookTrust, Op, RecordArgs, StartArgs, TokenArg, Trust};
use crate::out::outln;

/// A shared-memory recorder of first-event timestamps for pipeline stage
/// edges.
#[derive(Parser, Debug)]
#[command(name = "edgemark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a simulated three-stage pipeline (0:1, 1:2) of real worker
    /// processes recording into one region, and print the latency of
    /// each boundary and each delta between them.
    Demo {
        /// Requests to run.
        #[arg(long, default_value_t = 600, value_parser = ops::parse_count::<u32>, allow_negative_numbers = true)]
        requests: u32,
        /// Requests open at once.
        #[arg(long, default_value_t = 12, value_parser = ops::parse_count::<u32>, allow_negative_numbers = true)]
        concurrency: u32,
        /// Write each final snapshot to FILE, one JSON object per line.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Keep the region file (for `edgemark inspect`).
        #[arg(long)]
        keep: bool,
        /// Seed of the simulated timings.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// Write a latency page of the final snapshots to FILE (one
        /// self-contained HTML file).
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// A stage of the demo pipeline (started by `edgemark demo`).
    #[command(hide = true)]
    StageWorker {
        #[arg(long)]
        stage: u32,
        #[arg(long)]
        region: PathBuf,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        seed: u64,
    },
    /// Create a region file.
    Create {
        /// Where to create it (a new file).
        path: PathBuf,
        /// A directed edge FROM:TO or 'FROM->TO' (repeatable), for example
        /// 0:1 or '0->1'.
        #[arg(long = "edge", required = true, value_parser = ops::parse_edge, value_name = "EDGE")]
        edges: Vec<Edge>,
        /// Request slots.
        #[arg(long, default_value_t = 4096, value_parser = ops::parse_count::<u32>, allow_negative_numbers = true)]
        slots: u32,
        /// Segments kept per edge of a request.
        #[arg(long, default_value_t = 4, value_parser = ops::parse_count::<u32>, allow_negative_numbers = true)]
        segments: u32,
        /// Entries of the ring of closed requests that `edgemark export
        /// --otlp` drains (0: none). Default: the slot count, at most 4096.
        #[arg(long, value_name = "N", value_parser = ops::parse_count::<u32>, allow_negative_numbers = true)]
        closed_entries: Option<u32>,
        /// An extra clock domain for values measured elsewhere (repeatable).
        #[arg(long = "domain")]
        domains: Vec<String>,
        /// Let the file's group use the region (mode 0660 instead of 0600).
        #[arg(long, alias = "group")]
        group_access: bool,
        /// The shared clock: 'monotonic' (CLOCK_MONOTONIC) or 'counter' (the
        /// time-stamp counter, where the kernel trusts it; otherwise the
        /// region gets 'monotonic', and this says so).
        #[arg(long, default_value = "monotonic")]
        clock: edgemark::clock::Clock,
    },
    /// Print a region's header, geometry, schema, counters and open requests.
    Inspect {
        /// The region file.
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trust: LookTrust,
    },
    /// Refresh the `inspect` view until interrupted.
    Watch {
        /// The region file.
        path: PathBuf,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        interval: f64,
        /// Stop after this many refreshes.
        #[arg(long, value_parser = ops::parse_count::<u64>, allow_negative_numbers = true)]
        count: Option<u64>,
        #[command(flatten)]
        trust: LookTrust,
    },
    /// A live terminal view: latency per edge of the requests closed
    /// since it started, rates, occupancy and the open requests
    /// (`q` quits).
    Top {
        /// The region file.
        path: PathBuf,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
        interval: f64,
        #[command(flatten)]
        trust: LookTrust,
    },
    /// Write a latency page (waterfalls and histograms) of snapshots
    /// collected as JSON lines, as `demo --json` writes them.
    Report {
        /// The JSON lines file: one snapshot per line.
        snapshots: PathBuf,
        /// The HTML file to write (one self-contained page).
        #[arg(long, value_name = "FILE")]
        html: PathBuf,
    },
    /// Free the slots of dead owners (and of control operations whose
    /// process died), and say how many.
    ///
    /// A region that a process from another pid namespace attached for
    /// writing judges no pid (`inspect` shows it): this frees nothing then
    /// and says why, unless --judge-pids.
    Reclaim {
        /// The region file.
        path: PathBuf,
        /// Judge every owner as a process of this pid namespace even when
        /// the region is shared across pid namespaces. Give it only when
        /// the processes of other namespaces that attached are gone: a live
        /// owner there whose pid names no process here loses its request.
        #[arg(long)]
        judge_pids: bool,
        /// Then remove the region file if its creator has exited and no
        /// request is left open (a region left behind by a process that was
        /// killed, such as `edgemark.stream_edge`'s default region).
        /// Processes that still map it keep their mapping.
        #[arg(long)]
        remove_if_abandoned: bool,
        #[command(flatten)]
        trust: Trust,
    },
    /// Serve the region's metrics to Prometheus on /metrics, and with
    /// --otlp send each closed request as OpenTelemetry spans.
    Export {
        /// The region file.
        path: PathBuf,
        /// Address to serve /metrics on [default: 127.0.0.1:9464, unless
        /// --otlp is given without it].
        #[arg(long)]
        listen: Option<String>,
        /// Send each closed request as spans (OTLP over HTTP, protobuf) to
        /// the collector at URL, its base URL as OTEL_EXPORTER_OTLP_ENDPOINT
        /// takes it (/v1/traces is appended). Without URL, the
        /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
        /// variable says where; the other OTEL_EXPORTER_OTLP_* variables,
        /// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are honoured. It
        /// takes the closed requests from the region's ring, so it writes
        /// the region: a file of another user needs --allow-foreign-owner.
        #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
        otlp: Option<String>,
        /// Stop after this many seconds (default: run until killed).
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        serve_for: Option<f64>,
        #[command(flatten)]
        trust: LookTrust,
    },
    /// Begin a request and print its token.
    Begin {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        args: ops::BeginArgs,
        #[command(flatten)]
        trust: Trust,
    },
    /// Print the traceparent to hand a request's part on another host (its
    /// trace, with the request's own span as the parent).
    Traceparent {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        args: ops::TokenArg,
    },
    /// Record one event and print the outcome.
    Record {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        args: RecordArgs,
        #[command(flatten)]
        trust: Trust,
    },
    /// Start a new segment on an edge of a request and print the outcome.
    #[command(alias = "start")]
    StartSegment {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        args: StartArgs,
        #[command(flatten)]
        trust: Trust,
    },
    /// Print a request's snapshot as JSON.
    Snapshot {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        args: TokenArg,
        #[command(flatten)]
        trust: LookTrust,
    },
    /// Close a request and print its final snapshot as JSON.
    Close {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        args: TokenArg,
        #[command(flatten)]
        trust: Trust,
    },
    /// Run commands from standard input, one per line, one line of output
    /// for each.
    ///
    /// The commands are `begin`, `record`, `start-segment` (or `start`),
    /// `snapshot` and `close`, with the same arguments as on the command
    /// line minus the region's path, for example
    /// `record TOKEN 0:1 producer_first_nonempty_emit --chunk-seq 0`; `help`
    /// lists them with their arguments on one line. A line
    /// that fails, does not parse or is not UTF-8 gets `error <reason>`, and
    /// the batch goes on.
    Batch {
        /// The region file.
        path: PathBuf,
        #[command(flatten)]
        trust: Trust,
    },
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli).and_then(|code| {
        out::flush()?;
        Ok(code)
    }) {
        Ok(code) => code,
        // The reader of a pipe went away (`| head -1`): it wanted no more.
        Err(e)
            if e.chain()
                .find_map(|c| c.downcast_ref::<out::StdoutError>())
                .is_some_and(out::StdoutError::is_closed_pipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edgemark: {e:#}");
            ExitCode::FAILURE
        }
    };
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
}

fn attach(path: &Path, trust: Trust) -> Result<Recorder> {
    trust.options().attach(path).map_err(|e| named(path, e))
}

/// An attach error as one line that names the file once.
fn named(path: &Path, e: edgemark::AttachError) -> anyhow::Error {
    match e {
        // These name the path themselves.
        edgemark::AttachError::Io(..) | edgemark::AttachError::NotRegularFile(_) => anyhow!(e),
        // The library's message ends with its own hint, in the library's
        // terms: say it once, as this command's option.
        edgemark::AttachError::ForeignOwner { uid } => anyhow!(
            "{}: the region file belongs to uid {uid}, not to this user; \
             pass --allow-foreign-owner if you trust that user",
            path.display()
        ),
        other => anyhow!("{}: {other}", path.display()),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Demo {
            requests,
            concurrency,
            json,
            keep,
            seed,
            quiet,
            html,
        } => {
            // Both output files are opened before the run, so that a path
            // that cannot be written fails at once, not after the demo.
            let json = json
                .map(|p| create_output(&p).map(|f| (p, f)))
                .transpose()?;
            let html = html
                .map(|p| create_output(&p).map(|f| (p, f)))
                .transpose()?;
            let opts = crate::demo::DemoOptions {
                requests,
                concurrency,
                json,
                keep,
                seed,
                quiet,
            };
            let result = crate::demo::run(&opts)?;
            out::write(&crate::demo::summary(&result))?;
            if let Some((p, _)) = &opts.json {
                outln!("snapshots written to {}", p.display());
            }
            if let Some((p, file)) = html {
                crate::views::html::write_demo(&result.events, &result.finals, &p, file)?;
                outln!("latency page written to {}", p.display());
            }
        }
        Command::StageWorker {
            stage,
            region,
            dir,
            seed,
        } => crate::demo::stage_worker(stage, &region, &dir, seed)?,
        Command::Create {
            path,
            edges,
            slots,
            segments,
            closed_entries,
            domains,
            group_access,
            clock,
        } => {
            let asked = clock;
            // The library refuses both with one message; say which it is.
            for (i, e) in edges.iter().enumerate() {
                if e.from == e.to {
                    bail!("edge {e} joins stage {} to itself", e.from);
                }
                if edges[..i].contains(e) {
                    bail!("edge {e} is declared twice");
                }
            }
            let mut b = Recorder::builder()
                .edges(edges)
                .slots(slots)
                .segments(segments)
                .group_access(group_access)
                .clock(asked);
            if let Some(n) = closed_entries {
                b = b.closed_entries(n);
            }
            for d in &domains {
                b = b.domain(d);
            }
            let rec = b.create(&path)?;
            let info = rec.info().expect("an enabled recorder");
            outln!(
                "created {} ({} bytes, {} slots, region {})",
                path.display(),
                info.bytes,
                info.slots,
                info.region_id
            );
            outln!("clock   {}", info.clock_kind);
            if info.clock_kind != asked {
                outln!(
                    "note: the {asked} clock is not trusted on this machine; \
                     the region uses the {} clock",
                    info.clock_kind
                );
            }
        }
        Command::Inspect { path, json, .. } => {
            let rec = attach_for_reading(&path)?;
            inspect(&rec, json)?;
        }
        Command::Watch {
            path,
            interval,
            count,
            ..
        } => {
            let rec = attach_for_reading(&path)?;
            let interval = seconds("--interval", interval)?;
            if interval.is_zero() {
                bail!("--interval must be a positive number of seconds");
            }
            // In place on a terminal; through a pipe or into a file, plain
            // text, one refresh after another, a blank line between them.
            let terminal = std::io::stdout().is_terminal();
            let mut n = 0u64;
            loop {
                if terminal {
                    // Clear the screen and home the cursor.
                    out::write("\x1b[2J\x1b[H")?;
                } else if n > 0 {
                    out::write("\n")?;
                }
                inspect(&rec, false)?;
                out::flush()?;
                n += 1;
                if count.is_some_and(|c| n >= c) {
                    break;
                }
                std::thread::sleep(interval);
            }
        }
        Command::Export {
            path,
            listen,
            otlp,
            serve_for,
            trust,
        } => {
            let rec = attach_for_reading(&path)?;
            let serve_for = match serve_for {
                Some(s) => Some(seconds("--serve-for", s)?),
                None => None,
            };
            let listen = match (listen, &otlp) {
                (Some(l), _) => Some(l),
                (None, None) => Some("127.0.0.1:9464".to_owned()),
                (None, Some(_)) => None,
            };
            let listener = listen
                .map(|l| {
                    std::net::TcpListener::bind(l.as_str())
                        .with_context(|| format!("cannot listen on {l}"))
                })
                .transpose()?;
            let exporter = match otlp {
                Some(url) => {
                    let config =
                        edgemark_otlp::Config::new(Some(url.as_str()), |k| std::env::var(k).ok())?;
                    for w in config.warnings() {
                        eprintln!("edgemark: {w}");
                    }
                    let trust = Trust {
                        allow_foreign_owner: trust.allow_foreign_owner,
                    };
                    let drainer = attach_clockless(&path, trust)?;
                    let again = path.clone();
                    let e = edgemark_otlp::Exporter::start(
                        config.clone(),
                        drainer,
                        path.clone(),
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
                let again = path.clone();
                let mut source =
                    crate::serve::Source::new(rec, path, move || attach_for_reading(&again));
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
        }
        Command::Top { path, interval, .. } => {
            crate::views::top::run(attach_for_reading(&path)?, &path, interval)?
        }
        Command::Report { snapshots, html } => {
            crate::views::html::write_report(&snapshots, &html)?;
            outln!("latency page written to {}", html.display());
        }
        Command::Reclaim {
            path,
            judge_pids,
            remove_if_abandoned,
            trust,
        } => {
            let rec = attach_clockless(&path, trust)?;
            let r = if judge_pids {
                rec.reclaim_dead_owners_in_this_namespace()
            } else {
                rec.reclaim_dead_owners()
            }
            .context("the region changed under this process")?;
            match r.unjudged {
                Some(why) => outln!(
                    "freed 0 slots: pids are not judged in this region: {why}; \
                     pass --judge-pids to judge them as processes of this pid namespace"
                ),
                None => outln!(
                    "freed {} slots ({} of dead owners, {} left locked by dead processes)",
                    r.freed(),
                    r.dead_owners,
                    r.dead_holders
                ),
            }
            if r.live_owners_locked > 0 {
                outln!(
                    "closed {} requests of live owners, locked by a process that died inside start-segment: their values are discarded",
                    r.live_owners_locked
                );
            }
            if remove_if_abandoned {
                remove_if_abandoned_region(&rec, &path)?;
            }
        }
        Command::Begin { path, args, trust } => op(&path, trust, Op::Begin(args))?,
        Command::Traceparent { path, args } => {
            let rec = attach_for_reading(&path)?;
            outln!("{}", ops::traceparent(&rec, args.token)?);
        }
        Command::Record { path, args, trust } => op(&path, trust, Op::Record(args))?,
        Command::StartSegment { path, args, trust } => {
            op(&path, trust, Op::StartSegment(args))?;
        }
        // Only reads: read permission (and a read-only mount) is enough; a
        // read-only attach, from another pid namespace, marks nothing.
        Command::Snapshot { path, args, .. } => {
            let rec = attach_for_reading(&path)?;
            outln!("{}", ops::snapshot(&rec, args.token)?);
        }
        Command::Close { path, args, trust } => op(&path, trust, Op::Close(args))?,
        Command::Batch { path, trust } => {
            let rec = attach(&path, trust)?;
            ops::batch(
                &rec,
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Creates (or truncates) an output file named by an option, with an error
/// that names it.
fn create_output(path: &Path) -> Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))
}

/// `secs` seconds as a duration, or a one-line error naming `option`: for a
/// negative or non-finite number, and for one too large to represent.
fn seconds(option: &str, secs: f64) -> Result<std::time::Duration> {
    if !(secs.is_finite() && secs >= 0.0) {
        bail!("{option} must be a number of seconds, not {secs}");
    }
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| {
        anyhow!(
            "{option} {secs:e} is too long: at most {:e} seconds",
            u64::MAX as f64
        )
    })
}

/// Runs one operation on the region at `path` and prints its line.
fn op(path: &Path, trust: Trust, op: Op) -> Result<()> {
    let rec = attach(path, trust)?;
    outln!("{}", ops::run(&rec, op, false)?);
    Ok(())
}

/// Attach to look only: read permission is enough (the file is opened and
/// mapped read-only), and neither a foreign clock nor a foreign owner is a
/// reason not to look: this process cannot write the region, and whatever
/// the owner puts in the file gives a clear error or a working region (a
/// file shrunk under the mapping included), never a crash.
fn attach_for_reading(path: &Path) -> Result<Viewer> {
    edgemark::AttachOptions::new()
        .allow_foreign_owner(true)
        .allow_foreign_clock(true)
        .view(path)
        .map_err(|e| named(path, e))
}

/// Attach to write without reading the clock: to export closed requests
/// (taking them from the region's ring writes its read cursor, its
/// entries' states and its reader table) and to reclaim. Neither begins a
/// request nor records in `host_monotonic`, so a region of another boot or
/// time namespace is no reason to refuse.
fn attach_clockless(path: &Path, trust: Trust) -> Result<Recorder> {
    trust
        .options()
        .allow_foreign_clock(true)
        .attach(path)
        .map_err(|e| named(path, e))
}

/// `reclaim --remove-if-abandoned`: removes the region file when its
/// creator is gone and nothing is open, and says what it did.
fn remove_if_abandoned_region(rec: &Recorder, path: &Path) -> Result<()> {
    let open = rec
        .open_requests()
        .context("the region changed under this process")?
        .len();
    match rec.creator_alive() {
        None => outln!(
            "kept {}: whether its creator runs cannot be judged from this pid namespace",
            path.display()
        ),
        Some(true) => outln!(
            "kept {}: its creator (pid {}) is running",
            path.display(),
            rec.info().map_or(0, |i| i.creator_pid)
        ),
        Some(false) if open > 0 => outln!(
            "kept {}: its creator has exited but {open} requests of live owners are open",
            path.display()
        ),
        Some(false) => {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
            outln!(
                "removed {}: its creator has exited and no request is open",
                path.display()
            );
        }
    }
    Ok(())
}

/// The pid-namespace lines of `inspect`: whether pids are judged, and why
/// not.
fn pids_text(info: &edgemark::report::RegionInfo) -> String {
    match info.pids_unjudged {
        None => "judged (reclaim frees dead owners)".to_owned(),
        Some(why) => format!("NOT judged: {why}; reclaim frees nothing unless --judge-pids"),
    }
}

fn inspect(rec: &Viewer, json: bool) -> Result<()> {
    let report = rec
        .report()
        .context("the region changed under this process")?
        .expect("an enabled recorder");
    let open = rec
        .snapshot_open()
        .context("the region changed under this process")?;
    if json {
        // The region's report, in the library's one encoding of it, then
        // the open requests.
        let mut v = serde_json::to_value(&report)?;
        v["open"] = serde_json::Value::Array(
            open.iter()
                .map(|(t, s)| serde_json::json!({"token": t.to_string(), "snapshot": s}))
                .collect(),
        );
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let (info, counters) = (&report.info, &report.counters);
    outln!("region     {}", info.region_id);
    outln!(
        "geometry   {} slots x {} bytes, {} segments kept per edge, {} bytes in all",
        info.slots,
        info.slot_stride,
        info.segments,
        info.bytes
    );
    let edges: Vec<String> = info.edges.iter().map(|e| e.to_string()).collect();
    outln!("edges      {}", edges.join(", "));
    for e in &info.events {
        outln!(
            "event      {} ({}{})",
            e.name,
            e.domain,
            if e.keeps_chunk_seq {
                ", keeps chunk seq"
            } else {
                ""
            }
        );
    }
    outln!("domains    {}", info.domains.join(", "));
    outln!(
        "clock      {}, boot {:032x}, time namespace {} ({})",
        info.clock_kind,
        info.clock.boot_id,
        info.clock.time_namespace,
        if info.shares_clock {
            "shared with this process"
        } else {
            "NOT this process's clock"
        }
    );
    outln!("creator    pid {}", info.creator_pid);
    outln!("pids       {}", pids_text(info));
    outln!(
        "ring       {} entries x {} bytes (of closed requests)",
        info.ring_entries,
        info.ring_stride
    );
    // Every counter and gauge of the report, by the table that names them
    // in the JSON and on /metrics too; a count by reason with its nonzero
    // reasons.
    let width = METRICS.iter().map(|m| m.key.len()).max().unwrap_or(0);
    for m in METRICS {
        let kind = match m.kind {
            MetricKind::Counter => "counter",
            _ => "gauge",
        };
        let value = m.value(counters, &report.occupancy);
        let mut shown = value.total().to_string();
        if let MetricValue::ByLabel(by) = &value {
            let nonzero: Vec<String> = by
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(l, n)| format!("{l} {n}"))
                .collect();
            if !nonzero.is_empty() {
                shown = format!("{shown} ({})", nonzero.join(", "));
            }
        }
        outln!("{kind:<10} {:<width$} {shown}: {}", m.key, m.help);
    }
    let held = counters
        .closed_overwritten_taken
        .saturating_sub(counters.closed_settled_overwritten);
    if held > 0 {
        outln!(
            "note       {held} closed requests overwritten while a reader held them are not \
             settled: lost if that reader died"
        );
    }
    for (t, s) in &open {
        outln!("open       {t} {}", serde_json::to_string(s)?);
    }
    Ok(())
}
