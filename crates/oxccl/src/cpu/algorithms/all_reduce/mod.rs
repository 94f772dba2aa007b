//! all_reduce: every rank ends with the element-wise reduction of all inputs.

pub mod ring;
