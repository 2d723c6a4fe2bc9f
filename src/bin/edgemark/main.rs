//! The `edgemark` command: create, inspect and drive regions from a shell.

#[cfg(edgemark_loom)]
fn main() {}

#[cfg(not(edgemark_loom))]
fn main() {
    cli::main()
}

#[cfg(not(edgemark_loom))]
mod demo;
#[cfg(not(edgemark_loom))]
mod views;

#[cfg(not(edgemark_loom))]
mod cli {
    use std::io::{BufRead, Write};
    use std::path::{Path, PathBuf};
    use std::process::ExitCode;

    use anyhow::{anyhow, bail, Context, Result};
    use clap::{Parser, Subcommand};
    use edgemark::{AttachOptions, Edge, Mark, Outcome, Recorder, Token};

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
        /// Run a simulated three-stage pipeline (0->1->2) of real worker
        /// processes recording into one region, and print the latency of
        /// each boundary and each delta between them.
        Demo {
            /// Requests to run.
            #[arg(long, default_value_t = 600)]
            requests: u32,
            /// Requests open at once.
            #[arg(long, default_value_t = 12)]
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
            /// A directed edge FROM->TO (repeatable), for example 0->1.
            #[arg(long = "edge", required = true, value_parser = parse_edge)]
            edges: Vec<Edge>,
            /// Request slots.
            #[arg(long, default_value_t = 4096)]
            slots: u32,
            /// Segments kept per edge of a request.
            #[arg(long, default_value_t = 4)]
            segments: u32,
            /// An extra clock domain for values measured elsewhere (repeatable).
            #[arg(long = "domain")]
            domains: Vec<String>,
            /// Let the file's group use the region.
            #[arg(long)]
            group: bool,
        },
        /// Print a region's header, geometry, schema, counters and open requests.
        Inspect {
            /// The region file.
            path: PathBuf,
            /// Print JSON instead of text.
            #[arg(long)]
            json: bool,
        },
        /// Refresh the `inspect` view until interrupted.
        Watch {
            /// The region file.
            path: PathBuf,
            /// Seconds between refreshes.
            #[arg(long, default_value_t = 1.0)]
            interval: f64,
            /// Stop after this many refreshes.
            #[arg(long)]
            count: Option<u64>,
        },
        /// A live terminal view: latency per edge of the requests closed
        /// since it started, rates, occupancy and the open requests
        /// (`q` quits).
        Top {
            /// The region file.
            path: PathBuf,
            /// Seconds between refreshes.
            #[arg(long, default_value_t = 0.5)]
            interval: f64,
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
        Reclaim {
            /// The region file.
            path: PathBuf,
        },
        /// Serve the region's metrics to Prometheus on /metrics.
        Export {
            /// The region file.
            path: PathBuf,
            /// Address to listen on.
            #[arg(long, default_value = "127.0.0.1:9464")]
            listen: String,
            /// Stop after this many seconds (default: run until killed).
            #[arg(long, value_name = "SECONDS")]
            serve_for: Option<f64>,
        },
        /// Begin a request and print its token.
        Begin {
            /// The region file.
            path: PathBuf,
        },
        /// Record one event and print the outcome.
        Record {
            /// The region file.
            path: PathBuf,
            /// The request's token.
            token: Token,
            /// The edge, FROM->TO.
            #[arg(value_parser = parse_edge)]
            edge: Edge,
            /// The event's name.
            event: String,
            /// The segment index.
            #[arg(long, default_value_t = 0)]
            segment: u32,
            /// The payload's chunk sequence number.
            #[arg(long)]
            chunk: Option<u64>,
            /// The payload was empty (records nothing).
            #[arg(long)]
            empty: bool,
            /// Elapsed milliseconds measured elsewhere, instead of reading the clock.
            #[arg(long, requires = "domain")]
            elapsed_ms: Option<f64>,
            /// The clock domain of --elapsed-ms.
            #[arg(long, requires = "elapsed_ms")]
            domain: Option<String>,
        },
        /// Start a new segment on an edge of a request.
        StartSegment {
            /// The region file.
            path: PathBuf,
            /// The request's token.
            token: Token,
            /// The edge, FROM->TO.
            #[arg(value_parser = parse_edge)]
            edge: Edge,
            /// The new segment index.
            segment: u32,
        },
        /// Print a request's snapshot as JSON.
        Snapshot {
            /// The region file.
            path: PathBuf,
            /// The request's token.
            token: Token,
        },
        /// Close a request and print its final snapshot as JSON.
        Close {
            /// The region file.
            path: PathBuf,
            /// The request's token.
            token: Token,
        },
        /// Run commands from standard input, one per line, printing one line
        /// of output for each (see `docs/cli.md`).
        Batch {
            /// The region file.
            path: PathBuf,
        },
    }

    fn parse_edge(s: &str) -> Result<Edge, String> {
        let (a, b) = s
            .split_once("->")
            .ok_or_else(|| format!("{s:?} is not an edge FROM->TO"))?;
        let n = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("{x:?} is not a stage number"))
        };
        Ok(Edge::new(n(a)?, n(b)?))
    }

    pub(crate) fn main() {
        let cli = Cli::parse();
        let code = match run(cli) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("edgemark: {e:#}");
                ExitCode::FAILURE
            }
        };
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }

    fn attach(path: &Path) -> Result<Recorder> {
        AttachOptions::new()
            .attach(path)
            .map_err(|e| named(path, e))
    }

    /// An attach error as one line that names the file once.
    fn named(path: &Path, e: edgemark::AttachError) -> anyhow::Error {
        match e {
            // These name the path themselves.
            edgemark::AttachError::Io(..) | edgemark::AttachError::NotRegularFile(_) => anyhow!(e),
            other => anyhow!("{}: {other}", path.display()),
        }
    }

    fn event_id(rec: &Recorder, name: &str) -> Result<edgemark::EventId> {
        rec.event(name)
            .ok_or_else(|| anyhow!("the region's schema has no event {name:?}"))
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
                let opts = crate::demo::DemoOptions {
                    requests,
                    concurrency,
                    json,
                    keep,
                    seed,
                    quiet,
                };
                let result = crate::demo::run(&opts)?;
                print!("{}", crate::demo::summary(&result));
                if let Some(file) = html {
                    crate::views::html::write_demo(&result.finals, &file)?;
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
                domains,
                group,
            } => {
                let mut b = Recorder::builder()
                    .edges(edges)
                    .slots(slots)
                    .segments(segments)
                    .group_access(group);
                for d in &domains {
                    b = b.domain(d);
                }
                let rec = b.create(&path)?;
                let info = rec.info().expect("an enabled recorder");
                println!(
                    "created {} ({} bytes, {} slots, region {:016x})",
                    path.display(),
                    info.bytes,
                    info.slots,
                    info.region_id
                );
            }
            Command::Inspect { path, json } => {
                let rec = attach_for_reading(&path)?;
                inspect(&rec, json)?;
            }
            Command::Watch {
                path,
                interval,
                count,
            } => {
                let rec = attach_for_reading(&path)?;
                if !(interval.is_finite() && interval > 0.0) {
                    bail!("--interval must be a positive number of seconds");
                }
                let mut n = 0u64;
                loop {
                    // Clear the screen and home the cursor.
                    print!("\x1b[2J\x1b[H");
                    inspect(&rec, false)?;
                    std::io::stdout().flush()?;
                    n += 1;
                    if count.is_some_and(|c| n >= c) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_secs_f64(interval));
                }
            }
            Command::Export {
                path,
                listen,
                serve_for,
            } => {
                let rec = attach_for_reading(&path)?;
                let server = edgemark::export::Exporter::new(rec)
                    .serve(listen.as_str())
                    .with_context(|| format!("cannot listen on {listen}"))?;
                println!("serving http://{}/metrics", server.local_addr());
                std::io::stdout().flush()?;
                match serve_for {
                    Some(s) if s.is_finite() && s >= 0.0 => {
                        std::thread::sleep(std::time::Duration::from_secs_f64(s))
                    }
                    Some(_) => bail!("--serve-for must be a number of seconds"),
                    None => loop {
                        std::thread::park();
                    },
                }
                server.shutdown();
            }
            Command::Top { path, interval } => {
                crate::views::top::run(attach_for_reading(&path)?, &path, interval)?
            }
            Command::Report { snapshots, html } => {
                crate::views::html::write_report(&snapshots, &html)?
            }
            Command::Reclaim { path } => {
                let rec = attach_for_reading(&path)?;
                let r = rec.reclaim_dead_owners();
                println!(
                    "freed {} slots ({} of dead owners, {} left locked by dead processes)",
                    r.freed(),
                    r.dead_owners,
                    r.dead_holders
                );
            }
            Command::Begin { path } => {
                let rec = attach(&path)?;
                match rec.begin() {
                    Ok(t) => println!("{t}"),
                    Err(o) => bail!("no request begun: {o}"),
                }
            }
            Command::Record {
                path,
                token,
                edge,
                event,
                segment,
                chunk,
                empty,
                elapsed_ms,
                domain,
            } => {
                let rec = attach(&path)?;
                let mut mark = Mark::new(edge, event_id(&rec, &event)?)
                    .segment(segment)
                    .meaningful(!empty);
                if let Some(c) = chunk {
                    mark = mark.chunk_seq(c);
                }
                let o = match (elapsed_ms, domain) {
                    (Some(ms), Some(d)) => rec.record_elapsed(token, mark, ms, &d),
                    _ => rec.record(token, mark),
                };
                println!("{o}");
            }
            Command::StartSegment {
                path,
                token,
                edge,
                segment,
            } => {
                let rec = attach(&path)?;
                println!("{}", rec.start_segment(token, edge, segment));
            }
            Command::Snapshot { path, token } => {
                let rec = attach(&path)?;
                println!("{}", serde_json::to_string(&rec.snapshot(token))?);
            }
            Command::Close { path, token } => {
                let rec = attach(&path)?;
                let last = rec.close(token);
                if last.state() == edgemark::RequestState::Busy {
                    bail!("request {token} is busy: another control operation holds it; close it again");
                }
                println!("{}", serde_json::to_string(&last)?);
            }
            Command::Batch { path } => {
                let rec = attach(&path)?;
                batch(&rec)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// Attach for reading only: a foreign clock is no reason not to look.
    fn attach_for_reading(path: &Path) -> Result<Recorder> {
        AttachOptions::new()
            .allow_foreign_clock(true)
            .attach(path)
            .map_err(|e| named(path, e))
    }

    fn inspect(rec: &Recorder, json: bool) -> Result<()> {
        rec.check()
            .context("the region changed under this process")?;
        let info = rec.info().expect("an enabled recorder");
        let schema = rec.schema().expect("an enabled recorder");
        let counters = rec.counters();
        let open = rec.snapshot_open();
        if json {
            let v = serde_json::json!({
                "region_id": format!("{:016x}", info.region_id),
                "bytes": info.bytes,
                "slots": info.slots,
                "segments": info.segments,
                "slot_stride": info.slot_stride,
                "edges": rec.edges().iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                "events": schema.events().iter().map(|e| serde_json::json!({
                    "name": e.name(),
                    "domain": schema.domain_name(e.domain()),
                    "keeps_chunk_seq": e.keeps_chunk_seq(),
                })).collect::<Vec<_>>(),
                "domains": schema.domains(),
                "clock": {
                    "boot_id": format!("{:032x}", info.clock.boot_id),
                    "time_namespace": info.clock.time_namespace,
                    "shared_with_this_process": info.shares_clock,
                },
                "created_unix_ns": info.created_unix_ns,
                "creator_pid": info.creator_pid,
                "group_access": info.group_access,
                "refused": counters.refused.iter().map(|(o, n)| (o.name().to_owned(), serde_json::Value::from(*n))).collect::<serde_json::Map<String, serde_json::Value>>(),
                "dropped_segments": counters.dropped_segments,
                "open_requests": open.len(),
                "free_slots": u64::from(info.slots) - open.len() as u64,
                "open": open.iter().map(|(t, s)| serde_json::json!({"token": t.to_string(), "snapshot": s})).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(());
        }
        println!("region     {:016x}", info.region_id);
        println!(
            "geometry   {} slots x {} bytes, {} segments kept per edge, {} bytes in all",
            info.slots, info.slot_stride, info.segments, info.bytes
        );
        let edges: Vec<String> = rec.edges().iter().map(|e| e.to_string()).collect();
        println!("edges      {}", edges.join(", "));
        for e in schema.events() {
            println!(
                "event      {} ({}{})",
                e.name(),
                schema.domain_name(e.domain()).unwrap_or("?"),
                if e.keeps_chunk_seq() {
                    ", keeps chunk seq"
                } else {
                    ""
                }
            );
        }
        println!("domains    {}", schema.domains().join(", "));
        println!(
            "clock      boot {:032x}, time namespace {} ({})",
            info.clock.boot_id,
            info.clock.time_namespace,
            if info.shares_clock {
                "shared with this process"
            } else {
                "NOT this process's clock"
            }
        );
        println!("creator    pid {}", info.creator_pid);
        println!(
            "occupancy  {} open, {} free",
            open.len(),
            u64::from(info.slots) - open.len() as u64
        );
        println!("dropped    {} segments", counters.dropped_segments);
        for (o, n) in &counters.refused {
            if *n > 0 {
                println!("refused    {o}: {n}");
            }
        }
        for (t, s) in &open {
            println!("open       {t} {}", serde_json::to_string(s)?);
        }
        Ok(())
    }

    /// One command per line; one output line per command:
    ///
    /// ```text
    /// begin                                       -> token, or "refused <outcome>"
    /// record TOKEN FROM->TO SEGMENT EVENT [chunk=N] [empty] [ms=X domain=D]
    ///                                             -> outcome
    /// start TOKEN FROM->TO SEGMENT                -> outcome
    /// snapshot TOKEN | close TOKEN                -> JSON
    /// ```
    fn batch(rec: &Recorder) -> Result<()> {
        let stdin = std::io::stdin();
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for line in stdin.lock().lines() {
            let line = line?;
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match batch_line(rec, &words) {
                Ok(r) => r,
                Err(e) => format!("error {e}"),
            };
            writeln!(out, "{reply}")?;
            out.flush()?;
        }
        Ok(())
    }

    fn batch_line(rec: &Recorder, words: &[&str]) -> Result<String> {
        let token = |i: usize| -> Result<Token> {
            words
                .get(i)
                .ok_or_else(|| anyhow!("missing token"))?
                .parse()
                .map_err(|e| anyhow!("{e}"))
        };
        let edge = |i: usize| -> Result<Edge> {
            parse_edge(words.get(i).ok_or_else(|| anyhow!("missing edge"))?).map_err(|e| anyhow!(e))
        };
        let num = |i: usize| -> Result<u32> {
            words
                .get(i)
                .ok_or_else(|| anyhow!("missing segment"))?
                .parse()
                .map_err(|_| anyhow!("bad segment"))
        };
        match words.first().copied() {
            Some("begin") => Ok(match rec.begin() {
                Ok(t) => t.to_string(),
                Err(o) => format!("refused {o}"),
            }),
            Some("record") => {
                let (t, e, s) = (token(1)?, edge(2)?, num(3)?);
                let name = words.get(4).ok_or_else(|| anyhow!("missing event"))?;
                let mut mark = Mark::new(e, event_id(rec, name)?).segment(s);
                let (mut ms, mut domain) = (None, None);
                for opt in &words[5..] {
                    match opt.split_once('=') {
                        Some(("chunk", v)) => mark = mark.chunk_seq(v.parse()?),
                        Some(("ms", v)) => ms = Some(v.parse::<f64>()?),
                        Some(("domain", v)) => domain = Some(v),
                        None if *opt == "empty" => mark = mark.meaningful(false),
                        _ => bail!("unknown option {opt:?}"),
                    }
                }
                let o: Outcome = match (ms, domain) {
                    (Some(ms), Some(d)) => rec.record_elapsed(t, mark, ms, d),
                    (None, None) => rec.record(t, mark),
                    _ => bail!("ms= and domain= go together"),
                };
                Ok(o.to_string())
            }
            Some("start") => Ok(rec.start_segment(token(1)?, edge(2)?, num(3)?).to_string()),
            Some("snapshot") => Ok(serde_json::to_string(&rec.snapshot(token(1)?))?),
            Some("close") => {
                let last = rec.close(token(1)?);
                if last.state() == edgemark::RequestState::Busy {
                    bail!("busy: another control operation holds the request; close it again");
                }
                Ok(serde_json::to_string(&last)?)
            }
            Some(other) => bail!("unknown command {other:?}"),
            None => bail!("empty line"),
        }
    }
}
