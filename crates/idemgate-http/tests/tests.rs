//! The gateway over real HTTP on loopback, with a fake upstream that counts its calls.

mod coordinate;
mod errors;
mod forward;
mod limits;
mod ops;
mod profiles;
mod records;
mod regressions;
mod support;
mod tls;
mod verify;
