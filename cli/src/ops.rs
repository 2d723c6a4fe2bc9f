//! The commands on one region that both the command line and `batch` take,
//! with one grammar: `batch` parses each line with the same clap
//! definitions, the region's path left out.

use std::io::{BufRead, Write};

use anyhow::{Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use edgemark::{AttachOptions, Edge, Mark, Recorder, RequestState, Token, Viewer};

/// How far to trust the region file; taken by every command that attaches
/// to one.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct Trust {
    /// Use a region file that another user owns (refused by default).
    ///
    /// Whoever owns the file can change it under this process, so a file of
    /// another user is refused unless this is given. Give it only for a file
    /// created by a user you trust, for example a service account that
    /// shares the region with your group (`create --group-access`).
    #[arg(long)]
    pub(crate) allow_foreign_owner: bool,
}

impl Trust {
    /// Attach options for recording and control operations.
    pub(crate) fn options(self) -> AttachOptions {
        AttachOptions::new().allow_foreign_owner(self.allow_foreign_owner)
    }
}

/// The trust option of the commands that only look (`inspect`, `watch`,
/// `top`, `export`, `snapshot`): they attach read-only and accept a file of
/// another user without it, since they cannot write it; the option is
/// still accepted, hidden, so that scripts that pass it keep working.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct LookTrust {
    /// Accepted and not needed: this command only reads the region.
    #[arg(long, hide = true)]
    pub(crate) allow_foreign_owner: bool,
}

/// `record`'s arguments after the region's path.
#[derive(Args, Debug, Clone)]
pub(crate) struct RecordArgs {
    /// The request's token (printed by `begin`).
    pub(crate) token: Token,
    /// The edge: FROM:TO (0:1), or 'FROM->TO' quoted for the shell ('0->1').
    #[arg(value_parser = parse_edge, value_name = "EDGE")]
    pub(crate) edge: Edge,
    /// The event's name, for example producer_first_nonempty_emit.
    pub(crate) event: String,
    /// The segment index.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) segment: u32,
    /// The payload's chunk sequence number (kept by the producer event).
    #[arg(long, alias = "chunk", value_name = "N")]
    pub(crate) chunk_seq: Option<u64>,
    /// The payload was not meaningful (empty, a heartbeat, a retry): it
    /// records nothing.
    #[arg(long, alias = "empty")]
    pub(crate) not_meaningful: bool,
    /// Elapsed milliseconds measured elsewhere, instead of reading the clock.
    #[arg(
        long,
        requires = "domain",
        value_name = "MS",
        allow_negative_numbers = true
    )]
    pub(crate) elapsed_ms: Option<f64>,
    /// The clock domain of --elapsed-ms.
    #[arg(long, requires = "elapsed_ms", value_name = "NAME")]
    pub(crate) domain: Option<String>,
}

/// `start-segment`'s arguments after the region's path.
#[derive(Args, Debug, Clone)]
pub(crate) struct StartArgs {
    /// The request's token.
    pub(crate) token: Token,
    /// The edge: FROM:TO (0:1), or 'FROM->TO' quoted for the shell ('0->1').
    #[arg(value_parser = parse_edge, value_name = "EDGE")]
    pub(crate) edge: Edge,
    /// The new segment index.
    pub(crate) segment: u32,
}

/// A request's token, the one argument after the region's path.
#[derive(Args, Debug, Clone)]
pub(crate) struct TokenArg {
    /// The request's token.
    pub(crate) token: Token,
}

/// `begin`'s arguments after the region's path.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct BeginArgs {
    /// The W3C trace context the request runs under (a traceparent value,
    /// 00-<32 hex>-<16 hex>-<2 hex>): the caller's span, or what
    /// `edgemark traceparent` printed for the request's part on another
    /// host. Without it the request starts a new trace.
    #[arg(long, value_name = "TRACEPARENT")]
    pub(crate) traceparent: Option<edgemark::TraceContext>,
}

/// One operation on a region.
#[derive(Subcommand, Debug, Clone)]
pub(crate) enum Op {
    /// Begin a request and print its token.
    Begin(BeginArgs),
    /// Print the traceparent to hand a request's part on another host: the
    /// request's trace, with its own span as the parent.
    Traceparent(TokenArg),
    /// Record one event and print the outcome.
    Record(RecordArgs),
    /// Start a new segment on an edge of a request and print the outcome.
    #[command(alias = "start")]
    StartSegment(StartArgs),
    /// Print a request's snapshot as JSON.
    Snapshot(TokenArg),
    /// Close a request and print its final snapshot as JSON.
    Close(TokenArg),
}

/// One line of `batch`: an [`Op`] without the region's path.
#[derive(Parser, Debug)]
#[command(
    name = "batch",
    no_binary_name = true,
    disable_help_flag = true,
    disable_help_subcommand = true,
    disable_version_flag = true
)]
struct BatchLine {
    #[command(subcommand)]
    op: Op,
}

/// A count given to an option (`--slots`, `--requests`, ...): a whole
/// number, with a message that says what is wrong with a negative one (clap
/// alone would take `-1` for an option).
pub(crate) fn parse_count<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    let t = s.trim();
    if let Some(rest) = t.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        return Err("a count cannot be negative".to_owned());
    }
    t.parse::<T>().map_err(|_| {
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            "too large".to_owned()
        } else {
            "not a whole number".to_owned()
        }
    })
}

/// An edge written `FROM->TO` or `FROM:TO`.
pub(crate) fn parse_edge(s: &str) -> Result<Edge, String> {
    let (a, b) = s
        .split_once("->")
        .or_else(|| s.split_once(':'))
        .ok_or_else(|| format!("{s:?} is not an edge FROM:TO or FROM->TO"))?;
    let n = |x: &str| {
        x.trim()
            .parse::<u32>()
            .map_err(|_| format!("{x:?} is not a stage number"))
    };
    Ok(Edge::new(n(a)?, n(b)?))
}

fn event_id(rec: &Recorder, name: &str) -> Result<edgemark::schema::EventId> {
    rec.event(name)
        .ok_or_else(|| anyhow!("the region's schema has no event {name:?}"))
}

/// Runs `op` on `rec`; returns the line to print. A `begin` that finds no
/// free slot answers `refused <outcome>` in a batch and fails on the
/// command line (`in_batch`).
pub(crate) fn run(rec: &Recorder, op: Op, in_batch: bool) -> Result<String> {
    Ok(match op {
        Op::Traceparent(a) => traceparent(rec, a.token)?,
        Op::Begin(a) => match rec.begin_traced(a.traceparent) {
            Ok(t) => t.to_string(),
            Err(o) if in_batch => format!("refused {o}"),
            Err(o) => bail!("no request begun: {o}"),
        },
        Op::Record(a) => {
            let mut mark = Mark::new(a.edge, event_id(rec, &a.event)?)
                .segment(a.segment)
                .meaningful(!a.not_meaningful);
            if let Some(c) = a.chunk_seq {
                mark = mark.chunk_seq(c);
            }
            match (a.elapsed_ms, a.domain) {
                (Some(ms), Some(d)) => rec.record_elapsed(a.token, mark, ms, &d),
                _ => rec.record(a.token, mark),
            }
            .to_string()
        }
        Op::StartSegment(a) => rec.start_segment(a.token, a.edge, a.segment).to_string(),
        Op::Snapshot(a) => snapshot(rec, a.token)?,
        Op::Close(a) => {
            let last = rec.close(a.token);
            match last.state() {
                RequestState::Busy => bail!(
                    "request {} is busy: another control operation holds it; close it again",
                    a.token
                ),
                // The library's close is idempotent and says only "gone";
                // a person closing by hand is told which mistake it was.
                RequestState::Gone => {
                    let here = rec.info().map(|i| i.region_id).unwrap_or_default();
                    if a.token.region_id() != here {
                        bail!(
                            "foreign region: token {} is of region {}, and this is region {here}",
                            a.token,
                            a.token.region_id()
                        );
                    }
                    bail!(
                        "request {} is not open: it was closed already (or reclaimed, and its slot reused)",
                        a.token
                    );
                }
                RequestState::Faulted => bail!(
                    "request {} was not closed: this process lost a page of the region (the file shrank or its file system is full); its values stay in the file",
                    a.token
                ),
                RequestState::Open | RequestState::Closed => serde_json::to_string(&last)?,
            }
        }
    })
}

/// The snapshot of the request `token` as a JSON line (`snapshot` needs
/// only a viewer).
pub(crate) fn snapshot(view: &Viewer, token: Token) -> Result<String> {
    Ok(serde_json::to_string(&view.snapshot(token))?)
}

/// The traceparent to hand a request's part on another host, for a viewer
/// (`edgemark traceparent` only reads).
pub(crate) fn traceparent(view: &Viewer, token: Token) -> Result<String> {
    match view.trace_context(token) {
        Some(c) => Ok(c.to_string()),
        None => bail!("request {token} is not open"),
    }
}

/// Runs one command per line of `input`, writing one line per command to
/// `out`: the command's output, or `error <reason>` for a line that is not
/// UTF-8, does not parse or fails. Stops at the end of the input, or when
/// `out` fails (a [`StdoutError`](crate::out::StdoutError)).
pub(crate) fn batch(rec: &Recorder, input: &mut impl BufRead, out: &mut impl Write) -> Result<()> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let reply = batch_line(rec, &line).unwrap_or_else(|e| format!("error {e:#}"));
        writeln!(out, "{reply}")
            .and_then(|()| out.flush())
            .map_err(crate::out::StdoutError)?;
    }
}

/// `help` in a batch: every command with its arguments, on one line (a
/// batch answers each line with one line), from the same clap definitions
/// that parse them.
fn help_line() -> String {
    use clap::CommandFactory;
    let cmd = BatchLine::command();
    let mut commands: Vec<String> = cmd
        .get_subcommands()
        .map(|sub| {
            let mut parts = vec![sub.get_name().to_owned()];
            for arg in sub.get_arguments() {
                let value = || {
                    arg.get_value_names()
                        .and_then(|v| v.first())
                        .map_or_else(|| arg.get_id().as_str().to_uppercase(), |v| v.to_string())
                };
                if arg.is_positional() {
                    parts.push(value());
                } else if let Some(long) = arg.get_long() {
                    let takes = arg.get_action().takes_values();
                    parts.push(if takes {
                        format!("[--{long} {}]", value())
                    } else {
                        format!("[--{long}]")
                    });
                }
            }
            parts.join(" ")
        })
        .collect();
    commands.push("help".to_owned());
    format!("commands: {}", commands.join(" | "))
}

fn batch_line(rec: &Recorder, line: &[u8]) -> Result<String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).map_err(|e| {
        anyhow!(
            "the line is not UTF-8 (byte {} is invalid)",
            e.valid_up_to()
        )
    })?;
    let words = shlex::split(line).ok_or_else(|| anyhow!("unbalanced quotes"))?;
    if words.is_empty() {
        bail!("empty line");
    }
    if words[0] == "help" {
        return Ok(help_line());
    }
    let parsed = BatchLine::try_parse_from(&words).map_err(|e| {
        // clap's message on one line, without its "error: ", usage or tip.
        let text = e.to_string();
        let message: Vec<&str> = text
            .lines()
            .map(str::trim)
            .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
            .collect();
        let message = message.join(" ");
        anyhow!("{}", message.strip_prefix("error: ").unwrap_or(&message))
    })?;
    run(rec, parsed.op, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_edge_forms_parse_and_others_are_refused() {
        assert_eq!(parse_edge("0->1"), Ok(Edge::new(0, 1)));
        assert_eq!(parse_edge("1:2"), Ok(Edge::new(1, 2)));
        assert_eq!(parse_edge(" 3 -> 4 "), Ok(Edge::new(3, 4)));
        for bad in ["", "0", "0-1", "a:1", "0->", ":1", "0->1->2", "-1:2"] {
            assert!(parse_edge(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_batch_line_is_parsed_by_the_command_lines_definitions() {
        let words = [
            "record",
            "em1.0000000000000001.0.1",
            "0:1",
            "producer_first_nonempty_emit",
            "--chunk-seq",
            "5",
            "--not-meaningful",
            "--segment",
            "2",
        ];
        let Op::Record(a) = BatchLine::try_parse_from(words).unwrap().op else {
            panic!("not a record");
        };
        assert_eq!(a.edge, Edge::new(0, 1));
        assert_eq!(
            (a.chunk_seq, a.not_meaningful, a.segment),
            (Some(5), true, 2)
        );
        // The old spellings still parse.
        let old = [
            "record",
            "em1.0000000000000001.0.1",
            "0->1",
            "e",
            "--chunk",
            "5",
            "--empty",
        ];
        let Op::Record(a) = BatchLine::try_parse_from(old).unwrap().op else {
            panic!("not a record");
        };
        assert_eq!((a.chunk_seq, a.not_meaningful), (Some(5), true));
        assert!(matches!(
            BatchLine::try_parse_from(["start", "em1.0000000000000001.0.1", "0:1", "1"])
                .unwrap()
                .op,
            Op::StartSegment(_)
        ));
    }
}
