//! The rule for removing a region file left behind: `reclaim
//! --remove-if-abandoned`. A file is removed only when its creator has
//! exited (as judged from this pid namespace) and no request is open in it;
//! processes that still map it keep their mapping.

use std::path::Path;

use anyhow::{Context, Result};
use edgemark::Recorder;

use crate::out::outln;

/// What the rule decides for one region file.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Whether the creator runs cannot be judged from this pid namespace.
    KeepUnjudged,
    /// Its creator is running.
    KeepCreatorRuns,
    /// Its creator has exited, but this many requests of live owners are
    /// open.
    KeepOpen(usize),
    /// Its creator has exited and nothing is open.
    Remove,
}

/// The rule: `creator_alive` as
/// [`Viewer::creator_alive`](edgemark::Viewer::creator_alive) says it,
/// `open` the requests open now.
fn judge(creator_alive: Option<bool>, open: usize) -> Verdict {
    match creator_alive {
        None => Verdict::KeepUnjudged,
        Some(true) => Verdict::KeepCreatorRuns,
        Some(false) if open > 0 => Verdict::KeepOpen(open),
        Some(false) => Verdict::Remove,
    }
}

/// `reclaim --remove-if-abandoned`: removes the region file at `path` if
/// the rule says so, and says what it did.
pub(crate) fn remove_if_abandoned_region(rec: &Recorder, path: &Path) -> Result<()> {
    let open = rec
        .open_requests()
        .context("the region changed under this process")?
        .len();
    match judge(rec.creator_alive(), open) {
        Verdict::KeepUnjudged => outln!(
            "kept {}: whether its creator runs cannot be judged from this pid namespace",
            path.display()
        ),
        Verdict::KeepCreatorRuns => outln!(
            "kept {}: its creator (pid {}) is running",
            path.display(),
            rec.info().map_or(0, |i| i.creator_pid)
        ),
        Verdict::KeepOpen(open) => outln!(
            "kept {}: its creator has exited but {open} requests of live owners are open",
            path.display()
        ),
        Verdict::Remove => {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
            outln!(
                "removed {}: its creator has exited and no request is open",
                path.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_removed_only_when_its_creator_is_gone_and_nothing_is_open() {
        assert_eq!(judge(Some(false), 0), Verdict::Remove);
        assert_eq!(judge(Some(false), 2), Verdict::KeepOpen(2));
        assert_eq!(judge(Some(true), 0), Verdict::KeepCreatorRuns);
        assert_eq!(judge(None, 0), Verdict::KeepUnjudged);
        assert_eq!(judge(None, 3), Verdict::KeepUnjudged);
    }
}
