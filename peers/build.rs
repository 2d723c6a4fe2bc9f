//! Compiles the LTTng-UST tracepoint provider (`tp/`) and links it with
//! liblttng-ust (Debian: `liblttng-ust-dev`).

fn main() {
    println!("cargo:rerun-if-changed=tp/tp.c");
    println!("cargo:rerun-if-changed=tp/tp.h");
    cc::Build::new()
        .file("tp/tp.c")
        .include("tp")
        .warnings(false)
        .compile("edgemark_peers_tp");
    println!("cargo:rustc-link-lib=lttng-ust");
    println!("cargo:rustc-link-lib=dl");
    // The probes register through pointers that the linker keeps in the
    // section `lttng_ust_tracepoints_ptrs`, which nothing references by
    // name: with the default `-z start-stop-gc` of recent linkers (and
    // Rust's `--gc-sections`) the section is dropped and every tracepoint
    // silently stays disabled.
    println!("cargo:rustc-link-arg=-Wl,-z,nostart-stop-gc");
}
