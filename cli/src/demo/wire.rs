//! What crosses a process boundary in the demo: the orchestrator's dispatch
//! lines to the stage workers, the workers' report lines back, and the
//! chunks between stages on the connector.

use std::collections::BTreeMap;

use bytemuck::{Pod, Zeroable};
use edgemark::Token;

/// What the orchestrator tells every stage about a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Plan {
    /// Non-empty chunks stage 0 produces.
    pub(super) chunks: u32,
    /// Stage 0 sends an empty heartbeat before its first chunk.
    pub(super) heartbeat: bool,
    /// Stage 0's first put fails and is retried.
    pub(super) fail_first_send: bool,
    /// Stage 1 fails to admit the first chunk it receives.
    pub(super) fail_first_admission: bool,
}

impl Plan {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {}",
            self.chunks,
            u8::from(self.heartbeat),
            u8::from(self.fail_first_send),
            u8::from(self.fail_first_admission)
        )
    }
    fn decode(w: &[&str]) -> Option<Plan> {
        let b = |s: &str| s == "1";
        Some(Plan {
            chunks: w.first()?.parse().ok()?,
            heartbeat: b(w.get(1)?),
            fail_first_send: b(w.get(2)?),
            fail_first_admission: b(w.get(3)?),
        })
    }
}

/// A dispatch message from the orchestrator, one line on a worker's
/// standard input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Dispatch {
    /// A new request; its plan if the line carried a valid one.
    Request(Token, Option<Plan>),
    /// The request moved to a new segment.
    Segment(Token, Option<u32>),
    /// The request was aborted.
    Abort(Token),
}

impl Dispatch {
    pub(super) fn encode(&self) -> String {
        match self {
            Dispatch::Request(t, Some(plan)) => format!("req {t} {}", plan.encode()),
            Dispatch::Request(t, None) => format!("req {t}"),
            Dispatch::Segment(t, Some(s)) => format!("seg {t} {s}"),
            Dispatch::Segment(t, None) => format!("seg {t}"),
            Dispatch::Abort(t) => format!("abort {t}"),
        }
    }
    /// The message on `line`, or `None` for a line that is none.
    pub(super) fn decode(line: &str) -> Option<Dispatch> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let token = w.get(1)?.parse::<Token>().ok()?;
        match w[0] {
            "req" => Some(Dispatch::Request(token, Plan::decode(&w[2..]))),
            "seg" => Some(Dispatch::Segment(
                token,
                w.get(2).and_then(|s| s.parse().ok()),
            )),
            "abort" => Some(Dispatch::Abort(token)),
            _ => None,
        }
    }
}

/// What a worker reports on its standard output.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Report {
    /// The last stage finished the request.
    Done(Token),
    /// At the end of its input: the worker's record outcomes by name.
    Outcomes(BTreeMap<String, u64>),
}

impl Report {
    pub(super) fn encode(&self) -> String {
        match self {
            Report::Done(t) => format!("done {t}"),
            Report::Outcomes(map) => {
                let kv: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("outcomes {}", kv.join(" "))
            }
        }
    }
    pub(super) fn decode(line: &str) -> Option<Report> {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("done") => w.get(1).and_then(|t| t.parse().ok()).map(Report::Done),
            Some("outcomes") => {
                let map = w[1..]
                    .iter()
                    .filter_map(|kv| kv.split_once('='))
                    .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                    .collect();
                Some(Report::Outcomes(map))
            }
            _ => None,
        }
    }
}

/// A chunk on the connector from stage `from` to stage `from + 1`: one
/// datagram holds exactly these bytes (host byte order: both ends are on
/// this host).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub(super) struct Chunk {
    /// The request's token, [`Token::to_bytes`].
    token: [u8; 16],
    /// The chunk's sequence number.
    pub(super) seq: u64,
    /// The segment it belongs to.
    pub(super) segment: u32,
    /// [`Chunk::NONEMPTY`] and [`Chunk::LAST`].
    flags: u32,
}

impl Chunk {
    /// The payload is meaningful (not a heartbeat or a terminal marker).
    const NONEMPTY: u32 = 1;
    /// The request's last chunk.
    const LAST: u32 = 2;

    pub(super) fn new(token: Token, segment: u32, seq: u64, nonempty: bool, last: bool) -> Chunk {
        let flag = |on: bool, bit: u32| if on { bit } else { 0 };
        Chunk {
            token: token.to_bytes(),
            seq,
            segment,
            flags: flag(nonempty, Chunk::NONEMPTY) | flag(last, Chunk::LAST),
        }
    }
    pub(super) fn token(&self) -> Token {
        Token::from_bytes(self.token)
    }
    pub(super) fn nonempty(&self) -> bool {
        self.flags & Chunk::NONEMPTY != 0
    }
    pub(super) fn last(&self) -> bool {
        self.flags & Chunk::LAST != 0
    }
    /// The datagram.
    pub(super) fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(self)
    }
    /// The chunk a datagram holds, or `None` if it is not one.
    pub(super) fn from_bytes(datagram: &[u8]) -> Option<Chunk> {
        bytemuck::try_pod_read_unaligned(datagram).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_decodes_to_what_was_encoded() {
        let t: Token = "em1.0000000000000001.2.3".parse().unwrap();
        let plan = Plan {
            chunks: 5,
            heartbeat: true,
            fail_first_send: false,
            fail_first_admission: true,
        };
        for d in [
            Dispatch::Request(t, Some(plan)),
            Dispatch::Segment(t, Some(1)),
            Dispatch::Abort(t),
        ] {
            assert_eq!(Dispatch::decode(&d.encode()), Some(d));
        }
        let outcomes = Report::Outcomes([("recorded".to_owned(), 3)].into());
        for r in [Report::Done(t), outcomes] {
            assert_eq!(Report::decode(&r.encode()), Some(r));
        }
        let c = Chunk::new(t, 1, 7, true, false);
        assert_eq!(c.as_bytes().len(), 32);
        let back = Chunk::from_bytes(c.as_bytes()).unwrap();
        assert_eq!(back, c);
        assert_eq!(
            (
                back.token(),
                back.segment,
                back.seq,
                back.nonempty(),
                back.last()
            ),
            (t, 1, 7, true, false)
        );
        assert_eq!(Chunk::from_bytes(&c.as_bytes()[..31]), None);
        assert_eq!(Dispatch::decode("nonsense"), None);
    }
}
