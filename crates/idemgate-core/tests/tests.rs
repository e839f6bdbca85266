//! Integration tests of the engine: behaviours, failpoints and the reference model.

mod engine;
mod history;
mod journal;
mod journal_model;
mod model;
mod reopen;
mod support;
