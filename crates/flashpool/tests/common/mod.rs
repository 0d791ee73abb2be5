//! What the end-to-end tests share: the binary, free loopback ports, and a
//! scratch directory per test.

#![allow(dead_code)] // each test binary uses its own part

use std::net::TcpListener;
use std::path::PathBuf;

pub const BIN: &str = env!("CARGO_BIN_EXE_flashpool");

/// A port nothing listens on now (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A new directory under the system's temp dir, unique to this process,
/// suite and test.
pub fn scratch(suite: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "flashpool-{suite}-test-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
