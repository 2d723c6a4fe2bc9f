//! The exporter's counters, served on `/metrics` beside the region's and
//! encoded by prometheus-client, as the region's are
//! ([`edgemark::prometheus`]).

use std::sync::Mutex;

use edgemark::prometheus::Format;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The exporter's counters.
#[derive(Debug, Default)]
pub struct Stats(Mutex<Counts>);

/// The values of [`Stats`].
#[derive(Debug, Default, Clone, Copy)]
#[non_exhaustive]
pub struct Counts {
    /// Closed requests taken from the ring.
    pub requests: u64,
    /// Ring entries this exporter found torn (or holding what no close
    /// writes), or gave up on as never written (their closer died): lost,
    /// and counted in the region's
    /// [`closed_lost`](edgemark::report::Counters::closed_lost) too. Not
    /// the requests the ring overwrote before this exporter reached them:
    /// the closes that overwrote them counted those, in `closed_lost`
    /// alone.
    pub torn_or_unwritten: u64,
    /// Requests taken whose trace flags say not sampled: no spans.
    pub unsampled: u64,
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans dropped after their batch failed for
    /// [`RETRY_FOR`](crate::send::RETRY_FOR).
    pub dropped_retries: u64,
    /// Spans the collector refused (an answer that is not to be retried,
    /// or rejected spans of a partial success), and the spans of a post
    /// answered with a success over the read limit
    /// ([`MAX_ANSWER`](crate::client::MAX_ANSWER)), which are not sent again.
    pub dropped_rejected: u64,
    /// Posts that failed (each try).
    pub failures: u64,
    /// Posts that failed in the TLS handshake (each try), also counted in
    /// [`failures`](Counts::failures).
    pub tls_failures: u64,
    /// Spans waiting in the queue now, with the batch being posted.
    pub queued: u64,
    /// Closed requests adopted: taken by an exporter before this one (that
    /// died, or stopped before sending them) and sent by this one.
    pub adopted: u64,
    /// Closed requests left unsent at a stop (in the ring, for the next
    /// exporter).
    pub left_unsent: u64,
    /// Whether the last post succeeded.
    pub up: bool,
}

impl Stats {
    /// Changes the counts.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The metrics text of the exporter, in `format`, to append to the
    /// region's (before OpenMetrics' `# EOF`).
    pub fn render(&self, format: Format) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Encoded {
            counts: self.counts(),
            format,
        }));
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &registry);
        out
    }
}

/// The counts as one scrape encodes them.
#[derive(Debug)]
struct Encoded {
    counts: Counts,
    format: Format,
}

impl Encoded {
    /// A counter family's name in the HELP and TYPE lines: OpenMetrics
    /// names it without the `_total` its samples end in, the classic text
    /// format as its samples (as `edgemark::prometheus` does).
    fn family(&self, name: &str) -> String {
        match self.format {
            Format::OpenMetrics => name.to_owned(),
            _ => format!("{name}_total"),
        }
    }

    /// One counter sample under the family's encoder.
    fn sample(&self, m: MetricEncoder<'_>, v: u64) -> std::fmt::Result {
        match self.format {
            Format::OpenMetrics => ConstCounter::new(v).encode(m),
            // The family is already named `<name>_total`.
            _ => {
                let mut m = m;
                m.encode_gauge(&v)
            }
        }
    }
}

impl Collector for Encoded {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let c = &self.counts;
        let counters: [(&str, &str, u64); 7] = [
            (
                "edgemark_otlp_requests",
                "Closed requests the OTLP exporter took from the region's ring",
                c.requests,
            ),
            (
                "edgemark_otlp_ring_lost",
                "Ring entries the OTLP exporter found torn or gave up on as never written (its part \
                 of edgemark_closed_lost; the requests the ring overwrote before the exporter \
                 reached them are counted there only)",
                c.torn_or_unwritten,
            ),
            (
                "edgemark_otlp_unsampled_requests",
                "Closed requests whose trace flags say not sampled: no spans sent",
                c.unsampled,
            ),
            (
                "edgemark_otlp_exported_spans",
                "Spans the collector accepted",
                c.exported,
            ),
            (
                "edgemark_otlp_adopted_requests",
                "Closed requests an exporter before this one took and did not send, sent by this one",
                c.adopted,
            ),
            (
                "edgemark_otlp_export_failures",
                "Posts to the collector that failed (each try)",
                c.failures,
            ),
            (
                "edgemark_otlp_tls_failures",
                "Posts to the collector that failed in the TLS handshake (each try; also counted \
                 in edgemark_otlp_export_failures)",
                c.tls_failures,
            ),
        ];
        for (name, help, v) in counters {
            let family = self.family(name);
            self.sample(
                enc.encode_descriptor(&family, help, None, MetricType::Counter)?,
                v,
            )?;
        }
        let family = self.family("edgemark_otlp_dropped_spans");
        let mut m = enc.encode_descriptor(
            &family,
            "Spans not exported: retries ran out, or the collector refused them (or answered a \
             success too long to read)",
            None,
            MetricType::Counter,
        )?;
        for (reason, v) in [
            ("retries_exhausted", c.dropped_retries),
            ("rejected", c.dropped_rejected),
        ] {
            self.sample(m.encode_family(&[("reason", reason)])?, v)?;
        }
        for (name, help, v) in [
            (
                "edgemark_otlp_queue_spans",
                "Spans waiting to be sent, with the batch being posted",
                c.queued as i64,
            ),
            (
                "edgemark_otlp_collector_up",
                "1 if the last post to the collector succeeded, 0 if not",
                i64::from(c.up),
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_parse_in_both_formats() {
        let s = Stats::default();
        s.update(|c| {
            c.dropped_rejected = 3;
            c.queued = 7;
        });
        let text = s.render(Format::Text);
        assert!(
            text.contains("# TYPE edgemark_otlp_dropped_spans_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("edgemark_otlp_dropped_spans_total{reason=\"rejected\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("edgemark_otlp_queue_spans 7\n"), "{text}");
        let om = s.render(Format::OpenMetrics);
        assert!(
            om.contains("# TYPE edgemark_otlp_dropped_spans counter\n"),
            "{om}"
        );
        assert!(
            om.contains("edgemark_otlp_dropped_spans_total{reason=\"rejected\"} 3\n"),
            "{om}"
        );
        assert!(
            !om.contains("# EOF"),
            "appended before the region's end: {om}"
        );
    }
}
