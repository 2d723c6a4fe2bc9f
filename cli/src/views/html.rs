//! The latency page (`demo --html`, `report --html`): one self-contained
//! HTML file, SVG drawn here, no network access needed to view it.
//!
//! It shows a waterfall of a typical request (the median total) and of the
//! slowest one, each event of each edge segment as a mark and each delta as
//! a bar on one time axis, and a histogram per edge of each event and each
//! delta between consecutive events (segment 0 of every request, as the
//! demo's table counts them). A waterfall's time axis is one clock domain:
//! events recorded in another domain have another origin and are listed
//! beside it as excluded, never drawn.
//!
//! Elements carry stable classes and data attributes (`svg.waterfall`,
//! `g.wf-row[data-request]`, `svg.hist`, `rect.bar[data-count]`) so that
//! tests and scripts can count what was drawn.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use edgemark::Snapshot;
use edgemark::schema::DomainId;

use super::data::{Collected, RequestRow, SegmentRow, percentile, short_event};

/// Bins of every histogram.
pub(crate) const BINS: usize = 20;

/// Writes the page for the demo's final snapshots, of a region whose
/// events are `events`, into `file`, opened at `path` before the run.
pub(crate) fn write_demo(
    events: &[String],
    finals: &[(Snapshot, bool)],
    path: &Path,
    mut file: std::fs::File,
) -> Result<()> {
    let mut c = Collected::with_events(events.to_vec());
    for (i, (snap, _)) in finals.iter().enumerate() {
        c.push_snapshot(i + 1, snap);
    }
    let text = page(&c, "edgemark demo (line numbers are the order of --json)");
    std::io::Write::write_all(&mut file, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Writes the page for snapshots collected as JSON lines in `input`.
pub(crate) fn write_report(input: &Path, file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("cannot read {}", input.display()))?;
    let c = Collected::from_lines(&text).with_context(|| input.display().to_string())?;
    if c.requests.is_empty() {
        bail!("{}: no snapshots in it", input.display());
    }
    write(&c, &input.display().to_string(), file)
}

fn write(c: &Collected, source: &str, file: &Path) -> Result<()> {
    std::fs::write(file, page(c, source))
        .with_context(|| format!("cannot write {}", file.display()))
}

/// Escapes text for HTML and SVG, in content and in quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Milliseconds as the page prints them.
fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A round step for about `target` ticks over `span`: 1, 2 or 5 times a
/// power of ten.
fn tick_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-6);
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let m = if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A tick's label with as many decimals as the step needs.
fn tick_label(t: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{t:.decimals$}")
}

/// The clock domain the waterfalls are drawn in: the shared clock (domain
/// 0) if any value is in it, else the domain with the most values (the
/// last seen of those that tie).
fn axis_domain(c: &Collected) -> DomainId {
    let mut counts = vec![0usize; c.domains.len()];
    for v in c
        .requests
        .iter()
        .flat_map(|r| &r.segments)
        .flat_map(|s| s.values.iter().flatten())
    {
        counts[usize::from(v.domain.0)] += 1;
    }
    if counts.first().is_some_and(|n| *n > 0) {
        return DomainId::HOST_MONOTONIC;
    }
    let most = counts
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .max_by_key(|(_, n)| **n)
        .map_or(0, |(i, _)| i);
    // `Collected::domains` holds at most 256 names.
    DomainId(most as u8)
}

/// A request's total in `domain`: its latest event there.
fn total(r: &RequestRow, domain: DomainId) -> Option<f64> {
    r.segments
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .filter(|v| v.domain == domain)
        .map(|v| v.elapsed_ms())
        .reduce(f64::max)
}

/// The typical (median total, nearest rank) and the slowest request in
/// `domain`, and how many requests have no event there.
fn pick(c: &Collected, domain: DomainId) -> (Vec<(&'static str, &RequestRow, f64)>, usize) {
    let mut ranked: Vec<(&RequestRow, f64)> = c
        .requests
        .iter()
        .filter_map(|r| Some((r, total(r, domain)?)))
        .collect();
    let left_out = c.requests.len() - ranked.len();
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.line.cmp(&b.0.line)));
    let mut out = Vec::new();
    if let Some(last) = ranked.last() {
        let mid = ranked[(ranked.len().div_ceil(2)).max(1) - 1];
        out.push(("typical", mid.0, mid.1));
        out.push(("slowest", last.0, last.1));
    }
    (out, left_out)
}

/// The edge segments of a request in declared-edge order, then segment.
fn ordered<'a>(c: &Collected, r: &'a RequestRow) -> Vec<&'a SegmentRow> {
    let mut segs: Vec<&SegmentRow> = r.segments.iter().collect();
    segs.sort_by_key(|s| (c.edges.iter().position(|e| *e == s.edge), s.segment));
    segs
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

fn waterfall(
    out: &mut String,
    c: &Collected,
    which: &str,
    r: &RequestRow,
    total_ms: f64,
    domain: DomainId,
) {
    let segs = ordered(c, r);
    let (left, width, row_h, top) = (130.0, 1240.0, 30.0, 10.0);
    let plot_w = width - left - 20.0;
    let step = tick_step(total_ms.max(1e-3), 10.0);
    let span = ((total_ms / step).ceil() * step).max(step);
    let x = |v: f64| left + v / span * plot_w;
    let height = top + row_h * segs.len() as f64 + 44.0;
    let _ = writeln!(
        out,
        r#"<svg class="chart waterfall" id="waterfall-{which}" data-request="{which}" data-line="{line}" data-domain="{d}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="waterfall of the {which} request">"#,
        line = r.line,
        d = esc(c.domain_name(domain)),
    );
    // The time axis: grid lines and labels.
    let mut t = 0.0;
    while t <= span + step / 2.0 {
        let _ = writeln!(
            out,
            r#"<line class="grid" x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{y2:.1}"/><text class="tick" x="{x:.1}" y="{ty:.1}" text-anchor="middle">{label}</text>"#,
            x = x(t),
            y2 = height - 34.0,
            ty = height - 20.0,
            label = tick_label(t, step),
        );
        t += step;
    }
    let _ = writeln!(
        out,
        r#"<text class="axis-label" x="{x:.1}" y="{y:.1}" text-anchor="middle">ms since the request began (clock domain {d})</text>"#,
        x = left + plot_w / 2.0,
        y = height - 6.0,
        d = esc(c.domain_name(domain)),
    );
    for (row, s) in segs.iter().enumerate() {
        let y = top + row_h * row as f64;
        let _ = writeln!(
            out,
            r#"<g class="wf-row" data-request="{which}" data-edge="{key}"><text class="row-label" x="{lx}" y="{ly:.1}" text-anchor="end">{key}</text>"#,
            key = esc(&s.key()),
            lx = left - 8.0,
            ly = y + row_h * 0.62,
        );
        // Deltas between consecutive events of the axis domain, as bars.
        for i in 0..s.values.len().saturating_sub(1) {
            let (Some(a), Some(b)) = (&s.values[i], &s.values[i + 1]) else {
                continue;
            };
            let Some(delta) = s.delta(i, i + 1).filter(|_| a.domain == domain) else {
                continue;
            };
            let (a, b) = (a.elapsed_ms(), b.elapsed_ms());
            let _ = writeln!(
                out,
                r#"<rect class="phase" data-phase="{i}" x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{h:.1}" fill="{fill}"><title>{key} {name}: {d} ms ({a} to {b})</title></rect>"#,
                x = x(a),
                y = y + row_h * 0.25,
                w = (x(b) - x(a)).max(1.0),
                h = row_h * 0.5,
                fill = COLORS[(i + 1) % COLORS.len()],
                key = esc(&s.key()),
                name = esc(&format!(
                    "{} -> {}",
                    short_event(&c.events[i]),
                    short_event(&c.events[i + 1])
                )),
                d = ms(delta),
                a = ms(a),
                b = ms(b),
            );
        }
        // Every event of the axis domain, as a mark.
        for (i, v) in s.values.iter().enumerate() {
            let Some(v) = v.as_ref().filter(|v| v.domain == domain) else {
                continue;
            };
            let _ = writeln!(
                out,
                r#"<line class="mark" data-event="{name}" x1="{x:.2}" y1="{y1:.1}" x2="{x:.2}" y2="{y2:.1}" stroke="{color}"><title>{key} {name}: {v} ms</title></line>"#,
                name = esc(short_event(&c.events[i])),
                x = x(v.elapsed_ms()),
                y1 = y + row_h * 0.1,
                y2 = y + row_h * 0.9,
                color = COLORS[i % COLORS.len()],
                key = esc(&s.key()),
                v = ms(v.elapsed_ms()),
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
}

/// The excluded events of a drawn request: those of another clock domain.
fn excluded(c: &Collected, which: &str, r: &RequestRow, domain: DomainId) -> Vec<String> {
    let mut out = Vec::new();
    for s in ordered(c, r) {
        for (i, v) in s.values.iter().enumerate() {
            if let Some(v) = v.as_ref().filter(|v| v.domain != domain) {
                out.push(format!(
                    r#"<li class="excluded-event" data-request="{which}">{key} {name} ({v} ms): recorded in clock domain <code>{d}</code>, whose origin is not that of <code>{axis}</code>, so it has no place on this axis</li>"#,
                    key = esc(&s.key()),
                    name = esc(short_event(&c.events[i])),
                    v = ms(v.elapsed_ms()),
                    d = esc(c.domain_name(v.domain)),
                    axis = esc(c.domain_name(domain)),
                ));
            }
        }
    }
    out
}

fn histogram(
    out: &mut String,
    edge: &str,
    metric: &str,
    values: &[f64],
    left_out: usize,
    domain: &str,
) {
    let (width, height, left, bottom, top) = (400.0, 220.0, 44.0, 34.0, 40.0);
    let plot_w = width - left - 12.0;
    let plot_h = height - bottom - top;
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p50 = percentile(&sorted, 50.0);
    let _ = writeln!(
        out,
        r#"<svg class="chart hist" data-edge="{e}" data-metric="{m}" data-values="{n}" data-left-out="{left_out}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="histogram of {m} on {e}">"#,
        e = esc(edge),
        m = esc(metric),
        n = values.len(),
    );
    let _ = writeln!(
        out,
        r#"<text class="hist-title" x="{left}" y="16">{e} {m}</text><text class="hist-sub" x="{left}" y="31">n={n}{p}</text>"#,
        e = esc(edge),
        m = esc(metric),
        n = values.len(),
        p = p50.map_or(String::new(), |p| format!(", p50 {} ms", ms(p))),
    );
    if left_out > 0 {
        let _ = writeln!(
            out,
            r#"<text class="hist-left-out" x="{x}" y="31" text-anchor="end">{left_out} not in {d}, left out</text>"#,
            x = width - 12.0,
            d = esc(domain),
        );
    }
    let base = top + plot_h;
    let _ = writeln!(
        out,
        r#"<line class="axis" x1="{left}" y1="{base}" x2="{x2}" y2="{base}"/>"#,
        x2 = left + plot_w,
    );
    let (Some(&lo), Some(&hi)) = (sorted.first(), sorted.last()) else {
        let _ = writeln!(
            out,
            r#"<text class="no-values" x="{x}" y="{y}" text-anchor="middle">no values (no request had both events in one clock domain, in order)</text></svg>"#,
            x = left + plot_w / 2.0,
            y = top + plot_h / 2.0,
        );
        return;
    };
    let (lo, hi) = if hi - lo < 1e-9 {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    };
    let w = (hi - lo) / BINS as f64;
    let mut counts = [0usize; BINS];
    for v in &sorted {
        let i = (((v - lo) / w).floor() as usize).min(BINS - 1);
        counts[i] += 1;
    }
    let most = counts.iter().copied().max().unwrap_or(1).max(1);
    let bar_w = plot_w / BINS as f64;
    for (i, n) in counts.iter().enumerate() {
        let h = plot_h * *n as f64 / most as f64;
        let (a, b) = (lo + w * i as f64, lo + w * (i + 1) as f64);
        let _ = writeln!(
            out,
            r#"<rect class="bar" data-count="{n}" data-lo="{a:.3}" data-hi="{b:.3}" x="{x:.2}" y="{y:.2}" width="{bw:.2}" height="{h:.2}"><title>{a_} to {b_} ms: {n} requests</title></rect>"#,
            x = left + bar_w * i as f64 + 0.5,
            y = base - h,
            bw = (bar_w - 1.0).max(0.5),
            a_ = ms(a),
            b_ = ms(b),
        );
    }
    let _ = writeln!(
        out,
        r#"<text class="tick" x="{left}" y="{ty}" text-anchor="start">{lo}</text><text class="tick" x="{xm}" y="{ty}" text-anchor="middle">{mid}</text><text class="tick" x="{xr}" y="{ty}" text-anchor="end">{hi} ms</text><text class="tick" x="{yx}" y="{yy}" text-anchor="end">{most}</text><text class="tick" x="{yx}" y="{base}" text-anchor="end">0</text></svg>"#,
        ty = base + 16.0,
        xm = left + plot_w / 2.0,
        xr = left + plot_w,
        lo = ms(lo),
        mid = ms((lo + hi) / 2.0),
        hi = ms(hi),
        yx = left - 6.0,
        yy = top + 4.0,
    );
}

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.note { color: #555; max-width: 70em; }
svg { display: block; background: #fafafa; border: 1px solid #ddd; margin: 4px 0 10px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .hist-title { font-weight: 600; font-size: 12px; }
svg .grid { stroke: #ddd; } svg .axis { stroke: #888; }
svg .mark { stroke-width: 3; } svg .bar { fill: #4e79a7; }
svg .bar:hover, svg .phase:hover { opacity: 0.7; }
.hists { display: flex; flex-wrap: wrap; gap: 8px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 18px; height: 10px; margin-right: 4px; vertical-align: middle; }
#readout { position: fixed; right: 12px; top: 12px; background: #fffbe6; border: 1px solid #e0d890; padding: 4px 8px; font-size: 12px; }
#readout:empty { display: none; }
#errors { color: #b00; }
"#;

/// Checks that every chart was laid out, shows the title of what the mouse
/// is over, and marks the page rendered (or names the error).
const SCRIPT: &str = r#"
(function () {
  var errors = document.getElementById('errors');
  try {
    var charts = document.querySelectorAll('svg.chart');
    var flat = [];
    charts.forEach(function (svg) {
      var box = svg.getBBox();
      if (!(box.width > 0 && box.height > 0)) { flat.push(svg.id || svg.dataset.metric); }
    });
    if (flat.length) { throw new Error('charts with nothing drawn: ' + flat.join(', ')); }
    var readout = document.getElementById('readout');
    document.querySelectorAll('svg [class] > title').forEach(function (t) {
      t.parentNode.addEventListener('mouseenter', function () { readout.textContent = t.textContent; });
      t.parentNode.addEventListener('mouseleave', function () { readout.textContent = ''; });
    });
    document.body.dataset.bars = String(document.querySelectorAll('svg.hist rect.bar').length);
    document.body.dataset.waterfallRows = String(document.querySelectorAll('svg.waterfall g.wf-row').length);
    document.body.dataset.rendered = 'ok';
  } catch (e) {
    errors.textContent = 'script error: ' + e;
    document.body.dataset.rendered = 'error';
  }
})();
"#;

/// The whole page.
pub(crate) fn page(c: &Collected, source: &str) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let axis = axis_domain(c);
    let domain = c.domain_name(axis);
    let _ = writeln!(
        out,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="generator" content="edgemark {version}">
<title>edgemark latency: {src}</title><style>{STYLE}</style></head>
<body data-rendered="no" data-requests="{n}">
<div id="readout"></div>
<h1>edgemark: first-event latency per stage edge</h1>
<p class="note">{n} requests from <code>{src}</code>; edges {edges}. Times are milliseconds from each request's origin in the clock domain each value names.</p>
<p id="errors"></p>"#,
        version = env!("CARGO_PKG_VERSION"),
        src = esc(source),
        n = c.requests.len(),
        edges = esc(&c
            .edges
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")),
    );

    // Waterfalls.
    let (picked, left_out) = pick(c, axis);
    let _ = writeln!(
        out,
        r#"<h2>Waterfalls</h2>
<p class="note">A typical request (the median total, nearest rank) and the slowest, by their latest event in clock domain <code>{d}</code>. Each row is one edge segment: a mark per event, and a bar per delta between consecutive events in the color of the event it ends at.</p>
<p class="legend">{legend}</p>"#,
        d = esc(domain),
        legend = c
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| format!(
                r#"<span><i style="background:{}"></i>{}</span>"#,
                COLORS[i % COLORS.len()],
                esc(short_event(e))
            ))
            .collect::<String>(),
    );
    if left_out > 0 {
        let _ = writeln!(
            out,
            r#"<p class="note excluded-requests" data-count="{left_out}">{left_out} {what} no event in <code>{d}</code> and {verb} not ranked.</p>"#,
            d = esc(domain),
            what = if left_out == 1 {
                "request has"
            } else {
                "requests have"
            },
            verb = if left_out == 1 { "is" } else { "are" },
        );
    }
    if picked.is_empty() {
        out.push_str("<p class=\"note\">No request has an event to draw.</p>\n");
    }
    for (which, r, total_ms) in &picked {
        let _ = writeln!(
            out,
            r#"<h3>The {which} request: line {line}, {t} ms</h3>"#,
            line = r.line,
            t = ms(*total_ms),
        );
        waterfall(&mut out, c, which, r, *total_ms, axis);
        let ex = excluded(c, which, r, axis);
        if !ex.is_empty() {
            let _ = writeln!(
                out,
                "<p class=\"note\">Not drawn:</p><ul class=\"excluded\">{}</ul>",
                ex.join("\n")
            );
        }
    }

    // Histograms and the quantile table.
    let _ = writeln!(
        out,
        r#"<h2>Histograms</h2>
<p class="note">Segment 0 of every request, per edge: each event (ms from the request's origin in clock domain <code>{d}</code>; values of other domains are left out and counted) and each delta between consecutive events (only where both were recorded in one clock domain and in order), in {BINS} equal bins from the smallest value to the largest.</p>"#,
        d = esc(domain),
    );
    let names = c.metric_names();
    let mut table = String::new();
    for &e in &c.edges {
        let edge = e.to_string();
        let _ = writeln!(out, "<h3>Edge {}</h3>\n<div class=\"hists\">", esc(&edge));
        for (m, name) in names.iter().enumerate() {
            let (values, left_out) = c.metric_values(e, m, axis);
            histogram(&mut out, &edge, name, &values, left_out, domain);
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let q = |p| percentile(&sorted, p).map_or("-".to_owned(), ms);
            let _ = writeln!(
                table,
                "<tr><td>{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&edge),
                esc(name),
                sorted.len(),
                q(50.0),
                q(95.0),
                q(99.0)
            );
        }
        out.push_str("</div>\n");
    }
    let _ = writeln!(
        out,
        r#"<h2>Quantiles</h2>
<table class="quantiles"><tr><th>edge, boundary or delta</th><th>n</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th></tr>
{table}</table>
<script>{SCRIPT}</script>
</body></html>"#
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(100.0, 10.0), 10.0);
        assert_eq!(tick_step(130.0, 10.0), 20.0);
        assert!((tick_step(0.3, 10.0) - 0.05).abs() < 1e-12);
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc(r#"<a & "b">"#), "&lt;a &amp; &quot;b&quot;&gt;");
    }
}
