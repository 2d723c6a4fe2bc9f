//! Any bytes, opened as a region: an error or a working region, never a
//! panic or an out-of-bounds access. From the repository root:
//!
//! ```text
//! cargo +nightly fuzz run attach fuzz/corpus/attach fuzz/seeds
//! ```
//!
//! (new inputs go to the first directory; `fuzz/seeds` holds a small valid
//! region, so that the fuzzer starts past the header checks).
#![no_main]

use edgemark::{AttachOptions, Event, Mark, Token};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(rec) = AttachOptions::new().allow_foreign_clock(true).attach_copy(data) else {
        return;
    };
    let info = rec.info().expect("an enabled recorder");
    let _ = rec.counters();
    let _ = rec.histograms();
    for (t, s) in rec.snapshot_open() {
        let _ = keys_len(&s);
        for e in rec.edges() {
            let _ = rec.record(t, Mark::new(*e, Event::ConsumerFirstAccept));
            let _ = rec.start_segment(t, *e, 3);
        }
        let _ = rec.close(t);
    }
    for slot in 0..info.slots.min(16) {
        let t = Token::from_u128((u128::from(info.region_id) << 64) | (u128::from(slot) << 32) | 1);
        let _ = rec.snapshot(t);
    }
    while rec.begin().is_ok() {}
    let _ = rec.reclaim_where(|_| true, |_| true);
    let _ = edgemark::prometheus::render(&rec, edgemark::prometheus::Format::Text);
});

fn keys_len(s: &edgemark::Snapshot) -> usize {
    s.segments().iter().map(|g| g.key().len()).sum()
}
