//! One rank's runtime: the [`Driver`](driver::Driver) that holds its engine behind a lock
//! (the hot path every transport and caller shares), the actix actor that drives it when no
//! caller does ([`actor`]), and the actix system the actors run on ([`system`]).
//!
//! The driver knows nothing of the actor above it: it wakes it through a
//! `Recipient<Kick>`, so the arrows run one way, actor → driver.

pub(crate) mod actor;
pub(crate) mod driver;
pub(crate) mod system;
