//! The test bed lives in the `e2e` library (benchmarks use it too).

pub use e2e::bed::*;
