//! The exporter as a program runs it, through its builder: settings over
//! the environment's, a stop and a run that ends, the region file attached
//! again, and notes through the `log` facade.

mod common;

use std::time::Duration;

use common::{
    capture_notes, close, collector, exporter_of, nobody, notes, region_with_closed, stop, wait_for,
};
use edgemark::Recorder;
use edgemark_otlp::Exporter;
use edgemark_otlp::config::DEFAULT_BATCH;

#[test]
fn the_builder_s_settings_win_over_the_environment() {
    let env = |k: &str| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://from-env:4318".to_owned()),
        "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("1000".to_owned()),
        "OTEL_BSP_MAX_QUEUE_SIZE" => Some("64".to_owned()),
        _ => None,
    };
    let from_env = Exporter::builder("unused.region")
        .with_env(env)
        .config()
        .unwrap();
    assert_eq!(from_env.url, "http://from-env:4318/v1/traces");
    assert_eq!(from_env.timeout(), Duration::from_secs(1));
    assert_eq!(from_env.queue(), 64);
    // The queue bounds the batch.
    assert_eq!(from_env.batch(), 64.min(DEFAULT_BATCH));

    let given = Exporter::builder("unused.region")
        .with_env(env)
        .with_endpoint("http://given:4318")
        .with_timeout(Duration::from_secs(3))
        .with_queue_size(1000)
        .with_batch_size(2000)
        .with_schedule_delay(Duration::from_millis(7))
        .config()
        .unwrap();
    assert_eq!(given.url, "http://given:4318/v1/traces");
    assert_eq!(given.timeout(), Duration::from_secs(3));
    assert_eq!((given.queue(), given.batch()), (1000, 1000));
    assert_eq!(given.schedule_delay(), Duration::from_millis(7));

    // An empty endpoint is none: the environment says where.
    let empty = Exporter::builder("unused.region")
        .with_env(env)
        .with_endpoint("")
        .config()
        .unwrap();
    assert_eq!(empty.url, "http://from-env:4318/v1/traces");
    let none = Exporter::builder("unused.region")
        .with_env(|_| None)
        .config()
        .unwrap_err();
    assert!(none.is_missing_endpoint(), "{none}");
}

#[test]
fn the_exporter_attaches_its_region_and_says_why_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let missing = Exporter::builder(dir.path().join("missing.region"))
        .with_endpoint("http://127.0.0.1:9")
        .start()
        .unwrap_err();
    assert!(
        matches!(missing, edgemark_otlp::StartError::Attach(_)),
        "{missing:?}"
    );
    let path = dir.path().join("no-ring.region");
    Recorder::builder()
        .edge(0, 1)
        .closed_entries(0)
        .create(&path)
        .unwrap();
    let no_ring = Exporter::builder(&path)
        .with_endpoint("http://127.0.0.1:9")
        .start()
        .unwrap_err();
    assert!(
        matches!(
            no_ring,
            edgemark_otlp::StartError::Reader(edgemark::ReaderError::NoRing)
        ),
        "{no_ring:?}"
    );
}

#[test]
fn a_run_for_ends_by_itself_having_sent_what_it_took() {
    let (url, _) = collector("200 OK", 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = region_with_closed(&path, 3);
    let exporter = exporter_of(&path, url)
        .run_for(Duration::from_secs(1))
        .start()
        .unwrap();
    let (stopper, stats) = (exporter.stopper(), exporter.stats());
    // Ends without being stopped, and what it took before the end of its
    // run it sent in its flush.
    assert!(exporter.join());
    stopper.wait();
    let taken = stats.counts().requests;
    assert!(taken <= 3);
    assert_eq!(rec.counters().closed_acknowledged, taken);
    assert_eq!(stats.counts().left_unsent, 0);
}

#[test]
fn a_stop_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    capture_notes();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = region_with_closed(&path, 3);
    let first = exporter_of(&path, nobody()).start().unwrap();
    let stats = first.stats();
    wait_for("the three requests taken", || {
        (stats.counts().requests == 3).then_some(())
    });
    let stopper = first.stopper();
    stopper.stop();
    // Stopped again, or waited for twice: the same.
    stopper.stop();
    stopper.wait();
    stopper.wait();
    assert!(first.join());
    assert_eq!(stats.counts().left_unsent, 3);
    let report = rec.report().unwrap().unwrap();
    assert_eq!(report.occupancy.closed_unacknowledged, 3);
    assert_eq!(report.counters.closed_acknowledged, 0);
    let said: Vec<_> = notes()
        .into_iter()
        .filter(|(target, _, text)| {
            target.starts_with("edgemark_otlp")
                && text
                    .starts_with("3 closed requests not sent by the deadline: 3 left in the ring")
        })
        .collect();
    assert_eq!(said.len(), 1, "{:?}", notes());
    assert_eq!(said[0].1, log::Level::Warn);

    // The next exporter adopts them.
    let (url, _) = collector("200 OK", 0);
    let second = exporter_of(&path, url).start().unwrap();
    wait_for("the three acknowledged", || {
        (rec.counters().closed_acknowledged == 3).then_some(())
    });
    assert_eq!(second.stats().counts().adopted, 3);
    stop(second);
    let adopted = format!(
        "{}: 3 closed requests that an exporter before this one took and did not send",
        path.display()
    );
    assert!(
        notes()
            .iter()
            .any(|(_, level, text)| *level == log::Level::Info && text.starts_with(&adopted)),
        "{:?}",
        notes()
    );
}

#[test]
fn another_region_file_at_the_path_is_attached_and_exported() {
    capture_notes();
    let (url, _) = collector("200 OK", 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let before = region_with_closed(&path, 1);
    let exporter = exporter_of(&path, url).start().unwrap();
    wait_for("the first region's request acknowledged", || {
        (before.counters().closed_acknowledged == 1).then_some(())
    });
    std::fs::remove_file(&path).unwrap();
    let after = Recorder::builder().edge(0, 1).create(&path).unwrap();
    close(&after, 2);
    wait_for("the new region's requests acknowledged", || {
        (after.counters().closed_acknowledged == 2).then_some(())
    });
    assert_eq!(exporter.stats().counts().requests, 3);
    stop(exporter);
    let again = format!(
        "{}: attached again; exporting its closed requests",
        path.display()
    );
    assert!(
        notes().iter().any(|(_, _, text)| *text == again),
        "{:?}",
        notes()
    );
}
