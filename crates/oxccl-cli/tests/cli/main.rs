//! The `oxccl` command line, run as a user runs it (the built binary, in child processes),
//! one test binary (each module was a binary of its own; one binary links once).

mod bench;
mod common;
mod info;
mod run;
mod trace;
mod tune;
