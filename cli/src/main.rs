//! The `edgemark` command: create, inspect and drive regions from a shell.
//! Everything is in the library (`lib.rs`), which the Python package's
//! console script runs too.

fn main() {
    std::process::exit(edgemark_cli::run(std::env::args_os()));
}
