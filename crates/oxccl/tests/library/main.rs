//! The library through its public API, one test binary (each module was a binary of its
//! own; one binary links once). Tests that change something process-wide have binaries of
//! their own: `logging` (a global `tracing` subscriber) and `staging` (device copies
//! registered for CUDA memory, which would make the refusals in `buffers` stage instead).

mod async_work;
mod buffers;
mod p2p_sequence;
mod pmix;
mod rendezvous;
mod smoke;
mod tcp_pipeline;
