//! Helpers shared by the cases: where a check happened ([`Point`]) and how failures are
//! collected ([`Check`]).

use std::fmt;

use oxccl::{Algorithm, Communicator, DType, Error, ReduceOp};

use crate::element::TestElement;
use crate::inputs;
use crate::tolerance::Expected;
use crate::SuiteOptions;

/// The verdict of one case on one rank: `Err` carries the failure message.
pub(crate) type Verdict = Result<(), String>;

/// What a case function gets besides its communicator.
pub(crate) struct Cx<'a> {
    /// The suite's seed.
    pub seed: u64,
    /// The key of the case (from its name).
    pub key: u64,
    /// The suite's options.
    pub opts: &'a SuiteOptions,
}

impl Cx<'_> {
    /// The key of sub-case `i` (a count, a root, a pattern...).
    pub fn sub(&self, i: u64) -> u64 {
        inputs::sub_key(self.key, i)
    }

    /// `count` values of `rank`'s buffer in sub-case `key`.
    pub fn input<T: TestElement>(&self, key: u64, rank: usize, count: usize, dist: inputs::Dist) -> Vec<T> {
        inputs::rank_input(self.seed, key, rank, count, dist)
    }

    /// Every rank's buffer in sub-case `key`: rank r has `count(r)` values.
    pub fn inputs<T: TestElement>(
        &self,
        key: u64,
        n: usize,
        count: impl Fn(usize) -> usize,
        dist: inputs::Dist,
    ) -> Vec<Vec<T>> {
        inputs::all_inputs(self.seed, key, n, count, dist)
    }

    /// Initial contents of an output buffer (never equal to what should be written).
    pub fn sentinel<T: TestElement>(&self, key: u64, rank: usize, count: usize) -> Vec<T> {
        inputs::sentinel(self.seed, key, rank, count)
    }
}

/// Where a check happened: everything needed to reproduce it.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    op: &'static str,
    dtype: Option<DType>,
    reduce: Option<ReduceOp>,
    algo: Option<Algorithm>,
    form: Option<&'static str>,
    root: Option<usize>,
    count: Option<usize>,
    note: Option<String>,
    world: usize,
    rank: usize,
}

impl Point {
    /// A check of `op` on `comm`.
    pub fn new(op: &'static str, comm: &Communicator) -> Point {
        Point {
            op,
            dtype: None,
            reduce: None,
            algo: None,
            form: None,
            root: None,
            count: None,
            note: None,
            world: comm.world_size(),
            rank: comm.rank(),
        }
    }

    pub fn dtype(mut self, d: DType) -> Point {
        self.dtype = Some(d);
        self
    }

    pub fn reduce(mut self, op: ReduceOp) -> Point {
        self.reduce = Some(op);
        self
    }

    pub fn algo(mut self, a: Algorithm) -> Point {
        self.algo = Some(a);
        self
    }

    pub fn form(mut self, f: &'static str) -> Point {
        self.form = Some(f);
        self
    }

    pub fn root(mut self, r: usize) -> Point {
        self.root = Some(r);
        self
    }

    pub fn count(mut self, c: usize) -> Point {
        self.count = Some(c);
        self
    }

    pub fn note(mut self, s: impl Into<String>) -> Point {
        self.note = Some(s.into());
        self
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.op)?;
        if let Some(d) = self.dtype {
            write!(f, "dtype={d}, ")?;
        }
        if let Some(r) = self.reduce {
            write!(f, "op={r}, ")?;
        }
        if let Some(a) = self.algo {
            write!(f, "algo={a}, ")?;
        }
        if let Some(x) = self.form {
            write!(f, "form={x}, ")?;
        }
        if let Some(r) = self.root {
            write!(f, "root={r}, ")?;
        }
        if let Some(c) = self.count {
            write!(f, "count={c}, ")?;
        }
        if let Some(n) = &self.note {
            write!(f, "{n}, ")?;
        }
        write!(f, "world={}, rank={})", self.world, self.rank)
    }
}

/// Collects the failures of one case on one rank. Value checks are recorded and the case goes
/// on (so every rank keeps issuing the same calls); a failed call ends the case and aborts its
/// communicator so that peers still waiting on this rank fail fast instead of timing out.
pub(crate) struct Check<'c> {
    comm: &'c Communicator,
    first: Option<String>,
    more: usize,
}

impl<'c> Check<'c> {
    pub fn new(comm: &'c Communicator) -> Check<'c> {
        Check { comm, first: None, more: 0 }
    }

    /// Records a failure.
    pub fn fail(&mut self, msg: impl Into<String>) {
        if self.first.is_none() {
            self.first = Some(msg.into());
        } else {
            self.more += 1;
        }
    }

    /// Records a failure unless `cond` holds.
    pub fn that(&mut self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.fail(msg());
        }
    }

    /// A call returned an error: records it, aborts the case's communicator and ends the case.
    pub fn call_failed(mut self, p: &Point, e: &Error) -> Verdict {
        self.comm.abort("oxccl-conformance: a call failed on this rank; ending the case");
        match &mut self.first {
            None => self.first = Some(format!("{p}: returned error: {e}")),
            Some(first) => first.push_str(&format!("; later {p} returned error: {e}")),
        }
        self.finish()
    }

    /// Checks `got` against `want` bit for bit; reports the first differing index.
    pub fn bits<T: TestElement>(&mut self, p: &Point, what: &str, got: &[T], want: &[T]) {
        if got.len() != want.len() {
            self.fail(format!("{p}: {what} has {} elements, expected {}", got.len(), want.len()));
            return;
        }
        let mut bad = got.iter().zip(want).enumerate().filter(|(_, (g, w))| !g.same_bits(**w));
        if let Some((i, (g, w))) = bad.next() {
            let others = bad.count();
            self.fail(format!(
                "{p}: {what} differs at index {i}: got {}, expected {} (bit for bit){}",
                g.show(),
                w.show(),
                if others > 0 { format!("; {others} more elements differ") } else { String::new() }
            ));
        }
    }

    /// Checks `got` against reference values; reports the first index out of tolerance.
    pub fn expect<T: TestElement>(&mut self, p: &Point, what: &str, got: &[T], want: &[Expected<T>]) {
        if got.len() != want.len() {
            self.fail(format!("{p}: {what} has {} elements, expected {}", got.len(), want.len()));
            return;
        }
        let mut bad = got.iter().zip(want).enumerate().filter(|(_, (g, w))| !g.satisfies(w));
        if let Some((i, (g, w))) = bad.next() {
            let others = bad.count();
            self.fail(format!(
                "{p}: {what} differs at index {i}: got {}, expected {w}{}",
                g.show(),
                if others > 0 { format!("; {others} more elements differ") } else { String::new() }
            ));
        }
    }

    /// The verdict.
    pub fn finish(self) -> Verdict {
        match self.first {
            None => Ok(()),
            Some(m) if self.more == 0 => Err(m),
            Some(m) => Err(format!("{m} [+{} more failed check(s) in this case]", self.more)),
        }
    }
}

/// Runs a call; on error, ends the case through [`Check::call_failed`].
macro_rules! call {
    ($chk:ident, $p:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $chk.call_failed(&$p, &e),
        }
    };
}
pub(crate) use call;

/// Runs `$body` with the type alias `$T` bound to the Rust type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            oxccl::DType::I8 => {
                type $T = i8;
                $body
            }
            oxccl::DType::U8 => {
                type $T = u8;
                $body
            }
            oxccl::DType::I32 => {
                type $T = i32;
                $body
            }
            oxccl::DType::U32 => {
                type $T = u32;
                $body
            }
            oxccl::DType::I64 => {
                type $T = i64;
                $body
            }
            oxccl::DType::U64 => {
                type $T = u64;
                $body
            }
            oxccl::DType::F16 => {
                type $T = half::f16;
                $body
            }
            oxccl::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            oxccl::DType::F32 => {
                type $T = f32;
                $body
            }
            oxccl::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;
