//! How the exporter attaches the region it reads (the core's
//! [`RingFollower`](edgemark::follow::RingFollower) attaches it again when
//! another file takes its place or a drain fails).

use edgemark::AttachOptions;

/// The options the exporter attaches with. To write without the clock:
/// taking from the ring writes its read cursor, its entries' states and
/// its reader table, and the exporter neither begins a request nor
/// records a value, so a region of another boot or time namespace is no
/// reason to refuse.
pub(crate) fn attach_options(allow_foreign_owner: bool) -> AttachOptions {
    AttachOptions::new()
        .allow_foreign_owner(allow_foreign_owner)
        .allow_foreign_clock(true)
}
