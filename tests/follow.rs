//! The core's follower of a region file (`edgemark::follow`): the file at a
//! path attached again when another takes its place, a gone or unusable
//! file said once per reason, and a ring reader that adopts what a dead
//! reader left and attaches again after a failed take.

use std::path::Path;

use edgemark::follow::{Followed, Look, RingFollower};
use edgemark::{AttachOptions, Recorder, Viewer};

fn create(path: &Path) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .closed_entries(16)
        .create(path)
        .unwrap()
}

fn region_id(v: &Viewer) -> String {
    v.info().unwrap().region_id.to_string()
}

#[test]
fn a_followed_file_is_kept_while_it_is_there_and_attached_again_when_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let first = create(&path);
    let mut f: Followed<Viewer> = Followed::new(&path);
    let mut attaches = 0;
    let mut look = |f: &mut Followed<Viewer>| {
        f.look(|p| {
            attaches += 1;
            Viewer::attach(p)
        })
    };
    assert_eq!(look(&mut f), Look::Attached { replaced: false });
    assert_eq!(look(&mut f), Look::Same);
    assert_eq!(look(&mut f), Look::Same);
    let first_id = region_id(f.current().unwrap());
    assert_eq!(first_id, first.info().unwrap().region_id.to_string());

    // Removed: gone, said once, nothing attached.
    drop(first);
    std::fs::remove_file(&path).unwrap();
    match look(&mut f) {
        Look::Failing { why, new, gone } => {
            assert!(new && gone, "{why}");
            assert!(why.contains("r.region"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(f.current().is_none());
    assert!(matches!(look(&mut f), Look::Failing { new: false, .. }));

    // Something that is not a region: a new reason, not gone.
    std::fs::write(&path, b"not a region").unwrap();
    match look(&mut f) {
        Look::Failing { why, new, gone } => assert!(new && !gone, "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(look(&mut f), Look::Failing { new: false, .. }));

    // A region there again: attached, not a replacement of one attached.
    std::fs::remove_file(&path).unwrap();
    let second = create(&path);
    assert_eq!(look(&mut f), Look::Attached { replaced: false });
    assert_eq!(
        region_id(f.current().unwrap()),
        second.info().unwrap().region_id.to_string()
    );

    // Replaced while attached: another file at the name.
    let other = dir.path().join("other.region");
    let third = create(&other);
    std::fs::rename(&other, &path).unwrap();
    assert_eq!(look(&mut f), Look::Attached { replaced: true });
    assert_eq!(
        region_id(f.current().unwrap()),
        third.info().unwrap().region_id.to_string()
    );
    assert_eq!(
        attaches, 5,
        "one attach per new file, none for the same one"
    );
}

#[test]
fn a_followed_value_made_before_starts_attached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let _rec = create(&path);
    let mut f = Followed::attached(&path, Viewer::attach(&path).unwrap());
    let mut called = false;
    let look = f.look(|p| {
        called = true;
        Viewer::attach(p)
    });
    assert_eq!(look, Look::Same);
    assert!(!called);
    // Let go after a failure: the same file is attached again.
    f.drop_current();
    assert_eq!(
        f.look(|p| Viewer::attach(p)),
        Look::Attached { replaced: false }
    );
}

#[test]
fn a_ring_follower_takes_adopts_and_follows_a_replaced_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = create(&path);
    for _ in 0..3 {
        let t = rec.begin().unwrap();
        rec.close(t);
    }
    // A reader that took two and stopped without settling them (dropped:
    // they stay taken in the ring, for the next reader in its slot).
    {
        let gone = rec.closed_reader().unwrap();
        let mut took = Vec::new();
        assert_eq!(gone.take(2, &mut took).unwrap().taken, 2);
    }
    let mut follower = RingFollower::new(&path, AttachOptions::new());
    assert!(follower.reader().is_none());
    let mut closed = Vec::new();
    assert_eq!(
        follower.take(16, &mut closed),
        Default::default(),
        "nothing attached, nothing taken"
    );
    assert_eq!(follower.look(), Look::Attached { replaced: false });
    let step = follower.take(16, &mut closed);
    assert_eq!((step.adopted, step.taken), (2, 1), "{step:?}");
    assert_eq!(closed.len(), 3);
    for c in &closed {
        assert!(follower.reader().unwrap().acknowledge(c.claim()));
    }

    // Another file at the path: the follower attaches it at its next look
    // and takes from its ring.
    let other = dir.path().join("other.region");
    let rec2 = create(&other);
    let t = rec2.begin().unwrap();
    rec2.close(t);
    std::fs::rename(&other, &path).unwrap();
    assert_eq!(follower.look(), Look::Attached { replaced: true });
    closed.clear();
    let step = follower.take(16, &mut closed);
    assert_eq!(step.taken, 1, "{step:?}");
    assert!(follower.reader().unwrap().acknowledge(closed[0].claim()));
    assert_eq!(rec2.counters().closed_acknowledged, 1);
    assert_eq!(
        rec.counters().closed_acknowledged,
        3,
        "the old file's count unchanged"
    );
}

#[test]
fn a_ring_follower_says_a_region_without_a_ring_cannot_be_used() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let _rec = Recorder::builder()
        .edge(0, 1)
        .closed_entries(0)
        .create(&path)
        .unwrap();
    let mut follower = RingFollower::new(&path, AttachOptions::new());
    match follower.look() {
        Look::Failing { why, new, gone } => {
            assert!(new && !gone);
            assert!(why.contains("closed requests"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(follower.reader().is_none());
}

#[test]
fn a_ring_follower_drains_a_removed_file_until_another_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = create(&path);
    let mut follower = RingFollower::new(&path, AttachOptions::new());
    assert_eq!(follower.look(), Look::Attached { replaced: false });
    rec.close(rec.begin().unwrap());
    rec.close(rec.begin().unwrap());
    std::fs::remove_file(&path).unwrap();
    match follower.look() {
        Look::Failing { new, gone, .. } => assert!(new && gone),
        other => panic!("{other:?}"),
    }
    // Its ring is still read: what the closes left there is taken.
    let mut closed = Vec::new();
    assert_eq!(follower.take(16, &mut closed).taken, 2);
    for c in &closed {
        assert!(follower.reader().unwrap().acknowledge(c.claim()));
    }
    assert_eq!(rec.counters().closed_acknowledged, 2);
    // A new file at the name takes its place.
    let _new = create(&path);
    assert_eq!(follower.look(), Look::Attached { replaced: true });
}
