//! The command line: the `edgemark` command and its subcommands, as clap
//! parses them. What each one does is in `run.rs`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use edgemark::Edge;

use crate::demo::DemoOptions;
use crate::ops::{self, LookTrust, RecordArgs, StartArgs, TokenArg, Trust};

/// A shared-memory recorder of first-event timestamps for pipeline stage
/// edges.
#[derive(Parser, Debug)]
#[command(name = "edgemark", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a simulated three-stage pipeline (0:1, 1:2) of real worker
    /// processes recording into one region, and print the latency of
    /// each boundary and each delta between them.
    Demo {
        #[command(flatten)]
        options: DemoOptions,
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
    /// --otlp send each closed request as OpenTelemetry spans; with --dir,
    /// of every region file in a directory.
    Export {
        /// The region file (or --dir).
        #[arg(required_unless_present = "dir", conflicts_with = "dir")]
        path: Option<PathBuf>,
        /// Follow every region file in DIR instead of one: each is served
        /// on /metrics under a region label naming its file and, with
        /// --otlp, exported from when it appears; a removed one is let go
        /// once its exporter has sent what it holds.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// With --dir, the file names followed (* and ?) [default: *.region].
        #[arg(long = "match", value_name = "PATTERN", requires = "dir")]
        pattern: Option<String>,
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
