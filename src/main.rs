//! The `edgemark` command.
#[cfg(not(edgemark_loom))]
fn main() {
    println!("edgemark {}", env!("CARGO_PKG_VERSION"));
}

#[cfg(edgemark_loom)]
fn main() {}
