//! The expiry of open requests (`Recorder::expire_open`) racing another
//! expiry, and racing the ordinary close.

use std::time::Duration;

use super::*;

/// Two expirers (as two processes would) of one request with a value: the
/// close of exactly one of them ends it and counts it, once as expired and
/// once as closed; the request reaches the ring's reader once, with its
/// value.
#[test]
fn m13a_two_expirers_count_one_request_once() {
    const NAME: &str = "m13a_two_expirers_count_one_request_once";
    // (A's count, B's count, (expired, closed) counters, the producer
    //  value the reader took, if it took one)
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        assert_eq!(emit(&rec, t, 0, 1.0, 1), Outcome::Recorded);
        let rb = rec.clone();
        let b = spawn(move || rb.expire_open(Duration::ZERO).unwrap().expired);
        let a = rec.expire_open(Duration::ZERO).unwrap().expired;
        let b = b.join().unwrap();
        let c = rec.counters();
        let mut out = Vec::new();
        rec.drain_closed(4, &mut out).unwrap();
        let taken: Vec<Option<(u64, Option<u64>)>> =
            out.iter().map(|r| view(r.snapshot()).producer(0)).collect();
        (a, b, (c.expired_requests, c.closed_requests), taken)
    });
    assert_only(NAME, &seen, |(a, b, counts, taken)| {
        a + b == 1 && *counts == (1, 1) && *taken == [Some((1000, Some(1)))]
    });
    assert_seen(NAME, &seen, "A expiring it", |o| o.0 == 1);
    assert_seen(NAME, &seen, "B expiring it", |o| o.1 == 1);
}

/// An expiry racing the owner's close: exactly one of them ends the
/// request. The close returns the final snapshot and nothing is counted as
/// expired, or the expiry closes it (counted as expired) and the close
/// finds it gone; either way it is counted closed once.
#[test]
fn m13b_an_expiry_races_the_owners_close() {
    const NAME: &str = "m13b_an_expiry_races_the_owners_close";
    // (close's state, the expirer's count, (expired, closed) counters)
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        let rb = rec.clone();
        let expirer = spawn(move || rb.expire_open(Duration::ZERO).unwrap().expired);
        let state = rec.close(t).state();
        let n = expirer.join().unwrap();
        let c = rec.counters();
        (state, n, (c.expired_requests, c.closed_requests))
    });
    assert_only(NAME, &seen, |(state, n, counts)| match state {
        RequestState::Closed => *n == 0 && *counts == (0, 1),
        RequestState::Gone => *n == 1 && *counts == (1, 1),
        _ => false,
    });
    assert_seen(NAME, &seen, "the close winning", |o| {
        o.0 == RequestState::Closed
    });
    assert_seen(NAME, &seen, "the expiry winning", |o| {
        o.0 == RequestState::Gone
    });
}
