//! The exporter: its builder, the running exporter and its stopper, and
//! the run of its thread.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::config::{Config, ConfigError, Overrides};
use crate::queue::Queued;
use crate::region::attach_options;
use crate::shared::{FLUSH_DEADLINE, Shared};
use crate::stats::Stats;
use crate::{drain, send};
use edgemark::follow::RingFollower;

/// Reads one environment variable.
type Env = Box<dyn Fn(&str) -> Option<String> + Send>;

/// An exporter to be started: the region file it reads, and settings over
/// the environment's defaults (the `OTEL_*` variables, see
/// [`Config::new`]). From [`Exporter::builder`]; [`start`](Self::start)
/// starts it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use edgemark_otlp::Exporter;
///
/// let exporter = Exporter::builder("/dev/shm/pipeline.region")
///     .with_endpoint("http://127.0.0.1:4318")
///     .with_timeout(Duration::from_secs(5))
///     .run_for(Duration::from_secs(60))
///     .start()?;
/// println!("sending to {}", exporter.url());
/// exporter.join();
/// # Ok(())
/// # }
/// ```
pub struct ExporterBuilder {
    region: PathBuf,
    endpoint: Option<String>,
    overrides: Overrides,
    env: Env,
    allow_foreign_owner: bool,
    run_for: Option<Duration>,
}

impl std::fmt::Debug for ExporterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExporterBuilder")
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("overrides", &self.overrides)
            .field("allow_foreign_owner", &self.allow_foreign_owner)
            .field("run_for", &self.run_for)
            .finish_non_exhaustive()
    }
}

impl ExporterBuilder {
    /// The collector's base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it
    /// (`/v1/traces` is appended), over the variables. An empty one is
    /// none: the variables say where.
    pub fn with_endpoint(self, url: impl Into<String>) -> ExporterBuilder {
        self.with(|b| b.endpoint = Some(url.into()))
    }

    /// The limit on one post (connect, send, answer), over
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`; at least a millisecond.
    pub fn with_timeout(self, timeout: Duration) -> ExporterBuilder {
        self.with(|b| b.overrides.timeout = Some(timeout))
    }

    /// Spans sent in one post at most, over
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (at most the queue's size).
    pub fn with_batch_size(self, spans: usize) -> ExporterBuilder {
        self.with(|b| b.overrides.batch = Some(spans))
    }

    /// Spans queued at most, over `OTEL_BSP_MAX_QUEUE_SIZE`.
    pub fn with_queue_size(self, spans: usize) -> ExporterBuilder {
        self.with(|b| b.overrides.queue = Some(spans))
    }

    /// The longest a span waits for its batch to fill, over
    /// `OTEL_BSP_SCHEDULE_DELAY`.
    pub fn with_schedule_delay(self, delay: Duration) -> ExporterBuilder {
        self.with(|b| b.overrides.schedule_delay = Some(delay))
    }

    /// Where the `OTEL_*` variables are read: `lookup(name)`, instead of
    /// the process's environment.
    pub fn with_env(
        self,
        lookup: impl Fn(&str) -> Option<String> + Send + 'static,
    ) -> ExporterBuilder {
        self.with(|b| b.env = Box::new(lookup))
    }

    /// Use a region file that another user owns (refused by default: its
    /// owner can change it under this process).
    pub fn allow_foreign_owner(self, yes: bool) -> ExporterBuilder {
        self.with(|b| b.allow_foreign_owner = yes)
    }

    /// Stop after `run_for`: then the exporter stops taking, sends what it
    /// holds for at most [`FLUSH_DEADLINE`] (or its timeout, if shorter)
    /// and ends. Without it, it runs until [stopped](Stopper::stop).
    pub fn run_for(self, run_for: Duration) -> ExporterBuilder {
        self.with(|b| b.run_for = Some(run_for))
    }

    /// The builder with `set` applied: the one body of the setters above.
    fn with(mut self, set: impl FnOnce(&mut ExporterBuilder)) -> ExporterBuilder {
        set(&mut self);
        self
    }

    /// The configuration it will run with: the variables, with what this
    /// builder sets over them.
    pub fn config(&self) -> Result<Config, ConfigError> {
        Ok(Config::new(self.endpoint.as_deref(), &self.env)?.overridden(&self.overrides))
    }

    /// Attaches the region file, registers as a reader of its ring of
    /// closed requests and starts exporting, on a thread of its own. Each
    /// of the configuration's [warnings](Config::warnings) is logged.
    ///
    /// Fails if the configuration cannot be used, the file cannot be
    /// attached, the region keeps no ring of closed requests, or its reader
    /// table is full.
    pub fn start(self) -> Result<Exporter, StartError> {
        let config = self.config().map_err(StartError::Config)?;
        for w in config.warnings() {
            log::warn!("{w}");
        }
        let options = attach_options(self.allow_foreign_owner);
        let rec = options
            .clone()
            .attach(&self.region)
            .map_err(StartError::Attach)?;
        let reader = rec.closed_reader().map_err(StartError::Reader)?;
        let follower = RingFollower::with_reader(self.region, options, reader);
        let stats = Arc::new(Stats::default());
        let control = Arc::new(Control::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| StartError::Io("runtime", e))?;
        let url = config.url.clone();
        let deadline = self.run_for.map(|d| Instant::now() + d);
        let (thread_stats, thread_control) = (Arc::clone(&stats), Arc::clone(&control));
        let thread = std::thread::Builder::new()
            .name("otlp".to_owned())
            .spawn(move || {
                // Marks the exporter stopped however the run ends (a panic
                // included), so that no `Stopper::wait` waits forever.
                let _done = Done(&thread_control);
                runtime.block_on(run(
                    Arc::new(config),
                    follower,
                    &thread_stats,
                    deadline,
                    &thread_control,
                ));
            })
            .map_err(|e| StartError::Io("thread", e))?;
        Ok(Exporter {
            stats,
            control,
            url,
            thread,
        })
    }
}

/// Why [`ExporterBuilder::start`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration cannot be used.
    Config(ConfigError),
    /// The region file cannot be attached.
    Attach(edgemark::AttachError),
    /// The region cannot be read as a registered reader: it keeps no ring
    /// of closed requests, or its reader table is full.
    Reader(edgemark::ReaderError),
    /// The exporter's runtime or thread could not start.
    Io(&'static str, std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "{e}"),
            StartError::Attach(e) => write!(f, "{e}"),
            StartError::Reader(e) => write!(f, "{e}"),
            StartError::Io(what, e) => write!(f, "cannot start the exporter's {what}: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(e) => Some(e),
            StartError::Attach(e) => Some(e),
            StartError::Reader(e) => Some(e),
            StartError::Io(_, e) => Some(e),
        }
    }
}

/// What a running exporter and its stoppers share across threads.
#[derive(Debug, Default)]
struct Control {
    /// Told once a stop is asked for (a permit is kept if the exporter is
    /// not waiting yet).
    stop: tokio::sync::Notify,
    /// Whether the exporter's run has ended.
    done: Mutex<bool>,
    /// Told when `done` is set.
    ended: Condvar,
}

/// Sets [`Control::done`] when dropped: at the end of the exporter's
/// thread, however it ends.
struct Done<'a>(&'a Control);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        *self.0.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.ended.notify_all();
    }
}

/// The running exporter: a thread with a single-threaded runtime, on which
/// the drain and the sender run. It prints nothing and handles no signal:
/// what it has to say goes to the `log` facade (target `edgemark_otlp`),
/// and a program that stops on a signal calls [`Stopper::stop`] from its
/// handler.
#[derive(Debug)]
pub struct Exporter {
    stats: Arc<Stats>,
    control: Arc<Control>,
    url: String,
    thread: std::thread::JoinHandle<()>,
}

impl Exporter {
    /// A builder of an exporter of the closed requests of the region file
    /// at `region`.
    pub fn builder(region: impl Into<PathBuf>) -> ExporterBuilder {
        ExporterBuilder {
            region: region.into(),
            endpoint: None,
            overrides: Overrides::default(),
            env: Box::new(|k| std::env::var(k).ok()),
            allow_foreign_owner: false,
            run_for: None,
        }
    }

    /// The traces URL it posts to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The counters, for `/metrics`.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// A handle that stops the exporter, from any thread (a program's
    /// signal handler, say).
    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.control))
    }

    /// Whether the exporter's thread has ended (stopped, or at the end of
    /// [`ExporterBuilder::run_for`]): [`Exporter::join`] then returns at
    /// once.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits until the exporter has stopped (after its run, or a stop,
    /// having sent what it could). False if its thread panicked.
    pub fn join(self) -> bool {
        self.thread.join().is_ok()
    }
}

/// Stops an [`Exporter`]: it stops taking closed requests, sends what it
/// holds for at most [`FLUSH_DEADLINE`], and leaves the rest taken in the
/// ring in its name, where the next exporter on the region adopts it.
#[derive(Clone, Debug)]
pub struct Stopper(Arc<Control>);

impl Stopper {
    /// Asks the exporter to stop, and returns at once. A second call, or a
    /// call after it stopped, changes nothing.
    pub fn stop(&self) {
        self.0.stop.notify_one();
    }

    /// Waits until the exporter has stopped.
    pub fn wait(&self) {
        let mut done = self.0.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = self.0.ended.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Runs the exporter until its deadline or a stop.
async fn run(
    config: Arc<Config>,
    follower: RingFollower,
    stats: &Stats,
    deadline: Option<Instant>,
    control: &Control,
) {
    let shared = Shared::new();
    let watch = async {
        control.stop.notified().await;
        shared.stop(Instant::now() + FLUSH_DEADLINE);
        std::future::pending::<()>().await
    };
    let work = async {
        tokio::join!(
            drain::drain_loop(&config, follower, stats, &shared, deadline),
            send::send_loop(&config, stats, &shared),
        );
    };
    tokio::select! {
        _ = work => {}
        _ = watch => {}
    }
    // What the sender could not send by the deadline stays taken in the
    // ring: the next exporter on the region adopts it.
    let left: Vec<Queued> = shared.queue.borrow_mut().requests.drain(..).collect();
    if !left.is_empty() {
        let held = left.iter().filter(|q| q.reader.holds(q.claim)).count();
        log::warn!(
            "{} closed requests not sent by the deadline: {held} left in the ring \
             for the next exporter on it, {} already overwritten there (lost, counted in the \
             region's closed_overwritten_taken)",
            left.len(),
            left.len() - held
        );
        stats.update(|c| c.left_unsent += left.len() as u64);
    }
}
