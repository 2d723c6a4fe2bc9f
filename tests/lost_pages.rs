//! Pages a mapping cannot keep: a file truncated under an attached region,
//! and a full file system under a region, reserved at creation or sparse.
//!
//! The full file system is a real 4 MiB tmpfs, mounted in a private mount
//! namespace of one thread (`unshare(CLONE_NEWNS)`), so nothing is mounted
//! anywhere else and the mount goes with the thread. That needs root (CI
//! runs as root); elsewhere those tests say why they skip.

use std::path::{Path, PathBuf};

use edgemark::{CreateError, Edge, Event::*, Mark, Outcome, Recorder, RequestState, SweepError};

const E01: Edge = Edge::new(0, 1);

/// Runs `body` with a directory on a fresh 4 MiB tmpfs that only the thread
/// running it can see; `false` (after saying why) when not root.
fn with_small_tmpfs(body: impl FnOnce(&Path) + Send + 'static) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
        return false;
    }
    let thread = std::thread::spawn(move || {
        // SAFETY: unshare changes only this thread's namespaces (a mount
        // namespace and its own copy of the file-system attributes); it
        // touches no memory of ours.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        // Nothing mounted in this namespace may propagate to the others.
        // SAFETY: the strings are NUL-terminated literals; the null pointers
        // are allowed for a propagation change.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount --make-rprivate /: {}",
            std::io::Error::last_os_error()
        );
        let dir = tempfile::tempdir().unwrap();
        let c_dir = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                c_dir.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                c"size=4m".as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        /// Unmounts before the directory is removed, also on a panic.
        struct Unmount(std::ffi::CString);
        impl Drop for Unmount {
            fn drop(&mut self) {
                // SAFETY: a NUL-terminated path we mounted on.
                unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let mounted = Unmount(c_dir);
        body(dir.path());
        drop(mounted);
        drop(dir);
    });
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
    true
}

/// Writes a file in `dir` until its file system is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the file system: {e}"),
        }
    }
    p
}

#[test]
fn a_region_that_does_not_fit_is_refused_at_creation_with_no_space() {
    with_small_tmpfs(|dir| {
        let p = dir.join("r.region");
        let e = Recorder::builder()
            .edge(0, 1)
            .slots(65536)
            .create(&p)
            .unwrap_err();
        let CreateError::NoSpace {
            bytes, filesystem, ..
        } = &e
        else {
            panic!("not a no-space error: {e}");
        };
        assert!(*bytes > 4 << 20);
        assert_eq!(filesystem, &std::fs::canonicalize(dir).unwrap());
        let text = e.to_string();
        assert!(text.starts_with("no space for "), "{text}");
        assert!(text.contains(&bytes.to_string()), "{text}");
        assert!(text.contains(&*filesystem.to_string_lossy()), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!p.exists(), "a failed creation leaves no file behind");
        // What fits is created, with its space reserved: filling the file
        // system afterwards cannot take it away.
        let small = Recorder::builder().edge(0, 1).slots(64).create(&p).unwrap();
        fill(dir);
        let ts: Vec<_> = (0..64).map(|_| small.begin().unwrap()).collect();
        let emit = Mark::new(E01, ProducerFirstNonemptyEmit);
        assert!(
            ts.iter()
                .all(|t| small.record(*t, emit) == Outcome::Recorded)
        );
        small.check().unwrap();
        let other = Recorder::attach(&p).unwrap();
        assert_eq!(other.open_requests().unwrap().len(), 64);
    });
}

#[test]
fn a_sparse_region_on_a_full_file_system_reports_no_space_and_hands_out_no_lost_request() {
    with_small_tmpfs(|dir| {
        let p = dir.join("r.region");
        let owner = Recorder::builder()
            .edge(0, 1)
            .slots(65536)
            .sparse(true)
            .create(&p)
            .unwrap();
        fill(dir);
        // Every slot's page is unallocated and the file system is full:
        // the first begin's write cannot get its page.
        let mut handed_out = Vec::new();
        for _ in 0..8 {
            match owner.begin() {
                Ok(t) => handed_out.push(t),
                Err(o) => assert_eq!(o, Outcome::Faulted),
            }
        }
        let other = Recorder::attach(&p).unwrap();
        let seen = other.open_requests().unwrap();
        for t in &handed_out {
            assert!(seen.contains(t), "{t} was handed out but nobody sees it");
        }
        assert!(
            matches!(owner.check(), Err(SweepError::NoSpace)),
            "{:?}",
            owner.check()
        );
        assert!(matches!(owner.open_requests(), Err(SweepError::NoSpace)));
        assert!(owner.check().unwrap_err().to_string().contains("no space"));
        // Freeing space does not mend this mapping; attaching again does.
        std::fs::remove_file(dir.join("filler")).unwrap();
        assert_eq!(owner.begin(), Err(Outcome::Faulted));
        let again = Recorder::attach(&p).unwrap();
        let t = again.begin().unwrap();
        assert!(other.open_requests().unwrap().contains(&t));
        assert_eq!(again.close(t).state(), RequestState::Closed);
    });
}

#[test]
fn begin_start_segment_and_close_refuse_on_a_truncated_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    let owner = Recorder::builder().edge(0, 1).slots(64).create(&p).unwrap();
    // Fill the slots that lie in the part of the file the truncation keeps.
    let info = owner.info().unwrap();
    let kept = (8192 - info.slots_offset) / info.slot_stride;
    assert!(kept >= 1);
    let near: Vec<_> = (0..kept).map(|_| owner.begin().unwrap()).collect();
    let near = near[0];
    assert_eq!(near.slot(), 0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(8192)
        .unwrap();
    // The next free slot is past the new end: the begin loses its page.
    assert_eq!(owner.begin(), Err(Outcome::Faulted));
    // From then on no control operation trusts the mapping, even on a page
    // the file still covers.
    assert_eq!(owner.begin(), Err(Outcome::Faulted));
    assert_eq!(owner.start_segment(near, E01, 1), Outcome::Faulted);
    let last = owner.close(near);
    assert_eq!(last.state(), RequestState::Faulted);
    assert!(last.is_empty());
    assert!(matches!(owner.check(), Err(SweepError::Shrunk)));
    // The request is still open in the file for whoever attaches again.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(owner.info().unwrap().bytes)
        .unwrap();
    let again = Recorder::attach(&p).unwrap();
    assert_eq!(again.open_requests().unwrap().len() as u64, kept);
    assert_eq!(again.close(near).state(), RequestState::Closed);
}
