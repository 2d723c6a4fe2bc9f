//! The `/metrics` server of `edgemark export`: hyper's HTTP/1 server on a
//! single-threaded tokio runtime, answering with
//! [`edgemark::prometheus::render`].
//!
//! A connection costs one task, not a thread, so idle or slow clients hold
//! little. Each is bounded: its request head must arrive within
//! [`HEADER_READ_TIMEOUT`] (also the longest it may sit idle between
//! requests) and fit in [`MAX_HEAD_BYTES`] (hyper answers 431 and closes
//! otherwise); each response must be written within [`WRITE_TIMEOUT`]; it
//! is closed after [`MAX_REQUESTS_PER_CONNECTION`] requests; and at most
//! [`MAX_CONNECTIONS`] are served at once. A connection that arrives when
//! all are taken closes the one that has made no progress (read or written
//! a byte) for longest, so clients that pipeline requests and never read
//! the answers cannot hold every place while a scraper waits.
//!
//! Before each scrape the [`Source`] checks that the file at the region's
//! path is still the one attached (its device and inode: one `stat`); a
//! replaced file is attached anew, and a missing or unreadable one is served
//! as `edgemark_region_ok 0`. The scrape itself checks the file's length
//! before and after its reads ([`prometheus::render_with`]: two `fstat`s); a
//! file found shrunk under its mapping is attached again once it is whole.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use edgemark::follow::{Followed, Look};
use edgemark::prometheus::{self, Format, ServerCounter};
use edgemark::{SweepError, Viewer};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

/// How long a client may take to send a request head, from when the server
/// starts waiting for it: after it connects, and after each response (so it
/// is also the longest a kept-alive connection may sit idle).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest request head (request line and headers) read, in bytes.
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long writing one response (from its first byte until it is flushed
/// to the socket) may take; a client that does not read is closed after it.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The kernel's send buffer of a connection, in bytes (it doubles it for its
/// own bookkeeping): what a client that does not read can make the server
/// render ahead, a few responses, before writing stalls.
pub(crate) const SEND_BUFFER: usize = 64 * 1024;
/// Requests answered on one connection; the last answer says
/// `Connection: close`, and the connection ends after it.
pub(crate) const MAX_REQUESTS_PER_CONNECTION: u64 = 100;
/// Connections served at once (fewer if the process may not open that many
/// files; see [`connection_limit`]).
pub(crate) const MAX_CONNECTIONS: usize = 1024;

/// The region a server shows, followed ([`Followed`]): before each scrape
/// the file at the region's path is compared with the one attached; a
/// different file there (another device or inode) is attached in place of
/// the old one; a file shrunk under the mapping is attached again once it
/// is whole (a faulted mapping stays faulted); a missing or invalid file
/// shows as `edgemark_region_ok 0`. Each change is said once on standard
/// error, and replacements are counted.
pub(crate) struct Source {
    shown: Mutex<Followed<Viewer>>,
    /// Times another file was found at the path and attached.
    replaced: Mutex<u64>,
    reopen: Box<dyn Fn() -> Result<Viewer> + Send + Sync>,
    /// The OTLP exporter's counters, served after the region's.
    otlp: Option<Arc<edgemark_otlp::Stats>>,
}

impl Source {
    /// `rec`, attached from `path`, and how to attach that path again.
    pub(crate) fn new(
        rec: Viewer,
        path: PathBuf,
        reopen: impl Fn() -> Result<Viewer> + Send + Sync + 'static,
    ) -> Source {
        Source {
            shown: Mutex::new(Followed::attached(path, rec)),
            replaced: Mutex::new(0),
            reopen: Box::new(reopen),
            otlp: None,
        }
    }

    /// Also serves the counters of `edgemark export --otlp`.
    pub(crate) fn with_otlp(mut self, stats: Arc<edgemark_otlp::Stats>) -> Source {
        self.otlp = Some(stats);
        self
    }

    /// The recorder to read now, if any, after checking the file.
    fn current(&self) -> Option<Viewer> {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let old = shown
            .current()
            .and_then(|rec| rec.info())
            .map(|i| i.region_id);
        let look = shown.look(|_| (self.reopen)().map_err(|e| format!("{e:#}")));
        let p = shown.path().display();
        match look {
            Look::Same => {}
            Look::Attached { replaced } => {
                let new = shown
                    .current()
                    .and_then(|rec| rec.info())
                    .map(|i| i.region_id)
                    .unwrap_or_default();
                *self.replaced.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                match old {
                    Some(old) if replaced => eprintln!(
                        "edgemark: {p}: another file replaced region {old}; now serving region {new}"
                    ),
                    _ => eprintln!(
                        "edgemark: {p}: a region is there again; now serving region {new}"
                    ),
                }
            }
            Look::Failing {
                why,
                new: true,
                gone,
            } => {
                if gone {
                    eprintln!(
                        "edgemark: {why}; serving edgemark_region_ok 0 until a region is there again"
                    );
                } else {
                    eprintln!("edgemark: {why}; serving edgemark_region_ok 0");
                }
            }
            _ => {}
        }
        shown.current().cloned()
    }

    /// The region attached again from the same file, in place of one whose
    /// mapping lost a page (a faulted mapping stays faulted), if the file is
    /// whole again.
    fn reattach(&self) -> Option<Viewer> {
        let again = (self.reopen)().ok()?;
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        shown.current()?;
        shown.replace_current(again.clone());
        Some(again)
    }

    /// The metrics text now: the region's, or `edgemark_region_ok 0` when
    /// there is none, then the count of replacements. A region whose file
    /// was found shrunk under its mapping is attached again once the file
    /// is whole, and read from the new mapping.
    fn render(&self, format: Format) -> String {
        // First: it counts a replacement it finds.
        let rec = self.current();
        let replaced = *self.replaced.lock().unwrap_or_else(|e| e.into_inner());
        let served = [ServerCounter::new(
            "edgemark_region_replaced",
            "Times the exporter found another file at its region's path and attached it",
            replaced,
        )];
        let mut body = String::new();
        let read = prometheus::render_with(rec.as_ref(), &served, format, &mut body);
        if matches!(read, Err(SweepError::Shrunk))
            && let Some(again) = self.reattach()
        {
            body.clear();
            // What this read finds is in the text.
            let _ = prometheus::render_with(Some(&again), &served, format, &mut body);
        }
        if let Some(otlp) = &self.otlp {
            // The OTLP exporter's counters, before OpenMetrics' end.
            let lines = otlp.render(format);
            match body.strip_suffix("# EOF\n").map(str::len) {
                Some(at) => body.insert_str(at, &lines),
                None => body.push_str(&lines),
            }
        }
        body
    }
}

/// How many connections this process can serve at once: [`MAX_CONNECTIONS`],
/// or fewer when its limit of open files (raised to the hard limit first,
/// as far as needed) leaves less room.
pub(crate) fn connection_limit() -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    // Room for the connections, the listener, standard streams, the
    // region's file and the runtime's own descriptors.
    let want = MAX_CONNECTIONS as u64 + 64;
    let limit = getrlimit(Resource::Nofile);
    let mut soft = limit.current.unwrap_or(u64::MAX);
    if soft < want {
        let raised = limit.maximum.map_or(want, |hard| hard.min(want));
        if raised > soft {
            let new = rustix::process::Rlimit {
                current: Some(raised),
                maximum: limit.maximum,
            };
            if setrlimit(Resource::Nofile, new).is_ok() {
                soft = raised;
            }
        }
    }
    let room = soft.saturating_sub(64).max(1);
    usize::try_from(room).map_or(MAX_CONNECTIONS, |r| r.min(MAX_CONNECTIONS))
}

/// What a `/metrics` server shows: the text of one scrape.
pub(crate) trait Scrape: Send + Sync + 'static {
    /// The metrics text now, in `format`.
    fn render(&self, format: Format) -> String;
}

impl Scrape for Source {
    fn render(&self, format: Format) -> String {
        Source::render(self, format)
    }
}

/// Serves `/metrics` for `source` on `listener` for `serve_for` (or until
/// the process is killed).
pub(crate) fn serve(
    source: impl Scrape,
    listener: std::net::TcpListener,
    serve_for: Option<Duration>,
) -> Result<()> {
    let limit = connection_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the server's runtime")?;
    runtime.block_on(accept_loop(Arc::new(source), listener, serve_for, limit))
}

/// One connection as the accept loop sees it.
#[derive(Debug)]
struct Conn {
    /// When the connection last read or wrote a byte (or was accepted).
    progress: Mutex<Instant>,
    /// Told to end the connection.
    evict: tokio::sync::Notify,
}

/// The connections being served, to pick one to close when all places are
/// taken.
#[derive(Debug, Default)]
struct Conns {
    live: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Conns {
    /// Tells the connection with the oldest progress to end, if there is
    /// one; returns whether it found one.
    fn evict_stalest(&self) -> bool {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let stalest = live
            .values()
            .min_by_key(|c| *c.progress.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(c) = stalest {
            c.evict.notify_one();
        }
        stalest.is_some()
    }
}

async fn accept_loop(
    source: Arc<impl Scrape>,
    listener: std::net::TcpListener,
    serve_for: Option<Duration>,
    limit: usize,
) -> Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(limit));
    let conns = Arc::new(Conns::default());
    let mut next_id = 0u64;
    let deadline = async {
        match serve_for {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        let stream = tokio::select! {
            () = &mut deadline => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors: make room. Out of them, or a
                    // connection reset before it was accepted: wait a
                    // moment rather than spin.
                    let no_files = [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE]
                        .map(|n| Some(n.raw_os_error()));
                    if no_files.contains(&e.raw_os_error()) {
                        conns.evict_stalest();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Fixed, not grown by the kernel's autotuning: a client that sends
        // many requests and reads none stalls after a few answers instead
        // of having hundreds rendered into its buffer.
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&stream, SEND_BUFFER);
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Every place is taken: the connection that has done
                // nothing for longest gives up its place.
                conns.evict_stalest();
                tokio::select! {
                    () = &mut deadline => return Ok(()),
                    p = Arc::clone(&slots).acquire_owned() => p.expect("the semaphore is never closed"),
                }
            }
        };
        let conn = Arc::new(Conn {
            progress: Mutex::new(Instant::now()),
            evict: tokio::sync::Notify::new(),
        });
        let id = next_id;
        next_id += 1;
        conns
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::clone(&conn));
        let source = Arc::clone(&source);
        let conns = Arc::clone(&conns);
        tokio::spawn(async move {
            let answered = std::cell::Cell::new(0u64);
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let n = answered.get() + 1;
                answered.set(n);
                let mut response = answer(&*source, &req);
                if n >= MAX_REQUESTS_PER_CONNECTION {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                async move { Ok::<_, Infallible>(response) }
            });
            let io = TokioIo::new(Guarded {
                io: stream,
                writing: None,
                conn: Arc::clone(&conn),
            });
            // A connection's errors (a bad request, a reset, a timeout) end
            // that connection only.
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(true)
                .serve_connection(io, service);
            tokio::select! {
                _ = connection => {}
                () = conn.evict.notified() => {}
            }
            conns
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            drop(permit);
        });
    }
}

/// A connection's socket, with a deadline on writing each response and a
/// note of its last progress.
struct Guarded {
    io: tokio::net::TcpStream,
    /// Running while a response is being written: from its first write until
    /// the flush that completes it.
    writing: Option<Pin<Box<tokio::time::Sleep>>>,
    conn: Arc<Conn>,
}

impl Guarded {
    fn progressed(&self) {
        *self.conn.progress.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Starts the write deadline if it is not running: a response's first
    /// write does.
    fn start_deadline(&mut self) {
        if self.writing.is_none() {
            self.writing = Some(Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        }
    }

    /// An error once the write deadline has passed (polling it also
    /// arranges a wake-up for then).
    fn check_deadline(&mut self, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        self.start_deadline();
        let Some(sleep) = self.writing.as_mut() else {
            return Poll::Pending;
        };
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not take the response in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// What a write-side poll of the socket returned, with the deadline
    /// checked when it could not go on.
    ///
    /// A response's first write starts the deadline; the flush that
    /// completes it stops it.
    fn after_write<T>(
        &mut self,
        cx: &mut TaskContext<'_>,
        polled: Poll<std::io::Result<T>>,
        made_progress: impl Fn(&T) -> bool,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Ready(Ok(v)) => {
                if made_progress(&v) {
                    self.progressed();
                }
                Poll::Ready(Ok(v))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.check_deadline(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
        }
    }
}

impl tokio::io::AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.progressed();
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.start_deadline();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.after_write(cx, polled, |n| *n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.start_deadline();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.after_write(cx, polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        let polled = this.after_write(cx, polled, |()| false);
        if matches!(polled, Poll::Ready(Ok(()))) {
            // The response is out: the next one gets a fresh deadline.
            this.writing = None;
        }
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.after_write(cx, polled, |()| false)
    }
}

/// The response to one request.
fn answer<B>(source: &impl Scrape, req: &Request<B>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => match *req.method() {
            Method::GET | Method::HEAD => {
                let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
                let format = Format::negotiate(accept);
                let body = source.render(format);
                let length = body.len();
                let body = if req.method() == Method::HEAD {
                    Bytes::new()
                } else {
                    Bytes::from(body)
                };
                let mut r = Response::new(Full::new(body));
                let h = r.headers_mut();
                h.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                );
                h.insert(CONTENT_LENGTH, HeaderValue::from(length));
                r
            }
            _ => {
                let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use GET or HEAD\n");
                r.headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
                r
            }
        },
        "/" if req.method() == Method::GET => {
            text(StatusCode::OK, "edgemark exporter: metrics at /metrics\n")
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgemark::Recorder;

    #[test]
    fn a_mapping_that_lost_a_page_is_attached_again_once_the_file_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.region");
        let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
        let t = rec.begin().unwrap();
        rec.close(t);
        let len = std::fs::metadata(&path).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // Shrunk under the mapping, and a read of a lost page: the mapping
        // is faulted for good.
        file.set_len(4096).unwrap();
        let _ = rec.snapshot(t);
        assert!(matches!(rec.check(), Err(SweepError::Shrunk)));
        file.set_len(len).unwrap();
        let again = path.clone();
        let source = Source::new((*rec).clone(), path, move || Ok(Viewer::attach(&again)?));
        let body = source.render(Format::Text);
        assert!(body.contains("edgemark_region_ok 1\n"), "{body}");
        // The same file, attached again: not a replacement.
        assert!(
            body.contains("edgemark_region_replaced_total 0\n"),
            "{body}"
        );
    }
}
