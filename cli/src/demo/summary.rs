//! The table `edgemark demo` prints.

use std::fmt::Write as _;

use edgemark::{Edge, Event};

use super::DemoResult;
use crate::views::data::{percentile, short_event};

/// The table the demo prints: per edge, each boundary and each delta between
/// consecutive boundaries, then the requests and the refused records.
pub(crate) fn summary(r: &DemoResult) -> String {
    let mut s = String::new();
    let events = Event::ALL;
    let closed = r.finals.len();
    let aborted = r.finals.iter().filter(|(_, a)| *a).count();
    let _ = writeln!(
        s,
        "edgemark demo: {closed} requests closed ({} completed, {aborted} aborted) in {:.1} s",
        closed - aborted,
        r.elapsed.as_secs_f64()
    );
    for edge in [Edge::new(0, 1), Edge::new(1, 2)] {
        let segs: Vec<_> = r
            .finals
            .iter()
            .filter_map(|(snap, _)| snap.segment(edge, 0))
            .collect();
        let _ = writeln!(s, "\nedge {edge} (segment 0), {} requests", segs.len());
        let _ = writeln!(
            s,
            "  {:<34} {:>6} {:>9} {:>9} {:>9}",
            "boundary (ms from request start)", "n", "p50", "p95", "p99"
        );
        let mut row = |name: String, mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let f = |p| percentile(&v, p).map_or("-".to_owned(), |x| format!("{x:.2}"));
            let _ = writeln!(
                s,
                "  {:<34} {:>6} {:>9} {:>9} {:>9}",
                name,
                v.len(),
                f(50.0),
                f(95.0),
                f(99.0)
            );
        };
        for e in events {
            row(
                short_event(e.name()).to_owned(),
                segs.iter().filter_map(|g| g.elapsed_ms(e)).collect(),
            );
        }
        for i in 0..events.len() - 1 {
            let short = |i: usize| short_event(events[i].name());
            row(
                format!("{} -> {}", short(i), short(i + 1)),
                segs.iter()
                    .filter_map(|g| g.elapsed_between(events[i], events[i + 1]))
                    .collect(),
            );
        }
    }
    let second = r
        .finals
        .iter()
        .filter(|(snap, _)| snap.segment(Edge::new(0, 1), 1).is_some())
        .count();
    let _ = writeln!(s, "\nrequests with a second segment: {second}");
    let _ = writeln!(s, "record outcomes in the stage workers:");
    for (k, v) in &r.outcomes {
        let _ = writeln!(s, "  {k:<22} {v:>8}");
    }
    let refused: Vec<String> = r
        .counters
        .refused
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(o, n)| format!("{o}={n}"))
        .collect();
    let _ = writeln!(
        s,
        "refused records counted in the region: {}",
        if refused.is_empty() {
            "none".to_owned()
        } else {
            refused.join(", ")
        }
    );
    if let Some(p) = &r.region {
        let _ = writeln!(s, "region kept at {}", p.display());
    }
    s
}
