//! Test doubles of what the GPU backends load at run time, so that CI (which has no GPU)
//! runs the whole `nccl`/`rccl` code path: communicators of the NCCL API whose collectives
//! are computed on host memory ([`world`]), driven through the same function table as the
//! real library ([`nccl`]).

pub(crate) mod nccl;
pub(crate) mod world;
