//! Where and how to send: the endpoint given (the exporter's builder's
//! [`with_endpoint`](crate::ExporterBuilder::with_endpoint)) and the
//! standard `OTEL_*` variables, each name beside its default (the
//! certificate variables live with the TLS material, `tls.rs`, and are
//! re-exported here).

use std::path::Path;
use std::time::Duration;

use hyper::Uri;
use hyper::header::{HeaderName, HeaderValue};

pub use crate::error::ConfigError;
use crate::error::{Context, bail, err};
use crate::tls::Tls;
pub use crate::tls::{ALPN, CERTIFICATE_VARS, CLIENT_CERTIFICATE_VARS, CLIENT_KEY_VARS};

/// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: spans sent in one post.
pub const BATCH_VAR: &str = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE";
/// Spans sent in one post, unless [`BATCH_VAR`] says.
pub const DEFAULT_BATCH: usize = 512;
/// `OTEL_BSP_MAX_QUEUE_SIZE`: spans queued at most.
pub const QUEUE_VAR: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
/// Spans queued at most, unless [`QUEUE_VAR`] says.
pub const DEFAULT_QUEUE: usize = 16_384;
/// `OTEL_BSP_SCHEDULE_DELAY`: milliseconds a queued span waits at most for
/// a batch to fill.
pub const DELAY_VAR: &str = "OTEL_BSP_SCHEDULE_DELAY";
/// The longest a queued span waits for a batch to fill, unless
/// [`DELAY_VAR`] says.
pub const DEFAULT_DELAY: Duration = Duration::from_millis(500);
/// `OTEL_EXPORTER_OTLP_TIMEOUT` and its traces form: milliseconds one post
/// may take.
pub const TIMEOUT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
];
/// The limit on one post (connect, send, answer), unless [`TIMEOUT_VARS`]
/// say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the traces URL as it is.
pub const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_ENDPOINT`: a base URL, `/v1/traces` appended.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The protocol variables; only `http/protobuf` is spoken.
pub const PROTOCOL_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];
/// The compression variables: `gzip` or `none` (the default).
pub const COMPRESSION_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
];
/// The header variables: `key=value,...`, values %-encoded.
pub const HEADERS_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_HEADERS",
];

/// `OTEL_SERVICE_NAME`: the resource's `service.name` (default `edgemark`).
pub const SERVICE_NAME_VAR: &str = "OTEL_SERVICE_NAME";
/// `OTEL_RESOURCE_ATTRIBUTES`: the resource's other attributes.
pub const RESOURCE_VAR: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// Where and how to send: the endpoint given and the standard `OTEL_*`
/// variables, with what the exporter's builder sets over them.
#[derive(Debug, Clone)]
pub struct Config {
    /// The traces URL posted to, as given or built.
    pub url: String,
    /// The request target (path and query).
    pub(crate) target: Uri,
    /// `host:port` to connect to, also the `Host` header.
    pub(crate) authority: String,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) timeout: Duration,
    pub(crate) batch: usize,
    pub(crate) queue: usize,
    pub(crate) delay: Duration,
    /// The resource's attributes: `service.name`, `host.name`, then the
    /// rest of `OTEL_RESOURCE_ATTRIBUTES`.
    pub(crate) resource: Vec<(String, String)>,
    /// Settings ignored, each with why.
    pub(crate) warnings: Vec<String>,
    /// Whether bodies are sent gzip-compressed.
    pub(crate) gzip: bool,
    /// For an `https://` URL: the TLS settings.
    pub(crate) tls: Option<Tls>,
}

/// The first of `names` set (and not empty) in `env`, with its name.
fn first(env: &impl Fn(&str) -> Option<String>, names: &[&str]) -> Option<(String, String)> {
    names.iter().find_map(|n| {
        env(n)
            .filter(|v| !v.trim().is_empty())
            .map(|v| ((*n).to_owned(), v.trim().to_owned()))
    })
}

/// `%XX` escapes of `s` decoded, as the OTLP exporter variables write
/// header and resource values.
fn percent_decode(s: &str) -> Result<String, ConfigError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            let v = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| err!("a bad %-escape in {s:?}"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| err!("{s:?} decodes to text that is not UTF-8"))
}

/// A list `key=value,key=value` (the form of `OTEL_EXPORTER_OTLP_HEADERS`
/// and `OTEL_RESOURCE_ATTRIBUTES`), values %-decoded.
fn pairs(var: &str, s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| err!("{var}: {p:?} is not key=value"))?;
            let k = k.trim();
            if k.is_empty() {
                bail!("{var}: {p:?} has no key");
            }
            Ok((
                percent_decode(k).with_context(|| var.to_owned())?,
                percent_decode(v.trim()).with_context(|| var.to_owned())?,
            ))
        })
        .collect()
}

/// A positive number of milliseconds from `var`.
fn millis(var: &str, v: &str) -> Result<Duration, ConfigError> {
    match v.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => bail!("{var}={v}: not a positive number of milliseconds"),
    }
}

/// A positive count from `var`.
fn count(var: &str, v: &str) -> Result<usize, ConfigError> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{var}={v}: not a positive number"),
    }
}

/// This host's name, as `uname -n` says it.
fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

impl Config {
    /// `host:port` connected to, also the `Host` header.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The request target: path and query.
    pub fn target(&self) -> &str {
        self.target.path_and_query().map_or("/", |p| p.as_str())
    }

    /// The headers added to each post, from the header variables.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()))
    }

    /// The limit on one post.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Spans sent in one post at most.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Spans queued at most.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// The resource's attributes: `service.name`, `host.name`, then the
    /// rest of `OTEL_RESOURCE_ATTRIBUTES`.
    pub fn resource(&self) -> &[(String, String)] {
        &self.resource
    }

    /// Whether bodies are sent gzip-compressed
    /// (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`).
    pub fn gzip(&self) -> bool {
        self.gzip
    }

    /// Whether posts go over TLS (an `https://` URL).
    pub fn https(&self) -> bool {
        self.tls.is_some()
    }

    /// The PEM file of CA certificates trusted for the collector instead of
    /// the system's roots ([`CERTIFICATE_VARS`]), if one is given and the
    /// URL is `https://`.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref()?.ca_file.as_deref()
    }

    /// The client certificate file offered for mutual TLS
    /// ([`CLIENT_CERTIFICATE_VARS`]), if one is given and the URL is
    /// `https://`.
    pub fn client_certificate(&self) -> Option<&Path> {
        self.tls.as_ref()?.client_certificate.as_deref()
    }

    /// Settings that were ignored (a number that does not parse: its
    /// default is used; a certificate variable with an `http://` URL),
    /// each with why. The exporter logs each at start (`log`, warning).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The longest a batch waits to fill (`OTEL_BSP_SCHEDULE_DELAY`).
    pub fn schedule_delay(&self) -> Duration {
        self.delay
    }

    /// This configuration with what a builder set over the environment's.
    pub(crate) fn overridden(mut self, o: &Overrides) -> Config {
        if let Some(t) = o.timeout {
            // A post needs some time: no zero.
            self.timeout = t.max(Duration::from_millis(1));
        }
        if let Some(d) = o.schedule_delay {
            self.delay = d;
        }
        if let Some(q) = o.queue {
            self.queue = q.max(1);
        }
        if let Some(b) = o.batch {
            self.batch = b.max(1);
        }
        // A batch larger than the queue could never fill.
        self.batch = self.batch.min(self.queue);
        self
    }
}

/// What the exporter's builder sets over the environment's settings.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    pub(crate) timeout: Option<Duration>,
    pub(crate) schedule_delay: Option<Duration>,
    pub(crate) batch: Option<usize>,
    pub(crate) queue: Option<usize>,
}

/// Headers the exporter sets itself, which the header variables cannot
/// give.
pub const RESERVED_HEADERS: [&str; 6] = [
    "host",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "connection",
];

/// `url` if it can be posted to as it is: it starts with `http://` or
/// `https://`, has no fragment and
/// no credentials (refused without printing them), and a port, if it
/// names one, from 1 to 65535.
fn check_url(url: &str) -> Result<String, ConfigError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("{url}: the URL must start with http:// or https://");
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        bail!("{url}: the URL must start with http:// or https://");
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if let Some(at) = authority.rfind('@') {
        let shown = format!("{scheme}://{}{}", &authority[at + 1..], &rest[end..]);
        bail!(
            "{shown}: the URL holds credentials (before an @), which this exporter does not \
             send and never shows: give them as a header, for example \
             OTEL_EXPORTER_OTLP_HEADERS=authorization=Basic%20<base64 of the credentials>"
        );
    }
    if url.contains('#') {
        bail!("{url}: the URL has a fragment (#...), which is never sent: remove it");
    }
    // The port: after the host (an IPv6 host is in brackets).
    let host_end = if authority.starts_with('[') {
        authority.find(']').map_or(authority.len(), |i| i + 1)
    } else {
        authority.find(':').unwrap_or(authority.len())
    };
    if let Some(port) = authority[host_end..].strip_prefix(':')
        && !port.is_empty()
        && !matches!(port.parse::<u32>(), Ok(1..=65535))
    {
        bail!("{url}: {port:?} is not a port number (1 to 65535)");
    }
    Ok(url.to_owned())
}

impl Config {
    /// The configuration from the collector's base URL `endpoint` (`None`
    /// or empty: none given) and the variables `env` reads.
    ///
    /// The traces URL is `endpoint` with `/v1/traces` appended;
    /// without one, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended. Headers,
    /// timeout, protocol and compression come from
    /// `OTEL_EXPORTER_OTLP_{TRACES_,}{HEADERS,TIMEOUT,PROTOCOL,COMPRESSION}`,
    /// the batch and queue from `OTEL_BSP_*`, the resource from
    /// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`.
    ///
    /// For an `https://` URL, the TLS settings from [`CERTIFICATE_VARS`],
    /// [`CLIENT_KEY_VARS`] and [`CLIENT_CERTIFICATE_VARS`]: their files are
    /// read here, so that one missing, unreadable or holding no
    /// certificate (or key) is an error now, naming the variable and the
    /// path. With an `http://` URL those variables are not read: each one
    /// set is a [warning](Config::warnings).
    pub fn new(
        endpoint: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        // `/v1/traces` goes after the base's path, before its query.
        let join = |base: &str| match base.split_once('?') {
            Some((path, query)) => {
                format!("{}/v1/traces?{query}", path.trim_end_matches('/'))
            }
            None => format!("{}/v1/traces", base.trim_end_matches('/')),
        };
        let url = match endpoint.map(str::trim).filter(|u| !u.is_empty()) {
            Some(base) => join(base),
            None => match first(&env, &[TRACES_ENDPOINT_VAR]) {
                Some((_, u)) => u,
                None => match first(&env, &[ENDPOINT_VAR]) {
                    Some((_, base)) => join(&base),
                    None => {
                        return Err(ConfigError::missing_endpoint(format!(
                            "no collector URL: none given, and neither {ENDPOINT_VAR} nor \
                             {TRACES_ENDPOINT_VAR} is set (for example \
                             {ENDPOINT_VAR}=http://127.0.0.1:4318)"
                        )));
                    }
                },
            },
        };
        let url = check_url(&url)?;
        let uri: Uri = url.parse().with_context(|| format!("{url}: not a URL"))?;
        let https = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            _ => bail!("{url}: the URL must start with http:// or https://"),
        };
        let host = uri
            .host()
            .ok_or_else(|| err!("{url}: the URL has no host"))?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = format!("{host}:{port}");
        let mut warnings = Vec::new();
        let tls = if https {
            Some(Tls::new(
                &url,
                host,
                first(&env, &CERTIFICATE_VARS),
                first(&env, &CLIENT_KEY_VARS),
                first(&env, &CLIENT_CERTIFICATE_VARS),
            )?)
        } else {
            // Said once, at start: the files are not read.
            for vars in [
                &CERTIFICATE_VARS,
                &CLIENT_KEY_VARS,
                &CLIENT_CERTIFICATE_VARS,
            ] {
                if let Some((var, _)) = first(&env, vars) {
                    warnings.push(format!(
                        "{var} is set but {url} is http://: no TLS, the file is not used"
                    ));
                }
            }
            None
        };
        let target: Uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .with_context(|| format!("{url}: not a URL"))?;

        if let Some((var, p)) = first(&env, &PROTOCOL_VARS)
            && p != "http/protobuf"
        {
            bail!(
                "{var}={p}: this exporter speaks OTLP over HTTP with protobuf only \
                 (http/protobuf): point it at the collector's HTTP port (4318 by default)"
            );
        }
        let gzip = match first(&env, &COMPRESSION_VARS) {
            None => false,
            Some((_, c)) if c == "none" => false,
            Some((_, c)) if c == "gzip" => true,
            Some((var, c)) => bail!("{var}={c}: the compression is gzip or none"),
        };
        let mut headers = Vec::new();
        if let Some((var, h)) = first(&env, &HEADERS_VARS) {
            for (k, v) in pairs(&var, &h)? {
                let name = HeaderName::try_from(k.as_str())
                    .with_context(|| format!("{var}: {k:?} is not a header name"))?;
                if RESERVED_HEADERS.contains(&name.as_str()) {
                    bail!(
                        "{var}: {name} is the exporter's own header (it sets {}): \
                         it cannot be given",
                        RESERVED_HEADERS.join(", ")
                    );
                }
                let value = HeaderValue::try_from(v.as_str())
                    .with_context(|| format!("{var}: the value of {k} is not a header value"))?;
                headers.push((name, value));
            }
        }
        // A number that does not parse is warned about and the default
        // used, as the SDK configuration spec asks of numeric variables.
        let mut or_default =
            |r: Option<Result<_, ConfigError>>, default, shown: &dyn Fn() -> String| match r {
                Some(Ok(v)) => v,
                Some(Err(e)) => {
                    warnings.push(format!("{e}; using the default, {}", shown()));
                    default
                }
                None => default,
            };
        let timeout = or_default(
            first(&env, &TIMEOUT_VARS).map(|(var, t)| millis(&var, &t)),
            DEFAULT_TIMEOUT,
            &|| format!("{} ms", DEFAULT_TIMEOUT.as_millis()),
        );
        let delay = or_default(
            first(&env, &[DELAY_VAR]).map(|(var, t)| millis(&var, &t)),
            DEFAULT_DELAY,
            &|| format!("{} ms", DEFAULT_DELAY.as_millis()),
        );
        let mut or_default_n = |r: Option<Result<usize, ConfigError>>, default: usize| match r {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                warnings.push(format!("{e}; using the default, {default}"));
                default
            }
            None => default,
        };
        let batch = or_default_n(
            first(&env, &[BATCH_VAR]).map(|(var, n)| count(&var, &n)),
            DEFAULT_BATCH,
        );
        let queue = or_default_n(
            first(&env, &[QUEUE_VAR]).map(|(var, n)| count(&var, &n)),
            DEFAULT_QUEUE,
        );

        let mut given = match first(&env, &[RESOURCE_VAR]) {
            Some((var, a)) => pairs(&var, &a)?,
            None => Vec::new(),
        };
        let mut take = |key: &str| {
            given
                .iter()
                .position(|(k, _)| k == key)
                .map(|i| given.remove(i).1)
        };
        let named = take("service.name");
        let service = first(&env, &[SERVICE_NAME_VAR])
            .map(|(_, s)| s)
            .or(named)
            .unwrap_or_else(|| "edgemark".to_owned());
        let host = take("host.name").unwrap_or_else(host_name);
        let mut resource = vec![
            ("service.name".to_owned(), service),
            ("host.name".to_owned(), host),
        ];
        resource.append(&mut given);

        Ok(Config {
            url,
            target,
            authority,
            headers,
            timeout,
            batch: batch.min(queue),
            queue,
            delay,
            resource,
            warnings,
            gzip,
            tls,
        })
    }
}
