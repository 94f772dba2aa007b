//! all_gather: every rank ends with every rank's block, in rank order.

pub mod ring;
