//! Reduction operators.

use std::fmt;

/// How the values of all ranks are combined by all_reduce, reduce and reduce_scatter.
///
/// Integer `Sum` and `Prod` wrap on overflow (two's complement), as in NCCL and MPI.
/// Floating-point `Min`/`Max` follow IEEE 754 minNum/maxNum: a NaN loses against a number.
/// `Avg` is `Sum` divided by the number of ranks; on integers the division truncates
/// toward zero (as NCCL does), the intermediate sum wraps like `Sum`, and a world larger
/// than the type's maximum (128 ranks for `i8`) gives 0.
/// For `f16` and `bf16` every reduction accumulates in `f32` and rounds once at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum of all ranks' values.
    Sum = 0,
    /// Product of all ranks' values.
    Prod = 1,
    /// Smallest value.
    Min = 2,
    /// Largest value.
    Max = 3,
    /// Arithmetic mean (sum divided by the number of ranks).
    Avg = 4,
}

impl ReduceOp {
    /// Every reduce op.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// The short name (`sum`, `prod`, `min`, `max`, `avg`).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// The op with wire tag `tag`, if any.
    pub fn from_tag(tag: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(tag as usize).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
