//! Attaching to an existing region: the options, and the recorder built
//! from a region the region layer opened and validated.

#[cfg(not(edgemark_loom))]
use std::path::Path;
use std::path::PathBuf;

use super::{ClockShare, Recorder};
use crate::clock::{self, Clock, ClockIdentity};
use crate::mark::Edge;
use crate::process;
use crate::region::{self, Access, AttachError, FileOwner, Header, Opened};
use crate::schema::Schema;

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
    pub(crate) read_only: bool,
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

    /// Opens and maps the region for reading only (default `false`): read
    /// permission on the file is enough, which is what a monitoring user
    /// needs. Snapshots, sweeps, counters and histograms work; every call
    /// that writes (begin, record, start segment, close, registering a
    /// domain) returns [`Outcome::ReadOnly`](crate::Outcome::ReadOnly) or
    /// its equivalent and touches nothing, and a reclaim fails with
    /// [`AttachError::ReadOnly`].
    ///
    /// ```
    /// # use edgemark::{AttachOptions, Edge, Event, Mark, Outcome, Recorder};
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("r.region");
    /// let owner = Recorder::builder().edge(0, 1).create(&path)?;
    /// let t = owner.begin().unwrap();
    /// let viewer = AttachOptions::new().read_only(true).attach(&path)?;
    /// assert_eq!(viewer.open_requests()?, vec![t]);
    /// let emit = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit);
    /// assert_eq!(viewer.record(t, emit), Outcome::ReadOnly);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_only(mut self, yes: bool) -> AttachOptions {
        self.read_only = yes;
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
    ///
    /// Like every mapping of a region file, this installs edgemark's
    /// process-wide `SIGBUS` handler on first use (see
    /// [`RegionBuilder::create`](crate::RegionBuilder::create)).
    #[cfg(not(edgemark_loom))]
    pub fn attach(&self, path: impl AsRef<Path>) -> Result<Recorder, AttachError> {
        let path = path.as_ref();
        let owner = if self.allow_foreign_owner {
            FileOwner::Anyone
        } else {
            FileOwner::Me
        };
        let access = if self.read_only {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        };
        let opened = region::open_file(path, owner, access)?;
        Recorder::from_opened(opened, Some(path.to_owned()), self)
    }

    /// Opens a private, in-memory copy of a region's bytes (a file saved for
    /// later study, say), validated exactly as [`AttachOptions::attach`]
    /// validates a file. Records into the copy change only the copy.
    pub fn attach_copy(&self, bytes: &[u8]) -> Result<Recorder, AttachError> {
        Recorder::from_opened(region::open_copy(bytes)?, None, self)
    }

    /// Checks a validated header against these options.
    fn check(&self, h: &Header) -> Result<ClockShare, AttachError> {
        if let Some(s) = &self.expect_schema
            && *s != *h.schema
        {
            return Err(AttachError::SchemaMismatch);
        }
        if let Some(e) = &self.expect_edges
            && *e != h.edges
        {
            return Err(AttachError::EdgeMismatch);
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
        Ok(if !same_clock {
            ClockShare::Foreign
        } else if h.clock_kind == Clock::Counter && !self.read_only && !counter_agrees(h) {
            ClockShare::Untrusted
        } else {
            ClockShare::Shared
        })
    }
}

/// Whether this process trusts the counter of a counter region: the kernel
/// does, and a short calibration (about 10 ms) agrees with the region's rate
/// within [`clock::RATE_TOLERANCE_PPM`].
fn counter_agrees(h: &Header) -> bool {
    clock::counter_untrusted().is_none()
        && clock::calibrate(2, 5_000_000).is_some_and(|r| clock::rates_agree(h.counter_rate, r))
}

impl Recorder {
    /// A recorder on a validated region that `opts` accept.
    fn from_opened(
        opened: Opened,
        path: Option<PathBuf>,
        opts: &AttachOptions,
    ) -> Result<Recorder, AttachError> {
        let Opened { storage, header } = opened;
        let clock = opts.check(&header)?;
        if header.pid_namespace != process::pid_namespace() && storage.access() == Access::ReadWrite
        {
            // Pids in this region now mean different processes to different
            // attachers: tell everyone to stop judging them.
            region::mark_mixed_pid_namespaces(storage.words());
        }
        Ok(Recorder::from_header(storage, header, path, clock))
    }
}
