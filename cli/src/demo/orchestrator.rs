//! The orchestrator: creates the region, starts one worker process per
//! stage, begins requests at the target concurrency, dispatches each
//! request's token to every stage, starts second segments, aborts some
//! requests, and closes every request, completed or aborted.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use edgemark::{Edge, Recorder, Snapshot, Token};

use super::rng::Rng;
use super::wire::{Dispatch, Plan, Report};
use super::{DemoOptions, DemoResult, STAGES, socket_path};

/// The stage worker processes and their standard inputs.
struct Workers {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
}

impl Workers {
    /// Sends `message` to every stage.
    fn dispatch(&mut self, message: &Dispatch) -> Result<()> {
        let line = message.encode();
        for s in &mut self.stdins {
            writeln!(s, "{line}").context("a stage worker exited")?;
            s.flush()?;
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stdins.clear();
        for c in &mut self.children {
            // Workers exit on end of input; give them a moment, then insist.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the demo; `json` is the file `opts.json` names, opened before the
/// run so that a path that cannot be written fails at once.
pub(crate) fn run(opts: &DemoOptions, json: Option<std::fs::File>) -> Result<DemoResult> {
    if opts.requests == 0 || opts.concurrency == 0 {
        bail!("--requests and --concurrency must be at least 1");
    }
    // The region has a slot per request open at once (a power of two, at
    // least 64); say its bound in the option's terms.
    if opts.concurrency > edgemark::limits::MAX_SLOTS {
        bail!(
            "--concurrency {} is more than the demo can keep open at once (at most {})",
            opts.concurrency,
            edgemark::limits::MAX_SLOTS
        );
    }
    let started = Instant::now();
    // Private: 0700, whatever the umask.
    let dir = tempfile::Builder::new()
        .prefix("edgemark-demo-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(edgemark::default_dir())
        .context("cannot make a directory for the demo region")?;
    let path = dir.path().join("demo.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(opts.concurrency.max(64).next_power_of_two())
        .create(&path)?;
    // Where to watch it while it runs (standard error: standard output
    // holds the summary).
    let shown = path.display();
    eprintln!(
        "edgemark demo: region {shown}{}\n  watch it live:  edgemark top {shown}\n  or serve it:    edgemark export {shown} --listen 127.0.0.1:9464",
        if opts.keep {
            " (kept at the end)"
        } else {
            " (removed at the end; --keep keeps it)"
        }
    );

    let (tx, rx) = mpsc::channel::<Report>();
    let mut workers = Workers {
        children: Vec::new(),
        stdins: Vec::new(),
    };
    for stage in 0..STAGES {
        let mut child = crate::self_command()
            .context("cannot find the edgemark executable")?
            .arg("stage-worker")
            .arg("--stage")
            .arg(stage.to_string())
            .arg("--region")
            .arg(&path)
            .arg("--dir")
            .arg(dir.path())
            .arg("--seed")
            .arg((opts.seed ^ (u64::from(stage + 1) * 0x1000_0001)).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a stage worker")?;
        workers.stdins.push(child.stdin.take().expect("piped"));
        let out = BufReader::new(child.stdout.take().expect("piped"));
        workers.children.push(child);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Some(r) = Report::decode(&line)
                    && tx.send(r).is_err()
                {
                    break;
                }
            }
        });
    }
    drop(tx);
    // Wait until every stage is listening on its connector socket.
    let ready_by = Instant::now() + Duration::from_secs(10);
    while !(1..STAGES).all(|s| socket_path(dir.path(), s).exists()) {
        if Instant::now() > ready_by {
            bail!("the stage workers did not start");
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    let progress = if opts.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let p = indicatif::ProgressBar::new(u64::from(opts.requests));
        p.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {bar:40} {pos}/{len} requests  {elapsed_precise} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        p
    };

    let mut rng = Rng::new(opts.seed);
    let mut begun = 0u32;
    // Open requests: token -> (began, abort at, second segment at, aborted).
    struct Open {
        abort_at: Option<Instant>,
        segment_at: Option<Instant>,
    }
    let mut open: HashMap<Token, Open> = HashMap::new();
    let mut finals: Vec<(Snapshot, bool)> = Vec::with_capacity(opts.requests as usize);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while finals.len() < opts.requests as usize {
        if Instant::now() > deadline {
            bail!(
                "the demo pipeline stalled with {} requests open",
                open.len()
            );
        }
        while begun < opts.requests && (open.len() as u32) < opts.concurrency {
            let token = match rec.begin() {
                Ok(t) => t,
                Err(o) => bail!("begin refused: {o}"),
            };
            begun += 1;
            let plan = Plan {
                chunks: 4 + (rng.next() % 5) as u32,
                heartbeat: rng.chance(0.3),
                fail_first_send: rng.chance(0.08),
                fail_first_admission: rng.chance(0.05),
            };
            let now = Instant::now();
            let abort_at = rng.chance(0.06).then(|| now + rng.ms(60.0, 50.0));
            let segment_at =
                (abort_at.is_none() && rng.chance(0.1)).then(|| now + rng.ms(90.0, 20.0));
            workers.dispatch(&Dispatch::Request(token, Some(plan)))?;
            open.insert(
                token,
                Open {
                    abort_at,
                    segment_at,
                },
            );
        }
        // Control operations that are due.
        let now = Instant::now();
        let mut aborted = Vec::new();
        for (t, o) in open.iter_mut() {
            if o.segment_at.is_some_and(|at| at <= now) {
                o.segment_at = None;
                // A new input segment: fence the old one on both edges, then
                // tell the stages.
                rec.start_segment(*t, Edge::new(0, 1), 1);
                rec.start_segment(*t, Edge::new(1, 2), 1);
                workers.dispatch(&Dispatch::Segment(*t, Some(1)))?;
            }
            if o.abort_at.is_some_and(|at| at <= now) {
                aborted.push(*t);
            }
        }
        for t in aborted {
            open.remove(&t);
            // The abort path closes the request exactly as completion does.
            finals.push((rec.close(t), true));
            workers.dispatch(&Dispatch::Abort(t))?;
            progress.inc(1);
        }
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(Report::Done(t)) => {
                if open.remove(&t).is_some() {
                    finals.push((rec.close(t), false));
                    progress.inc(1);
                }
            }
            Ok(Report::Outcomes(_)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("every stage worker exited"),
        }
    }
    progress.finish_and_clear();
    // End of input tells the workers to report their outcomes and exit.
    workers.stdins.clear();
    let mut reported = 0;
    let report_by = Instant::now() + Duration::from_secs(10);
    while reported < STAGES && Instant::now() < report_by {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Report::Outcomes(map)) => {
                reported += 1;
                for (k, v) in map {
                    *outcomes.entry(k).or_default() += v;
                }
            }
            Ok(Report::Done(_)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if reported < STAGES {
        bail!("only {reported} of {STAGES} stage workers reported their outcomes");
    }
    drop(workers);

    if let (Some(p), Some(file)) = (&opts.json, &json) {
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(file);
            for (s, _) in &finals {
                serde_json::to_writer(&mut f, s)?;
                writeln!(f)?;
            }
            f.flush()
        };
        write().with_context(|| format!("cannot write {}", p.display()))?;
    }
    let counters = rec.counters();
    let region = if opts.keep {
        // The workers are gone: their connector sockets go too.
        for stage in 0..STAGES {
            let _ = std::fs::remove_file(socket_path(dir.path(), stage));
        }
        let kept = dir.keep();
        Some(kept.join("demo.region"))
    } else {
        None
    };
    let events = rec
        .schema()
        .map(|s| s.events().iter().map(|e| e.name().to_owned()).collect())
        .unwrap_or_default();
    Ok(DemoResult {
        events,
        finals,
        outcomes,
        region,
        elapsed: started.elapsed(),
        counters,
    })
}
