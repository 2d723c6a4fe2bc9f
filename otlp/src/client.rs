//! The HTTP client: one connection to the collector (over TLS for an
//! `https://` URL), made again after any failure; a post and the sorting
//! of its answer.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full};
use http_body_util::{LengthLimitError, Limited};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HOST, HeaderValue, RETRY_AFTER, USER_AGENT};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;

use crate::config::Config;
use crate::tls::{CLIENT_CERTIFICATE_VARS, CLIENT_KEY_VARS, Tls};

/// The most of an answer's body that is read: the exporter spec's
/// recommendation (4 MiB). A success whose body is longer is a failure,
/// not retried, as the OpenTelemetry Java and Go exporters take it.
pub const MAX_ANSWER: usize = 4 << 20;
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// `User-Agent: edgemark/<version>`, as the exporter spec suggests.
pub const USER_AGENT_VALUE: &str = concat!("edgemark/", env!("CARGO_PKG_VERSION"));

/// The wait a `Retry-After` value asks for: seconds, or an HTTP date
/// (IMF-fixdate, as RFC 9110 requires of senders), at most
/// [`MAX_RETRY_AFTER`].
pub fn retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    let wait = match v.parse::<u64>() {
        Ok(s) => Duration::from_secs(s),
        Err(_) => http_date(v)?
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) as a time.
fn http_date(v: &str) -> Option<SystemTime> {
    let f: Vec<&str> = v.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = f.as_slice() else {
        return None;
    };
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as i64
        + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time
        .split(':')
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Why a post failed.
#[derive(Debug)]
pub(crate) enum PostError {
    /// Worth another try: no connection, a timeout, 429, 502, 503, 504;
    /// with the wait the collector asked for (`Retry-After`), if any.
    Retry(String, Option<Duration>),
    /// The TLS handshake failed (a certificate not trusted, or not for the
    /// host; a client certificate refused): tried again as a connection
    /// that failed is, since a certificate can be replaced meanwhile, and
    /// counted apart.
    Tls(String),
    /// Not: the collector refused the batch.
    Refused(String),
    /// Not: the collector answered with a success whose body is over
    /// [`MAX_ANSWER`]. Whether it took the spans cannot be read, so they
    /// are not sent again (a second copy may be one too many) and not
    /// counted as exported: the post is a failure, and its spans dropped.
    Unreadable(String),
}

/// One connection to the collector, made again after any failure.
pub(crate) struct Client {
    pub(crate) config: Arc<Config>,
    pub(crate) sender: Option<http1::SendRequest<Full<Bytes>>>,
}

/// HTTP/1.1 over `stream`, its connection driven by a task of its own.
async fn handshake<S>(stream: S) -> Result<http1::SendRequest<Full<Bytes>>, PostError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| PostError::Retry(format!("the connection failed: {e}"), None))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// A failed TLS handshake, said as rustls says it (`invalid peer
/// certificate: UnknownIssuer`); an I/O error during it (the collector
/// closed the connection: not a TLS server, or one that refused the
/// client's certificate without an alert) as that.
fn tls_error(e: std::io::Error) -> PostError {
    let why = match tls_cause(&e) {
        Some(tls) => format!("the TLS handshake failed: {tls}"),
        None => format!("the TLS handshake failed: {e}"),
    };
    PostError::Tls(why)
}

/// The rustls error behind `e`, if one is: an alert the collector sent
/// after the handshake (with TLS 1.3 a server refuses the client's
/// certificate only then, on the first read), or one of its own.
fn tls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(t) = x.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        // An io::Error's source is its inner error's source: the inner
        // error itself is reached through get_ref.
        if let Some(t) = x
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(t);
        }
        cur = x.source();
    }
    None
}

/// `e` and its causes, `: `-separated (hyper's own message alone says
/// only `connection error`).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(x) = cur {
        s.push_str(": ");
        s.push_str(&x.to_string());
        cur = x.source();
    }
    s
}

/// A post that failed after the connection was made: a TLS failure if
/// rustls is behind it, or if the collector asked for a client
/// certificate and none was offered (then dropping the connection is
/// how it refuses); else worth another try.
fn post_failed(what: &str, e: &hyper::Error, tls: Option<&Tls>) -> PostError {
    if let Some(cause) = tls_cause(e) {
        return PostError::Tls(format!("{what}: TLS: {cause}"));
    }
    let asked = tls
        .and_then(|t| t.no_client_cert.as_ref())
        .is_some_and(|n| n.asked());
    if asked {
        return PostError::Tls(format!(
            "{what}: {}; the collector asked for a client certificate and none is set \
             ({} and {})",
            chain(e),
            CLIENT_CERTIFICATE_VARS[1],
            CLIENT_KEY_VARS[1]
        ));
    }
    PostError::Retry(format!("{what}: {}", chain(e)), None)
}

impl Client {
    /// Posts `body`; the spans the collector rejected (a partial success)
    /// and its message.
    pub(crate) async fn post(&mut self, body: Bytes) -> Result<(u64, String), PostError> {
        let timeout = self.config.timeout;
        let r = match tokio::time::timeout(timeout, self.try_post(body)).await {
            Ok(r) => r,
            Err(_) => Err(PostError::Retry(
                format!("no answer within {} ms", timeout.as_millis()),
                None,
            )),
        };
        if r.is_err() {
            self.sender = None;
        }
        r
    }

    async fn try_post(&mut self, body: Bytes) -> Result<(u64, String), PostError> {
        let retry =
            |what: &str, e: &dyn std::fmt::Display| PostError::Retry(format!("{what}: {e}"), None);
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(self.config.authority.as_str())
                .await
                .map_err(|e| retry("cannot connect", &e))?;
            let _ = stream.set_nodelay(true);
            self.sender = Some(match &self.config.tls {
                None => handshake(stream).await?,
                Some(tls) => {
                    if let Some(n) = &tls.no_client_cert {
                        n.clear();
                    }
                    let stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client))
                        .connect(tls.server_name.clone(), stream)
                        .await
                        .map_err(tls_error)?;
                    handshake(stream).await?
                }
            });
        }
        let Some(sender) = self.sender.as_mut() else {
            return Err(PostError::Retry("no connection".to_owned(), None));
        };
        sender
            .ready()
            .await
            .map_err(|e| post_failed("the connection closed", &e, self.config.tls.as_ref()))?;
        let mut req = Request::post(self.config.target.clone())
            .header(HOST, self.config.authority.as_str())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .header(USER_AGENT, USER_AGENT_VALUE)
            .body(Full::new(body))
            .map_err(|e| PostError::Refused(format!("cannot make the request: {e}")))?;
        if self.config.gzip {
            req.headers_mut()
                .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        for (k, v) in &self.config.headers {
            req.headers_mut().append(k.clone(), v.clone());
        }
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| post_failed("the post failed", &e, self.config.tls.as_ref()))?;
        let status = resp.status();
        let after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry_after);
        // The answer is read up to MAX_ANSWER bytes, as the exporter spec
        // asks. A success over that is a failure not to be retried (what
        // it says cannot be read); a failure's body is only its message,
        // so a longer one is read as none, and the status decides.
        let body = match Limited::new(resp.into_body(), MAX_ANSWER).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() && status.is_success() => {
                return Err(PostError::Unreadable(format!(
                    "the collector answered {status} with a body over {} MiB: \
                     taken as a failure, not retried",
                    MAX_ANSWER >> 20
                )));
            }
            Err(e) if e.is::<LengthLimitError>() => Bytes::new(),
            Err(e) => return Err(retry("the answer was cut", &e)),
        };
        if status.is_success() {
            // A partial success names the spans it rejected; a body that is
            // not the message (some answer `{}` as JSON) rejects none.
            let partial = ExportTraceServiceResponse::decode(body)
                .ok()
                .and_then(|r| r.partial_success);
            return Ok(partial.map_or((0, String::new()), |p| {
                (p.rejected_spans.max(0) as u64, p.error_message)
            }));
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        let why = format!("the collector answered {status}: {}", text.trim());
        match status.as_u16() {
            429 | 502 | 503 | 504 => Err(PostError::Retry(why, after)),
            _ => Err(PostError::Refused(why)),
        }
    }
}
