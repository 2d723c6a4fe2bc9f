//! Following a region file at a path, as a long-lived reader does: the
//! file there attached again when another file takes its place (a server
//! restarted, `edgemark clean` then a new server), told apart from a file
//! that is gone or cannot be used now, and, for a reader of the ring of
//! closed requests, what dead readers left adopted and a close that never
//! finished writing its entry given up.
//!
//! Written once here for every program that follows a region: the OTLP
//! exporter, `edgemark export`'s `/metrics` server and its `--dir` mode.
//! Nothing here logs: each call says what changed ([`Look`], [`Step`]) and
//! the program says it in its own words, once per change.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use edgemark::follow::{Look, RingFollower};
//! use edgemark::{AttachOptions, Recorder};
//!
//! let dir = std::env::temp_dir().join(format!("edgemark-follow-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("pipeline.region");
//! let rec = Recorder::builder().edge(0, 1).closed_entries(16).create(&path)?;
//! let t = rec.begin().unwrap();
//! rec.close(t);
//!
//! let mut follower = RingFollower::new(&path, AttachOptions::new());
//! assert!(matches!(follower.look(), Look::Attached { replaced: false }));
//! let mut closed = Vec::new();
//! let step = follower.take(16, &mut closed);
//! assert_eq!(step.taken, 1);
//! // ... sent; the receiver has it:
//! assert!(follower.reader().unwrap().acknowledge(closed[0].claim()));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::recorder::{AttachOptions, ClosedReader};
use crate::trace::ClosedRequest;

/// A file's device and inode: what tells one file at a path from another
/// that took its place.
pub type FileId = (u64, u64);

/// The device and inode of the file at `path`, or why there is none.
pub fn file_identity(path: &Path) -> std::io::Result<FileId> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// What [`Followed::look`] found at the path.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Look {
    /// The file attached before is still there.
    Same,
    /// A file was attached: the first one, one that took the place of the
    /// file attached before (`replaced`), or one there again after the
    /// path was empty or its file could not be used.
    Attached {
        /// Whether it took the place of a file that was attached.
        replaced: bool,
    },
    /// Nothing can be attached now: no file at the path, or one that
    /// cannot be used. The reason, given when it changes
    /// (`new == true`) and on every later look while it lasts. What was
    /// attached is let go, except a removed file's under
    /// [`Followed::keep_when_gone`].
    Failing {
        /// Why, in one line that names the path.
        why: String,
        /// Whether this look found a new reason (to be said), rather than
        /// the one the look before found.
        new: bool,
        /// Whether the path names no file (rather than a file that cannot
        /// be used).
        gone: bool,
    },
}

/// Something attached from the file at a path (a [`Viewer`](crate::Viewer),
/// a [`ClosedReader`]), followed: each [`Followed::look`] compares the
/// file at the path with the one attached (one `stat`) and attaches the
/// file there when another took its place, or when the path was empty or
/// unusable before.
pub struct Followed<T> {
    path: PathBuf,
    /// What is attached, and the file it was attached from.
    current: Option<(T, FileId)>,
    /// Why nothing is attached, as last given, and the file that was
    /// there then (none if the path was empty).
    failing: Option<(String, Option<FileId>)>,
    /// Whether what is attached is kept while the path names no file (its
    /// mapping stays readable after the file is removed).
    keep_when_gone: bool,
}

impl<T> fmt::Debug for Followed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Followed")
            .field("path", &self.path)
            .field("attached", &self.current.as_ref().map(|(_, id)| *id))
            .field("failing", &self.failing.as_ref().map(|(why, _)| why))
            .finish()
    }
}

impl<T> Followed<T> {
    /// Follows `path`, with nothing attached yet: the first
    /// [`Followed::look`] attaches.
    pub fn new(path: impl Into<PathBuf>) -> Followed<T> {
        Followed {
            path: path.into(),
            current: None,
            failing: None,
            keep_when_gone: false,
        }
    }

    /// Keeps what is attached while the path names no file, until another
    /// file is there: a removed file's mapping stays whole, so a reader of
    /// its ring can still take what its closes left there. Without it, a
    /// gone file lets what was attached go.
    pub fn keep_when_gone(mut self, yes: bool) -> Followed<T> {
        self.keep_when_gone = yes;
        self
    }

    /// Follows `path`, where `value` was attached from the file there now.
    pub fn attached(path: impl Into<PathBuf>, value: T) -> Followed<T> {
        let path = path.into();
        let mut f = Followed::new(path);
        match file_identity(&f.path) {
            Ok(id) => f.current = Some((value, id)),
            Err(e) => f.failing = Some((gone(&f.path, &e), None)),
        }
        f
    }

    /// The path followed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is attached now, if anything.
    pub fn current(&self) -> Option<&T> {
        self.current.as_ref().map(|(v, _)| v)
    }

    /// Looks at the path: the file attached before is kept while it is
    /// there; another file (or one there again) is attached with `attach`;
    /// a path with no file, or a file `attach` refuses, leaves nothing
    /// attached and says why.
    pub fn look<E: fmt::Display>(&mut self, attach: impl FnOnce(&Path) -> Result<T, E>) -> Look {
        let now = match file_identity(&self.path) {
            Ok(id) => id,
            Err(e) => {
                if !self.keep_when_gone {
                    self.current = None;
                }
                return self.fail(gone(&self.path, &e), None, true);
            }
        };
        if self.current.as_ref().is_some_and(|(_, id)| *id == now) {
            return Look::Same;
        }
        match attach(&self.path) {
            Ok(v) => {
                let replaced = self.current.replace((v, now)).is_some();
                self.failing = None;
                Look::Attached { replaced }
            }
            Err(e) => {
                self.current = None;
                // Named once: some errors name the path themselves.
                let (p, e) = (self.path.display().to_string(), e.to_string());
                let why = if e.contains(&p) {
                    e
                } else {
                    format!("{p}: {e}")
                };
                self.fail(why, Some(now), false)
            }
        }
    }

    /// Lets what is attached go (it failed): the next look attaches the
    /// file at the path again, even the same one. `why` is given by that
    /// look if it fails too.
    pub fn drop_current(&mut self) {
        self.current = None;
    }

    /// Puts `value`, attached again from the same file, in place of what
    /// is attached (a mapping that lost a page stays faulted; a new one of
    /// the whole file does not).
    pub fn replace_current(&mut self, value: T) {
        if let Some((v, _)) = &mut self.current {
            *v = value;
        }
    }

    fn fail(&mut self, why: String, id: Option<FileId>, gone: bool) -> Look {
        let new = self.failing.as_ref() != Some(&(why.clone(), id));
        self.failing = Some((why.clone(), id));
        Look::Failing { why, new, gone }
    }
}

fn gone(path: &Path, e: &std::io::Error) -> String {
    format!("{}: the region file is gone ({e})", path.display())
}

/// How often a [`RingFollower`] compares the file at its path with the
/// one it attached, at most.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often a [`RingFollower`] looks for requests that readers which
/// died (or stopped before settling them) left taken in the ring.
pub const ADOPT_EVERY: Duration = Duration::from_secs(5);
/// How long a ring entry may stay claimed and unwritten before a
/// [`RingFollower`] judges its closer dead and gives the entry up.
pub const PENDING_GIVE_UP: Duration = Duration::from_secs(5);

/// What one [`RingFollower::take`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Step {
    /// Closed requests that readers before this one left taken and never
    /// settled, adopted and appended first.
    pub adopted: usize,
    /// Closed requests taken from the ring and appended after them.
    pub taken: usize,
    /// Closed requests found torn and given up (lost, counted by the
    /// region).
    pub lost: u64,
    /// Whether a closed request whose close never finished writing it
    /// (its closer died) was given up, counted by the region as lost.
    pub gave_up_pending: bool,
    /// Whether the ring had nothing more to take.
    pub caught_up: bool,
    /// Why the ring could not be read, if it could not: the follower
    /// attaches again at its next look.
    pub failed: Option<String>,
}

/// A registered reader ([`ClosedReader`]) of the ring of the region at a
/// path, followed: attached again when another file takes the path's
/// place or a take fails; kept while the path names no file (a removed
/// file's ring still holds what its closes left, and is drained); what dead readers of the region left taken,
/// adopted every [`ADOPT_EVERY`] (and at once after each attach); a ring
/// entry claimed and left unwritten for [`PENDING_GIVE_UP`], given up.
///
/// The reader is shared ([`RingFollower::reader`]) so that what was taken
/// can be acknowledged after the follower attached again: a request
/// acknowledged through a reader of a replaced file settles nothing in
/// the new one.
pub struct RingFollower {
    file: Followed<Arc<ClosedReader>>,
    options: AttachOptions,
    checked: Option<Instant>,
    adopted_at: Option<Instant>,
    /// The ring entry a take found still being written, and since when.
    pending: Option<(u64, Instant)>,
}

impl fmt::Debug for RingFollower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingFollower")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl RingFollower {
    /// Follows the ring of the region at `path`, attached with `options`
    /// (to write: a reader writes its cursor and table); the first
    /// [`RingFollower::look`] attaches.
    pub fn new(path: impl Into<PathBuf>, options: AttachOptions) -> RingFollower {
        RingFollower {
            file: Followed::new(path).keep_when_gone(true),
            options,
            checked: None,
            adopted_at: None,
            pending: None,
        }
    }

    /// Follows `path`, whose ring `reader` already reads.
    pub fn with_reader(
        path: impl Into<PathBuf>,
        options: AttachOptions,
        reader: ClosedReader,
    ) -> RingFollower {
        RingFollower {
            file: Followed::attached(path, Arc::new(reader)).keep_when_gone(true),
            options,
            checked: Some(Instant::now()),
            adopted_at: None,
            pending: None,
        }
    }

    /// The path followed.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The reader of the file attached now, if any.
    pub fn reader(&self) -> Option<&Arc<ClosedReader>> {
        self.file.current()
    }

    /// Looks at the path now: as [`Followed::look`], attaching a reader of
    /// the ring of the file there when it is new.
    pub fn look(&mut self) -> Look {
        self.checked = Some(Instant::now());
        let options = self.options.clone();
        let look = self.file.look(|path| {
            let rec = options.attach(path).map_err(|e| e.to_string())?;
            rec.closed_reader()
                .map(Arc::new)
                .map_err(|e| format!("cannot read closed requests: {e}"))
        });
        if matches!(look, Look::Attached { .. }) {
            self.adopted_at = None;
            self.pending = None;
        }
        look
    }

    /// [`RingFollower::look`] if none was made for [`CHECK_EVERY`], or if
    /// nothing is attached; else `None`.
    pub fn look_if_due(&mut self) -> Option<Look> {
        let due = self.file.current().is_none()
            || self.checked.is_none_or(|t| t.elapsed() >= CHECK_EVERY);
        due.then(|| self.look())
    }

    /// Takes what dead readers left (when due) then up to `max` closed
    /// requests from the ring, appending them to `out`. Nothing is taken
    /// while no file is attached. A take that fails lets the reader go
    /// (the next look attaches again) and says why.
    pub fn take(&mut self, max: usize, out: &mut Vec<ClosedRequest>) -> Step {
        let mut step = Step::default();
        let Some(reader) = self.file.current().cloned() else {
            return step;
        };
        if self.adopted_at.is_none_or(|t| t.elapsed() >= ADOPT_EVERY) {
            self.adopted_at = Some(Instant::now());
            step.adopted = reader.adopt(out);
        }
        if max == 0 {
            return step;
        }
        match reader.take(max, out) {
            Ok(d) => {
                step.taken = d.taken;
                step.lost = d.lost;
                step.caught_up = d.caught_up;
                self.pending = match (d.pending, self.pending) {
                    (None, _) => None,
                    (Some(claim), Some((held, since))) if held == claim => {
                        if since.elapsed() < PENDING_GIVE_UP {
                            Some((held, since))
                        } else {
                            step.gave_up_pending = reader.skip(claim);
                            None
                        }
                    }
                    (Some(claim), _) => Some((claim, Instant::now())),
                };
            }
            Err(e) => {
                self.file.drop_current();
                step.failed = Some(format!(
                    "{}: cannot drain closed requests: {e}",
                    self.path().display()
                ));
            }
        }
        step
    }
}
