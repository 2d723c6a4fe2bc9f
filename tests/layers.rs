//! The layer table of `docs/design.md` is true of the code: no module of
//! `src/` names a module of a lower layer, and no two modules name each
//! other. Reads the table and every `crate::<module>` path outside comments
//! and test modules.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Module name -> layer index, from the table's rows (a row with an empty
/// first cell continues the layer above it; its modules are files inside
/// one already listed).
fn layers(design: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut layer = 0;
    let rows = design
        .lines()
        .skip_while(|l| !l.starts_with("| layer | module |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if cells.len() < 3 || cells[1].is_empty() {
            continue;
        }
        layer += 1;
        for part in cells[2].split('`') {
            if let Some(rest) = part.strip_prefix("src/") {
                let name = rest.trim_end_matches('/').trim_end_matches(".rs");
                out.insert(name.to_owned(), layer);
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a source file names as `crate::<module>`, outside comments
/// and its test module.
/// Where each item re-exported at the crate root is defined: `pub use
/// module::{A, B}` and `pub use module::A` lines of `src/lib.rs`, so that a
/// path through the root (`crate::Edge`) counts as naming its module.
fn root_items(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut text = String::new();
    let mut open = false;
    for line in lib.lines() {
        let l = line.trim();
        if l.starts_with("pub use ") || open {
            text.push_str(l);
            text.push(' ');
            open = !l.ends_with(';');
            if !open {
                let body = text.trim_start_matches("pub use ").trim_end_matches("; ");
                let body = body.trim_end_matches(';').trim();
                if let Some((module, items)) = body.split_once("::") {
                    let items = items.trim_matches(|c| c == '{' || c == '}' || c == ' ');
                    for item in items.split(',') {
                        let item = item.trim();
                        if !item.is_empty() {
                            out.insert(item.to_owned(), module.to_owned());
                        }
                    }
                }
                text.clear();
            }
        }
    }
    out
}

fn named_modules(
    source: &str,
    known: &BTreeMap<String, usize>,
    root: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let code = line.trim_start();
        if code.starts_with("mod tests") {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        let code = code.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if known.contains_key(&name) {
                out.insert(name);
            } else if let Some(module) = root.get(&name) {
                out.insert(module.clone());
            }
        }
    }
    out
}

/// Upward references left in place, each with its reason (none today:
/// `GeometryError::Edge` held a `mark::Edge` and the clock kind lived
/// above `layout`; both moved down).
const KNOWN_UPWARD: &[(&str, &str)] = &[];

#[test]
fn no_module_imports_a_lower_layer_and_no_two_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = fs::read_to_string(root.join("docs/design.md")).unwrap();
    let layers = layers(&design);
    assert!(
        ["word", "layout", "sync", "protocol", "region", "recorder"]
            .iter()
            .all(|m| layers.contains_key(*m)),
        "the layer table was not found in docs/design.md: {layers:?}"
    );
    let root_items = root_items(&fs::read_to_string(root.join("src/lib.rs")).unwrap());
    assert!(
        root_items.get("Edge").map(String::as_str) == Some("mark"),
        "the root re-exports were not read from src/lib.rs: {root_items:?}"
    );
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut edges = BTreeSet::new();
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root.join("src")).unwrap();
        let module = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" {
            continue;
        }
        let Some(&own) = layers.get(&module) else {
            wrong.push(format!(
                "{}: module {module} is not in the layer table",
                rel.display()
            ));
            continue;
        };
        let source = fs::read_to_string(&file).unwrap();
        for named in named_modules(&source, &layers, &root_items) {
            if named == module {
                continue;
            }
            edges.insert((module.clone(), named.clone()));
            if layers[&named] > own && !KNOWN_UPWARD.contains(&(module.as_str(), named.as_str())) {
                wrong.push(format!(
                    "{}: {module} (layer {own}) names {named} (layer {}), a lower layer",
                    rel.display(),
                    layers[&named]
                ));
            }
        }
    }
    for (a, b) in &edges {
        if a < b && edges.contains(&(b.clone(), a.clone())) {
            wrong.push(format!("{a} and {b} import each other"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
