//! The https tests' certificates, made with Debian's `openssl` command,
//! and Phoenix serving https with them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use super::{Phoenix, missing, phoenix, start_phoenix_with};

/// `openssl ARGS` in `dir`, which must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test's CAs and certificates, PEM files in one directory: `ca`
/// signed the server's (for `localhost` and 127.0.0.1) and the client's;
/// `other-ca` signed nothing here.
pub(crate) struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Made in `dir`, if `openssl` is there.
    pub(crate) fn make(dir: &Path) -> Option<Pki> {
        if Command::new("openssl").arg("version").output().is_err() {
            missing("the openssl command is not installed (Debian: openssl)");
            return None;
        }
        let dir = dir.join("pki");
        std::fs::create_dir_all(&dir).unwrap();
        // `openssl req`: a new EC key in `key`, and in `out` a request for
        // `subj` signed by it, with `more` arguments (`-x509`: a
        // self-signed certificate instead).
        let req = |key: &str, out: &str, subj: &str, more: &[&str]| {
            let mut args = vec!["req", "-newkey", "ec", "-pkeyopt"];
            args.extend(["ec_paramgen_curve:prime256v1", "-nodes"]);
            args.extend(["-keyout", key, "-out", out, "-subj", subj]);
            args.extend(more);
            openssl(&dir, &args);
        };
        for ca in ["ca", "other-ca"] {
            let (key, pem, subj) = (
                format!("{ca}.key"),
                format!("{ca}.pem"),
                format!("/CN=edgemark test {ca}"),
            );
            req(
                &key,
                &pem,
                &subj,
                &[
                    "-x509",
                    "-days",
                    "2",
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        for (name, ext) in [
            (
                "server",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key, csr, pem, cnf, subj) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.cnf"),
                format!("/CN=edgemark test {name}"),
            );
            std::fs::write(
                dir.join(&cnf),
                format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{ext}"),
            )
            .unwrap();
            req(&key, &csr, &subj, &[]);
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-days",
                    "2",
                    "-extfile",
                    &cnf,
                ],
            );
        }
        Some(Pki { dir })
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `name`'s path, for a variable.
    pub(crate) fn var(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_owned()
    }

    /// A client that trusts `ca` only, offering the client certificate if
    /// `client`.
    fn reader(&self, client: bool) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        // ring, as the exporter's (see otlp/src/config.rs).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(if client {
            let chain = CertificateDer::pem_file_iter(self.path("client.pem"))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(self.path("client.key")).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        } else {
            b.with_no_client_auth()
        })
    }
}

/// Phoenix serving https with the server certificate of `pki`, asking
/// for a client certificate signed by its CA if `verify_client`.
fn start_tls_phoenix(bin: &Path, dir: &Path, pki: &Pki, verify_client: bool) -> Phoenix {
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem"),
    );
    let mut envs: Vec<(&str, &Path)> = vec![
        ("PHOENIX_TLS_ENABLED_FOR_HTTP", Path::new("true")),
        ("PHOENIX_TLS_CERT_FILE", &cert),
        ("PHOENIX_TLS_KEY_FILE", &key),
    ];
    if verify_client {
        envs.push(("PHOENIX_TLS_CA_FILE", &ca));
        envs.push(("PHOENIX_TLS_VERIFY_CLIENT", Path::new("true")));
    }
    start_phoenix_with(
        bin,
        dir,
        "127.0.0.1",
        &envs,
        Some(pki.reader(verify_client)),
    )
}

/// What an https test starts from: a directory, the certificates made in
/// it, and Phoenix serving https with them, asking for a client
/// certificate if `verify_client`; `None` where Phoenix or `openssl` is
/// missing (said by [`missing`]).
pub(crate) fn tls_phoenix(verify_client: bool) -> Option<(tempfile::TempDir, Pki, Phoenix)> {
    let bin = phoenix()?;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path())?;
    let phoenix = start_tls_phoenix(&bin, dir.path(), &pki, verify_client);
    Some((dir, pki, phoenix))
}
