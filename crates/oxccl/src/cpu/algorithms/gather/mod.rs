//! gather: the root ends with every rank's block, in rank order.

pub mod linear;
