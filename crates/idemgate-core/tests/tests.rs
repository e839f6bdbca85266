//! Integration tests of the engine: behaviours, failpoints and the reference model.

mod engine;
mod model;
mod support;
