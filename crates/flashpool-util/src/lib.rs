//! Helpers shared by the `flashpool` binary (daemon and CLI) and the
//! `flashpool-bench` library, which never imports the binary's code:
//! standard output that survives a closed pipe, sizes and durations as
//! operators write them, user input echoed in errors, and private key files
//! (DH-HMAC-CHAP secrets, TLS PSKs).

pub mod echo;
pub mod keys;
pub mod output;
pub mod units;
