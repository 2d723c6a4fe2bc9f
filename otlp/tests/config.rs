//! The configuration: the endpoint given and the `OTEL_*` variables.

use std::time::Duration;

use edgemark_otlp::Config;

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[test]
fn the_url_and_the_variables() {
    let c = Config::new(Some("http://collector:4318/"), env(&[])).unwrap();
    assert_eq!(c.url, "http://collector:4318/v1/traces");
    assert_eq!(c.authority(), "collector:4318");
    assert_eq!(c.target(), "/v1/traces");
    assert_eq!(c.resource()[0], ("service.name".into(), "edgemark".into()));
    assert_eq!(c.resource()[1].0, "host.name");
    assert_eq!(
        (c.timeout(), c.batch(), c.queue()),
        (
            edgemark_otlp::config::DEFAULT_TIMEOUT,
            edgemark_otlp::config::DEFAULT_BATCH,
            edgemark_otlp::config::DEFAULT_QUEUE
        )
    );

    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1/base"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=a%20b, other = 2"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=ignored,host.name=h1,deployment.environment=ci",
        ),
        ("OTEL_SERVICE_NAME", "stage-a"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "64"),
    ];
    let c = Config::new(None, env(&vars)).unwrap();
    assert_eq!(c.url, "http://a:1/base/v1/traces");
    assert_eq!(c.timeout(), Duration::from_millis(2500));
    assert_eq!(c.batch(), 64);
    let headers: Vec<(&str, &[u8])> = c.headers().collect();
    assert_eq!(headers, [("x-key", &b"a b"[..]), ("other", &b"2"[..])]);
    let r: Vec<(&str, &str)> = c
        .resource()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        r,
        [
            ("service.name", "stage-a"),
            ("host.name", "h1"),
            ("deployment.environment", "ci")
        ]
    );
    // The traces endpoint is used as it is; the flag wins over both.
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/custom"),
    ];
    assert_eq!(
        Config::new(None, env(&vars)).unwrap().url,
        "http://b:2/custom"
    );
    assert_eq!(
        Config::new(Some("http://c:3"), env(&vars)).unwrap().url,
        "http://c:3/v1/traces"
    );
}

#[test]
fn what_is_refused_is_said() {
    let err = |flag: Option<&str>, vars: &[(&str, &str)]| {
        Config::new(flag, env(vars)).unwrap_err().to_string()
    };
    let missing = Config::new(None, env(&[])).unwrap_err();
    assert!(missing.is_missing_endpoint());
    assert!(
        missing.to_string().contains("no collector URL")
            && missing.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT"),
        "{missing}"
    );
    assert!(
        Config::new(Some(" "), env(&[]))
            .unwrap_err()
            .is_missing_endpoint()
    );
    assert!(
        !Config::new(
            Some("http://x"),
            env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
        )
        .unwrap_err()
        .is_missing_endpoint()
    );
    assert!(
        err(Some("http://x"), &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).contains(
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: this exporter speaks OTLP over HTTP with protobuf only"
        )
    );
    assert!(
        err(
            Some("http://x"),
            &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]
        )
        .contains("http/json")
    );
    assert!(
        err(
            Some("http://x"),
            &[("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]
        )
        .contains("the compression is gzip or none")
    );
    let gz = Config::new(
        Some("http://x"),
        env(&[("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")]),
    )
    .unwrap();
    assert!(gz.gzip());
    assert!(
        err(
            Some("http://x"),
            &[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]
        )
        .contains("key=value")
    );
}

#[test]
fn urls_that_would_go_wrong_are_refused_and_credentials_never_shown() {
    let err = |url: &str| Config::new(Some(url), |_| None).unwrap_err().to_string();
    for bad in ["99999", "abc", "0", "65536"] {
        let e = err(&format!("http://127.0.0.1:{bad}"));
        assert!(e.contains("is not a port number"), "{bad}: {e}");
    }
    let e = err("http://user:secret@collector:4318");
    assert!(e.contains("credentials"), "{e}");
    assert!(!e.contains("secret") && !e.contains("user:"), "{e}");
    assert!(e.contains("http://collector:4318"), "{e}");
    assert!(err("http://collector:4318/#frag").contains("fragment"));
    assert!(err("collector:4318").contains("must start with http://"));
    assert!(err("127.0.0.1:4318").contains("must start with http://"));
    // A query stays, after the path.
    let c = Config::new(Some("http://c:1/base?tenant=a"), |_| None).unwrap();
    assert_eq!(c.url, "http://c:1/base/v1/traces?tenant=a");
    assert_eq!(c.target(), "/base/v1/traces?tenant=a");
    // A port in range, and none (80).
    assert_eq!(
        Config::new(Some("http://c:65535"), |_| None)
            .unwrap()
            .authority(),
        "c:65535"
    );
    assert_eq!(
        Config::new(Some("http://c"), |_| None).unwrap().authority(),
        "c:80"
    );
}

#[test]
fn the_exporters_own_headers_cannot_be_given() {
    for name in [
        "content-length",
        "Host",
        "content-type",
        "transfer-encoding",
    ] {
        let vars = [("OTEL_EXPORTER_OTLP_HEADERS", format!("{name}=5"))];
        let e = Config::new(Some("http://c:1"), |k| {
            vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("the exporter's own header"), "{name}: {e}");
    }
}

#[test]
fn a_number_that_does_not_parse_is_a_warning_and_the_default() {
    let vars = [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "-3"),
    ];
    let c = Config::new(Some("http://c:1"), env(&vars)).unwrap();
    assert_eq!(c.timeout(), edgemark_otlp::config::DEFAULT_TIMEOUT);
    assert_eq!(c.queue(), edgemark_otlp::config::DEFAULT_QUEUE);
    assert_eq!(c.warnings().len(), 2, "{:?}", c.warnings());
    assert!(c.warnings()[0].contains("OTEL_EXPORTER_OTLP_TIMEOUT=soon"));
}

// ---------------------------------------------------------------------------
// https: the certificate variables.

/// A test file of `tests/data/`, as a variable would name it.
fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn https_takes_port_443_and_the_ca_file_given() {
    let ca = data("ca.pem");
    let c = Config::new(
        Some("https://collector.example"),
        env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca)]),
    )
    .unwrap();
    assert!(c.https());
    assert_eq!(c.authority(), "collector.example:443");
    assert_eq!(c.ca_file(), Some(std::path::Path::new(&ca)));
    assert_eq!(c.client_certificate(), None);
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    // An IP address is a host the certificate can name, v4 or v6.
    for url in ["https://127.0.0.1:4318", "https://[::1]:4318"] {
        let c = Config::new(Some(url), env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca)])).unwrap();
        assert!(c.https(), "{url}");
    }
    let plain = Config::new(Some("http://collector"), env(&[])).unwrap();
    assert!(!plain.https());
    assert_eq!(plain.authority(), "collector:80");
}

#[test]
fn each_traces_certificate_variable_wins_over_the_general_one() {
    let (ca, key, cert) = (data("ca.pem"), data("client.key"), data("client.pem"));
    let missing = data("no-such-file.pem");
    // The traces form is read, the general one not (a missing file there
    // is never opened).
    let c = Config::new(
        Some("https://collector:4318"),
        env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &ca),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &missing),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", &key),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &missing),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &missing),
        ]),
    )
    .unwrap();
    assert_eq!(c.ca_file(), Some(std::path::Path::new(&ca)));
    assert_eq!(c.client_certificate(), Some(std::path::Path::new(&cert)));
    // And the traces form's missing file is the one said.
    let e = Config::new(
        Some("https://collector:4318"),
        env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &missing),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
        ]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(&format!(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE={missing}: cannot read the file"
        )),
        "{e}"
    );
    // Each variable on its own: the general client pair with the traces
    // CA.
    let c = Config::new(
        Some("https://collector:4318"),
        env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &ca),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
        ]),
    )
    .unwrap();
    assert_eq!(c.client_certificate(), Some(std::path::Path::new(&cert)));
}

#[test]
fn a_certificate_file_that_cannot_be_used_is_said_with_its_variable_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let text = dir.join("text.pem");
    std::fs::write(&text, "not a certificate\n").unwrap();
    let (key, cert) = (data("client.key"), data("client.pem"));
    let missing = data("no-such-file.pem");
    let err = |vars: &[(&str, &str)]| {
        Config::new(Some("https://collector:4318"), env(vars))
            .unwrap_err()
            .to_string()
    };
    let e = err(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", &missing)]);
    assert!(
        e.starts_with(&format!(
            "OTEL_EXPORTER_OTLP_CERTIFICATE={missing}: cannot read the file"
        )),
        "{e}"
    );
    for holds_none in [&empty, &text] {
        let p = holds_none.to_str().unwrap();
        let e = err(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", p)]);
        assert!(
            e.starts_with(&format!(
                "OTEL_EXPORTER_OTLP_CERTIFICATE={p}: the file holds no certificate"
            )),
            "{e}"
        );
    }
    // A key file given as the certificate holds no certificate, and a
    // certificate given as the key no key.
    let e = err(&[
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &key),
    ]);
    assert!(
        e.starts_with(&format!(
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={key}: the file holds no certificate"
        )),
        "{e}"
    );
    let e = err(&[
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &cert),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
    ]);
    assert!(
        e.starts_with(&format!(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY={cert}: the file holds no private key"
        )),
        "{e}"
    );
    let e = err(&[
        ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", &missing),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
    ]);
    assert!(
        e.starts_with(&format!(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY={missing}: cannot read the file"
        )),
        "{e}"
    );
    // The CA file is read even where the system's roots would do.
    let e = err(&[("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &missing)]);
    assert!(e.contains(&missing), "{e}");
}

#[test]
fn a_client_key_without_its_certificate_or_the_reverse_is_refused() {
    let (key, cert) = (data("client.key"), data("client.pem"));
    let err = |vars: &[(&str, &str)]| {
        Config::new(Some("https://collector:4318"), env(vars))
            .unwrap_err()
            .to_string()
    };
    let e = err(&[("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key)]);
    assert!(
        e.starts_with(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY is set but not OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
        ),
        "{e}"
    );
    let e = err(&[("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", &cert)]);
    assert!(
        e.starts_with(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE is set but not \
             OTEL_EXPORTER_OTLP_CLIENT_KEY"
        ),
        "{e}"
    );
    // A key that is not the certificate's (one of the same kind).
    let e = err(&[
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &data("other.key")),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
    ]);
    assert!(
        e.contains("the key and the certificate cannot be used together"),
        "{e}"
    );
}

#[test]
fn certificate_variables_with_an_http_url_are_warned_about_and_not_read() {
    let missing = data("no-such-file.pem");
    let c = Config::new(
        Some("http://collector:4318"),
        env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &missing),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &missing),
        ]),
    )
    .unwrap();
    assert!(!c.https());
    assert_eq!(c.ca_file(), None);
    let w = c.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].starts_with("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE is set but")
            && w[0].contains("http://"),
        "{w:?}"
    );
    assert!(
        w[1].starts_with("OTEL_EXPORTER_OTLP_CLIENT_KEY is set but"),
        "{w:?}"
    );
}
