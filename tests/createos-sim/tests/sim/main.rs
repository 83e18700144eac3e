//! Integration tests for the CreateOS simulator (one binary, several modules).

mod common;
mod faults;
mod files;
mod lifecycle;
mod processes;
mod ratelimit;
mod soak;
