//! Integration tests of the engine: behaviours, failpoints and the reference model.

mod engine;
mod journal;
mod model;
mod support;
