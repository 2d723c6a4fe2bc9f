//! Other users: a group member who records into a region shared with the
//! group, a monitoring user with read permission alone, and a group member
//! who shrinks and regrows the file in a loop while root's readers run.
//!
//! The users are created by the test (`useradd`), which needs root; where it
//! cannot, each test says so on standard error and returns.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use edgemark::{Edge, Event, Mark, Outcome, Recorder};

/// A user of this machine, other than the one running the tests.
#[derive(Clone, Copy, Debug)]
struct User {
    uid: u32,
    gid: u32,
}

/// The user `name` (created with its own group if it does not exist yet),
/// or `None`, with a visible message, where this process cannot create
/// users.
fn other_user(name: &str, test: &str) -> Option<User> {
    let skip = |why: &str| {
        // Straight to stderr: the test harness captures `eprintln!`.
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
        None
    };
    // This process's effective uid owns its /proc entry.
    let euid = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    if euid != 0 {
        return skip("not root, so no second user can be created");
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, name]).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .flatten()
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", name])
            .output();
        // Another test may have created it meanwhile.
        if id("-u").is_none() {
            return skip(&format!("useradd {name} failed: {made:?}"));
        }
    }
    Some(User {
        uid: id("-u")?,
        gid: id("-g")?,
    })
}

/// A directory every user can enter, with a copy of the `edgemark` binary
/// that every user can run (the build directory may be private).
struct Shared {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Shared {
    fn new() -> Shared {
        let dir = tempfile::Builder::new()
            .prefix("edgemark-users-")
            .tempdir_in(edgemark::default_dir())
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("edgemark");
        std::fs::copy(env!("CARGO_BIN_EXE_edgemark"), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A process that another test thread forks while the copy is open
        // for writing keeps it open until it execs, and until then running
        // the copy fails with ETXTBSY ("text file busy"): wait that out.
        for _ in 0..200 {
            match Command::new(&bin).arg("--version").output() {
                Err(e) if e.raw_os_error() == Some(26) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => break,
            }
        }
        Shared { dir, bin }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `edgemark ARGS` as `user` (as this user for `None`).
    fn edgemark(&self, user: Option<User>, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args).current_dir("/");
        if let Some(u) = user {
            c.uid(u.uid).gid(u.gid);
        }
        c
    }

    fn run(&self, user: Option<User>, args: &[&str]) -> Output {
        self.edgemark(user, args).output().unwrap()
    }
}

fn chown_group(path: &Path, gid: u32) {
    std::os::unix::fs::chown(path, None, Some(gid)).unwrap();
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_group_member_records_into_a_region_shared_with_the_group() {
    const NAME: &str = "a_group_member_records_into_a_region_shared_with_the_group";
    let Some(member) = other_user("edgemark-member", NAME) else {
        return;
    };
    let shared = Shared::new();
    let p = shared.path("group.region");
    let ps = p.to_str().unwrap();
    let out = shared.run(None, &["create", ps, "--edge", "0:1", "--group-access"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    chown_group(&p, member.gid);
    let owner = Recorder::attach(&p).unwrap();
    let t = owner.begin().unwrap();
    let token = t.to_string();

    // Without saying it trusts the file's owner, the member is refused, and
    // told how to say it.
    let out = shared.run(
        Some(member),
        &["record", ps, &token, "0:1", "producer_first_nonempty_emit"],
    );
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--allow-foreign-owner"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let out = shared.run(
        Some(member),
        &[
            "record",
            ps,
            &token,
            "0:1",
            "producer_first_nonempty_emit",
            "--chunk-seq",
            "4",
            "--allow-foreign-owner",
        ],
    );
    assert_eq!(text(&out).0.trim(), "recorded", "{:?}", text(&out));
    let out = shared.run(Some(member), &["begin", ps, "--allow-foreign-owner"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let seg = owner.snapshot(t);
    let seg = seg.segment(Edge::new(0, 1), 0).unwrap();
    assert_eq!(seg.first_chunk_seq(), Some(4));

    // A user outside the group cannot even open it.
    let Some(stranger) = other_user("edgemark-stranger", NAME) else {
        return;
    };
    let out = shared.run(Some(stranger), &["inspect", ps, "--allow-foreign-owner"]);
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
}

#[test]
fn a_viewer_with_read_permission_alone_inspects_and_exports() {
    const NAME: &str = "a_viewer_with_read_permission_alone_inspects_and_exports";
    let Some(viewer) = other_user("edgemark-viewer", NAME) else {
        return;
    };
    let shared = Shared::new();
    let p = shared.path("viewed.region");
    let ps = p.to_str().unwrap();
    let owner = Recorder::builder().edge(0, 1).slots(16).create(&p).unwrap();
    let t = owner.begin().unwrap();
    let emit = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit);
    assert_eq!(owner.record(t, emit.chunk_seq(2)), Outcome::Recorded);
    // Read for everyone, write for the owner only.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();

    let out = shared.run(
        Some(viewer),
        &["inspect", ps, "--json", "--allow-foreign-owner"],
    );
    let (json, err) = text(&out);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["open_requests"], 1);
    assert_eq!(v["open"][0]["token"], t.to_string());
    assert_eq!(
        v["open"][0]["snapshot"]["0->1:0"]["first_chunk_seq"],
        serde_json::json!(2)
    );

    // export, read-only too: one scrape shows the open request.
    let mut export = shared
        .edgemark(
            Some(viewer),
            &[
                "export",
                ps,
                "--listen",
                "127.0.0.1:0",
                "--allow-foreign-owner",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = listening_on(&mut export);
    let body = scrape(addr).expect("a scrape");
    assert!(body.contains("edgemark_region_ok 1"), "{body}");
    assert!(body.contains("edgemark_open_requests 1"), "{body}");
    export.kill().unwrap();
    export.wait().unwrap();

    // Writing needs write permission: one line, nothing changed.
    let out = shared.run(
        Some(viewer),
        &[
            "record",
            ps,
            &t.to_string(),
            "0:1",
            "consumer_first_accept",
            "--allow-foreign-owner",
        ],
    );
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(
        owner
            .snapshot(t)
            .segment(Edge::new(0, 1), 0)
            .unwrap()
            .segment_index(),
        0
    );
    assert!(
        owner
            .snapshot(t)
            .segment(Edge::new(0, 1), 0)
            .unwrap()
            .elapsed_ms(Event::ConsumerFirstAccept)
            .is_none()
    );
}

#[test]
fn a_viewer_with_read_permission_alone_needs_no_flag_to_look() {
    const NAME: &str = "a_viewer_with_read_permission_alone_needs_no_flag_to_look";
    let Some(viewer) = other_user("edgemark-viewer", NAME) else {
        return;
    };
    let shared = Shared::new();
    let p = shared.path("looked-at.region");
    let ps = p.to_str().unwrap();
    let owner = Recorder::builder().edge(0, 1).slots(16).create(&p).unwrap();
    let t = owner.begin().unwrap();
    let emit = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit);
    assert_eq!(owner.record(t, emit.chunk_seq(5)), Outcome::Recorded);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();

    // `snapshot` only reads: it opens the file read-only (as on a read-only
    // mount, where a read-write open fails), and a file of another user is
    // no reason to refuse to read it.
    let out = shared.run(Some(viewer), &["snapshot", ps, &t.to_string()]);
    let (json, err) = text(&out);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["0->1:0"]["first_chunk_seq"], 5);
    let out = shared.run(Some(viewer), &["inspect", ps]);
    let (listing, err) = text(&out);
    assert!(out.status.success(), "{err}");
    assert!(listing.contains(&t.to_string()), "{listing}");
    // Writing needs write permission (and then the flag).
    let out = shared.run(Some(viewer), &["close", ps, &t.to_string()]);
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(owner.snapshot(t).state(), edgemark::RequestState::Open);
}

/// The address an `edgemark export` child says it serves.
fn listening_on(child: &mut Child) -> SocketAddr {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix("serving http://")
        .and_then(|l| l.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("edgemark export said {line:?}"))
        .parse()
        .unwrap()
}

/// One `GET /metrics`: the body, or `None` if the server did not answer.
fn scrape(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// How a child ended: `Err(signal)` if a signal killed it.
fn ended(status: std::process::ExitStatus) -> Result<Option<i32>, i32> {
    match status.signal() {
        Some(sig) => Err(sig),
        None => Ok(status.code()),
    }
}

const SHRINKER: &str = r#"
import os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_RDWR)
full = os.fstat(fd).st_size
end = time.monotonic() + seconds
loops = 0
while time.monotonic() < end:
    os.ftruncate(fd, full // 2)
    time.sleep(0.002)
    os.ftruncate(fd, full)
    time.sleep(0.002)
    loops += 1
print(loops)
"#;

/// The brief's promise made real: for 20 s a group member shrinks the file
/// to half and regrows it every 2 ms, while root's `export` is scraped ten
/// times a second and `inspect` and `reclaim` run in a loop. No reader dies
/// of a signal; each answers, or says in one line that the region changed
/// under it.
#[test]
fn readers_survive_a_group_member_shrinking_the_region_in_a_loop() {
    const NAME: &str = "readers_survive_a_group_member_shrinking_the_region_in_a_loop";
    let seconds: f64 = std::env::var("EDGEMARK_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20.0);
    let member = other_user("edgemark-hostile", NAME);
    let shared = Shared::new();
    let p = shared.path("soak.region");
    let ps = p.to_str().unwrap();
    let owner = Recorder::builder()
        .edge(0, 1)
        .slots(512)
        .group_access(true)
        .create(&p)
        .unwrap();
    let emit = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit);
    for _ in 0..300 {
        let t = owner.begin().unwrap();
        owner.record(t, emit);
    }
    if let Some(m) = member {
        chown_group(&p, m.gid);
    }
    let python = ["/usr/bin/python3", "/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(python) = python else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {NAME}: no system python3 for the shrinker"
        );
        return;
    };
    // The exporter attaches first, while the file is whole; it must then
    // live through everything the shrinker does.
    let mut export = shared
        .edgemark(None, &["export", ps, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = listening_on(&mut export);
    let mut shrinker = Command::new(python);
    shrinker
        .args(["-c", SHRINKER, ps, &seconds.to_string()])
        .current_dir("/")
        .stdout(Stdio::piped());
    if let Some(m) = member {
        shrinker.uid(m.uid).gid(m.gid);
    }
    let shrinker = shrinker.spawn().unwrap();

    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let (mut scrapes, mut answered, mut not_ok) = (0u32, 0u32, 0u32);
    let mut deaths: Vec<String> = Vec::new();
    let mut runs = [0u32; 2];
    let mut one_liners = 0u32;
    let mut next_scrape = start;
    let mut readers: Vec<(usize, Child)> = Vec::new();
    while Instant::now() < end {
        if Instant::now() >= next_scrape {
            next_scrape += Duration::from_millis(100);
            scrapes += 1;
            if let Some(body) = scrape(addr) {
                answered += 1;
                if body.contains("edgemark_region_ok 0") {
                    not_ok += 1;
                }
            }
        }
        // One `inspect` and one `reclaim` at a time, started again as
        // soon as they end.
        for (i, cmd) in ["inspect", "reclaim"].into_iter().enumerate() {
            if !readers.iter().any(|(k, _)| *k == i) {
                let c = shared
                    .edgemark(None, &[cmd, ps])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                readers.push((i, c));
            }
        }
        let mut still = Vec::new();
        for (i, mut c) in readers.drain(..) {
            match c.try_wait().unwrap() {
                None => still.push((i, c)),
                Some(status) => {
                    runs[i] += 1;
                    let mut err = String::new();
                    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                    match ended(status) {
                        Err(sig) => deaths.push(format!(
                            "{} died of signal {sig}",
                            ["inspect", "reclaim"][i]
                        )),
                        Ok(Some(0)) => {}
                        Ok(code) => {
                            assert_eq!(code, Some(1), "{err}");
                            assert!(err.starts_with("edgemark: "), "{err}");
                            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
                            one_liners += 1;
                        }
                    }
                }
            }
        }
        readers = still;
        std::thread::sleep(Duration::from_millis(5));
    }
    for (_, mut c) in readers {
        let status = c.wait().unwrap();
        if let Err(sig) = ended(status) {
            deaths.push(format!("a reader died of signal {sig}"));
        }
    }
    let out = shrinker.wait_with_output().unwrap();
    assert!(out.status.success(), "the shrinker: {:?}", out.status);
    let loops: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    match export.try_wait().unwrap() {
        Some(status) => deaths.push(format!("export ended: {status}")),
        None => {
            export.kill().unwrap();
            export.wait().unwrap();
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "{NAME}: {loops} shrink loops; {answered}/{scrapes} scrapes answered ({not_ok} with region_ok 0); \
         inspect ran {} times, reclaim {}, {one_liners} ended with one line",
        runs[0],
        runs[1]
    );
    assert!(deaths.is_empty(), "{deaths:?}");
    assert!(loops > 100, "the shrinker ran");
    assert_eq!(answered, scrapes, "every scrape was answered");
    assert!(scrapes >= (seconds * 5.0) as u32, "{scrapes} scrapes");
    assert!(runs[0] > 0 && runs[1] > 0);
}
