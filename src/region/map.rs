//! The storage of a region's words: creating a region file or a sealed
//! memory file, opening and mapping one, or a private copy on the heap.

use std::fmt;
use std::path::{Path, PathBuf};

#[cfg(not(edgemark_loom))]
use rustix::{fs::OFlags, io::Errno};

use super::error::{AttachError, CreateError, SweepError};
use super::header::{Header, read_header, write_header};
use crate::layout::{HEADER_BYTES, MAX_REGION_BYTES};
use crate::sync::{AtomicU64, HeapWords, Ordering};

/// A validated region: its words and what its header says.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) storage: Storage,
    pub(crate) header: Header,
}

/// A region in a sealed memory file.
#[cfg(not(edgemark_loom))]
#[derive(Debug)]
pub(crate) struct Sealed {
    pub(crate) storage: Storage,
    /// The `/proc/<pid>/fd/<fd>` path other processes attach through.
    pub(crate) path: PathBuf,
}

/// Whose region files may be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileOwner {
    /// Only files this user owns.
    Me,
    /// Files of any user (that this one may open).
    Anyone,
}

/// Whether a region is opened for writing or only for looking at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Opened and mapped for reading and writing.
    ReadWrite,
    /// Opened and mapped for reading only: read permission on the file is
    /// enough, and no access through the mapping may write.
    ReadOnly,
}

/// Where a region's words live.
pub(crate) enum Storage {
    /// An in-memory region, private to this process.
    Heap(HeapWords),
    /// A shared mapping of a region file.
    #[cfg(not(edgemark_loom))]
    Mapped(Mapped),
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Heap(w) => write!(f, "Heap({} words)", w.words().len()),
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => write!(f, "Mapped({} bytes)", m.map.len()),
        }
    }
}

impl Storage {
    /// For a mapped region, whether its file still has its full length.
    pub(crate) fn check_len(&self) -> Result<(), SweepError> {
        match self {
            Storage::Heap(_) => Ok(()),
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => m.check_len(),
        }
    }

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        match self {
            Storage::Heap(w) => w.words(),
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => m.words(),
        }
    }

    /// Whether an access lost a page of the mapping: the file shrunk under
    /// it, or (a sparse region) its file system had no space for the page.
    /// One relaxed load; no system call. Never for the heap.
    #[inline]
    pub(crate) fn faulted(&self) -> bool {
        match self {
            Storage::Heap(_) => false,
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => m.faulted(),
        }
    }

    /// The error for a faulted mapping ([`Storage::faulted`]): why the
    /// first page was lost, [`SweepError::Shrunk`] or
    /// [`SweepError::NoSpace`]. `Shrunk` if none was.
    pub(crate) fn fault_error(&self) -> SweepError {
        match self {
            Storage::Heap(_) => SweepError::Shrunk,
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => m.fault_error().unwrap_or(SweepError::Shrunk),
        }
    }

    /// Calls `f` with each run of slots that may have been written: for a
    /// file, the slots that meet a data extent of it (`SEEK_DATA` and
    /// `SEEK_HOLE`), so that a sweep does not make the untouched part of a
    /// sparse region resident; a slot in a hole has never been written and
    /// reads as a free slot, so leaving it out changes nothing. All slots
    /// for the heap, and for a file system that does not report holes.
    pub(crate) fn slot_runs(&self, layout: &crate::layout::Layout, mut f: impl FnMut(u32, u32)) {
        match self {
            Storage::Heap(_) => f(0, layout.slots),
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => m.runs(
                layout.slots_offset_bytes(),
                layout.slot_stride_bytes(),
                layout.slots,
                f,
            ),
        }
    }

    /// [`Storage::slot_runs`] for the entries of the ring of closed
    /// requests: an entry in a hole has never been written (its state is
    /// 0, an entry never used), so a pass over the ring that leaves it out
    /// counts the same.
    pub(crate) fn ring_runs(&self, layout: &crate::layout::Layout, mut f: impl FnMut(u32, u32)) {
        if layout.ring_entries == 0 {
            return;
        }
        match self {
            Storage::Heap(_) => f(0, layout.ring_entries),
            #[cfg(not(edgemark_loom))]
            Storage::Mapped(m) => m.runs(
                layout.ring_offset_bytes(),
                layout.ring_stride_bytes(),
                layout.ring_entries,
                f,
            ),
        }
    }
}

/// A shared mapping of a region file, writable or read-only.
///
/// # Safety
///
/// Other processes write the mapped memory at any time. This type therefore
/// never hands out references to plain data in it, only a slice of
/// `AtomicU64`, which permits shared mutation; every access edgemark makes is
/// atomic. The file's length was checked against the geometry before the
/// slice was formed (`docs/limitations.md` covers a file shrunk afterwards;
/// [`GuardedMap`](crate::fault::GuardedMap) owns the mapping, its `SIGBUS`
/// guard and the file).
#[cfg(not(edgemark_loom))]
pub(crate) struct Mapped {
    /// The mapping, guarded; the file is kept open with it: its length is
    /// re-checked before sweeps, and a sealed region lives as long as it is
    /// open.
    ///
    /// A read-only mapping ([`Access::ReadOnly`]) must never be written: it
    /// is only ever held by a [`Viewer`](crate::Viewer), which has no call
    /// that writes.
    map: crate::fault::GuardedMap,
}

#[cfg(not(edgemark_loom))]
impl Mapped {
    fn new(file: std::fs::File, len: u64, access: Access) -> std::io::Result<Mapped> {
        let map = crate::fault::GuardedMap::new(file, len as usize, access == Access::ReadWrite)?;
        Ok(Mapped { map })
    }

    /// The runs `[from, to)` of the `count` items of `stride` bytes from
    /// byte `first` that meet a data extent of the file ([`Storage::slot_runs`],
    /// [`Storage::ring_runs`]).
    fn runs(&self, first: u64, stride: u64, count: u32, mut f: impl FnMut(u32, u32)) {
        use rustix::fs::{SeekFrom, seek};
        let end = first + u64::from(count) * stride;
        let item_of = |byte: u64| ((byte.saturating_sub(first)) / stride) as u32;
        let mut at = first;
        while at < end {
            let data = match seek(self.map.file(), SeekFrom::Data(at)) {
                Ok(d) => d,
                // ENXIO: no data at or after `at`; the rest is a hole.
                Err(e) if e == Errno::NXIO => return,
                // No hole reporting here: sweep what is left.
                Err(_) => return f(item_of(at), count),
            };
            if data >= end {
                return;
            }
            let hole = match seek(self.map.file(), SeekFrom::Hole(data)) {
                Ok(h) => h.min(end),
                Err(_) => end,
            };
            // The items that meet [data, hole): from the one holding `data`
            // to the one holding the byte before `hole`.
            let (from, to) = (item_of(data), item_of(hole - 1) + 1);
            f(from, to.min(count));
            // Never go backwards, even if the file changes under us.
            at = hole.max(at + 1);
        }
    }

    /// Whether the file still covers the whole mapping. Touching mapped
    /// pages past the end of a shrunk file raises SIGBUS.
    fn check_len(&self) -> Result<(), SweepError> {
        if let Some(e) = self.fault_error() {
            return Err(e);
        }
        let actual = self.map.file().metadata().map_err(SweepError::Io)?.len();
        let expected = self.map.len() as u64;
        if actual < expected {
            return Err(SweepError::Truncated { actual, expected });
        }
        Ok(())
    }

    /// The error that says why an access lost a page of the mapping, if
    /// one did (`fault.rs`).
    fn fault_error(&self) -> Option<SweepError> {
        self.map.fault().map(|f| match f {
            crate::fault::Fault::Shrunk => SweepError::Shrunk,
            crate::fault::Fault::NoSpace => SweepError::NoSpace,
        })
    }

    /// Whether an access lost a page of the mapping: the file shrunk under
    /// it, or had no space for it (`fault.rs`); stays set once set.
    #[inline]
    fn faulted(&self) -> bool {
        self.map.faulted()
    }

    #[inline]
    fn words(&self) -> &[AtomicU64] {
        let ptr = self.map.as_mut_ptr();
        debug_assert_eq!(ptr as usize % std::mem::align_of::<AtomicU64>(), 0);
        // SAFETY:
        // 1. The mapping is page-aligned, so `ptr` is aligned for AtomicU64,
        //    and its length is a multiple of 8 (it is `4096 + slots * stride`
        //    with a stride of whole words), so the slice covers mapped bytes
        //    only.
        // 2. The mapping lives as long as `self`, which the slice borrows.
        // 3. AtomicU64 has the size and alignment of u64 and only interior,
        //    atomic mutation, so other processes writing the same memory
        //    through atomics is not a data race.
        unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), self.map.len() / 8) }
    }
}

/// Creates the region file exclusively, reserves its space (unless
/// `sparse`) and maps it. A failure after the file was created removes it,
/// so that the same path can be created again.
#[cfg(not(edgemark_loom))]
pub(crate) fn create_file(
    path: &Path,
    header: &Header,
    sparse: bool,
) -> Result<Storage, CreateError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            CreateError::Exists(path.to_owned())
        } else {
            CreateError::Io(path.to_owned(), e)
        }
    };
    let mode = if header.group_access { 0o660 } else { 0o600 };
    // create_new is O_CREAT | O_EXCL: it never opens an existing file and
    // never follows a symlink (even a dangling one). O_NOFOLLOW says so twice.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags((OFlags::NOFOLLOW | OFlags::CLOEXEC).bits() as i32)
        .open(path)
        .map_err(io)?;
    let len = header.layout.bytes();
    let made = (|| {
        // The umask may have cleared the group bits we were asked for.
        if header.group_access {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(io)?;
        }
        if sparse {
            file.set_len(len).map_err(io)?;
        } else {
            reserve(&file, len).map_err(|e| no_space(path, len, e).unwrap_or_else(io))?;
        }
        Ok(())
    })();
    if let Err(e) = made {
        remove_created(path, &file);
        return Err(e);
    }
    let mapped = match file.try_clone() {
        Ok(f) => Mapped::new(f, len, Access::ReadWrite),
        Err(e) => Err(e),
    };
    let mapped = match mapped {
        Ok(m) => m,
        Err(e) => {
            remove_created(path, &file);
            return Err(io(e));
        }
    };
    write_header(mapped.words(), header);
    Ok(Storage::Mapped(mapped))
}

/// Gives the file `len` bytes of allocated space (`posix_fallocate`: the
/// kernel's `fallocate`, or glibc's block-by-block fallback on a file system
/// without it), so that no page of the region can later fail for want of
/// space.
#[cfg(not(edgemark_loom))]
fn reserve(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len =
        libc::off_t::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
    loop {
        // SAFETY: `file` is an open descriptor this function borrows for
        // the call; `posix_fallocate` reads no memory of ours.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

/// The "no space" error for a reservation that failed with `ENOSPC` or
/// `EDQUOT`; `None` for any other error.
#[cfg(not(edgemark_loom))]
fn no_space(path: &Path, bytes: u64, e: std::io::Error) -> Result<CreateError, std::io::Error> {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {}
        _ => return Err(e),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let available = rustix::fs::statvfs(&dir)
        .ok()
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize));
    Ok(CreateError::NoSpace {
        path: path.to_owned(),
        bytes,
        filesystem: mount_point(&dir),
        available,
    })
}

/// The mount point of the file system that holds `dir`: its highest
/// ancestor on the same device (or `dir` itself if that cannot be told).
#[cfg(not(edgemark_loom))]
fn mount_point(dir: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return dir.to_owned();
    };
    let Ok(dev) = std::fs::metadata(&dir).map(|m| m.dev()) else {
        return dir;
    };
    let mut top = dir.as_path();
    while let Some(up) = top.parent() {
        match std::fs::metadata(up) {
            Ok(m) if m.dev() == dev => top = up,
            _ => break,
        }
    }
    top.to_owned()
}

/// Removes the file this process just created at `path`, if the path still
/// names it (same device and inode): a failed creation leaves nothing
/// behind, and never removes a file that replaced ours meanwhile.
#[cfg(not(edgemark_loom))]
fn remove_created(path: &Path, file: &std::fs::File) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(ours), Ok(there)) = (file.metadata(), std::fs::symlink_metadata(path)) else {
        return;
    };
    if ours.dev() == there.dev() && ours.ino() == there.ino() {
        let _ = std::fs::remove_file(path);
    }
}

/// Creates the region in a sealed memory file (`memfd_create` with
/// `F_SEAL_SHRINK | F_SEAL_GROW`): nobody can change its length, so no
/// process can make another's accesses fault. Other processes attach through
/// `/proc/<pid>/fd/<fd>` while this process keeps it open.
#[cfg(not(edgemark_loom))]
pub(crate) fn create_sealed(header: &Header) -> Result<Sealed, CreateError> {
    use rustix::fs::{MemfdFlags, SealFlags};
    use std::os::fd::AsRawFd;
    let path = PathBuf::from("(memfd)");
    let io = |e: std::io::Error| CreateError::Io(path.clone(), e);
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    let fd = rustix::fs::memfd_create(c"edgemark-region", flags).map_err(|e| io(e.into()))?;
    let file = std::fs::File::from(fd);
    let len = header.layout.bytes();
    file.set_len(len).map_err(io)?;
    let seals = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
    rustix::fs::fcntl_add_seals(&file, seals).map_err(|e| io(e.into()))?;
    let attach_path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        file.as_raw_fd()
    ));
    let mapped = Mapped::new(file, len, Access::ReadWrite).map_err(io)?;
    write_header(mapped.words(), header);
    Ok(Sealed {
        storage: Storage::Mapped(mapped),
        path: attach_path,
    })
}

/// Creates a region on the heap, private to this process.
pub(crate) fn create_in_memory(header: &Header) -> Storage {
    let heap = HeapWords::zeroed(header.layout.total_words);
    write_header(heap.words(), header);
    Storage::Heap(heap)
}

/// A private, in-memory copy of a region's bytes, validated exactly as
/// [`open_file`] validates a file.
pub(crate) fn open_copy(bytes: &[u8]) -> Result<Opened, AttachError> {
    let len = bytes.len() as u64;
    if len == 0 {
        return Err(AttachError::NotInitialised);
    }
    if len > MAX_REGION_BYTES || !len.is_multiple_of(8) {
        return Err(AttachError::Length {
            actual: len,
            expected: len.next_multiple_of(8).min(MAX_REGION_BYTES),
        });
    }
    let heap = HeapWords::zeroed(bytes.len() / 8);
    let words = heap.words();
    for (w, b) in words.iter().zip(bytes.chunks_exact(8)) {
        // Relaxed: the copy is private until it is returned.
        w.store(
            u64::from_le_bytes(b.try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
    }
    let header = read_header(words, len)?;
    Ok(Opened {
        storage: Storage::Heap(heap),
        header,
    })
}

/// Whether `path` is exactly `/proc/<pid>/fd/<n>` or `/proc/self/fd/<n>`.
fn is_proc_fd(path: &Path) -> bool {
    use std::path::Component;
    let c: Vec<Component<'_>> = path.components().collect();
    let digits = |c: &Component<'_>| matches!(c, Component::Normal(s) if !s.is_empty() && s.to_str().is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit())));
    c.len() == 5
        && c[0] == Component::RootDir
        && c[1] == Component::Normal("proc".as_ref())
        && (digits(&c[2]) || c[2] == Component::Normal("self".as_ref()))
        && c[3] == Component::Normal("fd".as_ref())
        && digits(&c[4])
}

/// Opens, checks and maps the region file at `path` and validates its
/// header.
#[cfg(not(edgemark_loom))]
pub(crate) fn open_file(
    path: &Path,
    owner: FileOwner,
    access: Access,
) -> Result<Opened, AttachError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let io = |e: std::io::Error| {
        if e.raw_os_error() == Some(Errno::LOOP.raw_os_error()) {
            AttachError::NotRegularFile(path.to_owned())
        } else {
            AttachError::Io(path.to_owned(), e)
        }
    };
    // Never through a symlink, except the kernel's own link to another
    // process's open file, exactly `/proc/<pid or self>/fd/<n>` (how sealed
    // regions are shared). O_NONBLOCK and O_NOCTTY: a path that names a
    // device or a FIFO must not block the open or become our terminal; it
    // is refused just below as not a regular file.
    let nofollow = if is_proc_fd(path) {
        OFlags::empty()
    } else {
        OFlags::NOFOLLOW
    };
    let flags = nofollow | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(access == Access::ReadWrite)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(AttachError::NotRegularFile(path.to_owned()));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && owner == FileOwner::Me {
        return Err(AttachError::ForeignOwner { uid: meta.uid() });
    }
    let len = meta.len();
    if len == 0 {
        return Err(AttachError::NotInitialised);
    }
    if len < HEADER_BYTES as u64 {
        return Err(AttachError::Length {
            actual: len,
            expected: HEADER_BYTES as u64,
        });
    }
    if len > MAX_REGION_BYTES || len % 8 != 0 {
        return Err(AttachError::Geometry(
            crate::layout::GeometryError::FileLength(len),
        ));
    }
    let mapped = Mapped::new(file, len, access).map_err(io)?;
    let header = read_header(mapped.words(), len)?;
    if let Some(fault) = mapped.map.fault() {
        // A page lost while the header was read: what was read is zeros.
        return Err(match fault {
            crate::fault::Fault::Shrunk => AttachError::Shrunk,
            crate::fault::Fault::NoSpace => AttachError::NoSpace,
        });
    }
    Ok(Opened {
        storage: Storage::Mapped(mapped),
        header,
    })
}
