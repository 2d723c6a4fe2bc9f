//! A Prometheus exporter of a region (feature `prometheus`, on by default).
//!
//! Every scrape reads the region afresh: the histograms of closed requests
//! (kept in the region by the close that ended each request, so each request
//! is counted exactly once however often the exporter polls, and nothing is
//! lost or repeated when it restarts), the refusal counters, and a sweep of
//! the slots for the open-request and free-slot gauges. Labels are bounded:
//! an edge, an event, a refusal reason; never a request.
//!
//! ```
//! use edgemark::export::Exporter;
//! let rec = edgemark::Recorder::builder().edge(0, 1).create_in_memory().unwrap();
//! let exporter = Exporter::new(rec);
//! let text = exporter.encode();
//! assert!(text.contains("edgemark_open_requests 0"));
//! let server = exporter.serve("127.0.0.1:0").unwrap(); // GET /metrics
//! assert_ne!(server.local_addr().port(), 0);
//! server.shutdown();
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::Recorder;

/// The content type of [`Exporter::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
struct RegionCollector(Recorder);

impl Collector for RegionCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let rec = &self.0;
        // A region whose file was shrunk is not read at all (its lost pages
        // would fault); the scrape says so instead.
        let ok = rec.check().is_ok();
        let g = ConstGauge::new(i64::from(ok));
        g.encode(enc.encode_descriptor(
            "edgemark_region_ok",
            "1 if the region file has its full length and was read, 0 if not",
            None,
            g.metric_type(),
        )?)?;
        if !ok {
            return Ok(());
        }
        let hists = rec.histograms().unwrap_or_default();
        {
            let mut family = enc.encode_descriptor(
                "edgemark_boundary_elapsed_ms",
                "Elapsed milliseconds from request start to each first event, over closed requests",
                None,
                MetricType::Histogram,
            )?;
            for h in hists.iter().filter(|h| h.delta.is_none()) {
                let labels = [("edge", h.edge.to_string()), ("event", h.metric.clone())];
                let m = family.encode_family(&labels)?;
                encode_histogram(m, &h.histogram)?;
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "edgemark_delta_ms",
                "Milliseconds between consecutive first events of one edge segment, over closed requests",
                None,
                MetricType::Histogram,
            )?;
            for h in &hists {
                let Some((from, to)) = &h.delta else { continue };
                let labels = [
                    ("edge", h.edge.to_string()),
                    ("from_event", from.clone()),
                    ("to_event", to.clone()),
                ];
                let m = family.encode_family(&labels)?;
                encode_histogram(m, &h.histogram)?;
            }
        }
        let c = rec.counters();
        {
            let mut family = enc.encode_descriptor(
                "edgemark_refused_records",
                "Records refused, by reason (duplicates and not-meaningful payloads are not counted)",
                None,
                MetricType::Counter,
            )?;
            for (o, n) in &c.refused {
                let labels = [("reason", o.name())];
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        let counter = |enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64| {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
        };
        counter(
            &mut enc,
            "edgemark_closed_requests",
            "Requests closed",
            c.closed_requests,
        )?;
        counter(
            &mut enc,
            "edgemark_reclaimed_requests",
            "Requests of dead owners freed by a reclaim",
            c.reclaimed_requests,
        )?;
        counter(
            &mut enc,
            "edgemark_dropped_segments",
            "Segments that left a request's window of kept segments",
            c.dropped_segments,
        )?;
        let open = rec.open_requests().map_or(0, |v| v.len()) as i64;
        let slots = rec.info().map_or(0, |i| i64::from(i.slots));
        let gauge = |enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64| {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
        };
        gauge(
            &mut enc,
            "edgemark_open_requests",
            "Requests open now",
            open,
        )?;
        gauge(
            &mut enc,
            "edgemark_free_slots",
            "Slots free now",
            slots - open,
        )?;
        Ok(())
    }
}

fn encode_histogram(
    mut m: prometheus_client::encoding::MetricEncoder<'_>,
    h: &crate::Histogram,
) -> Result<(), std::fmt::Error> {
    // prometheus-client takes each bucket's own count and accumulates.
    let buckets: Vec<(f64, u64)> = crate::BUCKETS_MS
        .iter()
        .copied()
        .chain([f64::INFINITY])
        .zip(h.buckets.iter().copied())
        .collect();
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(h.sum_ms, h.count, &buckets, None)
}

/// Exposes one region's metrics in the Prometheus text format.
#[derive(Debug)]
pub struct Exporter {
    registry: Arc<Registry>,
}

impl Exporter {
    /// An exporter of `recorder`'s region. Usable from the owner's own
    /// process, or from any process attached to the region.
    pub fn new(recorder: Recorder) -> Exporter {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(RegionCollector(recorder)));
        Exporter {
            registry: Arc::new(registry),
        }
    }

    /// The current metrics as text (OpenMetrics, which Prometheus reads).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Serves `GET /metrics` on `addr` from a background thread until the
    /// returned server is shut down or dropped.
    pub fn serve(&self, addr: impl ToSocketAddrs) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let registry = Arc::clone(&self.registry);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("edgemark-exporter".into())
            .spawn(move || accept_loop(&listener, &registry, &flag))?;
        Ok(Server {
            local,
            stop,
            thread: Some(thread),
        })
    }
}

/// Connections answered at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 8;

fn accept_loop(listener: &TcpListener, registry: &Arc<Registry>, stop: &AtomicBool) {
    use std::sync::atomic::Ordering;
    // Each connection's thread holds a clone: the count of clones is the
    // count of connections being answered.
    let busy = Arc::new(());
    // Relaxed: a stop flag; the join in `shutdown` orders the rest.
    while !stop.load(Ordering::Relaxed) {
        if Arc::strong_count(&busy) > MAX_CONNECTIONS {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                // One thread per connection, so that a client that sends
                // slowly (up to the request deadline) holds only itself.
                let registry = Arc::clone(registry);
                let token = Arc::clone(&busy);
                let spawned = std::thread::Builder::new()
                    .name("edgemark-exporter-conn".into())
                    .spawn(move || {
                        let _ = answer(stream, &registry);
                        drop(token);
                    });
                if spawned.is_err() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Longest request head read (request line and headers).
const MAX_REQUEST: usize = 8 * 1024;
/// Longest a client may take to send its request head.
const REQUEST_DEADLINE: Duration = Duration::from_secs(3);

/// Reads a request head, bounded in size and in time: a client that sends
/// too much, or too slowly, gets nothing and cannot hold the exporter.
fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || head.len() >= MAX_REQUEST {
            return Ok(None);
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        head.extend_from_slice(&buf[..n.min(MAX_REQUEST - head.len())]);
    }
    Ok(Some(String::from_utf8_lossy(&head).into_owned()))
}

fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let Some(head) = read_head(&mut stream)? else {
        return Ok(());
    };
    let request = head.lines().next().unwrap_or("");
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => {
            let mut body = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut body, registry);
            ("200 OK", CONTENT_TYPE, body)
        }
        ("GET", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "edgemark exporter: metrics at /metrics\n".to_owned(),
        ),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found\n".to_owned(),
        ),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// A running `/metrics` endpoint; see [`Exporter::serve`].
#[derive(Debug)]
pub struct Server {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// The address it listens on (useful after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops serving and waits for the thread.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        // Relaxed: see `accept_loop`.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}
