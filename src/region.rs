//! Creating, attaching and validating regions.
//!
//! This layer only produces a validated slice of atomic words (from a shared
//! mapping or from the heap) plus the geometry and schema read from its
//! header; the protocol runs over that slice.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::clock::ClockIdentity;
use crate::layout::*;
use crate::mark::Edge;
use crate::schema::{Schema, SchemaError, MAX_DOMAINS, MAX_EVENTS};
use crate::sync::{AtomicU64, Ordering};

/// Where a region's words live.
pub(crate) enum Storage {
    /// An in-memory region, private to this process.
    Heap(crate::sync::HeapWords),
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
    pub(crate) fn check_len(&self) -> Result<(), AttachError> {
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
}

/// A shared, writable mapping of a region file.
///
/// # Safety
///
/// Other processes write the mapped memory at any time. This type therefore
/// never hands out references to plain data in it, only a slice of
/// `AtomicU64`, which permits shared mutation; every access edgemark makes is
/// atomic. The file's length was checked against the geometry before the
/// slice was formed (`docs/limitations.md` covers a file shrunk afterwards).
#[cfg(not(edgemark_loom))]
pub(crate) struct Mapped {
    map: memmap2::MmapRaw,
    /// Kept open for the lifetime of the mapping: its length is re-checked
    /// before sweeps, and a sealed region lives as long as it is open.
    file: std::fs::File,
}

#[cfg(not(edgemark_loom))]
impl Mapped {
    fn new(file: std::fs::File, len: u64) -> std::io::Result<Mapped> {
        let map = memmap2::MmapOptions::new()
            .len(len as usize)
            .map_raw(&file)?;
        Ok(Mapped { map, file })
    }

    /// Whether the file still covers the whole mapping. Touching mapped
    /// pages past the end of a shrunk file raises SIGBUS.
    fn check_len(&self) -> Result<(), AttachError> {
        let actual = self
            .file
            .metadata()
            .map_err(|e| AttachError::Io(PathBuf::from("(mapped region)"), e))?
            .len();
        let expected = self.map.len() as u64;
        if actual < expected {
            return Err(AttachError::Length { actual, expected });
        }
        Ok(())
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

/// Why a region could not be created.
#[derive(Debug)]
#[non_exhaustive]
pub enum CreateError {
    /// The file exists already (regions are created exclusively, never over
    /// an existing file or through a symlink).
    Exists(PathBuf),
    /// Another I/O error at the path.
    Io(PathBuf, std::io::Error),
    /// No edges were declared.
    NoEdges,
    /// An edge is declared twice, or goes from a stage to itself.
    BadEdge(Edge),
    /// The geometry is outside what a region can hold.
    Geometry(String),
    /// The schema is invalid.
    Schema(SchemaError),
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::Exists(p) => write!(
                f,
                "{} exists already; regions are only created as new files",
                p.display()
            ),
            CreateError::Io(p, e) => write!(f, "cannot create {}: {e}", p.display()),
            CreateError::NoEdges => f.write_str("a region needs at least one edge"),
            CreateError::BadEdge(e) => {
                write!(f, "edge {e} is declared twice or joins a stage to itself")
            }
            CreateError::Geometry(s) => write!(f, "bad geometry: {s}"),
            CreateError::Schema(e) => write!(f, "bad schema: {e}"),
        }
    }
}

// The I/O and schema errors' messages are part of the Display text, so
// they are not also given as a source (a chain would print them twice); the
// variants hold them for callers that match.
impl std::error::Error for CreateError {}

/// Why a region file could not be attached. Every file, whatever it holds,
/// gives either one of these or a working region.
#[derive(Debug)]
#[non_exhaustive]
pub enum AttachError {
    /// The file could not be opened, inspected or mapped.
    Io(PathBuf, std::io::Error),
    /// The path is a symlink or not a regular file.
    NotRegularFile(PathBuf),
    /// The file is owned by another user (pass
    /// [`AttachOptions::allow_foreign_owner`] to attach anyway).
    ForeignOwner {
        /// The file's owner.
        uid: u32,
    },
    /// The file is not an edgemark region.
    BadMagic,
    /// The creator has not published the header yet (or died before it
    /// did): the file can be removed and created again.
    NotInitialised,
    /// The region's format version is not the one this build reads.
    UnsupportedVersion(u64),
    /// The file is shorter or longer than its geometry says.
    Length {
        /// The file's length.
        actual: u64,
        /// The length the header's geometry implies.
        expected: u64,
    },
    /// A header field is out of range or inconsistent.
    Geometry(String),
    /// The schema in the header is invalid.
    Schema(SchemaError),
    /// The schema differs from the one the caller expected.
    SchemaMismatch,
    /// The edges differ from the ones the caller expected.
    EdgeMismatch,
    /// The region was created in another boot: its `CLOCK_MONOTONIC` is not
    /// this process's.
    BootMismatch,
    /// The region was created in another time namespace.
    TimeNamespaceMismatch,
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Io(p, e) => write!(f, "cannot open {}: {e}", p.display()),
            AttachError::NotRegularFile(p) => {
                write!(f, "{} is a symlink or not a regular file", p.display())
            }
            AttachError::ForeignOwner { uid } => write!(
                f,
                "the region file belongs to uid {uid}, not to this user (allow foreign owners to attach anyway)"
            ),
            AttachError::BadMagic => f.write_str("not an edgemark region (bad magic)"),
            AttachError::NotInitialised => f.write_str(
                "the region's header was never published (its creator is still initialising it or died); remove the file and create it again",
            ),
            AttachError::UnsupportedVersion(v) => write!(
                f,
                "region format version {v} is not supported (this build reads version {FORMAT_VERSION})"
            ),
            AttachError::Length { actual, expected } => write!(
                f,
                "the region file is {actual} bytes but its geometry needs {expected}"
            ),
            AttachError::Geometry(s) => write!(f, "corrupt region header: {s}"),
            AttachError::Schema(e) => write!(f, "corrupt region schema: {e}"),
            AttachError::SchemaMismatch => {
                f.write_str("the region's schema is not the expected one")
            }
            AttachError::EdgeMismatch => f.write_str("the region's edges are not the expected ones"),
            AttachError::BootMismatch => f.write_str(
                "the region was created in another boot; its monotonic clock is not this one",
            ),
            AttachError::TimeNamespaceMismatch => f.write_str(
                "the region was created in another time namespace; its monotonic clock is not this one",
            ),
        }
    }
}

// As for CreateError: the inner errors are in the Display text.
impl std::error::Error for AttachError {}

/// Everything a validated header says.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub(crate) layout: Layout,
    pub(crate) schema: Schema,
    pub(crate) edges: Vec<Edge>,
    pub(crate) region_id: u64,
    pub(crate) clock: ClockIdentity,
    pub(crate) created_unix_ns: u64,
    pub(crate) creator_pid: u64,
    pub(crate) group_access: bool,
    pub(crate) pid_namespace: u64,
}

const FLAG_GROUP: u64 = 1;
/// Set (never cleared) by the first process that attaches from another pid
/// namespace: from then on no process trusts a pid found in the region, so
/// no lock is taken over and no owner is judged dead automatically.
pub(crate) const FLAG_MIXED_PID_NS: u64 = 2;

/// Writes a header into zeroed words: everything first, the version word
/// last.
pub(crate) fn write_header(words: &[AtomicU64], h: &Header) {
    let put = |i: usize, v: u64| words[i].store(v, Ordering::Relaxed);
    let l = &h.layout;
    put(H_MAGIC, MAGIC);
    put(H_HEADER_BYTES, HEADER_BYTES as u64);
    put(H_FILE_BYTES, l.bytes());
    put(H_SLOTS, l.slots.into());
    put(H_SEGMENTS, l.segments.into());
    put(H_EDGES, l.edges.into());
    put(H_EVENTS, l.events.into());
    put(H_DOMAINS, h.schema.domains().len() as u64);
    put(H_SLOT_STRIDE, l.slot_stride_bytes());
    put(H_SLOTS_OFFSET, l.slots_offset_bytes());
    put(H_REGION_ID, h.region_id);
    put(H_BOOT_ID, h.clock.boot_id as u64);
    put(H_BOOT_ID + 1, (h.clock.boot_id >> 64) as u64);
    put(H_TIME_NS, h.clock.time_namespace);
    put(H_CREATED_UNIX_NS, h.created_unix_ns);
    put(H_CREATOR_PID, h.creator_pid);
    put(H_FLAGS, if h.group_access { FLAG_GROUP } else { 0 });
    put(H_PID_NS, h.pid_namespace);
    for (i, e) in h.edges.iter().enumerate() {
        put(H_EDGE_TABLE + i, u64::from(e.from) | u64::from(e.to) << 32);
    }
    crate::domains::write_declared(words, h.schema.domains());
    for (i, e) in h.schema.events().iter().enumerate() {
        let base = H_EVENT_TABLE + i * EVENT_WORDS;
        for (j, w) in pack_name(e.name()).into_iter().enumerate() {
            put(base + j, w);
        }
        put(
            base + NAME_WORDS,
            u64::from(e.domain().0) | u64::from(e.keeps_chunk_seq()) << 8,
        );
    }
    // Release: publishes every word above (and the zeroed slots); pairs with
    // the Acquire load of the version in `read_header`. An opener that sees 0
    // knows the header is not ready (Aeron's CnC does the same).
    words[H_VERSION].store(FORMAT_VERSION, Ordering::Release);
}

/// Reads and validates a header from the first words of a region of
/// `file_len` bytes. Touches nothing past the header.
pub(crate) fn read_header(words: &[AtomicU64], file_len: u64) -> Result<Header, AttachError> {
    if words.len() < HEADER_WORDS {
        return Err(AttachError::Length {
            actual: file_len,
            expected: HEADER_BYTES as u64,
        });
    }
    // Acquire: pairs with the Release store of the version in `write_header`.
    let version = words[H_VERSION].load(Ordering::Acquire);
    // Relaxed from here on: ordered after the Acquire above, and these words
    // never change once the version is published.
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    let magic = get(H_MAGIC);
    if magic != MAGIC {
        return Err(if magic == 0 && version == 0 {
            AttachError::NotInitialised
        } else {
            AttachError::BadMagic
        });
    }
    if version == 0 {
        return Err(AttachError::NotInitialised);
    }
    if version != FORMAT_VERSION {
        return Err(AttachError::UnsupportedVersion(version));
    }
    let small = |i: usize, what: &str| -> Result<u32, AttachError> {
        u32::try_from(get(i)).map_err(|_| AttachError::Geometry(format!("{what} is {}", get(i))))
    };
    let layout = Layout::new(
        small(H_SLOTS, "the slot count")?,
        small(H_SEGMENTS, "the segment count")?,
        small(H_EDGES, "the edge count")?,
        small(H_EVENTS, "the event count")?,
    )
    .map_err(|e| AttachError::Geometry(e.0))?;
    let expect = |i: usize, what: &str, want: u64| {
        if get(i) == want {
            Ok(())
        } else {
            Err(AttachError::Geometry(format!(
                "{what} is {} but the geometry gives {want}",
                get(i)
            )))
        }
    };
    expect(H_HEADER_BYTES, "the header length", HEADER_BYTES as u64)?;
    expect(H_SLOT_STRIDE, "the slot stride", layout.slot_stride_bytes())?;
    expect(
        H_SLOTS_OFFSET,
        "the slots offset",
        layout.slots_offset_bytes(),
    )?;
    expect(H_FILE_BYTES, "the recorded file length", layout.bytes())?;
    if file_len != layout.bytes() {
        return Err(AttachError::Length {
            actual: file_len,
            expected: layout.bytes(),
        });
    }
    let domain_count = get(H_DOMAINS);
    if domain_count == 0 || domain_count > MAX_DOMAINS as u64 {
        return Err(AttachError::Geometry(format!(
            "the domain count is {domain_count}; it must be between 1 and {MAX_DOMAINS}"
        )));
    }
    let name_at = |base: usize, what: String| {
        let w = [get(base), get(base + 1), get(base + 2), get(base + 3)];
        unpack_name(w).ok_or(AttachError::Schema(SchemaError::BadName(what)))
    };
    // The declared domains are written ready at creation and never change;
    // entries after them are registered at run time and read when needed.
    let domains = (0..domain_count as usize)
        .map(|i| {
            crate::domains::read(words, i)
                .ok_or_else(|| AttachError::Schema(SchemaError::BadName(format!("domain #{i}"))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut events = Vec::with_capacity(layout.events as usize);
    for i in 0..layout.events as usize {
        debug_assert!(i < MAX_EVENTS);
        let base = H_EVENT_TABLE + i * EVENT_WORDS;
        let name = name_at(base, format!("event #{i}"))?;
        let meta = get(base + NAME_WORDS);
        if meta >> 9 != 0 {
            return Err(AttachError::Geometry(format!(
                "event #{i} has unknown flags {meta:#x}"
            )));
        }
        events.push((name, (meta & 0xff) as u8, meta & 0x100 != 0));
    }
    let schema = Schema::from_parts(events, domains).map_err(AttachError::Schema)?;
    let mut edges: Vec<Edge> = Vec::with_capacity(layout.edges as usize);
    for i in 0..layout.edges as usize {
        let w = get(H_EDGE_TABLE + i);
        let e = Edge::new(w as u32, (w >> 32) as u32);
        if e.from == e.to || edges.contains(&e) {
            return Err(AttachError::Geometry(format!(
                "edge #{i} ({e}) is a self-loop or a duplicate"
            )));
        }
        edges.push(e);
    }
    let flags = get(H_FLAGS);
    if flags & !(FLAG_GROUP | FLAG_MIXED_PID_NS) != 0 {
        return Err(AttachError::Geometry(format!("unknown flags {flags:#x}")));
    }
    Ok(Header {
        layout,
        schema,
        edges,
        region_id: get(H_REGION_ID),
        clock: ClockIdentity {
            boot_id: u128::from(get(H_BOOT_ID)) | u128::from(get(H_BOOT_ID + 1)) << 64,
            time_namespace: get(H_TIME_NS),
        },
        created_unix_ns: get(H_CREATED_UNIX_NS),
        creator_pid: get(H_CREATOR_PID),
        group_access: flags & FLAG_GROUP != 0,
        pid_namespace: get(H_PID_NS),
    })
}

/// A fresh, random region ID (never 0).
pub(crate) fn new_region_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::clock::unix_ns());
    h.write_u64(crate::clock::monotonic_ns());
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Validates the declared edges and geometry and builds the header of a new
/// region.
pub(crate) fn new_header(
    edges: &[Edge],
    slots: u32,
    segments: u32,
    schema: &Schema,
    group_access: bool,
) -> Result<Header, CreateError> {
    if edges.is_empty() {
        return Err(CreateError::NoEdges);
    }
    for (i, e) in edges.iter().enumerate() {
        if e.from == e.to || edges[..i].contains(e) {
            return Err(CreateError::BadEdge(*e));
        }
    }
    schema.validate().map_err(CreateError::Schema)?;
    let layout = Layout::new(
        slots,
        segments,
        u32::try_from(edges.len()).unwrap_or(u32::MAX),
        schema.events().len() as u32,
    )
    .map_err(|e| CreateError::Geometry(e.0))?;
    Ok(Header {
        layout,
        schema: schema.clone(),
        edges: edges.to_vec(),
        region_id: new_region_id(),
        clock: ClockIdentity::current(),
        created_unix_ns: crate::clock::unix_ns(),
        creator_pid: u64::from(std::process::id()),
        group_access,
        pid_namespace: crate::process::pid_namespace(),
    })
}

/// Creates the region file exclusively and maps it.
#[cfg(not(edgemark_loom))]
pub(crate) fn create_file(path: &Path, header: &Header) -> Result<Storage, CreateError> {
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
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    // The umask may have cleared the group bits we were asked for.
    if header.group_access {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io)?;
    }
    let len = header.layout.bytes();
    let mapped = file
        .set_len(len)
        .and_then(|()| Mapped::new(file, len))
        .map_err(io)?;
    write_header(mapped.words(), header);
    Ok(Storage::Mapped(mapped))
}

/// Creates the region in a sealed memory file (`memfd_create` with
/// `F_SEAL_SHRINK | F_SEAL_GROW`): nobody can change its length, so no
/// process can make another's accesses fault. Other processes attach through
/// `/proc/<pid>/fd/<fd>` while this process keeps it open.
#[cfg(not(edgemark_loom))]
pub(crate) fn create_sealed(header: &Header) -> Result<(Storage, PathBuf), CreateError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let path = PathBuf::from("(memfd)");
    let io = |e: std::io::Error| CreateError::Io(path.clone(), e);
    let name = c"edgemark-region";
    // SAFETY: `name` is a NUL-terminated string; the flags are valid.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nothing
    // else; the File takes ownership and closes it.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let len = header.layout.bytes();
    file.set_len(len).map_err(io)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a valid fd we own, with a valid command and argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    let attach_path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        file.as_raw_fd()
    ));
    let mapped = Mapped::new(file, len).map_err(io)?;
    write_header(mapped.words(), header);
    Ok((Storage::Mapped(mapped), attach_path))
}

/// Options for attaching to an existing region file.
///
/// [`Recorder::attach`](crate::Recorder::attach) is the same as
/// `AttachOptions::new().attach(path)`.
#[derive(Clone, Debug, Default)]
pub struct AttachOptions {
    pub(crate) allow_foreign_clock: bool,
    pub(crate) allow_foreign_owner: bool,
    pub(crate) expect_schema: Option<Schema>,
    pub(crate) expect_edges: Option<Vec<Edge>>,
}

impl AttachOptions {
    /// Default options: the region must share this process's clock and
    /// belong to this user.
    pub fn new() -> AttachOptions {
        AttachOptions::default()
    }

    /// Attach even if the region was created in another boot or time
    /// namespace. The clock-reading [`Recorder::record`](crate::Recorder::record)
    /// then returns [`Outcome::ClockMismatch`](crate::Outcome::ClockMismatch);
    /// values measured elsewhere can still be recorded in other domains.
    pub fn allow_foreign_clock(mut self, yes: bool) -> AttachOptions {
        self.allow_foreign_clock = yes;
        self
    }

    /// Attach even if the file belongs to another user.
    pub fn allow_foreign_owner(mut self, yes: bool) -> AttachOptions {
        self.allow_foreign_owner = yes;
        self
    }

    /// Refuse the region unless its schema is `schema`.
    pub fn expect_schema(mut self, schema: Schema) -> AttachOptions {
        self.expect_schema = Some(schema);
        self
    }

    /// Refuse the region unless it declares exactly these edges, in order.
    pub fn expect_edges(mut self, edges: impl IntoIterator<Item = Edge>) -> AttachOptions {
        self.expect_edges = Some(edges.into_iter().collect());
        self
    }

    /// Attaches to the region at `path`.
    #[cfg(not(edgemark_loom))]
    pub fn attach(&self, path: impl AsRef<Path>) -> Result<crate::Recorder, AttachError> {
        let path = path.as_ref();
        let (storage, header) = open_file(path, self)?;
        crate::Recorder::from_parts(storage, header, Some(path.to_owned()), self)
    }

    /// Opens a private, in-memory copy of a region's bytes (a file saved for
    /// later study, say), validated exactly as [`AttachOptions::attach`]
    /// validates a file. Records into the copy change only the copy.
    pub fn attach_copy(&self, bytes: &[u8]) -> Result<crate::Recorder, AttachError> {
        let len = bytes.len() as u64;
        if len == 0 {
            return Err(AttachError::NotInitialised);
        }
        if len > MAX_REGION_BYTES || len % 8 != 0 {
            return Err(AttachError::Length {
                actual: len,
                expected: len.next_multiple_of(8).min(MAX_REGION_BYTES),
            });
        }
        let heap = crate::sync::HeapWords::zeroed(bytes.len() / 8);
        let words = heap.words();
        for (w, b) in words.iter().zip(bytes.chunks_exact(8)) {
            // Relaxed: the copy is private until it is returned.
            w.store(
                u64::from_le_bytes(b.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
        let header = read_header(words, len)?;
        crate::Recorder::from_parts(Storage::Heap(heap), header, None, self)
    }

    /// Checks a validated header against these options.
    pub(crate) fn check(&self, h: &Header) -> Result<bool, AttachError> {
        if let Some(s) = &self.expect_schema {
            if *s != h.schema {
                return Err(AttachError::SchemaMismatch);
            }
        }
        if let Some(e) = &self.expect_edges {
            if *e != h.edges {
                return Err(AttachError::EdgeMismatch);
            }
        }
        let here = ClockIdentity::current();
        let same_clock = here == h.clock;
        if !same_clock && !self.allow_foreign_clock {
            return Err(if here.boot_id != h.clock.boot_id {
                AttachError::BootMismatch
            } else {
                AttachError::TimeNamespaceMismatch
            });
        }
        Ok(same_clock)
    }
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

#[cfg(not(edgemark_loom))]
fn open_file(path: &Path, opts: &AttachOptions) -> Result<(Storage, Header), AttachError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let io = |e: std::io::Error| {
        if e.raw_os_error() == Some(libc::ELOOP) {
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
        0
    } else {
        libc::O_NOFOLLOW
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nofollow | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(AttachError::NotRegularFile(path.to_owned()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && !opts.allow_foreign_owner {
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
        return Err(AttachError::Geometry(format!(
            "the file is {len} bytes, which no region geometry gives"
        )));
    }
    let mapped = Mapped::new(file, len).map_err(io)?;
    let header = read_header(mapped.words(), len)?;
    Ok((Storage::Mapped(mapped), header))
}
