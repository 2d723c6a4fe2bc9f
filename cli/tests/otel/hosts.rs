//! The two-host test's network: namespaces, veth links and a bridge made
//! with `ip`, deleted by their saved names.

use std::process::Command;

/// Network namespaces, veth links and a bridge, deleted by name when
/// dropped.
#[derive(Default)]
pub(crate) struct Net {
    pub(crate) namespaces: Vec<String>,
    pub(crate) links: Vec<String>,
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        for l in &self.links {
            // A veth went with its namespace: nothing to say then.
            let _ = Command::new("ip").args(["link", "del", l]).output();
        }
    }
}

/// `ip ARGS`, which must succeed.
pub(crate) fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
