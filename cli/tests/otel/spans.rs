//! Reading Phoenix's spans back: by name, as a tree, their attributes and
//! event times, and the check every delta attribute must pass.

use serde_json::Value;

/// The span of `spans` named `name`.
pub(crate) fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The span tree of `spans` as text, children indented under parents.
pub(crate) fn tree(spans: &[Value]) -> String {
    fn walk(spans: &[Value], parent: Option<&str>, depth: usize, out: &mut String) {
        let mut kids: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_id"].as_str() == parent)
            .collect();
        kids.sort_by_key(|s| s["start_time"].as_str().unwrap_or("").to_owned());
        for s in kids {
            let id = s["context"]["span_id"].as_str().unwrap_or("");
            let events: Vec<&str> = s["events"]
                .as_array()
                .map(|e| e.iter().filter_map(|e| e["name"].as_str()).collect())
                .unwrap_or_default();
            out.push_str(&format!(
                "{}{} [span {id}, region {}] {} .. {}{}\n",
                "  ".repeat(depth),
                s["name"].as_str().unwrap_or("?"),
                s["attributes"]["edgemark.region"]
                    .as_str()
                    .or_else(|| s["attributes"]["edgemark"]["region"].as_str())
                    .unwrap_or("?"),
                s["start_time"].as_str().unwrap_or(""),
                s["end_time"].as_str().unwrap_or(""),
                if events.is_empty() {
                    String::new()
                } else {
                    format!("\n{}  events: {}", "  ".repeat(depth), events.join(", "))
                }
            ));
            walk(spans, Some(id), depth + 1, out);
        }
    }
    let ids: Vec<&str> = spans
        .iter()
        .filter_map(|s| s["context"]["span_id"].as_str())
        .collect();
    let mut out = String::new();
    // Roots: spans whose parent is not among them.
    let mut roots: Vec<Option<&str>> = spans
        .iter()
        .map(|s| s["parent_id"].as_str())
        .filter(|p| p.is_none_or(|p| !ids.contains(&p)))
        .collect();
    roots.dedup();
    for r in roots {
        if let Some(p) = r {
            out.push_str(&format!("(remote parent {p})\n"));
        }
        walk(spans, r, usize::from(r.is_some()), &mut out);
    }
    out
}

/// An attribute of a Phoenix span (flat, or nested by its dots).
pub(crate) fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let a = &span["attributes"];
    a.get(key).or_else(|| {
        let mut v = a;
        for part in key.split('.') {
            v = v.get(part)?;
        }
        Some(v)
    })
}

/// The event timestamps of a span, in the order given.
pub(crate) fn event_times(span: &Value) -> Vec<String> {
    span["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["timestamp"].as_str().unwrap().to_owned())
        .collect()
}

/// Every delta attribute of `span` joins two values of this span in one
/// clock domain.
pub(crate) fn deltas_within_one_domain(span: &Value) {
    let Some(attrs) = span["attributes"].as_object() else {
        return;
    };
    let flat: Vec<(String, &Value)> = {
        fn flatten<'a>(prefix: &str, v: &'a Value, out: &mut Vec<(String, &'a Value)>) {
            match v.as_object() {
                Some(m) => {
                    for (k, v) in m {
                        let key = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        flatten(&key, v, out);
                    }
                }
                None => out.push((prefix.to_owned(), v)),
            }
        }
        let mut out = Vec::new();
        for (k, v) in attrs {
            flatten(k, v, &mut out);
        }
        out
    };
    let get = |k: &str| flat.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    for (k, v) in &flat {
        let Some(pair) = k
            .strip_prefix("edgemark.")
            .and_then(|k| k.strip_suffix("_ms"))
            .and_then(|k| k.split_once("_to_"))
        else {
            continue;
        };
        let (a, b) = pair;
        let da = get(&format!("edgemark.{a}.clock_domain")).expect("the start's domain");
        let db = get(&format!("edgemark.{b}.clock_domain")).expect("the end's domain");
        assert_eq!(da, db, "{k} joins two clock domains");
        let va = get(&format!("edgemark.{a}_ms"))
            .and_then(Value::as_f64)
            .unwrap();
        let vb = get(&format!("edgemark.{b}_ms"))
            .and_then(Value::as_f64)
            .unwrap();
        assert!((vb - va - v.as_f64().unwrap()).abs() < 1e-6, "{k}");
    }
}
