//! The `edgemark` command.
fn main() {
    println!("edgemark {}", env!("CARGO_PKG_VERSION"));
}
