//! The collector's answer as the exporter judges it, against a local
//! server that answers every post the same way.

mod common;

use common::{collector, exporter_of, region_with_closed, stop, wait_for};
use edgemark_otlp::client::MAX_ANSWER;

/// Closes one request with a value on one edge (two spans) into a region
/// at a temporary path, exports it to `url`, and waits until the region
/// says the request was acknowledged or given up. The exporter's counts
/// and the region's counters then.
fn export_one(url: &str) -> (edgemark_otlp::stats::Counts, edgemark::report::Counters) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = region_with_closed(&path, 1);
    let exporter = exporter_of(&path, url).start().unwrap();
    let stats = exporter.stats();
    // Settled by the answer to its first post.
    wait_for("the request acknowledged or given up", || {
        let c = rec.counters();
        (c.closed_acknowledged + c.closed_given_up.total() > 0).then_some(())
    });
    stop(exporter);
    // The counts are updated before the request is settled.
    (stats.counts(), rec.counters())
}

#[test]
fn a_success_whose_body_is_over_the_limit_is_a_failure_not_retried() {
    let (url, posts) = collector("200 OK", MAX_ANSWER + 1);
    let (counts, region) = export_one(&url);
    assert_eq!(*posts.lock().unwrap(), 1, "posted once, not retried");
    assert_eq!(counts.exported, 0);
    assert_eq!(counts.failures, 1);
    assert_eq!(counts.dropped_rejected, 2);
    assert_eq!(counts.dropped_retries, 0);
    assert!(!counts.up);
    assert_eq!(region.closed_acknowledged, 0);
    assert_eq!(region.closed_given_up.refused, 1);
}

#[test]
fn a_success_whose_body_is_at_the_limit_is_a_success() {
    // Not an export response: read as one that rejects nothing.
    let (url, posts) = collector("200 OK", MAX_ANSWER);
    let (counts, region) = export_one(&url);
    assert_eq!(*posts.lock().unwrap(), 1);
    assert_eq!((counts.exported, counts.failures), (2, 0));
    assert!(counts.up);
    assert_eq!(region.closed_acknowledged, 1);
    assert_eq!(region.closed_given_up.total(), 0);
}
