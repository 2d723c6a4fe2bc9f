//! The `/metrics` server of `edgemark export`: hyper's HTTP/1 server on a
//! single-threaded tokio runtime, answering with
//! [`edgemark::export::render`].
//!
//! A connection costs one task, not a thread, so idle or slow clients hold
//! little. Each is bounded: its request head must arrive within
//! [`HEADER_READ_TIMEOUT`] and fit in [`MAX_HEAD_BYTES`] (hyper answers 431
//! and closes otherwise), and at most [`MAX_CONNECTIONS`] are served at
//! once; more wait in the listen queue until one ends.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use edgemark::export::{self, Format};
use edgemark::{AttachError, Recorder};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

/// How long a client may take to send a request head, from when the server
/// starts waiting for it.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest request head (request line and headers) read, in bytes.
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 1024;

/// The region a server shows, attached again when an access found its file
/// shrunk under the mapping (a faulted mapping stays faulted, while the
/// file may be whole again by the next scrape).
pub(crate) struct Source {
    rec: Mutex<Recorder>,
    reopen: Box<dyn Fn() -> Option<Recorder> + Send + Sync>,
}

impl Source {
    /// `rec`, and how to attach its region again.
    pub(crate) fn new(
        rec: Recorder,
        reopen: impl Fn() -> Option<Recorder> + Send + Sync + 'static,
    ) -> Source {
        Source {
            rec: Mutex::new(rec),
            reopen: Box::new(reopen),
        }
    }

    /// The recorder to read now: the attached one, or, if an access found
    /// its file shrunk, a fresh attach when that works.
    fn current(&self) -> Recorder {
        let mut rec = self.rec.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(rec.check(), Err(AttachError::Shrunk)) {
            if let Some(again) = (self.reopen)() {
                *rec = again;
            }
        }
        rec.clone()
    }
}

/// Serves `/metrics` for `source` on `listener` for `serve_for` (or until
/// the process is killed).
pub(crate) fn serve(
    source: Source,
    listener: std::net::TcpListener,
    serve_for: Option<Duration>,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the server's runtime")?;
    runtime.block_on(accept_loop(Arc::new(source), listener, serve_for))
}

async fn accept_loop(
    source: Arc<Source>,
    listener: std::net::TcpListener,
    serve_for: Option<Duration>,
) -> Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let deadline = async {
        match serve_for {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        let permit = tokio::select! {
            () = &mut deadline => return Ok(()),
            p = Arc::clone(&slots).acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            () = &mut deadline => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, or a connection reset before it
                // was accepted: wait a moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let source = Arc::clone(&source);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = answer(&source, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            // A connection's errors (a bad request, a reset, a timeout) end
            // that connection only.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

/// The response to one request.
fn answer<B>(source: &Source, req: &Request<B>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => match *req.method() {
            Method::GET | Method::HEAD => {
                let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
                let format = Format::negotiate(accept);
                let body = export::render(&source.current(), format);
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
