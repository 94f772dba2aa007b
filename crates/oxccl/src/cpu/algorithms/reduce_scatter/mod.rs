//! reduce_scatter: rank i ends with block i of the element-wise reduction of all inputs.

pub mod ring;
