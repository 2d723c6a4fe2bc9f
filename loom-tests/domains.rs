//! Models of the clock-domain table: processes register domains at run
//! time.

use super::*;

// ---------------------------------------------------------------------------
// Model 9: processes register clock domains at run time.
// ---------------------------------------------------------------------------

/// What a registration model's reader saw of entry 1 at two moments:
/// `Ok(None)` not ready, `Ok(Some(name))` ready, `Err(())` garbled.
type EntryView = Result<Option<String>, ()>;

/// Two registrants of one name and a reader of the entry they race for, over
/// one domain table (each registrant stands for a separate process: there is
/// no per-process cache in the table). Both get the same id, 1 (the first
/// free entry after the shared clock); the reader sees the entry not ready
/// or ready with the name, never garbled, and never ready then not ready.
#[test]
fn m9a_two_registrants_of_one_name() {
    const NAME: &str = "m9a_two_registrants_of_one_name";
    let seen = explore(NAME, || {
        let table = Arc::new(edgemark::LoomTable::new());
        let (t1, t2) = (Arc::clone(&table), Arc::clone(&table));
        let b = spawn(move || t1.register("sender"));
        let r = spawn(move || (t2.inspect(1), t2.inspect(1)));
        let a = table.register("sender");
        let b = b.join().unwrap();
        let (r1, r2): (EntryView, EntryView) = r.join().unwrap();
        (a, b, r1, r2, table.inspect(1), table.inspect(2))
    });
    let ready = Ok(Some("sender".to_owned()));
    assert_only(NAME, &seen, |(a, b, r1, r2, end1, end2)| {
        *a == Some(1)
            && *b == Some(1)
            && (*r1 == Ok(None) || *r1 == ready)
            && (*r2 == Ok(None) || *r2 == ready)
            && !(*r1 == ready && *r2 == Ok(None))
            && *end1 == ready
            && *end2 == Ok(None)
    });
    assert_seen(NAME, &seen, "the reader before publication", |o| {
        o.2 == Ok(None)
    });
    assert_seen(NAME, &seen, "the reader after publication", |o| {
        o.2 == ready
    });
}

/// Two registrants of different names and a reader: they get ids 1 and 2 in
/// either order, each entry ends ready with its own name, and the reader
/// never sees entry 1 garbled or holding a third name.
#[test]
fn m9b_two_registrants_of_two_names() {
    const NAME: &str = "m9b_two_registrants_of_two_names";
    let seen = explore(NAME, || {
        let table = Arc::new(edgemark::LoomTable::new());
        let (t1, t2) = (Arc::clone(&table), Arc::clone(&table));
        let b = spawn(move || t1.register("receiver"));
        let r = spawn(move || t2.inspect(1));
        let a = table.register("sender");
        let b = b.join().unwrap();
        let r: EntryView = r.join().unwrap();
        (a, b, r, table.inspect(1), table.inspect(2))
    });
    let name = |n: &str| Ok(Some(n.to_owned()));
    assert_only(NAME, &seen, |(a, b, r, end1, end2)| {
        let (first, second) = match (a, b) {
            (Some(1), Some(2)) => ("sender", "receiver"),
            (Some(2), Some(1)) => ("receiver", "sender"),
            _ => return false,
        };
        *end1 == name(first) && *end2 == name(second) && (*r == Ok(None) || *r == name(first))
    });
    assert_seen(NAME, &seen, "the first name winning entry 1", |o| {
        o.0 == Some(1)
    });
    assert_seen(NAME, &seen, "the second name winning entry 1", |o| {
        o.1 == Some(1)
    });
    assert_seen(NAME, &seen, "the reader seeing entry 1 ready", |o| {
        o.2.as_ref().is_ok_and(|n| n.is_some())
    });
}
