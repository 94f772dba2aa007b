//! reduce: the root ends with the element-wise reduction of all inputs.

pub mod binomial_tree;
