//! `export --dir`: every region file in a directory, followed: each one
//! that appears (its name matching the pattern) is served on `/metrics`
//! under a `region` label naming its file, and with `--otlp` has an
//! exporter of its own, which adopts what a dead server's exporter took and
//! did not send; a file that is removed is let go (its exporter sends what
//! it holds first). The sidecar of a pod whose server and exporter share
//! `/dev/shm`, or the one exporter of a node whose servers share the
//! host's: no region name to know in advance, none to follow by hand
//! across restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use edgemark::Viewer;
use edgemark::follow::{Followed, Look};
use edgemark::prometheus::{self, Format, ServerCounter};
use edgemark_otlp::{Exporter, StartError, Stopper};

use crate::attach::attach_for_reading;
use crate::export::Signals;
use crate::ops::LookTrust;
use crate::out::{self, outln};
use crate::serve::Scrape;

/// How often the directory is listed.
pub(crate) const SCAN_EVERY: Duration = Duration::from_secs(1);
/// The most regions followed at once: one `region` label value each, so
/// the label stays bounded whatever lands in the directory.
pub(crate) const MAX_REGIONS: usize = 256;
/// The pattern of the file names followed by default: every region file
/// the plugins and `edgemark create` name.
pub(crate) const DEFAULT_MATCH: &str = "*.region";

/// One region file followed.
struct Tracked {
    path: PathBuf,
    /// The region served on `/metrics`.
    metrics: Followed<Viewer>,
    /// Its exporter, once one started.
    exporter: Option<Exporter>,
    /// Why its exporter did not start, as last said.
    refused: Option<String>,
}

/// The regions of the directory, as the last scan found them.
struct Regions {
    dir: PathBuf,
    pattern: String,
    otlp: Option<String>,
    allow_foreign_owner: bool,
    tracked: Mutex<BTreeMap<String, Tracked>>,
    /// Times a region file was found and followed, and let go.
    found: Mutex<(u64, u64)>,
    /// Exporters stopped (their files removed), still sending.
    stopping: Mutex<Vec<Exporter>>,
    over_limit_said: Mutex<bool>,
}

/// Whether `name` matches `pattern`: `*` any run of characters, `?` one
/// character, anything else itself.
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

impl Regions {
    /// The names of the regular files in the directory that match, sorted.
    fn list(&self) -> std::io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let Ok(entry) = entry else { continue };
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if kind.is_file() && matches(&self.pattern, &name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// One scan: new files followed, removed ones let go, exporters that
    /// did not start tried again.
    fn scan(&self) {
        let names = match self.list() {
            Ok(names) => names,
            Err(e) => {
                eprintln!(
                    "edgemark: cannot list {}: {e}; tried again",
                    self.dir.display()
                );
                return;
            }
        };
        let mut tracked = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        // Let go of the files that are gone.
        let gone: Vec<String> = tracked
            .keys()
            .filter(|k| names.binary_search(k).is_err())
            .cloned()
            .collect();
        for name in gone {
            let Some(t) = tracked.remove(&name) else {
                continue;
            };
            self.found.lock().unwrap_or_else(|e| e.into_inner()).1 += 1;
            match t.exporter {
                Some(e) => {
                    eprintln!(
                        "edgemark: {}: removed; let go once its exporter has sent what it holds",
                        t.path.display()
                    );
                    e.stopper().stop();
                    self.stopping
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(e);
                }
                None => eprintln!("edgemark: {}: removed; let go", t.path.display()),
            }
        }
        // Follow the new ones, up to the bound.
        for name in &names {
            if tracked.contains_key(name) {
                continue;
            }
            if tracked.len() >= MAX_REGIONS {
                let said = std::mem::replace(
                    &mut *self
                        .over_limit_said
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()),
                    true,
                );
                if !said {
                    eprintln!(
                        "edgemark: {} holds more than {MAX_REGIONS} region files matching {:?}; \
                         the others are not followed until some are removed",
                        self.dir.display(),
                        self.pattern
                    );
                }
                break;
            }
            let path = self.dir.join(name);
            eprintln!("edgemark: {}: found; following it", path.display());
            self.found.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
            tracked.insert(
                name.clone(),
                Tracked {
                    metrics: Followed::new(&path),
                    path,
                    exporter: None,
                    refused: None,
                },
            );
        }
        if tracked.len() < MAX_REGIONS {
            *self
                .over_limit_said
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = false;
        }
        if let Some(url) = &self.otlp {
            for t in tracked.values_mut().filter(|t| t.exporter.is_none()) {
                self.start_exporter(t, url);
            }
        }
        drop(tracked);
        // Stopped exporters that are done sending.
        let mut stopping = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
        let (done, going): (Vec<Exporter>, Vec<Exporter>) =
            stopping.drain(..).partition(Exporter::is_finished);
        *stopping = going;
        for e in done {
            let _ = e.join();
        }
    }

    /// Starts the exporter of `t`, or says why not (once per reason; tried
    /// again at the next scan: a region whose header is still being
    /// written, say).
    fn start_exporter(&self, t: &mut Tracked, url: &str) {
        let mut builder = Exporter::builder(&t.path).allow_foreign_owner(self.allow_foreign_owner);
        if !url.trim().is_empty() {
            builder = builder.with_endpoint(url.to_owned());
        }
        match builder.start() {
            Ok(e) => {
                // A closed standard output loses the line, not the export.
                let _ = out::write(&format!(
                    "sending closed requests of {} as spans to {}\n",
                    t.path.display(),
                    e.url()
                ));
                let _ = out::flush();
                t.exporter = Some(e);
                t.refused = None;
            }
            Err(e) => {
                let why = match e {
                    StartError::Attach(e) => crate::attach::named(&t.path, e).to_string(),
                    other => format!("{}: {other}", t.path.display()),
                };
                if t.refused.as_deref() != Some(why.as_str()) {
                    eprintln!("edgemark: not exporting {why}; tried again every second");
                }
                t.refused = Some(why);
            }
        }
    }

    /// Every exporter's stopper (the running ones and the stopping ones).
    fn stoppers(&self) -> Vec<Stopper> {
        let tracked = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        let stopping = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
        tracked
            .values()
            .filter_map(|t| t.exporter.as_ref())
            .chain(stopping.iter())
            .map(Exporter::stopper)
            .collect()
    }
}

impl Scrape for Regions {
    /// Every region followed, each under its file's name, each file looked
    /// at first (attached when it is new or replaced).
    fn render(&self, format: Format) -> String {
        let mut tracked = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        let mut shown: Vec<(String, Option<Viewer>)> = Vec::with_capacity(tracked.len());
        for (name, t) in tracked.iter_mut() {
            match t
                .metrics
                .look(|p| attach_for_reading(p).map_err(|e| format!("{e:#}")))
            {
                Look::Attached { replaced: true } => eprintln!(
                    "edgemark: {}: another file replaced the region; now serving the new one",
                    t.path.display()
                ),
                Look::Failing {
                    why,
                    new: true,
                    gone: false,
                } => eprintln!("edgemark: {why}; serving edgemark_region_ok{{region={name:?}}} 0"),
                _ => {}
            }
            shown.push((name.clone(), t.metrics.current().cloned()));
        }
        drop(tracked);
        let (found, let_go) = *self.found.lock().unwrap_or_else(|e| e.into_inner());
        let served = [
            ServerCounter::new(
                "edgemark_export_regions_found",
                "Region files the exporter found in its directory and followed",
                found,
            ),
            ServerCounter::new(
                "edgemark_export_regions_let_go",
                "Region files the exporter followed and let go when they were removed",
                let_go,
            ),
        ];
        let regions: Vec<(&str, Option<&Viewer>)> = shown
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_ref()))
            .collect();
        let mut body = String::new();
        let _ = prometheus::render_regions(&regions, &served, format, &mut body);
        body
    }
}

/// Runs `export --dir` on `dir`: follows the region files whose names match
/// `pattern`, serves `/metrics` on `listen` (by default 127.0.0.1:9464
/// unless `otlp` is given), exports each to the collector at `otlp` (empty:
/// the environment's), for `serve_for` or until SIGTERM or SIGINT (which
/// stop every exporter after its flush).
pub(crate) fn export_dir(
    dir: &Path,
    pattern: Option<String>,
    listen: Option<String>,
    otlp: Option<String>,
    serve_for: Option<Duration>,
    trust: LookTrust,
) -> Result<()> {
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let pattern = pattern.unwrap_or_else(|| DEFAULT_MATCH.to_owned());
    if pattern.is_empty() || pattern.contains('/') {
        bail!("--match takes a file name pattern (with * and ?), not {pattern:?}");
    }
    if let Some(url) = otlp.as_deref().filter(|u| !u.trim().is_empty()) {
        // A URL that does not parse fails here, once, not once per region.
        Exporter::builder(dir)
            .with_endpoint(url.to_owned())
            .config()
            .map_err(|e| anyhow::anyhow!(e))?;
    }
    let listener = crate::export::listener_for(listen, otlp.is_some())?;
    let regions = Arc::new(Regions {
        dir: dir.to_owned(),
        pattern,
        otlp: otlp.clone(),
        allow_foreign_owner: trust.allow_foreign_owner,
        tracked: Mutex::new(BTreeMap::new()),
        found: Mutex::new((0, 0)),
        stopping: Mutex::new(Vec::new()),
        over_limit_said: Mutex::new(false),
    });
    if otlp.is_some() {
        let signals = Signals::catch()?;
        let r = Arc::clone(&regions);
        signals.then(move || {
            let stoppers = r.stoppers();
            for s in &stoppers {
                s.stop();
            }
            for s in &stoppers {
                s.wait();
            }
        })?;
    }
    outln!(
        "following the region files {:?} in {}",
        regions.pattern,
        dir.display()
    );
    regions.scan();
    // Told to end by the main thread, at the end of --serve-for.
    let stop = Arc::new(Mutex::new(false));
    let scanner = {
        let (r, stop) = (Arc::clone(&regions), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("scan".to_owned())
            .spawn(move || {
                while !*stop.lock().unwrap_or_else(|e| e.into_inner()) {
                    std::thread::sleep(SCAN_EVERY);
                    r.scan();
                }
            })
            .context("cannot start the directory's scanner")?
    };
    let deadline = serve_for.map(|d| Instant::now() + d);
    if let Some(listener) = listener {
        outln!("serving http://{}/metrics", listener.local_addr()?);
        out::flush()?;
        crate::serve::serve(Scraped(Arc::clone(&regions)), listener, serve_for)?;
    } else {
        out::flush()?;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                break;
            }
            std::thread::sleep(left.unwrap_or(SCAN_EVERY).min(SCAN_EVERY));
        }
    }
    *stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
    let _ = scanner.join();
    // The end of --serve-for: every exporter stops and sends what it holds.
    let stoppers = regions.stoppers();
    for s in &stoppers {
        s.stop();
    }
    for s in &stoppers {
        s.wait();
    }
    let mut exporters: Vec<Exporter> = {
        let mut tracked = regions.tracked.lock().unwrap_or_else(|e| e.into_inner());
        tracked
            .values_mut()
            .filter_map(|t| t.exporter.take())
            .collect()
    };
    exporters.append(&mut regions.stopping.lock().unwrap_or_else(|e| e.into_inner()));
    let mut panicked = 0;
    for e in exporters {
        panicked += usize::from(!e.join());
    }
    if panicked > 0 {
        bail!("{panicked} OTLP exporter threads panicked");
    }
    Ok(())
}

/// The regions as the `/metrics` server shows them.
struct Scraped(Arc<Regions>);

impl Scrape for Scraped {
    fn render(&self, format: Format) -> String {
        self.0.render(format)
    }
}
