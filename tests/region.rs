//! Regions through the public API: create, attach and its checks, tokens,
//! segments, fail-open outcomes and the JSON form.

use std::os::unix::fs::PermissionsExt;

use edgemark::{
    AttachError, AttachOptions, CreateError, Edge, Event::*, Mark, Outcome, Recorder, RequestState,
    Token,
};

use edgemark::schema::Schema;

const E01: Edge = Edge::new(0, 1);
const E12: Edge = Edge::new(1, 2);

fn at(rec: &Recorder, t: Token, mark: Mark, ms: f64) -> Outcome {
    rec.record_elapsed(t, mark, ms, "host_monotonic")
}

fn region() -> (tempfile::TempDir, std::path::PathBuf, Recorder) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(8)
        .domain("device")
        .create(&path)
        .unwrap();
    (dir, path, rec)
}

/// Overwrites one little-endian word of a region file.
fn poke(path: &std::path::Path, word: usize, value: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_le_bytes(), word as u64 * 8)
        .unwrap();
}

#[test]
fn snapshot_json_is_exactly_the_upstream_form() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    assert_eq!(
        at(
            &rec,
            t,
            Mark::new(E01, ProducerFirstNonemptyEmit).chunk_seq(3),
            10.0
        ),
        Outcome::Recorded
    );
    assert_eq!(
        at(&rec, t, Mark::new(E01, EdgeFirstSendComplete), 12.0),
        Outcome::Recorded
    );
    let want = concat!(
        r#"{"0->1:0":{"from_stage":0,"to_stage":1,"segment_index":0,"first_chunk_seq":3,"#,
        r#""clock_domains":{"producer_first_nonempty_emit":"host_monotonic","edge_first_send_complete":"host_monotonic"},"#,
        r#""producer_first_nonempty_emit_ms":10.0,"edge_first_send_complete_ms":12.0,"#,
        r#""consumer_first_accept_ms":null,"consumer_first_nonempty_output_ms":null}}"#
    );
    assert_eq!(serde_json::to_string(&rec.snapshot(t)).unwrap(), want);
    let last = rec.close(t);
    assert_eq!(serde_json::to_string(&last).unwrap(), want);
    assert_eq!(last.state(), RequestState::Closed);
    assert_eq!(last.dropped_segments(), 0);
}

#[test]
fn successful_two_stage_transfer_over_both_edges() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let mut ms = 0.0;
    for e in [E01, E12] {
        for ev in [
            ProducerFirstNonemptyEmit,
            EdgeFirstSendComplete,
            ConsumerFirstAccept,
            ConsumerFirstNonemptyOutput,
        ] {
            ms += 1.5;
            assert_eq!(
                at(&rec, t, Mark::new(e, ev).chunk_seq(1), ms),
                Outcome::Recorded
            );
        }
    }
    let s = rec.close(t);
    let keys: Vec<String> = s.segments().iter().map(|g| g.key()).collect();
    assert_eq!(keys, ["0->1:0", "1->2:0"]);
    let g = s.segment(E12, 0).unwrap();
    assert_eq!(g.elapsed_ms(ProducerFirstNonemptyEmit), Some(7.5));
    assert_eq!(
        g.elapsed_between(ProducerFirstNonemptyEmit, ConsumerFirstNonemptyOutput),
        Some(4.5)
    );
    assert_eq!(g.first_chunk_seq(), Some(1));
}

#[test]
fn chunk_seq_is_the_winners_only_and_only_for_the_producer() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    assert_eq!(
        at(
            &rec,
            t,
            Mark::new(E01, EdgeFirstSendComplete).chunk_seq(8),
            1.0
        ),
        Outcome::Recorded
    );
    assert_eq!(
        rec.snapshot(t).segment(E01, 0).unwrap().first_chunk_seq(),
        None
    );
    assert_eq!(
        at(&rec, t, Mark::new(E01, ProducerFirstNonemptyEmit), 2.0),
        Outcome::Recorded
    );
    assert_eq!(
        at(
            &rec,
            t,
            Mark::new(E01, ProducerFirstNonemptyEmit).chunk_seq(5),
            3.0
        ),
        Outcome::Duplicate
    );
    let s = rec.close(t);
    assert_eq!(s.segment(E01, 0).unwrap().first_chunk_seq(), None);
    assert_eq!(
        s.segment(E01, 0)
            .unwrap()
            .elapsed_ms(ProducerFirstNonemptyEmit),
        Some(2.0)
    );
}

#[test]
fn interleaved_requests_edges_and_segments_never_share_a_cell() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 0)
        .edge(1, 2)
        .segments(3)
        .create_in_memory()
        .unwrap();
    let ts: Vec<Token> = (0..5).map(|_| rec.begin().unwrap()).collect();
    let edges = [Edge::new(0, 1), Edge::new(1, 0), Edge::new(1, 2)];
    for seg in 0..3u32 {
        for (i, t) in ts.iter().enumerate() {
            for (j, e) in edges.iter().enumerate() {
                if seg > 0 {
                    assert_eq!(rec.start_segment(*t, *e, seg), Outcome::Started);
                }
                let v = (i * 100 + j * 10) as f64 + f64::from(seg);
                assert_eq!(
                    at(&rec, *t, Mark::new(*e, ConsumerFirstAccept).segment(seg), v),
                    Outcome::Recorded
                );
            }
        }
    }
    for (i, t) in ts.iter().enumerate() {
        let s = rec.close(*t);
        assert_eq!(s.segments().len(), 9);
        for seg in 0..3u32 {
            for (j, e) in edges.iter().enumerate() {
                let v = (i * 100 + j * 10) as f64 + f64::from(seg);
                assert_eq!(
                    s.segment(*e, seg).unwrap().elapsed_ms(ConsumerFirstAccept),
                    Some(v)
                );
            }
        }
    }
}

#[test]
fn segments_are_fenced_kept_in_a_window_and_drops_are_counted() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .segments(2)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let emit = |s: u32| Mark::new(E01, ProducerFirstNonemptyEmit).segment(s);
    assert_eq!(
        at(&rec, t, emit(1), 1.0),
        Outcome::SegmentNotStarted,
        "recording never advances a segment"
    );
    assert_eq!(at(&rec, t, emit(0), 0.5), Outcome::Recorded);
    assert_eq!(rec.start_segment(t, E01, 1), Outcome::Started);
    assert_eq!(at(&rec, t, emit(0), 0.7), Outcome::StaleSegment);
    assert_eq!(at(&rec, t, emit(1), 1.0), Outcome::Recorded);
    let s = rec.snapshot(t);
    assert_eq!(
        s.segment(E01, 0)
            .unwrap()
            .elapsed_ms(ProducerFirstNonemptyEmit),
        Some(0.5)
    );
    assert_eq!(s.dropped_segments(), 0);
    // Skipping indices is allowed; the window keeps the newest two.
    assert_eq!(rec.start_segment(t, E01, 5), Outcome::Started);
    assert_eq!(at(&rec, t, emit(5), 5.0), Outcome::Recorded);
    assert_eq!(rec.start_segment(t, E01, 5), Outcome::StaleSegment);
    assert_eq!(rec.start_segment(t, E01, 4), Outcome::StaleSegment);
    let s = rec.close(t);
    let keys: Vec<String> = s.segments().iter().map(|g| g.key()).collect();
    assert_eq!(keys, ["0->1:1", "0->1:5"]);
    assert_eq!(s.dropped_segments(), 1);
    assert_eq!(rec.counters().dropped_segments, 1);
}

#[test]
fn undeclared_edges_events_and_domains_are_refused_and_counted() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    assert_eq!(
        rec.record(t, Mark::new(Edge::new(1, 0), ConsumerFirstAccept)),
        Outcome::UnknownEdge
    );
    assert_eq!(
        rec.record(t, Mark::new(E01, edgemark::schema::EventId(9))),
        Outcome::UnknownEvent
    );
    assert_eq!(
        rec.record_elapsed(t, Mark::new(E01, ConsumerFirstAccept), 1.0, "no\tpe"),
        Outcome::UnknownDomain
    );
    assert_eq!(
        rec.start_segment(t, Edge::new(5, 6), 1),
        Outcome::UnknownEdge
    );
    assert!(rec.snapshot(t).is_empty());
    let c = rec.counters();
    let n = |o: Outcome| c.refused.iter().find(|(x, _)| *x == o).unwrap().1;
    assert_eq!(n(Outcome::UnknownEdge), 2);
    assert_eq!(n(Outcome::UnknownEvent), 1);
    assert_eq!(n(Outcome::UnknownDomain), 1);
    assert!(
        c.refused.iter().all(|(o, _)| *o != Outcome::Duplicate),
        "duplicates are not counted"
    );
}

#[test]
fn every_event_id_outside_the_schema_is_refused_and_writes_nothing() {
    // Ids from the schema's end to 255, including those that share low bits
    // with schema events (16 + 0, 16 + 3, ...), on both edges: none may land
    // in another event's cell.
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let events = rec.schema().unwrap().events().len() as u8;
    for id in events..=u8::MAX {
        for edge in [E01, Edge::new(1, 2)] {
            assert_eq!(
                rec.record(
                    t,
                    Mark::new(edge, edgemark::schema::EventId(id)).chunk_seq(3)
                ),
                Outcome::UnknownEvent,
                "event id {id}"
            );
        }
    }
    assert!(rec.snapshot(t).is_empty());
    // The schema's own events still record, once each.
    for id in 0..events {
        let m = Mark::new(E01, edgemark::schema::EventId(id));
        assert_eq!(rec.record(t, m), Outcome::Recorded, "event id {id}");
        assert_eq!(rec.record(t, m), Outcome::Duplicate, "event id {id}");
    }
    let c = rec.counters();
    let n = |o: Outcome| c.refused.iter().find(|(x, _)| *x == o).unwrap().1;
    assert_eq!(n(Outcome::UnknownEvent), 2 * (256 - u64::from(events)));
}

#[test]
fn the_record_path_refuses_bad_tokens_and_marks_in_its_documented_order() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let other = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    let foreign = other.begin().unwrap();
    let m = Mark::new(E01, ProducerFirstNonemptyEmit);
    assert_eq!(rec.record(foreign, m), Outcome::ForeignToken);
    let forged = |slot: u32, generation: u32| {
        edgemark::Token::from_u128(
            (t.to_u128() >> 64 << 64) | (u128::from(slot) << 32) | u128::from(generation),
        )
    };
    assert_eq!(rec.record(forged(1 << 20, 1), m), Outcome::Invalid);
    assert_eq!(rec.record(forged(t.slot(), 0), m), Outcome::Invalid);
    // Not meaningful comes before everything about the token.
    assert_eq!(
        rec.record(foreign, m.meaningful(false)),
        Outcome::NotMeaningful
    );
    // A chunk sequence too large for the cell is refused before any write.
    let chunked = Mark::new(E01, ProducerFirstNonemptyEmit).chunk_seq(u64::MAX);
    assert_eq!(rec.record(t, chunked), Outcome::OutOfRange);
    assert!(rec.snapshot(t).is_empty());
    assert_eq!(rec.record(t, m.chunk_seq(7)), Outcome::Recorded);
    assert_eq!(rec.record(t, m), Outcome::Duplicate);
    // The edge reversed, and a stage pair beyond the direct table.
    assert_eq!(
        rec.record(t, Mark::new(Edge::new(1, 0), ProducerFirstNonemptyEmit)),
        Outcome::UnknownEdge
    );
    assert_eq!(
        rec.record(t, Mark::new(Edge::new(0, 100), ProducerFirstNonemptyEmit)),
        Outcome::UnknownEdge
    );
    let far = Recorder::builder().edge(100, 7).create_in_memory().unwrap();
    let ft = far.begin().unwrap();
    let fm = Mark::new(Edge::new(100, 7), ProducerFirstNonemptyEmit);
    assert_eq!(far.record(ft, fm), Outcome::Recorded);
    assert_eq!(far.record(ft, fm), Outcome::Duplicate);
}

#[test]
fn elapsed_beyond_the_encoding_and_huge_chunks_are_refused_without_state() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    let m = Mark::new(E01, ProducerFirstNonemptyEmit);
    assert_eq!(
        at(&rec, t, m, edgemark::limits::MAX_ELAPSED_MS + 1.0),
        Outcome::OutOfRange
    );
    assert_eq!(
        at(
            &rec,
            t,
            m.chunk_seq(edgemark::limits::MAX_CHUNK_SEQ + 1),
            1.0
        ),
        Outcome::OutOfRange
    );
    assert!(rec.snapshot(t).is_empty());
    assert_eq!(
        at(
            &rec,
            t,
            m.chunk_seq(edgemark::limits::MAX_CHUNK_SEQ),
            edgemark::limits::MAX_ELAPSED_MS
        ),
        Outcome::Recorded
    );
    let s = rec.close(t);
    let g = s.segment(E01, 0).unwrap();
    assert_eq!(g.first_chunk_seq(), Some(edgemark::limits::MAX_CHUNK_SEQ));
    assert_eq!(
        g.elapsed_ms(ProducerFirstNonemptyEmit),
        Some(edgemark::limits::MAX_ELAPSED_MS)
    );
}

#[test]
fn a_full_region_refuses_begin_fails_open_and_recovers() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(2)
        .create_in_memory()
        .unwrap();
    let a = rec.begin().unwrap();
    let b = rec.begin().unwrap();
    assert_ne!(a.slot(), b.slot());
    assert_eq!(rec.begin(), Err(Outcome::RegionFull));
    let c = rec.counters();
    assert_eq!(
        c.refused
            .iter()
            .find(|(o, _)| *o == Outcome::RegionFull)
            .unwrap()
            .1,
        1
    );
    rec.close(a);
    let d = rec.begin().unwrap();
    assert_eq!(d.slot(), a.slot());
    assert_ne!(d.generation(), a.generation());
    // The stale token cannot touch the slot's new occupant.
    assert_eq!(
        rec.record(a, Mark::new(E01, ConsumerFirstAccept)),
        Outcome::Reused
    );
    assert!(rec.snapshot(d).is_empty());
    assert!(rec.snapshot(a).is_empty());
    assert_eq!(rec.close(a).state(), RequestState::Gone);
    assert_eq!(rec.snapshot(d).state(), RequestState::Open);
}

#[test]
fn tokens_round_trip_through_text_integers_bytes_and_serde() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    assert!(std::mem::size_of::<Token>() <= 16);
    assert_eq!(t.to_string().parse::<Token>().unwrap(), t);
    assert_eq!(Token::from_u128(t.to_u128()), t);
    assert_eq!(Token::from_bytes(t.to_bytes()), t);
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(serde_json::from_str::<Token>(&json).unwrap(), t);
    for bad in [
        "",
        "em1",
        "em2.1.2.3",
        "em1.1.2",
        "em1.1.2.3.4",
        "em1.x.2.3",
        "em1.1..3",
        "em1.11111111111111111.2.3",
    ] {
        assert!(bad.parse::<Token>().is_err(), "{bad:?}");
    }
}

#[test]
fn tokens_of_another_region_and_garbage_tokens_are_refused() {
    let a = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let b = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let ta = a.begin().unwrap();
    let tb = b.begin().unwrap();
    assert_eq!(ta.slot(), tb.slot());
    let m = Mark::new(E01, ConsumerFirstAccept);
    assert_eq!(b.record(ta, m), Outcome::ForeignToken);
    assert!(b.close(ta).is_empty());
    assert_eq!(b.snapshot(tb).state(), RequestState::Open);
    let forged = Token::from_u128(ta.to_u128() | 0xffff_0000_0000);
    assert_eq!(a.record(forged, m), Outcome::Invalid);
    let gen0 = Token::from_u128(ta.to_u128() & !0xffff_ffff);
    assert_eq!(a.record(gen0, m), Outcome::Invalid);
    assert!(a.snapshot(forged).is_empty());
}

#[test]
fn a_disabled_recorder_records_nothing_and_answers_everything() {
    let rec = Recorder::disabled();
    assert!(!rec.is_enabled());
    assert_eq!(rec.begin(), Err(Outcome::Disabled));
    let t = Token::from_u128(1);
    assert_eq!(
        rec.record(t, Mark::new(E01, ConsumerFirstAccept)),
        Outcome::Disabled
    );
    assert_eq!(
        rec.record_elapsed(t, Mark::new(E01, ConsumerFirstAccept), 1.0, "x"),
        Outcome::Disabled
    );
    assert_eq!(rec.start_segment(t, E01, 1), Outcome::Disabled);
    assert_eq!(rec.close(t).state(), RequestState::Gone);
    assert!(rec.open_requests().unwrap().is_empty());
    assert!(rec.counters().refused.is_empty());
}

#[test]
fn attach_reads_the_declared_geometry_and_schema() {
    let (_d, path, rec) = region();
    let other = Recorder::attach(&path).unwrap();
    assert_eq!(other.edges(), rec.edges());
    assert_eq!(other.schema(), rec.schema());
    assert_eq!(other.info().unwrap(), rec.info().unwrap());
    let t = rec.begin().unwrap();
    assert_eq!(
        other.record_elapsed(t, Mark::new(E12, ConsumerFirstAccept), 3.0, "device"),
        Outcome::Recorded
    );
    assert_eq!(
        rec.snapshot(t)
            .segment(E12, 0)
            .unwrap()
            .domain(ConsumerFirstAccept),
        Some("device")
    );
    let want = Schema::stream_edges().with_domain("device").unwrap();
    AttachOptions::new()
        .expect_schema(want)
        .expect_edges([E01, E12])
        .attach(&path)
        .unwrap();
    assert!(matches!(
        AttachOptions::new()
            .expect_schema(Schema::stream_edges())
            .attach(&path),
        Err(AttachError::SchemaMismatch)
    ));
    assert!(matches!(
        AttachOptions::new().expect_edges([E01]).attach(&path),
        Err(AttachError::EdgeMismatch)
    ));
}

#[test]
fn regions_are_created_exclusively_owner_only_and_never_through_symlinks() {
    let (dir, path, _rec) = region();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = Recorder::builder().edge(0, 1).create(&path);
    assert!(matches!(again, Err(CreateError::Exists(_))), "{again:?}");
    let link = dir.path().join("link.region");
    std::os::unix::fs::symlink(dir.path().join("target.region"), &link).unwrap();
    assert!(matches!(
        Recorder::builder().edge(0, 1).create(&link),
        Err(CreateError::Exists(_))
    ));
    assert!(!dir.path().join("target.region").exists());
    std::os::unix::fs::symlink(&path, dir.path().join("to-region")).unwrap();
    assert!(matches!(
        Recorder::attach(dir.path().join("to-region")),
        Err(AttachError::NotRegularFile(_))
    ));
    let g = dir.path().join("group.region");
    Recorder::builder()
        .edge(0, 1)
        .group_access(true)
        .create(&g)
        .unwrap();
    assert_eq!(
        std::fs::metadata(&g).unwrap().permissions().mode() & 0o777,
        0o660
    );
}

#[test]
fn bad_creation_arguments_are_errors() {
    let b = Recorder::builder();
    assert!(matches!(
        b.clone().create_in_memory(),
        Err(CreateError::NoEdges)
    ));
    assert!(matches!(
        b.clone().edge(1, 1).create_in_memory(),
        Err(CreateError::BadEdge(_))
    ));
    assert!(matches!(
        b.clone().edge(0, 1).edge(0, 1).create_in_memory(),
        Err(CreateError::BadEdge(_))
    ));
    assert!(matches!(
        b.clone().edge(0, 1).slots(0).create_in_memory(),
        Err(CreateError::Geometry(_))
    ));
    assert!(matches!(
        b.clone().edge(0, 1).segments(0).create_in_memory(),
        Err(CreateError::Geometry(_))
    ));
    assert!(matches!(
        b.clone().edge(0, 1).domain("").create_in_memory(),
        Err(CreateError::Schema(_))
    ));
    let long = "d".repeat(33);
    assert!(matches!(
        b.clone().edge(0, 1).domain(&long).create_in_memory(),
        Err(CreateError::Schema(_))
    ));
    let mut many = b.clone().edge(0, 1);
    for i in 1..edgemark::limits::MAX_DOMAINS {
        many = many.domain(&format!("d{i}"));
    }
    assert!(many.clone().create_in_memory().is_ok(), "32 domains fit");
    let e = many.domain("one_more").create_in_memory().unwrap_err();
    assert!(matches!(
        e,
        CreateError::Schema(edgemark::schema::SchemaError::TooManyDomains)
    ));
    assert!(e.to_string().contains("too many clock domains"), "{e}");
    let e = b
        .clone()
        .edge(0, 1)
        .domain("bad\u{1b}]0;title\u{7}")
        .create_in_memory()
        .unwrap_err();
    assert!(!e.to_string().contains('\u{1b}'), "escaped: {e}");
    for e in [
        CreateError::NoEdges,
        CreateError::Geometry(edgemark::GeometryError::Flags(4)),
    ] {
        assert!(!e.to_string().is_empty());
    }
}

/// A name that reads as another (a bidirectional override turns
/// `\u{202e}evil` into "live" on screen) or hides characters is refused
/// where control characters are: at creation, and when a record would
/// register it; the error shows it escaped.
#[test]
fn names_with_bidi_controls_or_invisible_format_characters_are_refused() {
    for bad in [
        "\u{202e}evil",
        "gpu\u{2066}",
        "a\u{200f}b",
        "zero\u{200b}width",
        "bom\u{feff}",
        "tag\u{e0041}",
        "line\u{2028}break",
    ] {
        let e = Recorder::builder()
            .edge(0, 1)
            .domain(bad)
            .create_in_memory()
            .unwrap_err();
        assert!(
            matches!(&e, CreateError::Schema(edgemark::schema::SchemaError::BadName(n)) if n == bad),
            "{bad:?}: {e}"
        );
        let text = e.to_string();
        assert!(text.is_ascii(), "the name is shown escaped: {text}");
        let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
        let t = rec.begin().unwrap();
        let emit = Mark::new(E01, ProducerFirstNonemptyEmit);
        assert_eq!(
            rec.record_elapsed(t, emit, 1.0, bad),
            Outcome::UnknownDomain
        );
        assert_eq!(rec.register_domain(bad), Err(Outcome::UnknownDomain));
    }
    // Visible non-ASCII names stay valid.
    for good in ["gpu-été", "設備", "ﬁ"] {
        assert!(
            Recorder::builder()
                .edge(0, 1)
                .domain(good)
                .create_in_memory()
                .is_ok(),
            "{good:?}"
        );
    }
}

#[test]
fn attach_refuses_files_that_are_not_regions_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x");
    assert!(matches!(Recorder::attach(&p), Err(AttachError::Io(..))));
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(
        Recorder::attach(&p),
        Err(AttachError::NotInitialised)
    ));
    std::fs::write(&p, vec![0u8; 4096]).unwrap();
    assert!(matches!(
        Recorder::attach(&p),
        Err(AttachError::NotInitialised)
    ));
    std::fs::write(&p, b"hello").unwrap();
    assert!(matches!(
        Recorder::attach(&p),
        Err(AttachError::Length { .. })
    ));
    std::fs::write(&p, vec![0x5au8; 8192]).unwrap();
    assert!(matches!(Recorder::attach(&p), Err(AttachError::BadMagic)));
    assert!(matches!(
        Recorder::attach(dir.path()),
        Err(AttachError::NotRegularFile(_)) | Err(AttachError::Io(..))
    ));
}

#[test]
fn attach_validates_every_header_field() {
    // (word, value, what must be refused)
    type Want = fn(&AttachError) -> bool;
    let cases: [(usize, u64, Want); 15] = [
        (1, 0, |e| matches!(e, AttachError::NotInitialised)),
        (1, 2, |e| matches!(e, AttachError::UnsupportedVersion(2))),
        // Format 3: the ring's state word before acknowledgment.
        (1, 3, |e| matches!(e, AttachError::UnsupportedVersion(3))),
        (1, 5, |e| matches!(e, AttachError::UnsupportedVersion(5))),
        (2, 8192, |e| matches!(e, AttachError::Geometry(_))),
        (3, 1, |e| matches!(e, AttachError::Geometry(_))),
        (4, 9, |e| {
            matches!(e, AttachError::Geometry(_) | AttachError::Length { .. })
        }),
        (4, u64::MAX, |e| matches!(e, AttachError::Geometry(_))),
        (9, 64, |e| matches!(e, AttachError::Geometry(_))),
        (12, 0xdead, |e| matches!(e, AttachError::BootMismatch)),
        (14, 0xbeef, |e| {
            matches!(e, AttachError::TimeNamespaceMismatch)
        }),
        // The ring of closed requests: its entry count, stride and offset.
        (21, 1 << 40, |e| matches!(e, AttachError::Geometry(_))),
        (21, 7, |e| {
            matches!(e, AttachError::Geometry(_) | AttachError::Length { .. })
        }),
        (22, 64, |e| matches!(e, AttachError::Geometry(_))),
        (23, 4096, |e| matches!(e, AttachError::Geometry(_))),
    ];
    for (word, value, want) in cases {
        let (_d, path, _rec) = region();
        poke(&path, word, value);
        match Recorder::attach(&path) {
            Err(e) => {
                assert!(want(&e), "word {word} = {value}: {e:?}");
                assert!(!e.to_string().is_empty());
            }
            Ok(_) => panic!("word {word} = {value} was accepted"),
        }
    }
}

#[test]
fn a_region_of_the_format_before_the_rings_acknowledgment_is_refused_by_name() {
    // Format 3 had the same geometry: only the version tells it apart.
    let (_d, path, _rec) = region();
    poke(&path, 1, 3);
    let e = Recorder::attach(&path).unwrap_err();
    assert!(matches!(e, AttachError::UnsupportedVersion(3)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "region format version 3 is not supported (this build reads version 4)"
    );
}

#[test]
fn a_truncated_or_extended_file_is_refused() {
    for delta in [-8i64, 8, 4096] {
        let (_d, path, rec) = region();
        let len = rec.info().unwrap().bytes as i64;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len((len + delta) as u64).unwrap();
        let e = Recorder::attach(&path).unwrap_err();
        assert!(
            matches!(e, AttachError::Length { .. } | AttachError::Geometry(_)),
            "{delta}: {e:?}"
        );
    }
}

#[test]
fn a_foreign_clock_is_refused_or_fenced_from_the_shared_domain() {
    let (_d, path, rec) = region();
    let t = rec.begin().unwrap();
    poke(&path, 12, 0x1234); // as if created in another boot
    let refused = Recorder::attach(&path).unwrap_err();
    assert!(matches!(refused, AttachError::BootMismatch));
    let other = AttachOptions::new()
        .allow_foreign_clock(true)
        .attach(&path)
        .unwrap();
    assert!(!other.info().unwrap().shares_clock);
    let m = Mark::new(E01, ConsumerFirstAccept);
    assert_eq!(other.record(t, m), Outcome::ClockMismatch);
    assert_eq!(
        other.record_elapsed(t, m, 1.0, "host_monotonic"),
        Outcome::ClockMismatch
    );
    assert_eq!(other.record_elapsed(t, m, 1.0, "device"), Outcome::Recorded);
    assert_eq!(
        rec.snapshot(t)
            .segment(E01, 0)
            .unwrap()
            .domain(ConsumerFirstAccept),
        Some("device")
    );
}

#[test]
fn events_in_other_domains_cannot_be_read_off_the_shared_clock() {
    let schema = Schema::empty()
        .with_domain("gpu")
        .unwrap()
        .with_event("kernel_start", "gpu", false)
        .unwrap()
        .with_event("host_seen", "host_monotonic", true)
        .unwrap();
    let rec = Recorder::builder()
        .edge(0, 1)
        .schema(schema)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let k = rec.event("kernel_start").unwrap();
    let h = rec.event("host_seen").unwrap();
    assert_eq!(rec.record(t, Mark::new(E01, k)), Outcome::ClockMismatch);
    assert_eq!(
        rec.record_elapsed(t, Mark::new(E01, k), 2.0, "gpu"),
        Outcome::Recorded
    );
    assert_eq!(
        rec.record(t, Mark::new(E01, h).chunk_seq(4)),
        Outcome::Recorded
    );
    let v = rec.close(t).to_json();
    let seg = &v["0->1:0"];
    assert_eq!(seg["kernel_start_ms"], 2.0);
    assert!(seg["host_seen_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(seg["first_chunk_seq"], 4);
    assert_eq!(seg["clock_domains"]["kernel_start"], "gpu");
}

#[test]
fn the_shared_clock_records_elapsed_time_since_begin() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let t = rec.begin().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert_eq!(
        rec.record(t, Mark::new(E01, ProducerFirstNonemptyEmit)),
        Outcome::Recorded
    );
    let s = rec.close(t);
    let v = s
        .segment(E01, 0)
        .unwrap()
        .elapsed_ms(ProducerFirstNonemptyEmit)
        .unwrap();
    assert!(v >= 2.0, "{v}");
}

#[test]
fn open_requests_and_their_owner_are_listed() {
    let (_d, path, rec) = region();
    let ts: Vec<Token> = (0..3).map(|_| rec.begin().unwrap()).collect();
    rec.close(ts[1]);
    let other = Recorder::attach(&path).unwrap();
    let mut open = other.open_requests().unwrap();
    open.sort_by_key(|t| t.slot());
    assert_eq!(open, vec![ts[0], ts[2]]);
    assert_eq!(other.snapshot_open().unwrap().len(), 2);
    assert_eq!(
        other.owner(ts[0]).unwrap().pid,
        u64::from(std::process::id())
    );
}

#[test]
fn closed_requests_reach_the_histograms_exactly_once() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .create_in_memory()
        .unwrap();
    for _ in 0..3 {
        let t = rec.begin().unwrap();
        assert_eq!(
            at(&rec, t, Mark::new(E01, ProducerFirstNonemptyEmit), 10.0),
            Outcome::Recorded
        );
        assert_eq!(
            at(&rec, t, Mark::new(E01, EdgeFirstSendComplete), 12.0),
            Outcome::Recorded
        );
        // Out of order: a value, but no delta.
        assert_eq!(
            at(&rec, t, Mark::new(E01, ConsumerFirstAccept), 11.0),
            Outcome::Recorded
        );
        rec.close(t);
        rec.close(t); // idempotent: counted once
    }
    let open = rec.begin().unwrap();
    assert_eq!(
        at(&rec, open, Mark::new(E12, ProducerFirstNonemptyEmit), 1.0),
        Outcome::Recorded
    );
    let c = rec.counters();
    assert_eq!(c.closed_requests, 3);
    let hs = rec.histograms().unwrap();
    assert_eq!(hs.len(), 2 * 7);
    let get = |edge: Edge, metric: &str| {
        hs.iter()
            .find(|h| h.edge == edge && h.metric == metric)
            .unwrap()
            .histogram
            .clone()
    };
    let emit = get(E01, "producer_first_nonempty_emit");
    assert_eq!(emit.count, 3);
    assert_eq!(emit.sum_ms, 30.0);
    let le10 = edgemark::report::BUCKETS_MS
        .iter()
        .position(|b| *b == 10.0)
        .unwrap();
    assert_eq!(emit.buckets[le10], 3);
    assert_eq!(emit.cumulative().last(), Some(&(f64::INFINITY, 3)));
    let d = get(
        E01,
        "producer_first_nonempty_emit__to__edge_first_send_complete",
    );
    assert_eq!((d.count, d.sum_ms), (3, 6.0));
    assert_eq!(
        get(E01, "edge_first_send_complete__to__consumer_first_accept").count,
        0
    );
    assert_eq!(get(E01, "consumer_first_accept").count, 3);
    assert_eq!(
        get(E12, "producer_first_nonempty_emit").count,
        0,
        "open requests are not counted"
    );
    rec.close(open);
    assert_eq!(rec.counters().closed_requests, 4);
    assert_eq!(
        rec.histograms()
            .unwrap()
            .iter()
            .find(|h| h.edge == E12 && h.metric == "producer_first_nonempty_emit")
            .unwrap()
            .histogram
            .count,
        1
    );
}

/// A sweep of a sparse region (an opt-in; regions reserve their space by
/// default) reads only the slots that were ever written:
/// the untouched part of the file stays a hole, so an `inspect` of a large,
/// mostly empty region does not commit its size in memory.
#[test]
fn sweeps_of_a_sparse_region_leave_its_holes_alone() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir_in(edgemark::default_dir()).unwrap();
    let p = dir.path().join("sparse.region");
    let owner = Recorder::builder()
        .edge(0, 1)
        .slots(1 << 20)
        .sparse(true)
        .create(&p)
        .unwrap();
    let bytes = owner.info().unwrap().bytes;
    assert!(bytes > 200 << 20, "{bytes}");
    let ts: Vec<Token> = (0..3).map(|_| owner.begin().unwrap()).collect();
    let allocated = || std::fs::metadata(&p).unwrap().blocks() * 512;
    let before = allocated();
    assert!(before < 8 << 20, "a new region is sparse: {before} bytes");
    let reader = Recorder::attach(&p).unwrap();
    let mut open = reader.open_requests().unwrap();
    open.sort_by_key(|t| t.slot());
    assert_eq!(open, ts);
    assert_eq!(reader.snapshot_open().unwrap().len(), 3);
    assert_eq!(reader.reclaim_dead_owners().unwrap().freed(), 0);
    // The report (what `inspect` prints): a sweep, and a pass over the
    // ring of closed requests, which no close has written yet.
    let report = reader.report().unwrap().unwrap();
    assert_eq!(report.occupancy.open_requests, 3);
    assert_eq!(report.occupancy.closed_unread, 0);
    // A registered reader of that ring: its registration and an adoption
    // look for what earlier readers left, and find nothing.
    let closed = reader.closed_reader().unwrap();
    assert_eq!(closed.adopt_where(|_| true, &mut Vec::new()), 0);
    drop(closed);
    let after = allocated();
    assert!(
        after < before + (1 << 20),
        "the sweeps allocated {} bytes of a {bytes}-byte region",
        after - before
    );
}

/// The fuzzer's seed (`fuzz/seeds`, named in `fuzz/fuzz_targets/attach.rs`)
/// is a working region of this format, so that fuzzing starts past the
/// header checks; a format change that breaks it fails here.
#[test]
fn the_fuzz_seed_is_a_working_region() {
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/seeds/two-slots.bin"
    ))
    .unwrap();
    let rec = edgemark::AttachOptions::new()
        .allow_foreign_clock(true)
        .attach_copy(&bytes)
        .unwrap();
    assert_eq!(rec.info().unwrap().slots, 2);
    assert_eq!(rec.edges(), [Edge::new(0, 1)]);
}

#[test]
fn a_sweep_into_a_kept_buffer_replaces_what_it_held() {
    let (_dir, _path, rec) = region();
    let a = rec.begin().unwrap();
    let b = rec.begin().unwrap();
    assert_eq!(
        at(&rec, a, Mark::new(E01, ProducerFirstNonemptyEmit), 1.0),
        Outcome::Recorded
    );
    // b has more edge segments than a snapshot holds inline.
    let accept = |edge, seg| Mark::new(edge, ConsumerFirstAccept).segment(seg);
    assert_eq!(at(&rec, b, accept(E01, 0), 2.0), Outcome::Recorded);
    assert_eq!(rec.start_segment(b, E01, 1), Outcome::Started);
    assert_eq!(at(&rec, b, accept(E01, 1), 3.0), Outcome::Recorded);
    assert_eq!(at(&rec, b, accept(E12, 0), 4.0), Outcome::Recorded);
    let mut open = Vec::new();
    rec.snapshot_open_into(&mut open).unwrap();
    assert_eq!(open, rec.snapshot_open().unwrap());
    assert_eq!(open.len(), 2);
    assert_eq!(open[1].1.segments().len(), 3);
    assert_eq!(
        open[1]
            .1
            .segment(E01, 1)
            .unwrap()
            .elapsed_ms(ConsumerFirstAccept),
        Some(3.0)
    );
    // Fewer requests: the buffer shrinks to them, and what it held for a
    // slot now used by another request is replaced.
    rec.close(a);
    let c = rec.begin().unwrap();
    rec.close(b);
    rec.snapshot_open_into(&mut open).unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].0, c);
    assert!(open[0].1.is_empty());
    assert_eq!(open, rec.snapshot_open().unwrap());
    rec.close(c);
    rec.snapshot_open_into(&mut open).unwrap();
    assert!(open.is_empty());
    // A disabled recorder sweeps nothing into it.
    open.push((c, rec.snapshot(c)));
    Recorder::disabled().snapshot_open_into(&mut open).unwrap();
    assert!(open.is_empty());
}

/// Minor page faults taken by the calling thread so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value we own
    // and pass by a valid pointer.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut u), 0);
        u.ru_minflt
    }
}

/// A region whose space is reserved (the default) is mapped with its page
/// tables filled, by its creator and by every process that attaches it:
/// beginning, recording into and polling every slot of a fresh default
/// region takes no first-touch page fault (each one cost 5-20 us on the
/// benchmark machine; see `docs/benchmarks.md`, "Visibility").
#[test]
fn a_reserved_region_is_mapped_whole_so_records_and_polls_take_no_page_fault() {
    let dir = tempfile::tempdir_in(edgemark::default_dir()).unwrap();
    let p = dir.path().join("populated.region");
    let owner = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .create(&p)
        .unwrap();
    let slots = owner.info().unwrap().slots as usize;
    let reader = AttachOptions::new().view(&p).unwrap();
    // The tokens' buffer is touched before counting.
    let mut tokens = vec![Token::from_u128(1); slots];
    tokens.clear();
    let mark = Mark::new(E12, ConsumerFirstNonemptyOutput);
    let before = thread_minor_faults();
    for _ in 0..slots {
        tokens.push(owner.begin().unwrap());
    }
    for t in &tokens {
        assert_eq!(owner.record(*t, mark), Outcome::Recorded);
    }
    for t in &tokens {
        let s = reader.snapshot(*t);
        assert!(
            s.segment(E12, 0)
                .unwrap()
                .get(ConsumerFirstNonemptyOutput)
                .is_some()
        );
    }
    let faults = thread_minor_faults() - before;
    // Without the filled page tables this is several hundred (one write
    // fault per page the owner first writes, one read fault per 16 pages
    // the reader first reads); a few are left for the allocator and stack.
    assert!(faults < 32, "{faults} page faults over {slots} slots");
}
