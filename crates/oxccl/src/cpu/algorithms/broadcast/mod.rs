//! broadcast: every rank ends with the root's buffer.

pub mod binomial_tree;
