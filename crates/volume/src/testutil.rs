//! Test helpers come from blockdev's shared test utilities.

pub(crate) use blockdev::testutil::{Rng, block_on};
