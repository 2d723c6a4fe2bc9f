//! The README's Rust example runs as written, twice in a row: it removes
//! the region file it creates, so running it again works again.
//!
//! The example below is the README's, line for line (the test checks it),
//! except for its first line and its path (and an attribute that keeps
//! rustfmt from reflowing it): it is a function rather than
//! `main`, and its region goes to a private directory instead of
//! `/dev/shm`, so that concurrent test runs cannot meet on one path.

use std::path::Path;

// README example: begin
use edgemark::{Edge, Event::*, Mark, Outcome, Recorder};

#[rustfmt::skip] // formatted as in the README
fn readme_example(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let path = dir.join("pipeline.region");
    // The orchestrator creates the region and begins each request.
    let owner = Recorder::builder().edge(0, 1).edge(1, 2).create(&path)?;
    let token = owner.begin().expect("a free slot");
    // The token (16 bytes, Copy) travels inside the existing dispatch message,
    // as text (`token.to_string()`), a u128 or 16 bytes.

    // Each stage worker attaches by path once, and records what it observes.
    let worker = Recorder::attach(&path)?;
    let edge = Edge::new(0, 1);
    worker.record(token, Mark::new(edge, ProducerFirstNonemptyEmit).chunk_seq(3));
    worker.record(token, Mark::new(edge, EdgeFirstSendComplete));
    // A heartbeat or an empty terminal payload records nothing.
    assert_eq!(worker.record(token, Mark::new(edge, ConsumerFirstAccept).meaningful(false)), Outcome::NotMeaningful);

    // Any process may snapshot at any time; every removal path closes.
    let so_far = owner.snapshot(token); // detached: the request goes on
    assert_eq!(so_far.segment(edge, 0).unwrap().first_chunk_seq(), Some(3));
    let last = owner.close(token);
    println!("{}", serde_json::to_string(&last)?);

    // The file outlives the processes (that is how workers find it): remove it
    // when the pipeline is done, or the next `create` of this path is refused.
    std::fs::remove_file(&path)?;
    Ok(())
}
// README example: end

/// The README's one Rust block.
fn readme_block() -> String {
    let readme = include_str!("../README.md");
    let start = readme
        .find("```rust\n")
        .expect("the README has a Rust example")
        + 8;
    let len = readme[start..].find("```").expect("a closed block");
    readme[start..start + len].to_owned()
}

#[test]
fn the_readme_rust_example_is_the_one_tested_here() {
    let here = include_str!("readme.rs");
    let from = here.find("// README example: begin\n").unwrap() + 25;
    let to = here.find("// README example: end").unwrap();
    let ours: Vec<&str> = here[from..to]
        .lines()
        .filter(|l| !l.starts_with("#[rustfmt::skip]"))
        .collect();
    let block = readme_block();
    let theirs: Vec<&str> = block.lines().collect();
    assert_eq!(ours.len(), theirs.len(), "README:\n{block}");
    for (a, b) in ours.iter().zip(&theirs) {
        let differs_by_design = (a.starts_with("fn readme_example") && b.starts_with("fn main"))
            || (a.contains("let path = ") && b.contains("let path = "));
        assert!(a == b || differs_by_design, "{a:?} != README's {b:?}");
    }
}

#[test]
fn the_readme_rust_example_runs_twice_in_a_row() {
    let dir = tempfile::tempdir().unwrap();
    readme_example(dir.path()).unwrap();
    readme_example(dir.path()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
