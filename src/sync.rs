//! The one place the protocol gets its atomics from.
//!
//! Production builds use `core`'s atomics; a build with `--cfg edgemark_loom`
//! uses loom's, so that the loom models in `loom-tests/` drive exactly the
//! protocol code that runs over a mapped region, only over heap storage
//! (loom's atomics cannot live in a mapping). `clippy.toml` forbids the core
//! atomic types everywhere else.

#![allow(clippy::disallowed_types)]

#[cfg(not(edgemark_loom))]
use core::sync::atomic::AtomicU64 as Inner;
#[cfg(edgemark_loom)]
use loom::sync::atomic::AtomicU64 as Inner;

pub(crate) use core::sync::atomic::Ordering;

/// The 64-bit atomic every protocol word is.
///
/// A transparent wrapper rather than a re-export, so that `clippy.toml` can
/// forbid the core type everywhere else, and so that this file is the one
/// place that says which implementation runs. Without loom it has the size,
/// alignment and bit validity of `u64`, which is what lets a mapped region be
/// viewed as a slice of it.
#[repr(transparent)]
#[derive(Debug)]
pub(crate) struct AtomicU64(Inner);

impl AtomicU64 {
    #[inline]
    pub(crate) fn new(v: u64) -> AtomicU64 {
        AtomicU64(Inner::new(v))
    }
    #[inline(always)]
    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    #[inline(always)]
    pub(crate) fn store(&self, v: u64, order: Ordering) {
        self.0.store(v, order)
    }
    #[inline(always)]
    pub(crate) fn swap(&self, v: u64, order: Ordering) -> u64 {
        self.0.swap(v, order)
    }
    #[inline(always)]
    pub(crate) fn fetch_add(&self, v: u64, order: Ordering) -> u64 {
        self.0.fetch_add(v, order)
    }
    #[inline(always)]
    pub(crate) fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange(current, new, success, failure)
    }
}

#[cfg(not(edgemark_loom))]
const _: () = {
    assert!(core::mem::size_of::<AtomicU64>() == 8);
    assert!(core::mem::align_of::<AtomicU64>() == 8);
};

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
