//! Why a region could not be created or attached, or a sweep of it failed.

use std::fmt;
use std::path::PathBuf;

use crate::layout::{FORMAT_VERSION, GeometryError};
use crate::mark::Edge;
use crate::schema::SchemaError;

/// Why a region could not be created.
#[derive(Debug)]
#[non_exhaustive]
pub enum CreateError {
    /// The file exists already (regions are created exclusively, never over
    /// an existing file or through a symlink).
    Exists(PathBuf),
    /// Another I/O error at the path.
    Io(PathBuf, std::io::Error),
    /// The file system has no space for the region (`ENOSPC` or `EDQUOT`
    /// when its space was reserved); the file was removed again.
    NoSpace {
        /// The region file's path.
        path: PathBuf,
        /// The bytes the region needs.
        bytes: u64,
        /// The mount point of the file system (or the directory) that is
        /// full.
        filesystem: PathBuf,
        /// The bytes that file system had free for this user, when known.
        available: Option<u64>,
    },
    /// No edges were declared.
    NoEdges,
    /// An edge is declared twice, or goes from a stage to itself.
    BadEdge(Edge),
    /// The geometry is outside what a region can hold.
    Geometry(GeometryError),
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
            CreateError::NoSpace {
                path,
                bytes,
                filesystem,
                available,
            } => {
                write!(
                    f,
                    "no space for {}: the region needs {bytes} bytes ({:.1} MiB) and the file system at {} ",
                    path.display(),
                    *bytes as f64 / (1024.0 * 1024.0),
                    filesystem.display()
                )?;
                match available {
                    Some(a) => write!(f, "has {a} bytes free"),
                    None => f.write_str("is full"),
                }
            }
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
    /// [`AttachOptions::allow_foreign_owner`](crate::AttachOptions::allow_foreign_owner)
    /// to attach anyway).
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
    Geometry(GeometryError),
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
    /// The file was shrunk under the mapping while the header was read
    /// (another process truncated it): attach it again once it is whole.
    Shrunk,
    /// A page of a sparse region could not be allocated while the header
    /// was read: its file system is full.
    NoSpace,
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
            AttachError::Shrunk => f.write_str(
                "the region file was truncated under this process while it was attached; attach it again once it is whole",
            ),
            AttachError::NoSpace => f.write_str(
                "no space left on the file system for a page of this sparse region; free space, then attach it again",
            ),
        }
    }
}

// As for CreateError: the inner errors are in the Display text.
impl std::error::Error for AttachError {}

/// Why a read of every slot failed (a sweep of the open requests, a
/// reclaim, the histograms, or [`Viewer::check`](crate::Viewer::check)):
/// this process's mapping of the region is no longer whole. Snapshots of
/// single requests do not check (see [`Outcome::Faulted`](crate::Outcome::Faulted)
/// for the calls that write). Attach the file again once it is whole.
#[derive(Debug)]
#[non_exhaustive]
pub enum SweepError {
    /// The file is now shorter than the mapping: another process truncated
    /// it after it was attached (found by its length, before a sweep).
    Truncated {
        /// The file's length.
        actual: u64,
        /// The length of the mapping, which the geometry implies.
        expected: u64,
    },
    /// The file was shrunk under this process's mapping after it was
    /// attached (another process truncated it), found by an access to a
    /// lost page: what is left of the mapping no longer shows the region,
    /// so sweeps stop.
    Shrunk,
    /// A page of a sparse region (created with
    /// [`RegionBuilder::sparse`](crate::RegionBuilder::sparse)) could not be
    /// allocated when this process first wrote it: its file system was
    /// full. The file still has its length, but what this process wrote to
    /// that page reached no other process, so sweeps stop.
    NoSpace,
    /// The file's length could not be read.
    Io(std::io::Error),
}

impl fmt::Display for SweepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SweepError::Truncated { actual, expected } => write!(
                f,
                "the region file is {actual} bytes but its geometry needs {expected}"
            ),
            SweepError::Shrunk => f.write_str(
                "the region file was truncated under this process after it was attached; attach it again once it is whole",
            ),
            SweepError::NoSpace => f.write_str(
                "no space left on the file system for a page of this sparse region: what this process wrote there was lost; free space, then attach it again",
            ),
            SweepError::Io(e) => write!(f, "cannot read the region file's length: {e}"),
        }
    }
}

// As for CreateError: the I/O error is in the Display text.
impl std::error::Error for SweepError {}
