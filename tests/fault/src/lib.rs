//! Raw-TCP fault tests live in tests/; this crate has no library code.
