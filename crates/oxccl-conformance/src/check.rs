//! Helpers shared by the cases: where a check happened ([`Point`]), how failures are
//! collected ([`Check`]), and where the buffers of a call live ([`Placed`], [`PlacedIn`]:
//! on the host, or copied to the GPU of [`SuiteOptions::gpu`]).

use std::fmt;

use oxccl::backend::{RawBuf, RawBufMut};
use oxccl::{Algorithm, Buffer, BufferMut, Communicator, DType, DeviceBuffer, Element, Error, ReduceOp};

use crate::element::TestElement;
use crate::inputs;
use crate::options::SuiteOptions;
use crate::tolerance::Expected;

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

    /// Of every rank `r`'s buffer in sub-case `key`, the values at `range(r)`: what this rank
    /// needs of the others' buffers where they are large (an all-to-all's or a
    /// reduce-scatter's `n` blocks), without making them whole.
    pub fn slices<T: TestElement>(
        &self,
        key: u64,
        n: usize,
        range: impl Fn(usize) -> std::ops::Range<usize>,
        dist: inputs::Dist,
    ) -> Vec<Vec<T>> {
        inputs::all_slices(self.seed, key, n, range, dist)
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

    /// A read-only buffer for a call: `host` itself without device placement, a device
    /// copy of it with.
    pub fn place<'h, T: Element>(&self, host: &'h [T]) -> oxccl::Result<PlacedIn<'h, T>> {
        match &self.opts.gpu {
            None => Ok(PlacedIn::Host(host)),
            Some(gpu) => Ok(PlacedIn::Device(gpu.copy_from_host(host)?)),
        }
    }

    /// A writable buffer for a call: `host` itself without device placement, a device copy
    /// of it with (copied back into `host` by [`Placed::back`]).
    pub fn place_mut<'h, T: Element>(&self, host: &'h mut [T]) -> oxccl::Result<Placed<'h, T>> {
        match &self.opts.gpu {
            None => Ok(Placed::Host(host)),
            Some(gpu) => {
                let dev = gpu.copy_from_host(host)?;
                Ok(Placed::Device { host, dev })
            }
        }
    }
}

/// A buffer that a call only reads, where [`Cx::place`] put it.
pub(crate) enum PlacedIn<'h, T: Element> {
    /// The host slice itself.
    Host(&'h [T]),
    /// A device copy of it.
    Device(DeviceBuffer<T>),
}

// SAFETY: forwards to the host slice or the owned device buffer, which are borrowed (or
// owned) by `self` and so stay valid, and unwritten by others, while `self` is borrowed.
unsafe impl<T: Element> Buffer for PlacedIn<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        match self {
            PlacedIn::Host(h) => h.as_raw(),
            PlacedIn::Device(d) => d.as_raw(),
        }
    }
}

/// A buffer that a call may write, where [`Cx::place_mut`] put it; [`back`](Placed::back)
/// brings the device contents back to the host slice.
pub(crate) enum Placed<'h, T: Element> {
    /// The host slice itself.
    Host(&'h mut [T]),
    /// A device copy of `host`, copied back into it by [`back`](Placed::back).
    Device {
        /// Where the contents go back to.
        host: &'h mut [T],
        /// The copy the call uses.
        dev: DeviceBuffer<T>,
    },
}

impl<T: Element> Placed<'_, T> {
    /// Copies the device contents into the host slice (nothing to do on the host).
    ///
    /// # Errors
    /// The device runtime's error; a device copy whose length differs from the host slice's.
    pub fn back(self) -> oxccl::Result<()> {
        match self {
            Placed::Host(_) => Ok(()),
            Placed::Device { host, dev } => {
                let v = dev.to_vec()?;
                if v.len() != host.len() {
                    return Err(Error::invalid(format!(
                        "oxccl-conformance: a device buffer of {} elements placed from {} host elements",
                        v.len(),
                        host.len()
                    )));
                }
                host.copy_from_slice(&v);
                Ok(())
            }
        }
    }

    /// The current contents (the device's, when placed on a device), copied to the host.
    ///
    /// # Errors
    /// The device runtime's error.
    pub fn to_vec(&self) -> oxccl::Result<Vec<T>> {
        match self {
            Placed::Host(h) => Ok(h.to_vec()),
            Placed::Device { dev, .. } => dev.to_vec(),
        }
    }
}

// SAFETY: forwards to the host slice (borrowed exclusively by `self`) or the owned device
// buffer: both stay valid, and unwritten by others, while `self` is borrowed.
unsafe impl<T: Element> Buffer for Placed<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        match self {
            Placed::Host(h) => (**h).as_raw(),
            Placed::Device { dev, .. } => dev.as_raw(),
        }
    }
}

// SAFETY: as above; `&mut self` is exclusive, and so is `self`'s borrow of the host slice
// (or its ownership of the device buffer), and `as_raw_mut` names the same memory as
// `as_raw`.
unsafe impl<T: Element> BufferMut for Placed<'_, T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        match self {
            Placed::Host(h) => h.as_raw_mut(),
            Placed::Device { dev, .. } => dev.as_raw_mut(),
        }
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

/// Runs a communicator call on buffers placed by [`Cx::place`] / [`Cx::place_mut`]:
///
/// ```text
/// placed!(chk, p, cx; [in1, in2] [out1, out2] => c.some_call(&in1, &mut out1, ...))
/// ```
///
/// Inside a block, shadows each `inN` (any `&[T]`-like value) with its placed read-only
/// copy and each `outN` (a mutable `Vec`/slice binding) with its placed writable copy,
/// runs the expression through [`call!`], copies every `outN` back into its host buffer
/// and yields the expression's value. Each step that fails ends the case like `call!`.
/// Without device placement the shadows are the host buffers themselves. Inputs that the
/// case later checks for being unchanged go in the out list, so the device copy is what is
/// checked; so do inputs of calls that take input and output as the same buffer type
/// (`reduce_into`, `broadcast_into`, `gather`, `scatter`).
macro_rules! placed {
    ($chk:ident, $p:expr, $cx:expr; [$($i:ident),* $(,)?] [$($o:ident),* $(,)?] => $e:expr) => {{
        $(
            let $i = $crate::check::call!($chk, $p, $cx.place(&$i));
        )*
        $(
            #[allow(unused_mut)]
            let mut $o = $crate::check::call!($chk, $p, $cx.place_mut(&mut $o));
        )*
        let value = $crate::check::call!($chk, $p, $e);
        $(
            $crate::check::call!($chk, $p, $o.back());
        )*
        value
    }};
}
pub(crate) use placed;

#[cfg(test)]
mod tests {
    use super::*;

    /// A case body that all_gathers `input` into a sentinel-filled output through `placed!`
    /// (on a 1-rank world the output is the input) and checks it.
    fn gather_case(comm: &Communicator, cx: &Cx, input: Vec<i32>, out_len: usize) -> Verdict {
        let mut chk = Check::new(comm);
        let p = Point::new("all_gather", comm);
        let want = input.clone();
        let mut out = vec![-7i32; out_len];
        placed!(chk, p, cx; [input] [out] => comm.all_gather(&input, &mut out));
        chk.bits(&p, "output", &out, &want);
        chk.finish()
    }

    #[test]
    fn placed_on_a_gpu_runs_on_the_device_copy_and_back_brings_it_home() {
        let gpu = oxccl::testing::host_gpu(1, 0).unwrap();
        let opts = SuiteOptions::new().on_gpu(gpu);
        let cx = Cx { seed: 1, key: 2, opts: &opts };
        let results = oxccl::local::run(1, |comm| {
            let input = vec![1i32, 2, 3, 4];
            let mut out = vec![0i32; 4];
            let placed_in = cx.place(&input).unwrap();
            assert!(matches!(placed_in, PlacedIn::Device(_)));
            assert_eq!(placed_in.as_raw().device, oxccl::Device::Cuda(0));
            let mut placed_out = cx.place_mut(&mut out).unwrap();
            assert_eq!(placed_out.as_raw_mut().device, oxccl::Device::Cuda(0));
            comm.all_gather(&placed_in, &mut placed_out).unwrap();
            // The call wrote the device copy, not the host slice.
            assert_eq!(placed_out.to_vec().unwrap(), input);
            match &placed_out {
                Placed::Device { host, .. } => assert_eq!(**host, [0, 0, 0, 0]),
                Placed::Host(_) => panic!("placed on the host with a GPU in the options"),
            }
            placed_out.back().unwrap();
            assert_eq!(out, input);
            (gather_case(&comm, &cx, vec![5, 6, 7], 3), gather_case(&comm, &cx, vec![5, 6, 7], 4))
        })
        .unwrap();
        let (ok, wrong_length) = &results[0];
        assert_eq!(ok, &Ok(()));
        // A failing call inside `placed!` ends the case with the call's error.
        let e = wrong_length.as_ref().unwrap_err();
        assert!(e.contains("all_gather") && e.contains("returned error"), "{e}");
    }

    #[test]
    fn without_a_gpu_the_host_buffers_are_passed_themselves() {
        let opts = SuiteOptions::new();
        let cx = Cx { seed: 1, key: 2, opts: &opts };
        let input = vec![1u8, 2];
        let mut out = vec![0u8; 2];
        let placed_in = cx.place(&input).unwrap();
        assert_eq!(placed_in.as_raw().ptr, input.as_ptr());
        let out_ptr = out.as_mut_ptr();
        let mut placed_out = cx.place_mut(&mut out).unwrap();
        assert!(matches!(placed_out, Placed::Host(_)));
        assert_eq!(placed_out.as_raw_mut().ptr, out_ptr);
        assert_eq!(placed_out.as_raw().device, oxccl::Device::Cpu);
        placed_out.back().unwrap();
        let results = oxccl::local::run(1, |comm| gather_case(&comm, &cx, vec![9, 8], 2)).unwrap();
        assert_eq!(results, vec![Ok(())]);
    }
}
