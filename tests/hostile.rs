//! Hostile region files: arbitrary bytes, lying headers, garbage slots,
//! files shrunk under a reader, foreign owners. Each gives a typed error or
//! a working region; never a panic, never an out-of-bounds access.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;

use common::Rng;
use edgemark::prometheus::{self, Format};
use edgemark::{
    AttachError, AttachOptions, Edge, Event, Event::*, Mark, Outcome, Recorder, RequestState,
    SweepError, Token,
};

/// A value that lies in an interesting way.
fn lie(rng: &mut Rng) -> u64 {
    match rng.below(8) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::from(u32::MAX),
        4 => 1 << rng.below(64),
        5 => rng.below(100_000),
        6 => rng.next() & 0xffff,
        _ => rng.next(),
    }
}

const E01: Edge = Edge::new(0, 1);
const E12: Edge = Edge::new(1, 2);

/// The bytes of a small valid region with open, closed and segmented
/// requests in it.
fn valid_region_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(4)
        .segments(2)
        .domain("gpu")
        .create(&path)
        .unwrap();
    let ts: Vec<Token> = (0..3).map(|_| rec.begin().unwrap()).collect();
    for (i, t) in ts.iter().enumerate() {
        for ev in Event::ALL {
            let m = Mark::new(E01, ev).chunk_seq(i as u64);
            rec.record_elapsed(*t, m, 1.0 + i as f64, "host_monotonic");
        }
        rec.record_elapsed(*t, Mark::new(E12, ConsumerFirstAccept), 2.0, "gpu");
    }
    rec.start_segment(ts[1], E01, 1);
    rec.start_segment(ts[1], E01, 2);
    rec.close(ts[2]);
    std::fs::read(&path).unwrap()
}

/// Everything a reader or writer might do with a region that opened. None of
/// it may panic, loop or touch memory out of bounds; the counts returned are
/// bounded by the geometry.
fn exercise(rec: &Recorder) -> (usize, bool) {
    let info = rec.info().unwrap();
    let _ = rec.counters();
    let hs = rec.histograms().unwrap();
    assert!(
        hs.iter()
            .all(|h| h.histogram.buckets.len() == edgemark::report::BUCKETS_MS.len() + 1)
    );
    let open = rec.snapshot_open().unwrap();
    assert!(open.len() <= info.slots as usize);
    let mut corrupt = false;
    for (t, s) in &open {
        corrupt |= s.is_corrupt();
        let _ = serde_json::to_string(s).unwrap();
        for e in rec.edges() {
            let _ = rec.record(*t, Mark::new(*e, ConsumerFirstAccept));
            let _ = rec.record_elapsed(
                *t,
                Mark::new(*e, ProducerFirstNonemptyEmit).chunk_seq(1),
                1.0,
                "host_monotonic",
            );
            let _ = rec.start_segment(*t, *e, 7);
        }
        let last = rec.close(*t);
        assert!(last.segments().len() <= rec.edges().len() * info.segments as usize);
        corrupt |= last.is_corrupt();
    }
    // Slots that are not open (garbage heads included) refuse quietly.
    for slot in 0..info.slots.min(64) {
        let t = Token::from_u128((u128::from(info.region_id) << 64) | (u128::from(slot) << 32) | 1);
        let _ = rec.snapshot(t);
        let _ = rec.record(t, Mark::new(rec.edges()[0], ConsumerFirstAccept));
        let _ = rec.close(t);
    }
    let mut begun = 0;
    while rec.begin().is_ok() {
        begun += 1;
        assert!(
            begun <= info.slots,
            "begin handed out more slots than exist"
        );
    }
    let _ = rec.reclaim_where(|_| true, |_| true);
    let _ = prometheus::render(rec, Format::OpenMetrics);
    // The ring of closed requests, garbage included: whatever it holds is
    // taken, lost or pending, never a panic; a pending claim is skipped.
    let mut closed = Vec::new();
    for _ in 0..8 {
        let d = rec.drain_closed(64, &mut closed).unwrap();
        if let Some(p) = d.pending {
            rec.skip_closed(p);
        }
    }
    for c in &closed {
        let _ = serde_json::to_string(c.snapshot()).unwrap();
        assert!(c.closed_unix_ns() >= c.origin_unix_ns());
        assert_ne!(c.trace_id(), [0; 16]);
    }
    (open.len(), corrupt)
}

fn attach_bytes(bytes: &[u8]) -> Result<Recorder, AttachError> {
    AttachOptions::new()
        .allow_foreign_clock(true)
        .attach_copy(bytes)
}

#[test]
fn arbitrary_bytes_give_an_error_or_a_working_region() {
    let mut rng = Rng(1);
    let valid = valid_region_bytes();
    let mut errors = 0;
    for case in 0..3000 {
        let len = match case % 4 {
            0 => rng.below(64),
            1 => rng.below(9000),
            2 => 4096 + 8 * rng.below(1024),
            _ => valid.len() as u64,
        } as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if case % 3 == 0 && len >= 16 {
            // A plausible start: the magic and the version of a real
            // region (this format's), so that the rest is parsed.
            bytes[..16].copy_from_slice(&valid[..16]);
        }
        match attach_bytes(&bytes) {
            Ok(rec) => {
                exercise(&rec);
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
        }
    }
    assert!(
        errors > 2900,
        "random bytes are almost never a region ({errors})"
    );
}

#[test]
fn every_header_word_lied_about_gives_an_error_or_a_working_region() {
    let valid = valid_region_bytes();
    assert!(attach_bytes(&valid).is_ok());
    let mut rng = Rng(2);
    let (mut ok, mut refused) = (0, 0);
    // Each of the header's 512 words, several lies each, then random
    // combinations of lies.
    for case in 0..6000u64 {
        let mut bytes = valid.clone();
        let lies = if case < 512 * 8 { 1 } else { 1 + rng.below(6) };
        for i in 0..lies {
            let word = if case < 512 * 8 && i == 0 {
                (case / 8) as usize
            } else {
                rng.below(512) as usize
            };
            let v = lie(&mut rng);
            bytes[word * 8..word * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        match attach_bytes(&bytes) {
            Ok(rec) => {
                exercise(&rec);
                ok += 1;
            }
            Err(_) => refused += 1,
        }
    }
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}

#[test]
fn truncated_extended_and_half_initialised_files_are_refused() {
    let valid = valid_region_bytes();
    let mut rng = Rng(3);
    for _ in 0..500 {
        let cut = rng.below(valid.len() as u64) as usize;
        assert!(attach_bytes(&valid[..cut]).is_err(), "cut at {cut}");
        let mut longer = valid.clone();
        longer.extend((0..1 + rng.below(5000)).map(|_| 0u8));
        assert!(attach_bytes(&longer).is_err());
    }
    let mut half = valid.clone();
    half[8..16].copy_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        attach_bytes(&half),
        Err(AttachError::NotInitialised)
    ));
    let zeros = vec![0u8; valid.len()];
    assert!(matches!(
        attach_bytes(&zeros),
        Err(AttachError::NotInitialised)
    ));
}

#[test]
fn schemas_with_absurd_counts_or_non_utf8_names_are_refused() {
    let valid = valid_region_bytes();
    let put = |b: &mut Vec<u8>, word: usize, v: u64| {
        b[word * 8..word * 8 + 8].copy_from_slice(&v.to_le_bytes())
    };
    // (word, value): event count, domain count, a domain name, an event
    // name, an event's domain index, its flags, an edge that loops.
    for (word, value) in [
        (7, 0),
        (7, 17),
        (7, u64::MAX),
        (8, 0),
        (8, 9),
        // The domain table: the shared clock's entry emptied, its name
        // garbled (no longer its hash), a non-UTF-8 name, a claimed state.
        (256, 0),
        (257, 0xfffe_fdfc),
        (257, u64::from_le_bytes(*b"\xff\xfe\xfd\0\0\0\0\0")),
        (256, 1 << 62),
        (160, 0),
        (160 + 4, 7),
        (160 + 4, 1 << 20),
        (64, 1 | 1 << 32),
        (65, 1 << 32),
    ] {
        let mut b = valid.clone();
        put(&mut b, word, value);
        let e = attach_bytes(&b)
            .err()
            .unwrap_or_else(|| panic!("word {word} = {value:#x} accepted"));
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn garbage_slot_words_are_reported_corrupt_and_never_trusted() {
    let valid = valid_region_bytes();
    let rec = attach_bytes(&valid).unwrap();
    let info = rec.info().unwrap();
    let slot_base = info.slots_offset as usize;
    let stride = info.slot_stride as usize;
    let mut rng = Rng(4);
    let mut corrupt_seen = 0;
    for case in 0..3000 {
        let mut b = valid.clone();
        // Garbage in the slots (and the histograms), never the header.
        let n = 1 + rng.below(8);
        for _ in 0..n {
            let word = (4096 + rng.below(((b.len() - 4096) / 8) as u64) as usize * 8) / 8;
            let v = if case % 2 == 0 {
                lie(&mut rng)
            } else {
                rng.next()
            };
            b[word * 8..word * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        let rec = attach_bytes(&b).expect("a valid header opens whatever the slots hold");
        let (_, corrupt) = exercise(&rec);
        corrupt_seen += usize::from(corrupt);
    }
    assert!(
        corrupt_seen > 100,
        "garbage was reported corrupt {corrupt_seen} times"
    );

    // One precise case: a cell of an open request with bits edgemark never
    // writes.
    let mut b = valid.clone();
    let slot = (0..info.slots)
        .find(|s| {
            let h = u64::from_le_bytes(
                b[slot_base + *s as usize * stride..][..8]
                    .try_into()
                    .unwrap(),
            );
            h & 0xff == 2
        })
        .unwrap();
    let cell = slot_base + slot as usize * stride + (4 + 2 + 1) * 8; // edge 0, entry 0, event 0
    b[cell..cell + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let rec = attach_bytes(&b).unwrap();
    let (t, s) = rec
        .snapshot_open()
        .unwrap()
        .into_iter()
        .find(|(t, _)| t.slot() == slot)
        .unwrap();
    assert!(s.is_corrupt());
    assert_eq!(
        s.segment(E01, 0)
            .and_then(|g| g.get(ProducerFirstNonemptyEmit)),
        None
    );
    assert_eq!(
        rec.record(t, Mark::new(E01, ProducerFirstNonemptyEmit)),
        Outcome::Corrupt
    );
    // A garbage head: the slot is no request at all.
    let head = slot_base + slot as usize * stride;
    b[head..head + 8].copy_from_slice(&0xffu64.to_le_bytes());
    let rec = attach_bytes(&b).unwrap();
    assert_eq!(rec.snapshot(t).state(), RequestState::Gone);
    assert_eq!(
        rec.record(t, Mark::new(E12, ConsumerFirstAccept)),
        Outcome::Corrupt
    );
}

#[test]
fn real_files_with_lying_headers_are_refused_through_attach() {
    let valid = valid_region_bytes();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(5);
    for case in 0..300 {
        let mut b = valid.clone();
        let word = rng.below(240) as usize;
        b[word * 8..word * 8 + 8].copy_from_slice(&lie(&mut rng).to_le_bytes());
        if case % 5 == 0 {
            b.truncate(rng.below(b.len() as u64) as usize);
        }
        let p = dir.path().join(format!("c{case}.region"));
        std::fs::write(&p, &b).unwrap();
        match AttachOptions::new().allow_foreign_clock(true).attach(&p) {
            Ok(rec) => {
                exercise(&rec);
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

fn region_file(dir: &Path) -> (std::path::PathBuf, Recorder) {
    let p = dir.join("r.region");
    let rec = Recorder::builder().edge(0, 1).slots(8).create(&p).unwrap();
    (p, rec)
}

#[test]
fn a_file_shrunk_under_a_reader_fails_its_sweeps_instead_of_faulting() {
    let dir = tempfile::tempdir().unwrap();
    let (p, owner) = region_file(dir.path());
    let t = owner.begin().unwrap();
    let reader = Recorder::attach(&p).unwrap();
    assert_eq!(reader.open_requests().unwrap(), vec![t]);
    let full = owner.info().unwrap().bytes;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096)
        .unwrap();
    assert!(
        matches!(reader.check(), Err(SweepError::Truncated { actual: 4096, expected }) if expected == full)
    );
    // Every sweep says why it cannot sweep, instead of an empty result.
    let shrunk = |e: &SweepError| matches!(e, SweepError::Truncated { actual: 4096, .. });
    assert!(reader.open_requests().is_err_and(|e| shrunk(&e)));
    assert!(reader.snapshot_open().is_err_and(|e| shrunk(&e)));
    assert!(reader.histograms().is_err_and(|e| shrunk(&e)));
    assert!(reader.reclaim_dead_owners().is_err_and(|e| shrunk(&e)));
    let mut called = false;
    assert!(reader.for_each_open(|_, _| called = true).is_err());
    assert!(!called);
    let text = prometheus::render(&reader, Format::OpenMetrics);
    assert!(text.contains("edgemark_region_ok 0"), "{text}");
    assert!(!text.contains("edgemark_open_requests"));
    // Attaching now is refused outright.
    assert!(matches!(
        Recorder::attach(&p),
        Err(AttachError::Length { .. })
    ));
}

#[test]
fn watch_exits_with_one_line_when_its_region_is_shrunk() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _owner) = region_file(dir.path());
    let mut watch = Command::new(common::edgemark_bin())
        .arg("watch")
        .arg(&p)
        .args(["--interval", "0.05", "--count", "400"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Shrink the file once watch shows the region (its first refresh),
    // however slowly it starts; then keep reading what it prints.
    let mut shown = std::io::BufReader::new(watch.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut shown, &mut first).unwrap();
    assert!(!first.is_empty(), "watch printed nothing");
    let drain = std::thread::spawn(move || std::io::copy(&mut shown, &mut std::io::sink()));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let out = watch.wait_with_output().unwrap();
    drain.join().unwrap().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("edgemark: the region changed under this process"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1);
}

#[test]
fn a_recorder_touching_a_shrunk_page_loses_the_record_and_a_sealed_region_cannot_be_shrunk() {
    use std::io::{BufRead, BufReader, Write};
    // A process that records into a page that another process cut off the
    // file survives: the page is replaced (`src/fault.rs`), the record is
    // lost, and the region reports the damage.
    let dir = tempfile::tempdir().unwrap();
    let (p, owner) = region_file(dir.path());
    let ts: Vec<Token> = (0..8).map(|_| owner.begin().unwrap()).collect();
    let far = *ts.iter().max_by_key(|t| t.slot()).unwrap();
    let mut child = Command::new(common::edgemark_bin())
        .arg("batch")
        .arg(&p)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, "record {far} 0->1 consumer_first_accept").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "recorded");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096)
        .unwrap();
    writeln!(stdin, "record {far} 0->1 producer_first_nonempty_emit").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let answer = line.trim();
    assert!(
        !answer.is_empty() && answer != "recorded",
        "the record into a lost page is refused, not a death: {answer:?}"
    );
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    // The owner's own mapping faults too on its next look, and says so.
    assert!(owner.snapshot(far).is_empty());
    assert!(matches!(owner.check(), Err(edgemark::SweepError::Shrunk)));

    // The defence: a sealed region cannot change length, and is shared
    // through /proc/<pid>/fd.
    let sealed = Recorder::builder()
        .edge(0, 1)
        .slots(8)
        .create_sealed()
        .unwrap();
    let path = sealed.path().unwrap().to_owned();
    assert!(path.starts_with("/proc"));
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let e = f.set_len(4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    let t = sealed.begin().unwrap();
    let out = Command::new(common::edgemark_bin())
        .arg("record")
        .arg(&path)
        .arg(t.to_string())
        .args(["0->1", "consumer_first_accept"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "recorded",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        sealed
            .snapshot(t)
            .segment(E01, 0)
            .unwrap()
            .get(ConsumerFirstAccept)
            .is_some()
    );
    let _ = f
        .write_at(&[0u8; 8], 1 << 40)
        .map(|_| panic!("a sealed region grew"));
}

#[test]
fn a_file_of_another_user_is_refused_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _owner) = region_file(dir.path());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Only root can give a file away; the check itself is the uid test.
        let e = AttachOptions::new().attach("/proc/1/environ");
        assert!(e.is_err());
        return;
    }
    std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    assert!(matches!(
        Recorder::attach(&p),
        Err(AttachError::ForeignOwner { uid: 65534 })
    ));
    let rec = AttachOptions::new()
        .allow_foreign_owner(true)
        .attach(&p)
        .unwrap();
    assert!(rec.begin().is_ok());
}

#[test]
fn a_full_region_fails_open_counts_it_and_recovers() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(3)
        .create_in_memory()
        .unwrap();
    let ts: Vec<Token> = (0..3).map(|_| rec.begin().unwrap()).collect();
    for _ in 0..5 {
        assert_eq!(rec.begin(), Err(Outcome::RegionFull));
    }
    let full = |r: &Recorder| {
        r.counters()
            .refused
            .iter()
            .find(|(o, _)| *o == Outcome::RegionFull)
            .unwrap()
            .1
    };
    assert_eq!(full(&rec), 5);
    rec.close(ts[1]);
    let again = rec.begin().unwrap();
    assert_eq!(again.slot(), ts[1].slot());
    assert_eq!(rec.begin(), Err(Outcome::RegionFull));
    assert_eq!(full(&rec), 6);
}

#[test]
fn bad_timestamps_give_an_outcome_and_write_nothing() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .domain("gpu")
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let m = Mark::new(E01, ProducerFirstNonemptyEmit);
    for (ms, domain, want) in [
        (-0.001, "host_monotonic", Outcome::Invalid),
        (f64::NEG_INFINITY, "gpu", Outcome::Invalid),
        (f64::NAN, "gpu", Outcome::Invalid),
        (
            edgemark::limits::MAX_ELAPSED_MS * 2.0,
            "gpu",
            Outcome::OutOfRange,
        ),
        (1e300, "host_monotonic", Outcome::OutOfRange),
        (1.0, "", Outcome::UnknownDomain),
        (1.0, "  ", Outcome::UnknownDomain),
        (1.0, "esc\u{1b}[2J", Outcome::UnknownDomain),
        (1.0, &"x".repeat(33), Outcome::UnknownDomain),
    ] {
        assert_eq!(rec.record_elapsed(t, m, ms, domain), want, "{ms} {domain}");
        assert!(rec.snapshot(t).is_empty());
    }
    assert_eq!(rec.record_elapsed(t, m, 0.0, "gpu"), Outcome::Recorded);
}

/// A hostile file that puts terminal control characters in a name shows
/// them to nobody: attach refuses the name with it escaped, and the command
/// says so in one line without a raw escape.
#[test]
fn control_characters_in_a_hostile_name_are_refused_and_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _owner) = region_file(dir.path());
    // The event table starts at byte 1280: the first event's name.
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"\x1b]0;owned\x07\x1b[2J", 1280).unwrap();
    let e = Recorder::attach(&p).unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains('\u{1b}') && !msg.contains('\u{7}'), "{msg:?}");
    assert!(msg.contains("\\u{1b}"), "the name is shown escaped: {msg}");
    let out = Command::new(common::edgemark_bin())
        .arg("inspect")
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
}

/// edgemark's SIGBUS handler handles faults in its own mappings only: a
/// fault in any other mapping of the process still ends it, as it would
/// without edgemark.
#[test]
fn a_fault_outside_edgemark_mappings_still_ends_the_process() {
    const CHILD: &str = "EDGEMARK_FAULT_OUTSIDE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let dir = tempfile::tempdir().unwrap();
        // An edgemark mapping: the handler is installed.
        let (_p, rec) = region_file(dir.path());
        assert!(rec.check().is_ok());
        // Another file, mapped by hand, then cut under its mapping.
        let q = dir.path().join("other");
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&q)
            .unwrap();
        f.set_len(65536).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file this process owns; no
        // reference is formed into it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                65536,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        f.set_len(4096).unwrap();
        // SAFETY: inside the mapping; the file no longer covers it, so this
        // read faults, which is the point.
        let v = unsafe { std::ptr::read_volatile(p.cast::<u8>().add(32768)) };
        println!("survived, read {v}");
        std::process::exit(0);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_fault_outside_edgemark_mappings_still_ends_the_process",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}
