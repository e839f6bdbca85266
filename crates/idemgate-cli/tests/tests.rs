//! End-to-end tests of the `idemgate` binary.

mod cli;
mod gateway;
