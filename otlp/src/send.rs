//! Sending: batches of the queue posted one at a time, retried with
//! backoff, and each request acknowledged or given up by the answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgemark::GiveUp;
use hyper::body::Bytes;
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::client::{Client, PostError};
use crate::config::Config;
use crate::envelope::body;
use crate::queue::Queued;
use crate::shared::Shared;
use crate::stats::Stats;

/// How long a batch is retried before its requests are given up.
pub const RETRY_FOR: Duration = Duration::from_secs(30);
/// The first wait before a retry; each next one doubles, up to
/// [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two tries (unless the collector asks for a
/// longer one with `Retry-After`).
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Partial successes are logged at most this often.
const PARTIAL_EVERY: Duration = Duration::from_secs(60);

/// Sends the queue in batches until the drain stops and the queue is
/// sent (or its deadline passed).
pub(crate) async fn send_loop(config: &Arc<Config>, stats: &Stats, shared: &Shared) {
    let mut client = Client {
        config: Arc::clone(config),
        sender: None,
    };
    // Whether the collector was last found down: said once, and once
    // when it is back.
    let mut down = false;
    // When a partial success was last logged.
    let mut said_partial: Option<Instant> = None;
    let past = |shared: &Shared| shared.stop_by.get().is_some_and(|d| Instant::now() >= d);
    loop {
        // Wait for spans.
        while shared.queue.borrow().spans == 0 {
            if shared.stopping() {
                return;
            }
            shared.wake.notified().await;
        }
        // Wait for a full batch, at most the schedule delay.
        let since = Instant::now();
        while !shared.stopping() && shared.queue.borrow().spans < config.batch {
            let left = config.delay.saturating_sub(since.elapsed());
            if left.is_zero() {
                break;
            }
            let _ = tokio::time::timeout(left, shared.wake.notified()).await;
        }
        if past(shared) {
            return;
        }
        let batch: Vec<Queued> = shared.queue.borrow_mut().take(config.batch);
        let n: usize = batch.iter().map(|q| q.spans.len()).sum();
        shared.in_flight.set(n);
        shared.publish(stats);
        let spans: Vec<Span> = batch.iter().flat_map(|q| q.spans.iter().cloned()).collect();
        let body = Bytes::from(body(config, spans));
        let n = n as u64;
        let started = Instant::now();
        let mut backoff = BACKOFF_FIRST;
        let outcome = loop {
            // After a signal, no post outlives the flush deadline.
            let post = client.post(body.clone());
            let r = match shared.stop_by.get() {
                Some(d) => {
                    match tokio::time::timeout(d.saturating_duration_since(Instant::now()), post)
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => {
                            client.sender = None;
                            break None;
                        }
                    }
                }
                None => post.await,
            };
            match r {
                Ok((rejected, message)) => {
                    let rejected = rejected.min(n);
                    // A partial success's message, at most once a minute.
                    if (rejected > 0 || !message.is_empty())
                        && said_partial.is_none_or(|t: Instant| t.elapsed() >= PARTIAL_EVERY)
                    {
                        said_partial = Some(Instant::now());
                        log::warn!(
                            "OTLP export to {}: partial success, {rejected} spans \
                             rejected: {}",
                            config.url,
                            if message.is_empty() {
                                "(no message)"
                            } else {
                                message.as_str()
                            }
                        );
                    }
                    stats.update(|c| {
                        c.up = true;
                        c.exported += n - rejected;
                        c.dropped_rejected += rejected;
                    });
                    if down {
                        log::info!("OTLP export to {}: sending again", config.url);
                        down = false;
                    }
                    break Some(None);
                }
                Err(e) => {
                    let tls = matches!(e, PostError::Tls(_));
                    stats.update(|c| {
                        c.up = false;
                        c.failures += 1;
                        c.tls_failures += u64::from(tls);
                    });
                    let (why, retry, asked) = match e {
                        PostError::Retry(w, after) => (w, true, after),
                        PostError::Tls(w) => (w, true, None),
                        PostError::Refused(w) | PostError::Unreadable(w) => (w, false, None),
                    };
                    if !retry {
                        log::warn!("OTLP export to {}: {why}; {n} spans dropped", config.url);
                        stats.update(|c| c.dropped_rejected += n);
                        break Some(Some(GiveUp::Refused));
                    }
                    if !down {
                        log::warn!(
                            "OTLP export to {}: {why}; retrying with backoff \
                             (closed requests wait in the region's ring meanwhile)",
                            config.url
                        );
                        down = true;
                    }
                    if past(shared) {
                        break None;
                    }
                    if started.elapsed() >= RETRY_FOR {
                        stats.update(|c| c.dropped_retries += n);
                        break Some(Some(GiveUp::RetriesExhausted));
                    }
                    // Jitter over the second half of the wait, from the
                    // clock's low bits (not an id: any spread will do).
                    let noise = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::from(d.subsec_nanos()));
                    let jitter = noise % (backoff.as_millis() as u64 / 2 + 1);
                    let mut wait = backoff / 2 + Duration::from_millis(jitter);
                    // The wait the collector asked for (capped), if longer.
                    if let Some(asked) = asked {
                        wait = wait.max(asked);
                    }
                    if let Some(d) = shared.stop_by.get() {
                        wait = wait.min(d.saturating_duration_since(Instant::now()));
                    }
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        };
        shared.in_flight.set(0);
        match outcome {
            // The collector has them.
            Some(None) => batch.iter().for_each(Queued::acknowledge),
            Some(Some(why)) => batch.iter().for_each(|q| q.give_up(why)),
            // The deadline passed with the batch unsent: back to the
            // queue's front, for `run` to count and leave in the ring.
            None => {
                let mut q = shared.queue.borrow_mut();
                for b in batch.into_iter().rev() {
                    q.spans += b.spans.len();
                    q.requests.push_front(b);
                }
                drop(q);
                shared.publish(stats);
                return;
            }
        }
        shared.publish(stats);
        shared.room.notify_one();
    }
}
