//! What `inspect` and `watch` print: the region's report as text, or as
//! the library's JSON with the open requests after it.

use anyhow::{Context, Result};
use edgemark::Viewer;
use edgemark::report::{METRICS, MetricKind, MetricValue};

use crate::out::outln;

/// The pid-namespace lines of `inspect`: whether pids are judged, and why
/// not.
fn pids_text(info: &edgemark::report::RegionInfo) -> String {
    match info.pids_unjudged {
        None => "judged (reclaim frees dead owners)".to_owned(),
        Some(why) => format!("NOT judged: {why}; reclaim frees nothing unless --judge-pids"),
    }
}

/// Prints the region's report: as text, or as JSON.
pub(crate) fn inspect(rec: &Viewer, json: bool) -> Result<()> {
    let report = rec
        .report()
        .context("the region changed under this process")?
        .expect("an enabled recorder");
    let open = rec
        .snapshot_open()
        .context("the region changed under this process")?;
    if json {
        // The region's report, in the library's one encoding of it, then
        // the open requests.
        let mut v = serde_json::to_value(&report)?;
        v["open"] = serde_json::Value::Array(
            open.iter()
                .map(|(t, s)| serde_json::json!({"token": t.to_string(), "snapshot": s}))
                .collect(),
        );
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let (info, counters) = (&report.info, &report.counters);
    outln!("region     {}", info.region_id);
    outln!(
        "geometry   {} slots x {} bytes, {} segments kept per edge, {} bytes in all",
        info.slots,
        info.slot_stride,
        info.segments,
        info.bytes
    );
    let edges: Vec<String> = info.edges.iter().map(|e| e.to_string()).collect();
    outln!("edges      {}", edges.join(", "));
    for e in &info.events {
        outln!(
            "event      {} ({}{})",
            e.name,
            e.domain,
            if e.keeps_chunk_seq {
                ", keeps chunk seq"
            } else {
                ""
            }
        );
    }
    outln!("domains    {}", info.domains.join(", "));
    outln!(
        "clock      {}, boot {:032x}, time namespace {} ({})",
        info.clock_kind,
        info.clock.boot_id,
        info.clock.time_namespace,
        if info.shares_clock {
            "shared with this process"
        } else {
            "NOT this process's clock"
        }
    );
    outln!("creator    pid {}", info.creator_pid);
    outln!("pids       {}", pids_text(info));
    outln!(
        "ring       {} entries x {} bytes (of closed requests)",
        info.ring_entries,
        info.ring_stride
    );
    // Every counter and gauge of the report, by the table that names them
    // in the JSON and on /metrics too; a count by reason with its nonzero
    // reasons.
    let width = METRICS.iter().map(|m| m.key.len()).max().unwrap_or(0);
    for m in METRICS {
        let kind = match m.kind {
            MetricKind::Counter => "counter",
            _ => "gauge",
        };
        let value = m.value(counters, &report.occupancy);
        let mut shown = value.total().to_string();
        if let MetricValue::ByLabel(by) = &value {
            let nonzero: Vec<String> = by
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(l, n)| format!("{l} {n}"))
                .collect();
            if !nonzero.is_empty() {
                shown = format!("{shown} ({})", nonzero.join(", "));
            }
        }
        outln!("{kind:<10} {:<width$} {shown}: {}", m.key, m.help);
    }
    let held = counters
        .closed_overwritten_taken
        .saturating_sub(counters.closed_settled_overwritten);
    if held > 0 {
        outln!(
            "note       {held} closed requests overwritten while a reader held them are not \
             settled: lost if that reader died"
        );
    }
    for (t, s) in &open {
        outln!("open       {t} {}", serde_json::to_string(s)?);
    }
    Ok(())
}
