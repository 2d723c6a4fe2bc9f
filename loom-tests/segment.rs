//! Models of segments: writers race `start_segment`, and a snapshot races
//! the relay of a segment's cells.

use super::*;

// ---------------------------------------------------------------------------
// Model 4: a writer races start_segment.
// ---------------------------------------------------------------------------

/// The owner starts segment 1 while a writer records the producer event
/// (1 ms, chunk 1) for segment 0. The write lands in segment 0 or is refused
/// as `StaleSegment`; it never shows in segment 1. With two kept segments,
/// segment 0 keeps the write exactly when it was `Recorded`; with one, ring
/// entry 0 is relaid for segment 1, segment 0 is dropped (and counted) and
/// its value goes with it.
///
/// The owner runs on the main thread so that loom's first schedule runs the
/// control operation first (see "Thread placement" in `docs/loom.md`).
fn old_writer_races_start_segment(segments: u32) {
    let name = format!("m4a_old_segment_writer_races_start_segment_k{segments}");
    // (start outcome, writer outcome, final snapshot)
    let seen = explore(&name, move || {
        let rec = region(1, segments);
        let t = rec.begin().unwrap();
        let rw = rec.clone();
        let w = spawn(move || emit(&rw, t, 0, 1.0, 1));
        let st = rec.start_segment(t, EDGE, 1);
        let o0 = w.join().unwrap();
        let fin = view(&rec.close(t));
        (st, o0, fin)
    });
    let old = (1000, Some(1));
    // With one kept segment the writer's CAS and start_segment's relay swap
    // are both read-modify-writes of the same cell, so loom orders them
    // strictly: either the write lands and the relay evicts it with segment
    // 0, or the writer finds the relaid word and is refused.
    assert_only(&name, &seen, |(st, o0, fin)| {
        let seg0_ok = match (segments, o0) {
            (1, Outcome::Recorded | Outcome::StaleSegment) => {
                fin.seg(0).is_none() && fin.dropped == 1 && fin.segs.is_empty()
            }
            (_, Outcome::Recorded) => fin.producer(0) == Some(old) && fin.segs.len() == 1,
            (_, Outcome::StaleSegment) => fin.segs.is_empty(),
            _ => false,
        };
        *st == Outcome::Started && seg0_ok
    });
    assert_seen(&name, &seen, "the write landing", |o| {
        o.1 == Outcome::Recorded
    });
    assert_seen(&name, &seen, "the write refused as stale", |o| {
        o.1 == Outcome::StaleSegment
    });
}

#[test]
fn m4a_old_segment_writer_races_start_segment_k1() {
    old_writer_races_start_segment(1);
}

#[test]
fn m4a_old_segment_writer_races_start_segment_k2() {
    old_writer_races_start_segment(2);
}

/// The owner starts segment 1 while a writer that was told of segment 1
/// records its producer event (3 ms, chunk 3). If the writer read the new
/// segment word, it finds the segment's cells laid and its write lands in
/// segment 1; if it came first, it is refused as `SegmentNotStarted`
/// (recording never advances a segment). Never `StaleSegment`, never in
/// segment 0.
fn new_writer_races_start_segment(segments: u32) {
    let name = format!("m4b_new_segment_writer_races_start_segment_k{segments}");
    let seen = explore(&name, move || {
        let rec = region(1, segments);
        let t = rec.begin().unwrap();
        let rw = rec.clone();
        let w = spawn(move || emit(&rw, t, 1, 3.0, 3));
        let st = rec.start_segment(t, EDGE, 1);
        let o1 = w.join().unwrap();
        let fin = view(&rec.close(t));
        (st, o1, fin)
    });
    let new = (3000, Some(3));
    assert_only(&name, &seen, |(st, o1, fin)| {
        let ok = match o1 {
            Outcome::Recorded => fin.producer(1) == Some(new) && fin.segs.len() == 1,
            Outcome::SegmentNotStarted => fin.segs.is_empty(),
            _ => false,
        };
        *st == Outcome::Started && ok && fin.dropped == u64::from(segments == 1)
    });
    assert_seen(&name, &seen, "the write landing in segment 1", |o| {
        o.1 == Outcome::Recorded
    });
    assert_seen(&name, &seen, "the write before the start", |o| {
        o.1 == Outcome::SegmentNotStarted
    });
}

#[test]
fn m4b_new_segment_writer_races_start_segment_k1() {
    new_writer_races_start_segment(1);
}

#[test]
fn m4b_new_segment_writer_races_start_segment_k2() {
    new_writer_races_start_segment(2);
}

// ---------------------------------------------------------------------------
// Model 5b: a snapshot races a segment's relay.
// ---------------------------------------------------------------------------

/// Model 5b: a snapshot races the relaying of a ring entry.
///
/// With one kept segment, segment 1 reuses segment 0's cells. Segment 0 has
/// the producer (1 ms, chunk 1) and send (1.5 ms) events; the owner starts
/// segment 1 and records its producer event (3 ms, chunk 3) while another
/// thread takes two snapshots. A snapshot shows segment 0 whole or not at
/// all, and segment 1's value only as segment 1: never a mixture of the
/// two epochs of the entry.
#[test]
fn m5b_snapshot_races_segment_relay() {
    const NAME: &str = "m5b_snapshot_races_segment_relay";
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        assert_eq!(emit(&rec, t, 0, 1.0, 1), Outcome::Recorded);
        assert_eq!(mark(&rec, t, S, 1.5), Outcome::Recorded);
        let rs = rec.clone();
        let snaps = spawn(move || (view(&rs.snapshot(t)), view(&rs.snapshot(t))));
        let st = rec.start_segment(t, EDGE, 1);
        let o1 = emit(&rec, t, 1, 3.0, 3);
        let (s1, s2) = snaps.join().unwrap();
        let fin = view(&rec.close(t));
        (st, o1, s1, s2, fin)
    });
    let seg0 = SegView {
        index: 0,
        us: [Some(1000), Some(1500), None, None],
        chunk: Some(1),
    };
    let seg1 = SegView {
        index: 1,
        us: [Some(3000), None, None, None],
        chunk: Some(3),
    };
    let whole =
        |v: &View| v.segs.is_empty() || v.segs == [seg0.clone()] || v.segs == [seg1.clone()];
    assert_only(NAME, &seen, |(st, o1, s1, s2, fin)| {
        *st == Outcome::Started
            && *o1 == Outcome::Recorded
            && whole(s1)
            && whole(s2)
            // Once segment 1 is seen, segment 0 never comes back.
            && !(s1.seg(1).is_some() && s2.seg(0).is_some())
            && s1.seg(1).map_or(true, |_| s1.kept_by(s2))
            && fin.segs == [seg1.clone()]
            && fin.dropped == 1
    });
    assert_seen(NAME, &seen, "a snapshot of segment 0", |o| {
        o.2.seg(0).is_some()
    });
    assert_seen(NAME, &seen, "a snapshot of segment 1", |o| {
        o.3.seg(1).is_some()
    });
    assert_seen(NAME, &seen, "a snapshot between the epochs", |o| {
        o.2.segs.is_empty() || o.3.segs.is_empty()
    });
}
