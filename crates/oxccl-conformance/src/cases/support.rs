//! What the case files share: a case and its constructors, the in-place/out-of-place form,
//! and the dtypes, element counts, roots and algorithms the matrix covers.

use oxccl::{Algorithm, Communicator, DType, OpKind};

use crate::check::{Cx, Verdict};
use crate::options::SuiteOptions;

/// In-place or out-of-place form of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// The result overwrites the input buffer (`all_reduce`, `reduce`, `broadcast`,
    /// `all_gather_in_place`, `reduce_scatter_in_place`, `all_to_all_in_place`).
    InPlace,
    /// Separate input and output (`all_reduce_into`, `reduce_into`, `broadcast_into`,
    /// `all_gather`, `reduce_scatter`, `all_to_all`).
    OutOfPlace,
}

impl Form {
    pub const BOTH: [Form; 2] = [Form::InPlace, Form::OutOfPlace];

    pub fn name(self) -> &'static str {
        match self {
            Form::InPlace => "in_place",
            Form::OutOfPlace => "out_of_place",
        }
    }
}

/// What every rank runs for one case, on the case's own communicator.
pub(crate) type CaseFn = Box<dyn Fn(&Communicator, &Cx) -> Verdict>;

/// One case: a name and what every rank runs.
pub(crate) struct Case {
    pub name: String,
    /// The smallest world the case applies to.
    pub min_world: usize,
    pub run: CaseFn,
}

pub(crate) fn case(name: String, run: impl Fn(&Communicator, &Cx) -> Verdict + 'static) -> Case {
    Case { name, min_world: 1, run: Box::new(run) }
}

pub(crate) fn case_min(name: String, min_world: usize, run: impl Fn(&Communicator, &Cx) -> Verdict + 'static) -> Case {
    Case { name, min_world, run: Box::new(run) }
}

/// The dtypes the matrix covers.
pub(crate) fn dtypes(opts: &SuiteOptions) -> Vec<DType> {
    if opts.quick {
        vec![DType::U8, DType::I64, DType::BF16, DType::F32]
    } else {
        DType::ALL.to_vec()
    }
}

fn dedup(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Element counts: the full list (`heavy == false`) or the one for heavy cross products.
pub(crate) fn counts(n: usize, opts: &SuiteOptions, heavy: bool) -> Vec<usize> {
    let below = n.saturating_sub(1);
    if opts.quick {
        dedup(vec![0, 1, below, 13])
    } else if heavy {
        dedup(vec![0, 1, 2, below, n, n + 1, 7, 13, 131, 1031])
    } else {
        dedup(vec![0, 1, 2, below, n, n + 1, 7, 13, 131, 4099])
    }
}

/// Roots: 0, the middle rank and the last rank.
pub(crate) fn roots(n: usize) -> Vec<usize> {
    dedup(vec![0, n / 2, n.saturating_sub(1)])
}

/// `Auto` and every algorithm of `kind`.
pub(crate) fn algos(kind: OpKind) -> Vec<Algorithm> {
    std::iter::once(Algorithm::Auto).chain(Algorithm::for_op(kind).iter().copied()).collect()
}
