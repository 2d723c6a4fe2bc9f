//! The TLS material of an `https://` URL: the certificate variables, and
//! the files they name read into rustls' client configuration (the roots
//! the collector's certificate is checked against, the client certificate
//! of mutual TLS). The configuration reads the variables and hands their
//! paths here.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::RootCertStore;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;

use crate::error::{ConfigError, bail, err};

/// The certificate variables (https only): a PEM file of the CA
/// certificates trusted for the collector's certificate, in place of the
/// system's roots (the default, read as `rustls-native-certs` reads them:
/// `SSL_CERT_FILE` and `SSL_CERT_DIR` if set, else the system's store).
pub const CERTIFICATE_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
];
/// The client key variables (https only): a PEM file of the private key
/// for mutual TLS, with [`CLIENT_CERTIFICATE_VARS`]. By default none: no
/// client certificate is offered.
pub const CLIENT_KEY_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
];
/// The client certificate variables (https only): a PEM file of the
/// certificate chain for mutual TLS, the client's own certificate first,
/// with [`CLIENT_KEY_VARS`].
pub const CLIENT_CERTIFICATE_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
];
/// The protocol offered by ALPN: the exporter speaks HTTP/1.1.
pub const ALPN: &[u8] = b"http/1.1";

/// The TLS settings of an `https://` URL.
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    /// rustls' client configuration: the roots, the client certificate if
    /// any, ALPN `http/1.1`.
    pub(crate) client: Arc<rustls::ClientConfig>,
    /// The name the collector's certificate is checked against, sent as
    /// SNI (not for an IP address): the URL's host.
    pub(crate) server_name: ServerName<'static>,
    /// Without a client certificate: whether a collector asked for one.
    pub(crate) no_client_cert: Option<Arc<NoClientCert>>,
    /// The CA file trusted instead of the system's roots, if any.
    pub(crate) ca_file: Option<PathBuf>,
    /// The client certificate file, if any.
    pub(crate) client_certificate: Option<PathBuf>,
}

/// No client certificate to offer, as rustls' default; but noting that a
/// collector asked for one, so that a connection it then drops (TLS 1.3
/// refuses a missing client certificate only after the handshake, often
/// by closing) is said as a TLS failure, with what to set.
/// The exporter makes one connection at a time, and clears the note before
/// each: it tells of the connection in use.
#[derive(Debug, Default)]
pub(crate) struct NoClientCert {
    asked: Mutex<bool>,
}

impl NoClientCert {
    /// Whether the collector asked for a client certificate since
    /// [`clear`](Self::clear).
    pub(crate) fn asked(&self) -> bool {
        *self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before a new connection.
    pub(crate) fn clear(&self) {
        *self.asked.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }
}

impl ResolvesClientCert for NoClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        *self.asked.lock().unwrap_or_else(|e| e.into_inner()) = true;
        None
    }

    fn has_certs(&self) -> bool {
        false
    }
}

/// The file a certificate variable names, read.
fn read_file(var: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| err!("{var}={}: cannot read the file: {e}", path.display()))
}

/// The certificates of the PEM file `path` that `var` names: at least one.
fn certificates(var: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let pem = read_file(var, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err!("{var}={}: not a PEM file: {e}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{var}={}: the file holds no certificate (a PEM block \
             -----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    Ok(certs)
}

/// The private key of the PEM file `path` that `var` names.
fn private_key(var: &str, path: &Path) -> Result<PrivateKeyDer<'static>, ConfigError> {
    let pem = read_file(var, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => err!(
            "{var}={}: the file holds no private key (a PEM block -----BEGIN PRIVATE KEY-----, \
             -----BEGIN RSA PRIVATE KEY----- or -----BEGIN EC PRIVATE KEY-----)",
            path.display()
        ),
        e => err!("{var}={}: not a PEM file: {e}", path.display()),
    })
}

impl Tls {
    /// The TLS settings for `url`, whose host is `host`, from the files
    /// the certificate variables name, each `(variable, path)` as the
    /// configuration found it: the CA file `ca` (`None`: the system's
    /// roots), and for mutual TLS the client key `key` and its certificate
    /// chain `chain` (both or neither). The files are read here.
    pub(crate) fn new(
        url: &str,
        host: &str,
        ca: Option<(String, String)>,
        key: Option<(String, String)>,
        chain: Option<(String, String)>,
    ) -> Result<Tls, ConfigError> {
        // A bracketed IPv6 host is an address without its brackets.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(bare.to_owned())
            .map_err(|e| err!("{url}: {host} cannot be checked against a certificate: {e}"))?;
        let mut roots = RootCertStore::empty();
        let ca_file = match ca {
            Some((var, path)) => {
                let path = PathBuf::from(path);
                for (i, cert) in certificates(&var, &path)?.into_iter().enumerate() {
                    roots.add(cert).map_err(|e| {
                        err!(
                            "{var}={}: certificate {} of the file is not a CA certificate \
                             rustls can use: {e}",
                            path.display(),
                            i + 1
                        )
                    })?;
                }
                Some(path)
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    let why = found
                        .errors
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ");
                    bail!(
                        "{url}: no trusted root certificates were found on this system{}: \
                         install them (Debian: ca-certificates), or set {} to a PEM file \
                         of the CA certificates to trust",
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(" ({why})")
                        },
                        CERTIFICATE_VARS[1]
                    );
                }
                None
            }
        };
        // ring: builds with a C compiler alone, where aws-lc-rs needs cmake.
        // rustls 0.23.48 deprecates it for lacking post-quantum key exchange
        // (X25519MLKEM768, aws-lc-rs only); its classical suites and groups
        // are the ones collectors accept.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err!("{url}: TLS cannot be set up: {e}"))?
            .with_root_certificates(roots);
        let mut no_client_cert = None;
        let (mut client, client_certificate) = match (key, chain) {
            (None, None) => {
                let none = Arc::new(NoClientCert::default());
                no_client_cert = Some(Arc::clone(&none));
                (builder.with_client_cert_resolver(none), None)
            }
            (Some((var, _)), None) => bail!(
                "{var} is set but not {}: a client key needs its certificate \
                 (mutual TLS takes both)",
                CLIENT_CERTIFICATE_VARS[1]
            ),
            (None, Some((var, _))) => bail!(
                "{var} is set but not {}: a client certificate needs its key \
                 (mutual TLS takes both)",
                CLIENT_KEY_VARS[1]
            ),
            (Some((key_var, key_path)), Some((cert_var, cert_path))) => {
                let (key_path, cert_path) = (PathBuf::from(key_path), PathBuf::from(cert_path));
                let key = private_key(&key_var, &key_path)?;
                let chain = certificates(&cert_var, &cert_path)?;
                let client = builder.with_client_auth_cert(chain, key).map_err(|e| {
                    err!(
                        "{key_var}={} and {cert_var}={}: the key and the certificate \
                         cannot be used together: {e}",
                        key_path.display(),
                        cert_path.display()
                    )
                })?;
                (client, Some(cert_path))
            }
        };
        client.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Tls {
            client: Arc::new(client),
            server_name,
            no_client_cert,
            ca_file,
            client_certificate,
        })
    }
}
