//! `edgemark top`: a live terminal view of a region.
//!
//! Per edge, the p50/p95/p99 of each boundary and each delta over the
//! requests closed since `top` started (the region's histograms now, less the
//! histograms read at start), with the distribution over the histogram's
//! buckets; rates of closed, begun and refused records between refreshes;
//! occupancy; and every open request, oldest first.
//!
//! Before every sweep the region is checked (its mapping's length, the
//! file's length, and its header through a fresh attach); when a check fails
//! the terminal is restored and the error returned, for the caller to print
//! as one line.

use std::collections::HashMap;
use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use edgemark::report::{Counters, EdgeHistogram, Histogram, RegionInfo};
use edgemark::schema::{DomainId, EventId};
use edgemark::{AttachOptions, Outcome, Token, Viewer};
use ratatui::DefaultTerminal;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Text};
use ratatui::widgets::{Block, LineGauge, Paragraph, Row, Table};

use super::data::{quantile, short_event, short_metric, since};

/// Runs `edgemark top` on the region at `path` (already attached as `rec`)
/// until `q`, Esc or Ctrl-C, refreshing every `interval` seconds.
pub(crate) fn run(rec: Viewer, path: &Path, interval: f64) -> Result<()> {
    if !(interval.is_finite() && (0.05..=3600.0).contains(&interval)) {
        bail!("--interval must be a number of seconds from 0.05 to 3600");
    }
    if !io::stdout().is_terminal() {
        bail!(
            "top draws on a terminal; for a pipe or a file use `edgemark watch` or `edgemark inspect`"
        );
    }
    let interval = Duration::from_secs_f64(interval);
    let mut top = Top::new(rec, path, interval)?;
    // Raw mode, the alternate screen, and a panic hook that restores both
    // before the panic is reported.
    let mut term = ratatui::try_init()
        .inspect_err(|_| {
            // Undo whatever step succeeded.
            let _ = ratatui::try_restore();
        })
        .context("cannot draw on this terminal")?;
    let result = top.run(&mut term, interval);
    // Leave the alternate screen before the caller prints any error (the
    // terminal shows its cursor again as it is dropped).
    drop(term);
    let restored = ratatui::try_restore().context("cannot restore the terminal");
    result.and(restored)
}

/// One open request as the table shows it.
#[derive(Debug)]
struct OpenRow {
    token: Token,
    /// Time since this view first saw it, or its latest shared-clock event
    /// if later: a lower bound of its age.
    age: Duration,
    /// It was open before the view started, so its age is at least `age`.
    at_least: bool,
    /// Declared edges with at least one event.
    reached: usize,
    /// Per declared edge, its newest segment, if it has one.
    edges: Vec<Option<EdgeCells>>,
    corrupt: bool,
}

/// The newest segment of one edge of an open request: its index and each
/// event's value in milliseconds, with whether it is in another clock domain
/// than the shared clock.
type EdgeCells = (u32, Vec<Option<(f64, bool)>>);

/// Rates between the last two refreshes, per second.
#[derive(Debug, Default)]
struct Rates {
    begun: f64,
    closed: f64,
    reclaimed: f64,
    /// Each counted refusal: its rate and its count since the view started.
    refused: Vec<(Outcome, f64, u64)>,
}

#[derive(Debug)]
struct Top {
    rec: Viewer,
    path: PathBuf,
    info: RegionInfo,
    events: Vec<String>,
    started: Instant,
    hist_start: Vec<EdgeHistogram>,
    /// (edge, metric label, closed since start) per region histogram.
    latency: Vec<(String, String, Histogram)>,
    counters_start: Counters,
    last: Option<(Instant, Counters, usize)>,
    rates: Rates,
    first_seen: HashMap<Token, (Instant, bool)>,
    open: Vec<OpenRow>,
    refreshes: u64,
    /// Time between refreshes.
    interval: Duration,
    /// The first open request shown, and how many rows fit (possibly none).
    scroll: usize,
    page: usize,
}

impl Top {
    fn new(rec: Viewer, path: &Path, interval: Duration) -> Result<Top> {
        let info = rec
            .info()
            .ok_or_else(|| anyhow!("the recorder is disabled"))?;
        let events = rec
            .schema()
            .map(|s| s.events().iter().map(|e| e.name().to_owned()).collect())
            .unwrap_or_default();
        let mut top = Top {
            path: path.to_owned(),
            info,
            events,
            started: Instant::now(),
            hist_start: Vec::new(),
            latency: Vec::new(),
            counters_start: Counters::default(),
            last: None,
            rates: Rates::default(),
            first_seen: HashMap::new(),
            open: Vec::new(),
            refreshes: 0,
            interval,
            scroll: 0,
            page: 1,
            rec,
        };
        top.verify()?;
        // "Since start": later reads are taken less these.
        top.hist_start = top.read_histograms()?;
        top.counters_start = top.rec.counters();
        Ok(top)
    }

    /// The region's histograms, or why they cannot be read.
    fn read_histograms(&self) -> Result<Vec<edgemark::report::EdgeHistogram>> {
        self.rec.histograms().map_err(|e| {
            anyhow!(
                "{}: the region changed under this process: {e}",
                self.path.display()
            )
        })
    }

    /// Whether the region is still whole and still the one attached: the
    /// mapping's length, the file's length, and its header, validated by a
    /// fresh attach.
    fn verify(&self) -> Result<()> {
        let p = self.path.display();
        self.rec
            .check()
            .map_err(|e| anyhow!("{p}: the region changed under this process: {e}"))?;
        let len = std::fs::metadata(&self.path)
            .map_err(|e| anyhow!("{p}: the region file is gone: {e}"))?
            .len();
        if len != self.info.bytes {
            bail!(
                "{p}: the region file is now {len} bytes, not {}",
                self.info.bytes
            );
        }
        // Only to compare the header: read-only, and the file was already
        // trusted when it was attached.
        let again = AttachOptions::new()
            .allow_foreign_clock(true)
            .allow_foreign_owner(true)
            .view(&self.path)
            .map_err(|e| anyhow!("{p}: the region is no longer valid: {e}"))?;
        if again.info().map(|i| i.region_id) != Some(self.info.region_id) {
            bail!("{p}: another region replaced the one shown");
        }
        Ok(())
    }

    fn refresh(&mut self) -> Result<()> {
        self.verify()?;
        let now = Instant::now();
        self.refreshes += 1;

        let hists = self.read_histograms()?;
        self.latency = hists
            .iter()
            .map(|h| {
                let start = self
                    .hist_start
                    .iter()
                    .find(|s| s.edge == h.edge && s.metric == h.metric);
                let closed = match start {
                    Some(s) => since(&h.histogram, &s.histogram),
                    None => h.histogram.clone(),
                };
                (h.edge.to_string(), short_metric(h), closed)
            })
            .collect();

        let edges = self.rec.edges().to_vec();
        let n_events = self.events.len();
        let shared = self.info.shares_clock;
        let first_refresh = self.refreshes == 1;
        let mut seen_now = HashMap::with_capacity(self.first_seen.len());
        let mut open = Vec::new();
        self.rec
            .for_each_open(|token, snap| {
                let (first, at_least) =
                    *self.first_seen.get(&token).unwrap_or(&(now, first_refresh));
                seen_now.insert(token, (first, at_least));
                let mut latest_ms = 0.0f64;
                let per_edge: Vec<_> = edges
                    .iter()
                    .map(|edge| {
                        let seg = snap
                            .segments()
                            .iter()
                            .filter(|s| s.edge() == *edge)
                            .max_by_key(|s| s.segment_index())?;
                        let values = (0..n_events)
                            .map(|i| {
                                let o = seg.get(EventId(i as u8))?;
                                let foreign = o.domain != DomainId::HOST_MONOTONIC;
                                if !foreign && shared {
                                    latest_ms = latest_ms.max(o.elapsed_ms());
                                }
                                Some((o.elapsed_ms(), foreign))
                            })
                            .collect();
                        Some((seg.segment_index(), values))
                    })
                    .collect();
                let age = now
                    .duration_since(first)
                    .max(Duration::from_secs_f64(latest_ms / 1000.0));
                open.push(OpenRow {
                    token,
                    age,
                    at_least,
                    reached: per_edge.iter().filter(|e| e.is_some()).count(),
                    edges: per_edge,
                    corrupt: snap.is_corrupt(),
                });
            })
            .map_err(|e| {
                anyhow!(
                    "{}: the region changed under this process: {e}",
                    self.path.display()
                )
            })?;
        open.sort_by_key(|r| std::cmp::Reverse(r.age));
        self.first_seen = seen_now;

        let counters = self.rec.counters();
        if let Some((at, before, open_before)) = &self.last {
            let dt = now.duration_since(*at).as_secs_f64().max(1e-3);
            let d = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            let closed = d(counters.closed_requests, before.closed_requests);
            let reclaimed = d(counters.reclaimed_requests, before.reclaimed_requests);
            // The region counts no begins: a begun request is open now, or
            // was closed or reclaimed since.
            let grew = (open.len() as f64 - *open_before as f64) / dt;
            self.rates = Rates {
                begun: (closed + reclaimed + grew).max(0.0),
                closed,
                reclaimed,
                refused: counters
                    .refused
                    .iter()
                    .map(|(o, n)| {
                        let was = |c: &Counters| {
                            c.refused
                                .iter()
                                .find(|(x, _)| x == o)
                                .map_or(0, |(_, n)| *n)
                        };
                        (
                            *o,
                            d(*n, was(before)),
                            n.saturating_sub(was(&self.counters_start)),
                        )
                    })
                    .collect(),
            };
        }
        self.last = Some((now, counters, open.len()));
        self.open = open;
        self.scroll = self
            .scroll
            .min(self.open.len().saturating_sub(self.page.max(1)));
        Ok(())
    }

    /// Refreshes, sizes the view to the terminal and draws it from this
    /// state, then takes keys, until one says to quit.
    fn run(&mut self, term: &mut DefaultTerminal, interval: Duration) -> Result<()> {
        term.clear()?;
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                self.refresh()?;
                next = Instant::now() + interval;
            }
            let size = term.size()?;
            self.fit(Rect::new(0, 0, size.width, size.height));
            term.draw(|f| self.draw(f))?;
            let wait = next.saturating_duration_since(Instant::now());
            if !event::poll(wait)? {
                continue;
            }
            if let TermEvent::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                let page = self.page.max(1);
                let max = self.open.len().saturating_sub(page);
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Up => self.scroll = self.scroll.saturating_sub(1),
                    KeyCode::Down => self.scroll = (self.scroll + 1).min(max),
                    KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(page),
                    KeyCode::PageDown => self.scroll = (self.scroll + page).min(max),
                    KeyCode::Home => self.scroll = 0,
                    KeyCode::End => self.scroll = max,
                    _ => {}
                }
            }
        }
    }

    /// The view's areas in `area`: the header, the occupancy gauge, the
    /// latency table and the open requests.
    fn areas(&self, area: Rect) -> [Rect; 4] {
        let metrics_per_edge = (2 * self.events.len()).saturating_sub(1).max(1);
        let latency_rows = (self.rec.edges().len() * metrics_per_edge) as u16;
        // The header and the gauge take five lines; the open requests keep
        // room for a few rows (borders and two header lines take four), and
        // the latency table, whose title then says how many of its rows it
        // shows, gets the rest.
        let below = area.height.saturating_sub(5);
        let open_rows = (self.open.len() as u16).clamp(1, 3);
        let latency_height = (latency_rows + 3).min(below.saturating_sub(4 + open_rows));
        Layout::vertical([
            Constraint::Length(4),
            Constraint::Length(1),
            Constraint::Length(latency_height),
            Constraint::Fill(1),
        ])
        .areas(area)
    }

    /// Sizes the page of open requests to a terminal of `area` and keeps
    /// the scroll within the list: the state the next draw shows, and the
    /// step of the page keys.
    fn fit(&mut self, area: Rect) {
        let [.., open] = self.areas(area);
        self.page = page_rows(open);
        self.scroll = self
            .scroll
            .min(self.open.len().saturating_sub(self.page.max(1)));
    }

    /// Draws the view from the state as it is (see [`Top::fit`]).
    fn draw(&self, f: &mut Frame<'_>) {
        let [head, gauge, latency, open] = self.areas(f.area());
        self.draw_head(f, head);
        let occupied = self.open.len() as f64 / f64::from(self.info.slots.max(1));
        f.render_widget(
            LineGauge::default()
                .label(format!(
                    "occupancy {}/{} slots",
                    self.open.len(),
                    self.info.slots
                ))
                .ratio(occupied.clamp(0.0, 1.0))
                .filled_style(Style::new().cyan()),
            gauge,
        );
        self.draw_latency(f, latency);
        self.draw_open(f, open);
    }

    fn draw_head(&self, f: &mut Frame<'_>, area: Rect) {
        let r = &self.rates;
        let mut refused: Vec<String> = r
            .refused
            .iter()
            .filter(|(_, rate, total)| *rate > 0.0 || *total > 0)
            .map(|(o, rate, total)| format!("{o} {rate:.1}/s ({total})"))
            .collect();
        if refused.is_empty() {
            refused.push("none".to_owned());
        }
        let lines = vec![
            Line::from(vec![
                "edgemark top ".bold(),
                format!(
                    "{}  region {}  {} edges  up {:.0} s  refreshed every {} s",
                    self.path.display(),
                    self.info.region_id,
                    self.rec.edges().len(),
                    self.started.elapsed().as_secs_f64(),
                    self.interval.as_secs_f64()
                )
                .into(),
            ]),
            Line::from(format!(
                "per second: begun {:.1}  closed {:.1}  reclaimed {:.1}",
                r.begun, r.closed, r.reclaimed
            )),
            Line::from(format!(
                "refused per second (since start): {}",
                refused.join(", ")
            )),
            Line::from("q quit   Up/Down PgUp/PgDn scroll the open requests".dim()),
        ];
        f.render_widget(Paragraph::new(lines), area);
    }

    fn draw_latency(&self, f: &mut Frame<'_>, area: Rect) {
        let ms = |v: Option<f64>| match v {
            None => "-".to_owned(),
            Some(x) if x.is_infinite() => format!(">{}", edgemark::report::BUCKETS_MS[14]),
            Some(x) => format!("{x:.2}"),
        };
        // Every column as wide as its widest entry, so that no label is cut
        // (two labels cut to one width can read the same); the bars only
        // where the terminal has room for all of them.
        let text_width = |texts: &mut dyn Iterator<Item = usize>, header: &str| {
            texts.max().unwrap_or(0).max(header.chars().count()) as u16
        };
        let edge_w = text_width(&mut self.latency.iter().map(|(e, _, _)| e.len()), "edge");
        let metric_w = text_width(
            &mut self.latency.iter().map(|(_, m, _)| m.chars().count()),
            "boundary / delta",
        );
        let bars_w = (edgemark::report::BUCKETS_MS.len() + 1).max("per bucket".len()) as u16;
        let fixed = 2 + edge_w + 1 + metric_w + 1 + 7 + 3 * (1 + 9);
        let bars = area.width >= fixed + 1 + bars_w;
        let rows = self.latency.iter().map(|(edge, metric, h)| {
            let mut cells = vec![
                edge.clone(),
                metric.clone(),
                h.count.to_string(),
                ms(quantile(h, 0.50)),
                ms(quantile(h, 0.95)),
                ms(quantile(h, 0.99)),
            ];
            if bars {
                cells.push(spark(&h.buckets));
            }
            Row::new(cells)
        });
        let mut header = vec!["edge", "boundary / delta", "closed", "p50", "p95", "p99"];
        let mut widths = vec![
            Constraint::Length(edge_w),
            Constraint::Length(metric_w),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
        ];
        if bars {
            header.push("per bucket");
            widths.push(Constraint::Length(bars_w));
        }
        let header = Row::new(header).style(Style::new().add_modifier(Modifier::BOLD));
        // Borders and the header line take three lines.
        let fit = usize::from(area.height.saturating_sub(3));
        let mut title = String::from(" latency ms of requests closed since top started");
        if bars {
            title.push_str(" (bars: buckets 0.5 ms .. 30 s)");
        }
        if fit < self.latency.len() {
            title.push_str(&format!(
                "; {fit} of {} rows (a taller terminal shows all)",
                self.latency.len()
            ));
        }
        title.push(' ');
        let table = Table::new(rows, widths)
            .header(header)
            .block(Block::bordered().title(title));
        f.render_widget(table, area);
    }

    fn draw_open(&self, f: &mut Frame<'_>, area: Rect) {
        // `fit` sized the page to this area; a terminal resized since gets
        // the rows that fit now.
        let page = page_rows(area);
        let scroll = self.scroll.min(self.open.len().saturating_sub(page.max(1)));
        let edges = self.rec.edges();
        let shown: Vec<&OpenRow> = self.open.iter().skip(scroll).take(page).collect();
        // Columns as wide as what they hold; as many edges as fit.
        let token_w = shown
            .iter()
            .map(|r| r.token.to_string().len() + if r.corrupt { 8 } else { 0 })
            .max()
            .unwrap_or(0)
            .max("token".len()) as u16;
        let segment_mark = shown
            .iter()
            .any(|r| r.edges.iter().flatten().any(|(segment, _)| *segment > 0));
        let n_events = self.events.len().max(1) as u16;
        let cell_w = 9 * n_events - 1 + if segment_mark { 4 } else { 0 };
        let fixed = 2 + token_w + 1 + 8 + 1 + 5;
        let fit_edges =
            usize::from(area.width.saturating_sub(fixed) / (cell_w + 1)).min(edges.len());
        // Two header lines: the edge, then each event's short name over its
        // column of values.
        let names: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                let short = short_event(e);
                let word = short.rsplit(' ').next().unwrap_or(short);
                format!("{:>8}", word.chars().take(8).collect::<String>())
            })
            .collect();
        let mut header: Vec<Text<'_>> = ["token", "age", "edges"]
            .into_iter()
            .map(|h| Text::from(vec![Line::from(h), Line::from("")]))
            .collect();
        header.extend(edges.iter().take(fit_edges).map(|e| {
            Text::from(vec![
                Line::from(format!("edge {e} (ms from start)")),
                Line::from(names.join(" ")),
            ])
        }));
        let mut widths = vec![
            Constraint::Length(token_w),
            Constraint::Length(8),
            Constraint::Length(5),
        ];
        widths.extend((0..fit_edges).map(|_| Constraint::Length(cell_w)));
        let rows = shown.iter().map(|r| {
            let mut cells = vec![
                if r.corrupt {
                    format!("{} corrupt", r.token)
                } else {
                    r.token.to_string()
                },
                format!(
                    "{}{:.1}s",
                    if r.at_least { ">=" } else { "" },
                    r.age.as_secs_f64()
                ),
                format!("{}/{}", r.reached, edges.len()),
            ];
            cells.extend(r.edges.iter().take(fit_edges).map(|e| {
                match e {
                    None => vec!["-"; self.events.len()]
                        .iter()
                        .map(|d| format!("{d:>8}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    Some((segment, values)) => {
                        let mut s = values
                            .iter()
                            .map(|v| match v {
                                None => format!("{:>8}", "-"),
                                Some((ms, foreign)) => {
                                    format!(
                                        "{:>8}",
                                        format!("{ms:.1}{}", if *foreign { "*" } else { "" })
                                    )
                                }
                            })
                            .collect::<Vec<_>>()
                            .join(" ");
                        if *segment > 0 {
                            s.push_str(&format!(" s{segment}"));
                        }
                        s
                    }
                }
            }));
            Row::new(cells)
        });
        let mut title = if self.open.is_empty() {
            " open requests: none".to_owned()
        } else if shown.is_empty() {
            format!(
                " open requests: {}, no room to list them (a taller terminal shows them)",
                self.open.len()
            )
        } else {
            format!(
                " open requests, oldest first: {}-{} of {}",
                scroll + 1,
                scroll + shown.len(),
                self.open.len()
            )
        };
        if fit_edges < edges.len() {
            title.push_str(&format!(
                "; {} of {} edges (wider shows all)",
                fit_edges,
                edges.len()
            ));
        }
        title.push_str(" (* another clock domain; sN segment N) ");
        let table = Table::new(rows, widths)
            .header(
                Row::new(header)
                    .height(2)
                    .style(Style::new().add_modifier(Modifier::BOLD)),
            )
            .block(Block::bordered().title(title));
        f.render_widget(table, area);
    }
}

/// The rows of open requests that an area of the open-requests table
/// holds: borders and the two header lines take four lines, and what is
/// left may be no row at all.
fn page_rows(area: Rect) -> usize {
    usize::from(area.height.saturating_sub(4))
}

/// The distribution over histogram buckets as one block character per
/// bucket, scaled to the fullest; a dot for an empty bucket.
fn spark(buckets: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = buckets.iter().copied().max().unwrap_or(0);
    buckets
        .iter()
        .map(|&n| {
            if n == 0 || max == 0 {
                '·'
            } else {
                let i = ((n as f64 / max as f64) * 8.0).ceil() as usize;
                BARS[i.clamp(1, 8) - 1]
            }
        })
        .collect()
}
