//! The configuration: `--otlp`'s URL and the `OTEL_*` variables.

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
    assert!(err(None, &[]).contains("--otlp needs"));
    assert!(err(Some("https://x:4318"), &[]).contains("https is not supported"));
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
