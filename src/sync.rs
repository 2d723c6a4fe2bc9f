//! The one place the protocol gets its atomics from.
//!
//! Production builds use `core`'s atomics; a build with `--cfg edgemark_loom`
//! uses loom's, so that the loom models in `loom-tests/` drive exactly the
//! protocol code that runs over a mapped region, only over heap storage
//! (loom's atomics cannot live in a mapping). `clippy.toml` forbids the core
//! atomic types everywhere else.

#![allow(clippy::disallowed_types)]

#[cfg(edgemark_loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(not(edgemark_loom))]
pub(crate) use core::sync::atomic::AtomicU64;

pub(crate) use core::sync::atomic::Ordering;

// A region is shared between processes, so a lock-based emulation of a
// 64-bit atomic (a spinlock in one process's memory) would be silently wrong.
// The `atomic` crate is used here only for this compile-time proof; its
// `fallback` feature is off.
const _: () = assert!(atomic::Atomic::<u64>::is_lock_free());

/// One step of a bounded wait on another party's control operation.
///
/// Under loom this yields to the model's scheduler, which is how loom
/// explores a spin loop without running it forever.
#[inline]
pub(crate) fn spin_step(round: u32) {
    #[cfg(edgemark_loom)]
    {
        let _ = round;
        loom::thread::yield_now();
    }
    #[cfg(not(edgemark_loom))]
    {
        if round < 64 {
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Makes a zeroed block of atomics on the heap, for in-memory regions.
pub(crate) fn zeroed_words(len: usize) -> Box<[AtomicU64]> {
    (0..len).map(|_| AtomicU64::new(0)).collect()
}
