//! all_to_all: block j of rank i's input becomes block i of rank j's output.

pub mod pairwise;
