//! Python bindings of edgemark (built with maturin; see python/README.md).
