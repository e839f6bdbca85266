//! Integration tests of the engine: behaviours, failpoints and the reference model.

mod engine;
mod history;
mod journal;
mod journal_model;
mod model;
mod observe;
mod reopen;
mod support;
