//! scatter: rank i ends with block i of the root's buffer.

pub mod linear;
