//! Surviving a region file that another process shrinks.
//!
//! A process that can write a region file can also `ftruncate` it. Every
//! other process that has the file mapped then takes `SIGBUS` on its next
//! access to a page past the new end of file, and the default action of
//! `SIGBUS` kills it: a hostile or broken writer could kill the orchestrator,
//! every stage worker and every monitor with one system call.
//!
//! edgemark therefore installs, once per process and only when it maps a
//! region file, a `SIGBUS` handler that knows the address ranges of
//! edgemark's own mappings (a fixed table of [`RANGES`] entries, registered
//! by [`Guard`] and read by the handler with atomic loads only). For a fault
//! inside one of them, the handler maps a private anonymous zero page over
//! the faulting page with `MAP_FIXED` and returns: the faulting access is
//! retried and succeeds on that page, a record lands nowhere (a lost record,
//! never a dead process), a read sees zeros, and the range is marked
//! *faulted*, with the cause ([`Fault`]: the file shrank, or a sparse file's
//! file system had no space for the page), so that sweeps and snapshots
//! report an error instead of returning a result assembled from zeros, and
//! control operations refuse. A fault anywhere else is passed
//! on to the handler that was installed before ([`PREVIOUS`]), or, if there
//! was none, the default action is restored and the faulting access is
//! retried, which ends the process exactly as it would have ended without
//! edgemark.
//!
//! `docs/design.md` ("A file shrunk under a mapping") argues for this design
//! over copying the region with `pread`; `docs/limitations.md` lists what
//! remains (a handler installed later that does not chain to ours).

// The handler's table is this process's own state, read inside a signal
// handler; it is never in a region and never modelled by loom (the module is
// not built under it), so it uses the facade's process-local atomics
// (`core`'s, lock-free and signal-safe).
use crate::sync::Ordering;
use crate::sync::local::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicUsize};
use std::sync::Once;

/// How many mappings one process can have guarded at once. A mapping beyond
/// that still works; it is only unguarded (see [`register`]).
const RANGES: usize = 256;

/// One guarded mapping: `[start, start + len)`, or free while `start` is 0.
struct Range {
    /// The first byte of the mapping; 0 while the entry is free. Claimed by
    /// a CAS from 0 in [`register`], cleared last in [`Guard::drop`].
    start: AtomicUsize,
    /// The mapping's length; 0 while the entry is being claimed or freed, so
    /// that the handler never matches a half-written entry.
    len: AtomicUsize,
    /// Whether the mapping is writable (the replacement page gets the same
    /// protection, so a read-only mapping stays read-only).
    writable: AtomicBool,
    /// The mapped file's descriptor (open for at least the registration's
    /// lifetime), or -1: the handler `fstat`s it to tell a shrunk file from
    /// a page the file system could not provide.
    fd: AtomicI32,
    /// 0 until the handler replaced a page of this mapping, then the
    /// [`Fault`] of the first replacement (`Fault as u8`), never changed.
    faulted: AtomicU8,
}

/// Why a page of a guarded mapping was replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fault {
    /// The file no longer covers the page: it was truncated under the
    /// mapping.
    Shrunk = 1,
    /// The file still covers the page, but the kernel could not provide it:
    /// a sparse file whose file system had no space left for the page (or
    /// could not read it).
    NoSpace = 2,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    writable: AtomicBool::new(false),
    fd: AtomicI32::new(-1),
    faulted: AtomicU8::new(0),
};

static TABLE: [Range; RANGES] = [FREE; RANGES];

/// The `sigaction` that was in place before ours, written once before ours
/// is installed (the release of [`INSTALL`]'s `Once` and the `sigaction`
/// system call order it before any delivery to our handler).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

static INSTALL: Once = Once::new();

/// The page size, read once before the handler is installed (so that the
/// handler makes no library call to learn it).
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// A shared mapping of a whole file together with its registration with the
/// `SIGBUS` handler and the file itself: the one owner of the three, so that
/// the order the handler's soundness needs is kept here, not by field order
/// elsewhere. The guard is dropped (the range unregistered) before the
/// mapping is unmapped, and the file, whose descriptor the handler may
/// `fstat`, stays open while the guard lives.
///
/// Mapping a file installs, on the first call in a process, a
/// **process-wide** `SIGBUS` handler that stays installed for the life of
/// the process and chains every fault outside edgemark's mappings to the
/// action it replaced (see the module docs and `docs/limitations.md`).
///
/// # Safety
///
/// Other processes write the mapped memory at any time, and may shrink the
/// file. This type hands out only the mapping's address and length, never a
/// reference into it.
#[derive(Debug)]
pub(crate) struct GuardedMap {
    /// `None` when the handler's table was full or the handler could not be
    /// installed: the mapping then works unguarded.
    guard: Option<Guard>,
    map: memmap2::MmapRaw,
    /// Open for at least the guard's lifetime (the handler `fstat`s it).
    file: std::fs::File,
}

impl GuardedMap {
    /// Maps the first `len` bytes of `file`, writable or read-only, and
    /// registers the mapping with the handler.
    pub(crate) fn new(file: std::fs::File, len: usize, writable: bool) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let mut opts = memmap2::MmapOptions::new();
        opts.len(len);
        // Fill the page tables now when every page of the file already
        // exists (a region whose space was reserved, the default): no
        // memory is added, and no later record or poll pays a first-touch
        // page fault (5-20 us each on the virtualised benchmark machine; see
        // `docs/benchmarks.md`, "Visibility"). A sparse region's holes are
        // left alone: on a memory-backed file system even a read fault
        // allocates the page.
        use std::os::unix::fs::MetadataExt;
        if file.metadata()?.blocks().saturating_mul(512) >= len as u64 {
            opts.populate();
        }
        let map = if writable {
            opts.map_raw(&file)?
        } else {
            opts.map_raw_read_only(&file)?
        };
        // `file` is kept in `self` until after the guard is dropped (see
        // `Drop`), as `register` requires.
        let guard = register(map.as_mut_ptr(), map.len(), writable, file.as_raw_fd());
        Ok(GuardedMap { guard, map, file })
    }

    /// The start of the mapping (page-aligned).
    #[inline]
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The mapping's length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The mapped file.
    pub(crate) fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Whether an access lost a page of the mapping ([`Guard::faulted`]);
    /// never for an unguarded mapping.
    #[inline]
    pub(crate) fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(Guard::faulted)
    }

    /// Why the first lost page was lost, if one was ([`Guard::fault`]).
    pub(crate) fn fault(&self) -> Option<Fault> {
        self.guard.as_ref()?.fault()
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Unregister first: the fields (the mapping, then the file) are
        // dropped after this body, whatever their order.
        drop(self.guard.take());
    }
}

/// A registration of one mapping with the `SIGBUS` handler; dropping it
/// unregisters the mapping, which must happen before the mapping is
/// unmapped ([`GuardedMap`] owns both and sees to it).
#[derive(Debug)]
struct Guard {
    index: usize,
}

/// Registers `[ptr, ptr + len)` (a whole mapping, page-aligned, of the file
/// `fd` from offset 0; -1 when there is no file to ask) so that a `SIGBUS`
/// inside it replaces the page instead of killing the process. `fd` must
/// stay open while the guard lives. Installs the handler on first use.
/// Returns `None` when the table is full or the handler could not be
/// installed: the mapping then works as before, unguarded.
fn register(ptr: *mut u8, len: usize, writable: bool, fd: i32) -> Option<Guard> {
    let start = ptr as usize;
    if start == 0 || len == 0 || !install() {
        return None;
    }
    for (index, r) in TABLE.iter().enumerate() {
        // Acquire on success: orders the claim before our writes of the
        // other fields; pairs with the Release store of 0 in `Guard::drop`,
        // so the previous user's writes are done. Relaxed on failure: the
        // entry is taken and we only move on.
        if r.start
            .compare_exchange(0, start, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            r.writable.store(writable, Ordering::Relaxed);
            r.fd.store(fd, Ordering::Relaxed);
            r.faulted.store(0, Ordering::Relaxed);
            // Release: publishes `start`, `writable`, `fd` and `faulted` before
            // the length that makes the entry match; pairs with the Acquire
            // load of `len` in the handler.
            r.len.store(len, Ordering::Release);
            return Some(Guard { index });
        }
    }
    None
}

impl Guard {
    /// Whether a page of this mapping was replaced because the file could
    /// not back it (it had shrunk, or had no space for it). Once set, it
    /// stays set for the mapping's lifetime.
    #[inline]
    fn faulted(&self) -> bool {
        // Relaxed: a flag read on its own. When the fault happened in this
        // thread, program order makes it visible (the handler ran in this
        // thread, between two of its instructions); a fault in another
        // thread is seen at the latest by the next check.
        TABLE[self.index].faulted.load(Ordering::Relaxed) != 0
    }

    /// Why the first page of this mapping was replaced, if one was.
    fn fault(&self) -> Option<Fault> {
        // Relaxed: as in `faulted`; the value is written once.
        match TABLE[self.index].faulted.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(Fault::Shrunk),
            _ => Some(Fault::NoSpace),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let r = &TABLE[self.index];
        // Relaxed: the mapping is still in place, and this thread is the
        // only one that can unmap it; a handler that still matches the entry
        // after this store replaces a page of a live mapping, which is what
        // it would have done anyway.
        r.len.store(0, Ordering::Relaxed);
        // Release: frees the entry after the length is 0; pairs with the
        // Acquire CAS in `register`.
        r.start.store(0, Ordering::Release);
    }
}

/// Installs the handler once; whether it is in place.
fn install() -> bool {
    static OK: AtomicBool = AtomicBool::new(false);
    INSTALL.call_once(|| {
        // SAFETY: `sysconf` has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            // Relaxed: the `sigaction` system call below orders it before
            // any delivery to the handler.
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: `sigaction` is plain old data; all-zero is a valid value
        // that the system call overwrites.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sa_mask` is a valid, owned signal set.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // Read the previous action first and keep it where the handler can
        // find it before the handler can run.
        // SAFETY: a null `act` only reads the current action into `old`.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return;
        }
        PREVIOUS.store(Box::into_raw(Box::new(old)), Ordering::Release);
        // SAFETY: `new` is a fully initialised action whose handler is an
        // `extern "C"` function with the SA_SIGINFO signature.
        if unsafe { libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) } == 0 {
            // Relaxed: `Once` orders this store before `call_once` returns
            // in every thread.
            OK.store(true, Ordering::Relaxed);
        }
    });
    // Relaxed: read after `call_once`, which synchronises with the closure.
    OK.load(Ordering::Relaxed)
}

/// The `SIGBUS` handler. Async-signal-safe: atomic loads, `mmap` (a system
/// call; not on POSIX's list, but on Linux a direct call with no lock),
/// `sigaction` and `raise`, nothing that allocates or locks.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The interrupted code may be between a system call and its read of
    // `errno`; the `mmap` and `fstat` below may set it. Restored on every
    // return, chained or not.
    let _errno = SavedErrno::save();
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO
    // handler; `si_addr` is the faulting address for a fault it raised.
    let addr = unsafe { (*info).si_addr() } as usize;
    // SAFETY: as above; `si_code` is always valid.
    let from_kernel = unsafe { (*info).si_code } > 0;
    if from_kernel {
        for r in TABLE.iter() {
            // Acquire: pairs with the Release store of `len` in `register`,
            // so `start` and `writable` are those of this registration.
            let len = r.len.load(Ordering::Acquire);
            if len == 0 {
                continue;
            }
            let start = r.start.load(Ordering::Relaxed);
            if addr < start || addr - start >= len {
                continue;
            }
            // Relaxed: written once before the handler was installed.
            let page = PAGE.load(Ordering::Relaxed);
            let at = addr & !(page - 1);
            let prot = if r.writable.load(Ordering::Relaxed) {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            // SAFETY: `at` is the page-aligned start of a page inside a
            // mapping edgemark made and still holds (the entry is
            // registered for exactly its lifetime), so replacing it touches
            // no memory of anyone else; the mapping's owner unmaps the whole
            // range, this page included, when it drops it.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    prot,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // Relaxed: `fd` was published with `len`, whose Acquire
                // load above pairs with the Release store in `register`.
                let cause = cause(r.fd.load(Ordering::Relaxed), at - start);
                // Relaxed: see `Guard::faulted`. Only the first cause is
                // kept (a failed exchange means one is there already).
                let _ = r.faulted.compare_exchange(
                    0,
                    cause as u8,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return;
            }
            break;
        }
    }
    chain(sig, info, ctx);
}

/// The calling thread's `errno`, restored when dropped: a signal handler
/// must leave it as it found it.
struct SavedErrno(libc::c_int);

impl SavedErrno {
    fn save() -> SavedErrno {
        // SAFETY: `__errno_location` returns the calling thread's `errno`,
        // valid for the thread's lifetime; reading it is async-signal-safe.
        SavedErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for SavedErrno {
    fn drop(&mut self) {
        // SAFETY: as in `save`; this thread's own `errno`.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// Why the page at byte `offset` of a mapping of the file `fd` (mapped
/// from offset 0) faulted: the file ends at or before it (it shrank), or it
/// still covers it, so the kernel could not provide the page (a sparse
/// file on a full file system). Async-signal-safe: one `fstat`. A file that
/// cannot be asked counts as shrunk, the cause edgemark reported before it
/// could tell them apart.
fn cause(fd: i32, offset: usize) -> Fault {
    if fd < 0 {
        return Fault::Shrunk;
    }
    // SAFETY: `stat` is plain old data; all-zero is a valid value that the
    // system call overwrites.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is the open descriptor registered with the mapping (its
    // owner keeps it open while the entry is registered); `st` is a valid,
    // owned buffer. `fstat` is async-signal-safe.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Fault::Shrunk;
    }
    if st.st_size > 0 && (st.st_size as u64) > offset as u64 {
        Fault::NoSpace
    } else {
        Fault::Shrunk
    }
}

/// Passes a fault that is not ours to the handler installed before ours, or
/// restores the default action, so that the process ends as it would have
/// without edgemark.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Acquire: pairs with the Release store in `install`.
    let prev = PREVIOUS.load(Ordering::Acquire);
    // SAFETY: `prev` is null or the leaked box written once in `install`,
    // never freed.
    let prev = unsafe { prev.as_ref() };
    let action = prev.map_or(libc::SIG_DFL, |a| a.sa_sigaction);
    let siginfo = prev.is_some_and(|a| a.sa_flags & libc::SA_SIGINFO != 0);
    if action == libc::SIG_DFL || action == libc::SIG_IGN {
        // SAFETY: an all-zero `sigaction` with `SIG_DFL` (0) is the default
        // action; `sigaction` is async-signal-safe. The faulting access is
        // retried on return and now takes the default action; a signal sent
        // by `kill` is raised again under it.
        unsafe {
            let dfl: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(sig);
            }
        }
    } else if siginfo {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it
        // has this signature; we pass it what the kernel passed us.
        let f = unsafe {
            std::mem::transmute::<
                libc::sighandler_t,
                extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
            >(action)
        };
        f(sig, info, ctx);
    } else {
        // SAFETY: a previous handler without SA_SIGINFO takes the signal
        // number only.
        let f = unsafe {
            std::mem::transmute::<libc::sighandler_t, extern "C" fn(libc::c_int)>(action)
        };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file shrunk under a guarded mapping: reads past the new end see
    /// zeros, writes land nowhere, the mapping reports the fault, and the
    /// interrupted thread's `errno` is as it was.
    #[test]
    fn a_shrunk_file_costs_a_page_not_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        f.write_all(&[7u8; 65536]).unwrap();
        let map = GuardedMap::new(f.try_clone().unwrap(), 65536, true).unwrap();
        assert!(map.guard.is_some(), "a free entry");
        assert!(!map.faulted());
        f.set_len(4096).unwrap();
        let p = map.as_mut_ptr();
        // SAFETY: this thread's own errno.
        unsafe { *libc::__errno_location() = libc::EINTR };
        // SAFETY: `p + 8192` lies inside the mapping; the file no longer
        // covers it, which is what the guard is for.
        let (before, after) = unsafe {
            let q = p.add(8192).cast::<u64>();
            let before = std::ptr::read_volatile(q);
            std::ptr::write_volatile(q, 42);
            (before, std::ptr::read_volatile(q))
        };
        // SAFETY: as above.
        let errno = unsafe { *libc::__errno_location() };
        assert_eq!(errno, libc::EINTR, "the handler restores errno");
        assert_eq!(before, 0, "a replaced page reads as zeros");
        assert_eq!(after, 42, "and takes writes, which reach no file");
        assert!(map.faulted());
        assert_eq!(map.fault(), Some(Fault::Shrunk));
        // The part the file still covers is still the file.
        // SAFETY: inside the mapping and the file.
        assert_eq!(unsafe { std::ptr::read_volatile(p) }, 7);
        drop(map);
    }

    #[test]
    fn guards_free_their_entries() {
        let mut v = vec![0u8; 8192];
        let p = v.as_mut_ptr();
        for _ in 0..RANGES * 2 {
            let g = register(p, 8192, true, -1).expect("entries are reused after drop");
            drop(g);
        }
        // Other tests of this binary may hold a few entries meanwhile.
        let held: Vec<Guard> = (0..RANGES)
            .filter_map(|_| register(p, 8192, true, -1))
            .collect();
        assert!(held.len() > RANGES / 2);
        assert!(
            register(p, 8192, true, -1).is_none(),
            "a full table guards nothing"
        );
        drop(held);
        assert!(register(p, 8192, true, -1).is_some());
    }
}
