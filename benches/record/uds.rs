//! The upstream design's transport: observations sent as datagrams over a
//! Unix socket to an owner process. The owner is the bench binary
//! re-executed with `EDGEMARK_BENCH_ROLE=uds-owner` ([`owner_main`]).

use std::hint::black_box;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command};
use std::time::Duration;

use crate::common::ROLE;
use crate::upstream::{Observation, Owner, OwnerState, keys};

/// The child role that runs [`owner_main`].
pub(crate) const OWNER_ROLE: &str = "uds-owner";

/// The owner's socket path (child role `uds-owner`).
const OWNER_SOCKET: &str = "EDGEMARK_BENCH_OWNER_SOCKET";
/// The sender's socket path, where the owner replies.
const SENDER_SOCKET: &str = "EDGEMARK_BENCH_SENDER_SOCKET";

// ---------------------------------------------------------------------------
// The codec.

/// A datagram: 48 bytes, little-endian.
const MSG_LEN: usize = 48;

/// What a datagram asks of the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// Apply the observation, first write wins.
    Observation = 0,
    /// Close every request and acknowledge.
    Flush = 1,
    /// End the owner process.
    Quit = 2,
}

#[inline(always)]
fn encode(kind: Kind, o: &Observation) -> [u8; MSG_LEN] {
    let mut b = [0u8; MSG_LEN];
    b[0..16].copy_from_slice(&o.token.to_le_bytes());
    b[16..20].copy_from_slice(&o.from.to_le_bytes());
    b[20..24].copy_from_slice(&o.to.to_le_bytes());
    b[24..28].copy_from_slice(&o.segment.to_le_bytes());
    b[28] = o.event;
    b[29] = kind as u8;
    b[30] = u8::from(o.chunk_seq.is_some());
    b[32..40].copy_from_slice(&o.at_ns.to_le_bytes());
    b[40..48].copy_from_slice(&o.chunk_seq.unwrap_or(0).to_le_bytes());
    b
}

/// The datagram's kind (`None` if unknown: the owner quits) and
/// observation.
fn decode(b: &[u8; MSG_LEN]) -> (Option<Kind>, Observation) {
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let o = Observation {
        token: u128::from_le_bytes(b[0..16].try_into().expect("16 bytes")),
        from: u32_at(16),
        to: u32_at(20),
        segment: u32_at(24),
        event: b[28],
        chunk_seq: (b[30] != 0).then(|| u64_at(40)),
        at_ns: u64_at(32),
    };
    let kind = match b[29] {
        0 => Some(Kind::Observation),
        1 => Some(Kind::Flush),
        2 => Some(Kind::Quit),
        _ => None,
    };
    (kind, o)
}

// ---------------------------------------------------------------------------
// The owner process.

/// The owner process's main loop (child role `uds-owner`): apply every
/// observation, first write wins; on a flush, close every request and
/// acknowledge.
pub(crate) fn owner_main() {
    let own = std::env::var_os(OWNER_SOCKET).expect("owner socket path");
    let sender = std::env::var_os(SENDER_SOCKET).expect("sender socket path");
    let sock = UnixDatagram::bind(&own).expect("bind the owner socket");
    sock.send_to(b"ready", &sender).expect("tell the sender");
    let mut state = OwnerState::default();
    let mut buf = [0u8; MSG_LEN];
    loop {
        let n = sock.recv(&mut buf).expect("receive");
        assert_eq!(n, MSG_LEN, "a whole observation per datagram");
        match decode(&buf) {
            (Some(Kind::Observation), o) => {
                black_box(state.apply(&o));
            }
            (Some(Kind::Flush), _) => {
                state.clear();
                sock.send_to(b"flushed", &sender).expect("acknowledge");
            }
            (Some(Kind::Quit) | None, _) => return,
        }
    }
}

// ---------------------------------------------------------------------------
// The sender's side.

/// A connected datagram socket to an owner process.
pub(crate) struct UdsOwner {
    sock: UnixDatagram,
    child: Child,
    _dir: tempfile::TempDir,
}

impl UdsOwner {
    /// Starts the owner process and waits until it listens.
    pub(crate) fn spawn() -> UdsOwner {
        let dir = tempfile::tempdir().expect("a socket directory");
        let own = dir.path().join("owner.sock");
        let sender = dir.path().join("sender.sock");
        let sock = UnixDatagram::bind(&sender).expect("bind the sender socket");
        let child = Command::new(std::env::current_exe().expect("this binary"))
            .env(ROLE, OWNER_ROLE)
            .env(OWNER_SOCKET, &own)
            .env(SENDER_SOCKET, &sender)
            .spawn()
            .expect("start the owner process");
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut buf = [0u8; 16];
        sock.recv(&mut buf).expect("the owner process starts");
        sock.set_read_timeout(None).expect("no timeout");
        sock.connect(&own).expect("connect to the owner");
        UdsOwner {
            sock,
            child,
            _dir: dir,
        }
    }
}

impl Owner for UdsOwner {
    #[inline(always)]
    fn send(&self, o: &Observation) -> bool {
        matches!(self.sock.send(&encode(Kind::Observation, o)), Ok(MSG_LEN))
    }

    fn flush(&self) {
        let none = Observation::now(0, &keys(), 0);
        self.sock
            .send(&encode(Kind::Flush, &none))
            .expect("send a flush");
        let mut buf = [0u8; 16];
        self.sock.recv(&mut buf).expect("the owner acknowledges");
    }
}

impl Drop for UdsOwner {
    fn drop(&mut self) {
        let none = Observation::now(0, &keys(), 0);
        if self.sock.send(&encode(Kind::Quit, &none)).is_err() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
