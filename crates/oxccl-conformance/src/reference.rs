//! Plain sequential reference implementations of every collective, on `Vec<T>`.
//!
//! Each takes every rank's input (`inputs[r]` is rank r's buffer) and returns what one rank
//! must end with. Reductions return [`Expected`] values (the element semantics live in
//! [`TestElement::reduce_ref`]); data movement returns the exact values. Nothing here is
//! clever: clarity is the point, these are what the algorithms are judged against.

use std::ops::Range;

use oxccl::ReduceOp;

use crate::element::TestElement;
use crate::tolerance::Expected;

/// The element-wise reduction with `op` of every rank's input over the element `range`.
///
/// # Panics
/// When an input is shorter than `range.end` (a bug in the calling case, not in a backend).
pub fn reduce_range<T: TestElement>(inputs: &[Vec<T>], op: ReduceOp, range: Range<usize>) -> Vec<Expected<T>> {
    let mut vals = Vec::with_capacity(inputs.len());
    range
        .map(|i| {
            vals.clear();
            vals.extend(inputs.iter().map(|v| v[i]));
            T::reduce_ref(op, &vals)
        })
        .collect()
}

/// all_reduce (and reduce, at the root): the element-wise reduction of all inputs.
pub fn all_reduce<T: TestElement>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<Expected<T>> {
    let count = inputs.first().map_or(0, Vec::len);
    reduce_range(inputs, op, 0..count)
}

/// reduce_scatter: block `rank` (of `inputs.len()` equal blocks) of the reduction.
pub fn reduce_scatter<T: TestElement>(inputs: &[Vec<T>], op: ReduceOp, rank: usize) -> Vec<Expected<T>> {
    let n = inputs.len().max(1);
    let c = inputs.first().map_or(0, Vec::len) / n;
    reduce_range(inputs, op, rank * c..(rank + 1) * c)
}

/// broadcast: the root's input.
pub fn broadcast<T: TestElement>(inputs: &[Vec<T>], root: usize) -> Vec<T> {
    inputs[root].clone()
}

/// all_gather, all_gather_v and gather (at the root): every input, concatenated in rank order.
pub fn all_gather<T: TestElement>(inputs: &[Vec<T>]) -> Vec<T> {
    inputs.concat()
}

/// scatter: block `rank` of the root's input, split in `n` equal blocks.
pub fn scatter<T: TestElement>(root_input: &[T], n: usize, rank: usize) -> Vec<T> {
    let c = root_input.len() / n.max(1);
    root_input[rank * c..(rank + 1) * c].to_vec()
}

/// all_to_all: block `rank` of every rank's input (each split in `n` equal blocks), in rank order.
pub fn all_to_all<T: TestElement>(inputs: &[Vec<T>], rank: usize) -> Vec<T> {
    let n = inputs.len().max(1);
    inputs
        .iter()
        .flat_map(|v| {
            let c = v.len() / n;
            v[rank * c..(rank + 1) * c].iter().copied()
        })
        .collect()
}

/// all_to_all_v: rank i's input is its blocks for ranks 0..n in order, block j having
/// `send_counts[i][j]` elements; rank `rank` receives block `rank` of every input.
pub fn all_to_all_v<T: TestElement>(inputs: &[Vec<T>], send_counts: &[Vec<usize>], rank: usize) -> Vec<T> {
    inputs.iter().enumerate().flat_map(|(i, v)| v[sent(send_counts, i, rank)].iter().copied()).collect()
}

/// all_to_all_v: the range of rank `from`'s input that goes to rank `to` (its block `to`).
pub fn sent(send_counts: &[Vec<usize>], from: usize, to: usize) -> Range<usize> {
    let start: usize = send_counts[from][..to].iter().sum();
    start..start + send_counts[from][to]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movement_references() {
        let inputs = vec![vec![1u8, 2, 3, 4], vec![5, 6, 7, 8]];
        assert_eq!(all_gather(&inputs), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(all_to_all(&inputs, 1), vec![3, 4, 7, 8]);
        assert_eq!(scatter(&inputs[1], 2, 0), vec![5, 6]);
        assert_eq!(broadcast(&inputs, 1), vec![5, 6, 7, 8]);
        let sc = vec![vec![1, 3], vec![2, 2]];
        assert_eq!(all_to_all_v(&inputs, &sc, 1), vec![2, 3, 4, 7, 8]);
        assert_eq!(all_to_all_v(&inputs, &sc, 0), vec![1, 5, 6]);
    }

    #[test]
    fn reduction_references() {
        let inputs = vec![vec![1i32, 2, 3, 4], vec![10, 20, 30, 40]];
        assert_eq!(all_reduce(&inputs, ReduceOp::Sum), [11, 22, 33, 44].map(Expected::Exact).to_vec());
        assert_eq!(reduce_scatter(&inputs, ReduceOp::Max, 1), vec![Expected::Exact(30), Expected::Exact(40)]);
    }
}
