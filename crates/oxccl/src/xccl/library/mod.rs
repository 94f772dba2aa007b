//! The NCCL library, loaded at run time: its function table, its version, and turning its
//! result codes into oxccl errors.
//!
//! Rooms:
//! - [`types`]: the C ABI of `nccl.h` (result codes, ids, data types, operators, config);
//! - [`version`]: version codes, the oldest supported release, when optional calls appeared;
//! - [`search`]: where NCCL and RCCL are looked for.
//!
//! NCCL and RCCL export the same `nccl*` names with the same ABI, so one table serves both.

pub(crate) mod search;
pub(crate) mod types;
pub(crate) mod version;

#[cfg(test)]
mod tests;
