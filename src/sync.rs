//! The one place the crate gets its atomics and orderings from.
//!
//! Production builds use `core`'s atomics; a build with `--cfg edgemark_loom`
//! uses loom's for the region's words ([`AtomicU64`], [`fence`]), so that
//! the loom models in `loom-tests/` drive exactly the protocol code that runs
//! over a mapped region, only over heap storage (loom's atomics cannot live
//! in a mapping). Process-local state that no model races (the SIGBUS
//! handler's table, per-process caches) uses [`local`]'s atomics, `core`'s
//! in every build. `clippy.toml` forbids `core`'s and `std`'s atomic types,
//! their `Ordering` and `fence` everywhere else, with no exception: this is
//! the only module that names them.

#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[cfg(not(edgemark_loom))]
use core::sync::atomic::AtomicU64 as Inner;
#[cfg(edgemark_loom)]
use loom::sync::atomic::AtomicU64 as Inner;

/// A memory ordering: `core`'s, named here so that `clippy.toml` can forbid
/// `core`'s type (and with it any atomic call that bypasses this facade)
/// everywhere else. Every use says which operation it pairs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ordering {
    /// No ordering: atomicity only.
    Relaxed,
    /// Later accesses stay after this load.
    Acquire,
    /// Earlier accesses stay before this store.
    Release,
    /// Both, for a read-modify-write.
    AcqRel,
    /// Sequentially consistent.
    #[allow(dead_code)]
    SeqCst,
}

impl Ordering {
    /// The `core` ordering (loom's is the same type).
    #[inline(always)]
    const fn core(self) -> core::sync::atomic::Ordering {
        use core::sync::atomic::Ordering as O;
        match self {
            Ordering::Relaxed => O::Relaxed,
            Ordering::Acquire => O::Acquire,
            Ordering::Release => O::Release,
            Ordering::AcqRel => O::AcqRel,
            Ordering::SeqCst => O::SeqCst,
        }
    }
}

/// A memory fence, loom's under `--cfg edgemark_loom`.
#[inline(always)]
pub(crate) fn fence(order: Ordering) {
    #[cfg(not(edgemark_loom))]
    core::sync::atomic::fence(order.core());
    #[cfg(edgemark_loom)]
    loom::sync::atomic::fence(order.core());
}

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
    #[cfg(edgemark_loom)]
    #[inline]
    pub(crate) fn new(v: u64) -> AtomicU64 {
        AtomicU64(Inner::new(v))
    }
    #[inline(always)]
    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.0.load(order.core())
    }
    #[inline(always)]
    pub(crate) fn store(&self, v: u64, order: Ordering) {
        self.0.store(v, order.core())
    }
    #[inline(always)]
    pub(crate) fn swap(&self, v: u64, order: Ordering) -> u64 {
        self.0.swap(v, order.core())
    }
    #[inline(always)]
    pub(crate) fn fetch_add(&self, v: u64, order: Ordering) -> u64 {
        self.0.fetch_add(v, order.core())
    }
    #[inline(always)]
    pub(crate) fn fetch_or(&self, v: u64, order: Ordering) -> u64 {
        self.0.fetch_or(v, order.core())
    }
    #[inline(always)]
    pub(crate) fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0
            .compare_exchange(current, new, success.core(), failure.core())
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

/// Atomics of process-local state: `core`'s in every build, also under
/// loom, which has nothing to model in them (the SIGBUS handler's table of
/// mappings is not built under loom, and a per-process cache whose stale
/// read only sends its reader to the slow path adds nothing to a model but
/// executions). Each takes this module's [`Ordering`].
pub(crate) mod local {
    use super::Ordering;

    macro_rules! local_atomic {
        ($(#[$doc:meta] $name:ident($core:ident, $t:ty);)*) => {$(
            #[$doc]
            #[repr(transparent)]
            #[derive(Debug)]
            pub(crate) struct $name(core::sync::atomic::$core);

            #[allow(dead_code)]
            impl $name {
                pub(crate) const fn new(v: $t) -> $name {
                    $name(core::sync::atomic::$core::new(v))
                }
                #[inline(always)]
                pub(crate) fn load(&self, order: Ordering) -> $t {
                    self.0.load(order.core())
                }
                #[inline(always)]
                pub(crate) fn store(&self, v: $t, order: Ordering) {
                    self.0.store(v, order.core())
                }
                #[inline(always)]
                pub(crate) fn compare_exchange(
                    &self,
                    current: $t,
                    new: $t,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$t, $t> {
                    self.0
                        .compare_exchange(current, new, success.core(), failure.core())
                }
            }
        )*};
    }

    local_atomic! {
        /// A process-local `AtomicBool`.
        AtomicBool(AtomicBool, bool);
        /// A process-local `AtomicU8`.
        AtomicU8(AtomicU8, u8);
        /// A process-local `AtomicI32`.
        AtomicI32(AtomicI32, i32);
        /// A process-local `AtomicU32`.
        AtomicU32(AtomicU32, u32);
        /// A process-local `AtomicU64`.
        AtomicU64(AtomicU64, u64);
        /// A process-local `AtomicUsize`.
        AtomicUsize(AtomicUsize, usize);
    }

    impl AtomicU32 {
        #[inline(always)]
        pub(crate) fn fetch_or(&self, v: u32, order: Ordering) -> u32 {
            self.0.fetch_or(v, order.core())
        }
    }

    /// A process-local `AtomicPtr`.
    #[repr(transparent)]
    #[derive(Debug)]
    pub(crate) struct AtomicPtr<T>(core::sync::atomic::AtomicPtr<T>);

    impl<T> AtomicPtr<T> {
        pub(crate) const fn new(p: *mut T) -> AtomicPtr<T> {
            AtomicPtr(core::sync::atomic::AtomicPtr::new(p))
        }
        #[inline(always)]
        pub(crate) fn load(&self, order: Ordering) -> *mut T {
            self.0.load(order.core())
        }
        #[inline(always)]
        pub(crate) fn store(&self, p: *mut T, order: Ordering) {
            self.0.store(p, order.core())
        }
    }
}

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
        } else if round < 1000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// A zeroed block of atomics on the heap, for in-memory regions, aligned to
/// 128 bytes like a mapping (whose pages are aligned far more), so that
/// slots padded to 128 bytes never share a cache line pair here either.
pub(crate) struct HeapWords {
    #[cfg(not(edgemark_loom))]
    ptr: core::ptr::NonNull<AtomicU64>,
    #[cfg(not(edgemark_loom))]
    len: usize,
    // loom's atomics carry model state and cannot be made from zeroed
    // memory; alignment means nothing under loom.
    #[cfg(edgemark_loom)]
    words: Box<[AtomicU64]>,
}

#[cfg(not(edgemark_loom))]
const HEAP_ALIGN: usize = 128;

// SAFETY: a HeapWords owns its block, and AtomicU64 is Send and Sync.
unsafe impl Send for HeapWords {}
// SAFETY: as above; shared access only goes through the atomics.
unsafe impl Sync for HeapWords {}

impl HeapWords {
    #[cfg(not(edgemark_loom))]
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1) * 8, HEAP_ALIGN)
            .expect("a region's size is bounded far below isize::MAX")
    }

    /// `len` zeroed words.
    pub(crate) fn zeroed(len: usize) -> HeapWords {
        #[cfg(not(edgemark_loom))]
        {
            let layout = HeapWords::layout(len);
            // SAFETY: the layout has a non-zero size.
            let raw = unsafe { std::alloc::alloc_zeroed(layout) };
            let Some(ptr) = core::ptr::NonNull::new(raw.cast::<AtomicU64>()) else {
                std::alloc::handle_alloc_error(layout)
            };
            HeapWords { ptr, len }
        }
        #[cfg(edgemark_loom)]
        {
            HeapWords {
                words: (0..len).map(|_| AtomicU64::new(0)).collect(),
            }
        }
    }

    /// The words.
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        #[cfg(not(edgemark_loom))]
        {
            // SAFETY:
            // 1. `ptr` points to `len * 8` bytes allocated by `zeroed` with
            //    128-byte alignment, live until `drop`.
            // 2. All-zero bits are a valid AtomicU64 (transparent over u64).
            // 3. The slice borrows `self`, so it cannot outlive the block.
            unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }
        #[cfg(edgemark_loom)]
        {
            &self.words
        }
    }
}

#[cfg(not(edgemark_loom))]
impl Drop for HeapWords {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed` with this same layout, and freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), HeapWords::layout(self.len)) }
    }
}
