//! The commands. Each owns its arguments and is a thin consumer of the shared modules (the live
//! `session`, `export`, `table`, the dashboard); no command imports another.

pub mod bench;
pub mod plot;
pub mod probes;
pub mod programs;
pub mod record;
pub mod report;
pub mod selftest;
pub mod serve;
pub mod top;
