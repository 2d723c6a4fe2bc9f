//! What each command does: `run` takes the parsed command line and runs
//! it.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use edgemark::Recorder;

use crate::attach::{attach, attach_clockless, attach_for_reading};
use crate::command::{Cli, Command};
use crate::inspect::inspect;
use crate::ops::{self, Op, Trust};
use crate::out::{self, outln};
use crate::remove::remove_if_abandoned_region;

/// Runs the command.
pub(crate) fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Demo { options, html } => {
            // Both output files are opened before the run, so that a path
            // that cannot be written fails at once, not after the demo.
            let json = options.json.as_deref().map(create_output).transpose()?;
            let html_file = html.as_deref().map(create_output).transpose()?;
            let result = crate::demo::run(&options, json)?;
            out::write(&crate::demo::summary(&result))?;
            if let Some(p) = &options.json {
                outln!("snapshots written to {}", p.display());
            }
            if let (Some(p), Some(file)) = (html, html_file) {
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
            dir,
            pattern,
            listen,
            otlp,
            serve_for,
            trust,
        } => {
            let serve_for = match serve_for {
                Some(s) => Some(seconds("--serve-for", s)?),
                None => None,
            };
            match (path, dir) {
                (_, Some(dir)) => {
                    crate::export_dir::export_dir(&dir, pattern, listen, otlp, serve_for, trust)?
                }
                (Some(path), None) => crate::export::export(&path, listen, otlp, serve_for, trust)?,
                // clap requires one of them.
                (None, None) => anyhow::bail!("export needs a region file or --dir DIR"),
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
