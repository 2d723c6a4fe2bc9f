//! The queue of requests to send: whole requests, each with the reader
//! that acknowledges it.

use std::collections::VecDeque;
use std::sync::Arc;

use edgemark::{ClosedReader, GiveUp};
use opentelemetry_proto::tonic::trace::v1::Span;

/// One closed request's spans, and who acknowledges it.
pub(crate) struct Queued {
    /// The reader that took it (the region it came from).
    pub(crate) reader: Arc<ClosedReader>,
    pub(crate) claim: u64,
    pub(crate) spans: Vec<Span>,
}

impl Queued {
    pub(crate) fn acknowledge(&self) {
        self.reader.acknowledge(self.claim);
    }

    pub(crate) fn give_up(&self, why: GiveUp) {
        self.reader.give_up(self.claim, why);
    }
}

/// The queue of spans to send, whole requests at a time: a request's spans
/// are sent in one post.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) requests: VecDeque<Queued>,
    /// Spans in all of them.
    pub(crate) spans: usize,
}

impl Queue {
    /// Queues one request's spans.
    pub(crate) fn push(&mut self, request: Queued) {
        self.spans += request.spans.len();
        self.requests.push_back(request);
    }

    /// The oldest requests, up to `batch` spans (at least one request).
    pub(crate) fn take(&mut self, batch: usize) -> Vec<Queued> {
        let mut out: Vec<Queued> = Vec::new();
        let mut spans = 0;
        while let Some(next) = self.requests.front() {
            if !out.is_empty() && spans + next.spans.len() > batch {
                break;
            }
            let Some(next) = self.requests.pop_front() else {
                break;
            };
            self.spans -= next.spans.len();
            spans += next.spans.len();
            out.push(next);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgemark::Recorder;

    #[test]
    fn a_batch_takes_whole_requests_and_at_least_one() {
        let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
        let reader = Arc::new(rec.closed_reader().unwrap());
        let span = |n: u8| Span {
            name: n.to_string(),
            ..Default::default()
        };
        let queued = |n: u8, k: usize| Queued {
            reader: Arc::clone(&reader),
            claim: u64::from(n),
            spans: vec![span(n); k],
        };
        let mut q = Queue::default();
        q.push(queued(1, 3));
        q.push(queued(2, 2));
        q.push(queued(3, 2));
        assert_eq!(q.spans, 7);
        let claims = |b: &[Queued]| b.iter().map(|q| q.claim).collect::<Vec<_>>();
        // A request larger than the batch still goes, alone.
        assert_eq!(claims(&q.take(2)), [1]);
        assert_eq!(claims(&q.take(4)), [2, 3]);
        assert_eq!(q.spans, 0);
        assert!(q.take(8).is_empty());
    }
}
