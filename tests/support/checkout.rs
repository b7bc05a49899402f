//! Files of the checkout a test runs in.

/// A file of this checkout. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test, so a
/// test binary built from another checkout of the same sources (a shared target dir)
/// still reads this one's files; the compile-time path is the fallback.
pub(crate) fn checkout_file(relative: &str) -> std::path::PathBuf {
    let root = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    std::path::Path::new(&root).join(relative)
}
