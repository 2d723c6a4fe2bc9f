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
            &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]
        )
        .contains("gzip")
    );
    assert!(err(Some("http://x"), &[("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")]).contains("soon"));
    assert!(
        err(
            Some("http://x"),
            &[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]
        )
        .contains("key=value")
    );
}
