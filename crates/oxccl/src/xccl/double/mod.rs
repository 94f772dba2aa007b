//! Test doubles of what the GPU backends load at run time, so that CI (which has no GPU)
//! runs the whole `nccl`/`rccl` code path: communicators of the NCCL API whose collectives
//! are computed on host memory ([`world`]), driven through the same function table as the
//! real library ([`nccl`]).

// A test double: the `testing` feature builds it for other crates' tests, which use only
// part of it; the unit tests use the rest.
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod nccl;
pub(crate) mod world;
