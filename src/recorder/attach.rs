//! Attaching to an existing region: the options, and the recorder built
//! from a region the region layer opened and validated.

#[cfg(not(edgemark_loom))]
use std::path::Path;

use super::{ClockShare, Recorder, Viewer};
use crate::clock::{self, Clock, ClockIdentity};
use crate::mark::Edge;
use crate::process;
#[cfg(not(edgemark_loom))]
use crate::region::FileOwner;
use crate::region::{self, Access, AttachError, Header, Opened, Storage};
use crate::schema::Schema;

/// Options for attaching to an existing region file, to write it
/// ([`AttachOptions::attach`], a [`Recorder`]) or only to read it
/// ([`AttachOptions::view`], a [`Viewer`]).
///
/// [`Recorder::attach`] is the same as `AttachOptions::new().attach(path)`,
/// [`Viewer::attach`] as `AttachOptions::new().view(path)`.
#[derive(Clone, Debug, Default)]
pub struct AttachOptions {
    pub(crate) allow_foreign_clock: bool,
    pub(crate) allow_foreign_owner: bool,
    pub(crate) expect_schema: Option<Schema>,
    pub(crate) expect_edges: Option<Vec<Edge>>,
}

impl Recorder {
    /// Attaches to an existing region file with default options: the same as
    /// `AttachOptions::new().attach(path)`.
    #[cfg(not(edgemark_loom))]
    pub fn attach(path: impl AsRef<Path>) -> Result<Recorder, AttachError> {
        AttachOptions::new().attach(path)
    }
}

impl Viewer {
    /// Attaches to an existing region file to read it only, with default
    /// options: the same as `AttachOptions::new().view(path)`.
    #[cfg(not(edgemark_loom))]
    pub fn attach(path: impl AsRef<Path>) -> Result<Viewer, AttachError> {
        AttachOptions::new().view(path)
    }
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

    /// Attaches to the region at `path` for writing.
    ///
    /// Like every mapping of a region file, this installs edgemark's
    /// process-wide `SIGBUS` handler on first use (see
    /// [`RegionBuilder::create`](crate::RegionBuilder::create)).
    #[cfg(not(edgemark_loom))]
    pub fn attach(&self, path: impl AsRef<Path>) -> Result<Recorder, AttachError> {
        let path = path.as_ref();
        let opened = region::open_file(path, self.file_owner(), Access::ReadWrite)?;
        let (storage, header, clock) = self.accept(opened, Access::ReadWrite)?;
        Ok(Recorder::from_header(
            storage,
            header,
            Some(path.to_owned()),
            clock,
        ))
    }

    /// Attaches to the region at `path` to read it only: the file is opened
    /// and mapped read-only, so read permission on it is enough (what a
    /// monitoring user needs), and the [`Viewer`] has no call that writes.
    /// Installs the `SIGBUS` handler as [`AttachOptions::attach`] does.
    ///
    /// ```
    /// # use edgemark::{AttachOptions, Recorder};
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("r.region");
    /// let owner = Recorder::builder().edge(0, 1).create(&path)?;
    /// let t = owner.begin().unwrap();
    /// let viewer = AttachOptions::new().allow_foreign_owner(true).view(&path)?;
    /// assert_eq!(viewer.open_requests()?, vec![t]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(not(edgemark_loom))]
    pub fn view(&self, path: impl AsRef<Path>) -> Result<Viewer, AttachError> {
        let path = path.as_ref();
        let opened = region::open_file(path, self.file_owner(), Access::ReadOnly)?;
        let (storage, header, clock) = self.accept(opened, Access::ReadOnly)?;
        Ok(Viewer::from_header(
            storage,
            header,
            Some(path.to_owned()),
            clock,
        ))
    }

    /// Whose files these options open.
    #[cfg(not(edgemark_loom))]
    fn file_owner(&self) -> FileOwner {
        if self.allow_foreign_owner {
            FileOwner::Anyone
        } else {
            FileOwner::Me
        }
    }

    /// Opens a private, in-memory copy of a region's bytes (a file saved for
    /// later study, say), validated exactly as [`AttachOptions::attach`]
    /// validates a file. Records into the copy change only the copy.
    pub fn attach_copy(&self, bytes: &[u8]) -> Result<Recorder, AttachError> {
        let (storage, header, clock) = self.accept(region::open_copy(bytes)?, Access::ReadWrite)?;
        Ok(Recorder::from_header(storage, header, None, clock))
    }

    /// Checks a validated header against these options; `access` is how
    /// its storage is mapped.
    fn check(&self, h: &Header, access: Access) -> Result<ClockShare, AttachError> {
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
        } else if h.clock_kind == Clock::Counter
            && access == Access::ReadWrite
            && !counter_agrees(h)
        {
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

impl AttachOptions {
    /// A validated region that these options accept, and how this process
    /// shares its clock; `access` is how its storage is mapped.
    fn accept(
        &self,
        opened: Opened,
        access: Access,
    ) -> Result<(Storage, Header, ClockShare), AttachError> {
        let Opened { storage, header } = opened;
        let clock = self.check(&header, access)?;
        if header.pid_namespace != process::pid_namespace() && access == Access::ReadWrite {
            // Pids in this region now mean different processes to different
            // attachers: tell everyone to stop judging them.
            region::mark_mixed_pid_namespaces(storage.words());
        }
        Ok((storage, header, clock))
    }
}
