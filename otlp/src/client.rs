//! The HTTP client: one connection to the collector, made again after any
//! failure; a post and the sorting of its answer.

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;

use crate::Config;

/// Why a post failed.
#[derive(Debug)]
pub(crate) enum PostError {
    /// Worth another try: no connection, a timeout, 429, 502, 503, 504.
    Retry(String),
    /// Not: the collector refused the batch.
    Refused(String),
}

/// One connection to the collector, made again after any failure.
pub(crate) struct Client {
    pub(crate) config: Arc<Config>,
    pub(crate) sender: Option<http1::SendRequest<Full<Bytes>>>,
}

impl Client {
    /// Posts `body`; the spans the collector rejected (a partial success).
    pub(crate) async fn post(&mut self, body: Bytes) -> Result<u64, PostError> {
        let timeout = self.config.timeout;
        let r = match tokio::time::timeout(timeout, self.try_post(body)).await {
            Ok(r) => r,
            Err(_) => Err(PostError::Retry(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        };
        if r.is_err() {
            self.sender = None;
        }
        r
    }

    async fn try_post(&mut self, body: Bytes) -> Result<u64, PostError> {
        let retry =
            |what: &str, e: &dyn std::fmt::Display| PostError::Retry(format!("{what}: {e}"));
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(self.config.authority.as_str())
                .await
                .map_err(|e| retry("cannot connect", &e))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| retry("the connection failed", &e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        let Some(sender) = self.sender.as_mut() else {
            return Err(PostError::Retry("no connection".to_owned()));
        };
        sender
            .ready()
            .await
            .map_err(|e| retry("the connection closed", &e))?;
        let mut req = Request::post(self.config.target.clone())
            .header(HOST, self.config.authority.as_str())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
            .map_err(|e| PostError::Refused(format!("cannot make the request: {e}")))?;
        for (k, v) in &self.config.headers {
            req.headers_mut().append(k.clone(), v.clone());
        }
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| retry("the post failed", &e))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| retry("the answer was cut", &e))?
            .to_bytes();
        if status.is_success() {
            // A partial success names the spans it rejected; a body that is
            // not the message (some answer `{}` as JSON) rejects none.
            let rejected = ExportTraceServiceResponse::decode(body)
                .ok()
                .and_then(|r| r.partial_success)
                .map_or(0, |p| p.rejected_spans.max(0) as u64);
            return Ok(rejected);
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        let why = format!("the collector answered {status}: {}", text.trim());
        match status.as_u16() {
            429 | 502 | 503 | 504 => Err(PostError::Retry(why)),
            _ => Err(PostError::Refused(why)),
        }
    }
}
