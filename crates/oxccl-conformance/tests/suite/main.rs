//! The conformance suite's integration tests, one test binary (each module was a binary of
//! its own; one binary links once). Every world here is in this process or in child
//! processes it starts. The scale test (256 processes) and the staging tests (which read
//! the process-wide pinned pool's counters) have binaries of their own.

mod failures;
mod flight_recorder;
mod hosts;
mod local;
mod mutants;
mod nccl_double;
mod processes;
mod support;
