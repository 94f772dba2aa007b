//! `oxccl._oxccl`: the Rust half of the Python package. It holds communicators and runs
//! their collectives on memory that the Python half (`oxccl/_buffers.py`) describes as
//! `(address, element count, dtype name)` after taking it from a live exporter (a numpy
//! array, a torch tensor, a DLPack capsule, a writable buffer) that it keeps referenced for
//! the whole call. The GIL is released while a collective runs. Errors are raised as the
//! exception classes of `oxccl.errors`, chosen by the kind of `oxccl::Error`.
//!
//! This module is private: its methods trust the descriptions they get, and only the
//! package's Python half calls them.

use std::time::Duration;

use oxccl::backend::{RawBuf, RawBufMut};
use oxccl::{with_dtype, Buffer, BufferMut, Communicator, DType, Device, Element, Error, ReduceOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A buffer as the Python half describes it: address, element count, dtype name (with
/// `@cuda:N` / `@rocm:N` appended for device memory).
type Desc = (usize, usize, String);

/// Memory of `len` elements of `T` at `ptr` (on `device`), lent by a Python exporter for
/// one call.
struct Lent<T> {
    ptr: *mut T,
    len: usize,
    device: Device,
}

// SAFETY: the memory belongs to a Python object that the calling Python frame keeps
// referenced until the call returns (the GIL is released only inside that call), and the
// exporter does not move or free it while referenced (numpy and torch storage is fixed; a
// `bytearray` cannot resize while its memoryview is held by the caller).
unsafe impl<T> Send for Lent<T> {}

// SAFETY: `ptr` is valid for reads of `len` elements (see `Send`, and `lend`'s checks of
// alignment and non-null) on `device` (host memory, or a GPU's as the exporter said: a torch
// CUDA tensor), and the dtype is `T`'s.
unsafe impl<T: Element> Buffer for Lent<T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        RawBuf { ptr: self.ptr.cast_const().cast(), count: self.len, dtype: T::DTYPE, device: self.device }
    }
}

// SAFETY: as for `Buffer`; the Python half passes writable memory for outputs (it refuses
// read-only exporters there), and `&mut self` is the only user during the call.
unsafe impl<T: Element> BufferMut for Lent<T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        RawBufMut { ptr: self.ptr.cast(), count: self.len, dtype: T::DTYPE, device: self.device }
    }
}

/// Checks a description and makes a `Lent` of it.
fn lend<T: Element>(d: &Desc) -> PyResult<Lent<T>> {
    let (addr, len, _) = d;
    let device = device_of(d)?;
    let align = std::mem::align_of::<T>();
    if *len == 0 {
        // No memory is touched; an aligned dangling address satisfies the slice rules.
        return Ok(Lent { ptr: std::ptr::NonNull::<T>::dangling().as_ptr(), len: 0, device });
    }
    if *addr == 0 {
        return Err(PyValueError::new_err("a buffer of elements has a null address"));
    }
    if addr % align != 0 {
        return Err(PyValueError::new_err(format!(
            "a buffer of {} starts at {addr:#x}, which is not aligned to {align} bytes; pass an aligned copy",
            T::DTYPE
        )));
    }
    Ok(Lent { ptr: *addr as *mut T, len: *len, device })
}

/// The device named after `@` in a description's dtype (the host without one).
fn device_of(d: &Desc) -> PyResult<Device> {
    match d.2.split_once('@') {
        None => Ok(Device::Cpu),
        Some((_, dev)) => dev.parse::<Device>().map_err(|e| PyValueError::new_err(e.to_string())),
    }
}

/// The dtype named by a description.
fn dtype_of(d: &Desc) -> PyResult<DType> {
    let name = d.2.split_once('@').map_or(d.2.as_str(), |(t, _)| t);
    name.parse::<DType>().map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The one dtype of several descriptions.
fn common_dtype(ds: &[&Desc]) -> PyResult<DType> {
    let first = dtype_of(ds[0])?;
    for d in &ds[1..] {
        let t = dtype_of(d)?;
        if t != first {
            return Err(PyValueError::new_err(format!("the buffers' dtypes differ: {first} and {t}")));
        }
    }
    Ok(first)
}

/// `oxccl::Error` as the exception class of `oxccl.errors` for its kind.
fn raise(py: Python<'_>, e: Error) -> PyErr {
    let (class, extra): (&str, Vec<(&str, PyObject)>) = match &e {
        Error::InvalidArgument(_) => ("InvalidArgumentError", vec![]),
        Error::Mismatch { .. } => ("MismatchError", vec![]),
        Error::Timeout { .. } => ("TimeoutError", vec![]),
        Error::PeerLost { .. } => ("PeerLostError", vec![]),
        Error::Aborted { .. } => ("AbortedError", vec![]),
        Error::Revoked { rank, .. } => (
            "RevokedError",
            vec![("rank", rank.into_pyobject(py).map_or_else(|_| py.None(), |o| o.into_any().unbind()))],
        ),
        Error::BackendUnavailable { backend, .. } => (
            "BackendUnavailableError",
            vec![("backend", backend.clone().into_pyobject(py).map_or_else(|_| py.None(), |o| o.into_any().unbind()))],
        ),
        Error::Store(_) => ("StoreError", vec![]),
        Error::Io { .. } => ("OxcclIOError", vec![]),
        Error::Backend { code, .. } => (
            "BackendError",
            vec![("code", code.into_pyobject(py).map_or_else(|_| py.None(), |o| o.into_any().unbind()))],
        ),
        Error::Config(_) => ("ConfigError", vec![]),
        _ => ("InternalError", vec![]),
    };
    let message = e.to_string();
    let made = py.import("oxccl.errors").and_then(|m| m.getattr(class)).and_then(|c| c.call1((message.clone(),)));
    match made {
        Ok(exc) => {
            for (k, v) in extra {
                let _ = exc.setattr(k, v);
            }
            PyErr::from_value(exc)
        }
        Err(import_failed) => import_failed,
    }
}

/// A reduce op from its name (`sum`, `prod`, `min`, `max`, `avg`).
fn reduce_op(name: &str) -> PyResult<ReduceOp> {
    name.parse::<ReduceOp>().map_err(|e| PyValueError::new_err(e.to_string()))
}

/// An operation in flight, whatever it hands back (its buffers, dropped when it completes).
trait InFlight: Send {
    /// Waits for completion; the operation's error if it failed. A receive says who sent
    /// its message and how many elements came (`(source, count)`); other operations, `None`.
    fn wait(&mut self) -> oxccl::Result<Option<(usize, usize)>>;
    /// Whether it has completed (never blocks).
    fn is_completed(&self) -> bool;
}

impl<K: Send> InFlight for Option<oxccl::OwnedWork<K>> {
    fn wait(&mut self) -> oxccl::Result<Option<(usize, usize)>> {
        match self.take() {
            Some(w) => w.wait().map(|_| None),
            None => Ok(None),
        }
    }

    fn is_completed(&self) -> bool {
        self.as_ref().is_none_or(|w| w.is_completed())
    }
}

/// A receive in flight, and how its result says who sent how many elements.
struct Receiving<R> {
    work: Option<oxccl::OwnedWork<R>>,
    message: Box<dyn Fn(R) -> (usize, usize) + Send>,
}

impl<R: Send> InFlight for Receiving<R> {
    fn wait(&mut self) -> oxccl::Result<Option<(usize, usize)>> {
        match self.work.take() {
            Some(w) => w.wait().map(|r| Some((self.message)(r))),
            None => Ok(None),
        }
    }

    fn is_completed(&self) -> bool {
        self.work.as_ref().is_none_or(|w| w.is_completed())
    }
}

/// An async operation (`async_op=True`): `wait()` returns once it has completed (raising its
/// error, if any), `is_completed()` never blocks; any thread may wait (the torch backend
/// completes its futures from a helper thread). It keeps the buffers' Python objects alive
/// until the operation has completed, also when dropped unwaited (dropping waits).
#[pyclass(module = "oxccl._oxccl", name = "Work")]
struct PyWork {
    // Declared before `keep`: dropped (waiting for the operation) before the buffers' owners.
    work: std::sync::Mutex<Box<dyn InFlight>>,
    keep: std::sync::Mutex<Option<PyObject>>,
    error: std::sync::Mutex<Option<PyErr>>,
    /// A completed receive's `(source, count)`, for later waits.
    message: std::sync::Mutex<Option<(usize, usize)>>,
}

impl PyWork {
    fn new(work: Box<dyn InFlight>, keep: PyObject) -> PyWork {
        PyWork {
            work: std::sync::Mutex::new(work),
            keep: std::sync::Mutex::new(Some(keep)),
            error: std::sync::Mutex::new(None),
            message: std::sync::Mutex::new(None),
        }
    }
}

/// The Python handle of a started operation (or its error), keeping `keep` alive.
fn started<K: Send + 'static>(
    py: Python<'_>,
    r: oxccl::Result<oxccl::OwnedWork<K>>,
    keep: PyObject,
) -> PyResult<PyWork> {
    Ok(PyWork::new(Box::new(Some(r.map_err(|e| raise(py, e))?)), keep))
}

fn relock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[pymethods]
impl PyWork {
    /// Waits for the operation (the GIL released); raises its error. A receive returns
    /// `(source, count)`: who sent the message and how many elements came; other
    /// operations return None. Waiting again returns the same at once (or raises the same
    /// error again).
    fn wait(&self, py: Python<'_>) -> PyResult<Option<(usize, usize)>> {
        if let Some(e) = relock(&self.error).as_ref() {
            return Err(e.clone_ref(py));
        }
        let r = py.allow_threads(|| relock(&self.work).wait());
        // The operation has completed: the buffers may go.
        drop(relock(&self.keep).take());
        match r {
            Ok(Some(m)) => {
                *relock(&self.message) = Some(m);
                Ok(Some(m))
            }
            Ok(None) => Ok(*relock(&self.message)),
            Err(e) => {
                let err = raise(py, e);
                *relock(&self.error) = Some(err.clone_ref(py));
                Err(err)
            }
        }
    }

    /// Whether the operation has completed (successfully or not); never blocks.
    fn is_completed(&self) -> bool {
        if relock(&self.error).is_some() {
            return true;
        }
        // A waiter holds the lock while it waits: then it is not known to be complete.
        self.work.try_lock().is_ok_and(|w| w.is_completed())
    }
}

/// A communicator: a group of ranks that run collectives together.
#[pyclass(module = "oxccl._oxccl", name = "Communicator", frozen)]
struct PyCommunicator {
    comm: Communicator,
}

impl PyCommunicator {
    /// Runs `f` with the GIL released, mapping its error.
    fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&Communicator) -> oxccl::Result<R> + Send) -> PyResult<R> {
        let comm = &self.comm;
        py.allow_threads(|| f(comm)).map_err(|e| raise(py, e))
    }
}

#[pymethods]
impl PyCommunicator {
    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// The backend's name (`cpu`, `mpi`, ...).
    #[getter]
    fn backend(&self) -> &'static str {
        self.comm.backend()
    }

    /// The deadline of each operation, seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.comm.timeout().as_secs_f64()
    }

    /// A view of this communicator whose operations use `seconds` as their deadline.
    fn with_timeout(&self, seconds: f64) -> PyResult<PyCommunicator> {
        let d = Duration::try_from_secs_f64(seconds)
            .map_err(|_| PyValueError::new_err(format!("timeout {seconds} is not a number of seconds >= 0")))?;
        Ok(PyCommunicator { comm: self.comm.with_timeout(d) })
    }

    /// A view of this communicator whose GPU operations are ordered after the work already
    /// queued on the CUDA (or HIP) stream `handle`, a raw `cudaStream_t` such as torch's
    /// `torch.cuda.current_stream().cuda_stream` (0: the legacy default stream). The
    /// caller keeps that stream alive while operations using it are in flight, and it must
    /// belong to this communicator's device; host backends ignore it.
    fn after_stream(&self, handle: usize) -> PyCommunicator {
        // SAFETY: the handle is the caller's stream of this communicator's device, alive
        // while its operations are in flight (this method's contract, documented above and
        // kept by oxccl.torch, which passes torch's current stream of the tensor's device
        // and holds the tensors until the operation completes); the GPU engine only records
        // an event on it and makes its own stream wait for that event.
        let stream = unsafe { oxccl::Stream::from_raw(handle as *mut std::ffi::c_void) };
        PyCommunicator { comm: self.comm.with_stream(stream) }
    }

    fn all_reduce(&self, py: Python<'_>, buf: Desc, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        with_dtype!(dtype_of(&buf)?, T => {
            let mut b = lend::<T>(&buf)?;
            self.run(py, move |c| c.all_reduce(&mut b, op))
        })
    }

    fn all_reduce_into(&self, py: Python<'_>, input: Desc, output: Desc, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, mut o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            self.run(py, move |c| c.all_reduce_into(&i, &mut o, op))
        })
    }

    fn reduce(&self, py: Python<'_>, buf: Desc, op: &str, root: usize) -> PyResult<()> {
        let op = reduce_op(op)?;
        with_dtype!(dtype_of(&buf)?, T => {
            let mut b = lend::<T>(&buf)?;
            self.run(py, move |c| c.reduce(&mut b, op, root))
        })
    }

    #[pyo3(signature = (input, output, op, root))]
    fn reduce_into(&self, py: Python<'_>, input: Desc, output: Option<Desc>, op: &str, root: usize) -> PyResult<()> {
        let op = reduce_op(op)?;
        let dt = match &output {
            Some(o) => common_dtype(&[&input, o])?,
            None => dtype_of(&input)?,
        };
        with_dtype!(dt, T => {
            let i = lend::<T>(&input)?;
            let mut o = output.as_ref().map(lend::<T>).transpose()?;
            self.run(py, move |c| c.reduce_into(&i, o.as_mut(), op, root))
        })
    }

    fn broadcast(&self, py: Python<'_>, buf: Desc, root: usize) -> PyResult<()> {
        with_dtype!(dtype_of(&buf)?, T => {
            let mut b = lend::<T>(&buf)?;
            self.run(py, move |c| c.broadcast(&mut b, root))
        })
    }

    fn all_gather(&self, py: Python<'_>, input: Desc, output: Desc) -> PyResult<()> {
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, mut o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            self.run(py, move |c| c.all_gather(&i, &mut o))
        })
    }

    fn all_gather_in_place(&self, py: Python<'_>, buf: Desc) -> PyResult<()> {
        with_dtype!(dtype_of(&buf)?, T => {
            let mut b = lend::<T>(&buf)?;
            self.run(py, move |c| c.all_gather_in_place(&mut b))
        })
    }

    fn reduce_scatter(&self, py: Python<'_>, input: Desc, output: Desc, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, mut o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            self.run(py, move |c| c.reduce_scatter(&i, &mut o, op))
        })
    }

    fn all_to_all(&self, py: Python<'_>, input: Desc, output: Desc) -> PyResult<()> {
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, mut o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            self.run(py, move |c| c.all_to_all(&i, &mut o))
        })
    }

    fn all_to_all_v(
        &self,
        py: Python<'_>,
        input: Desc,
        send_counts: Vec<usize>,
        output: Desc,
        recv_counts: Vec<usize>,
    ) -> PyResult<()> {
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, mut o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            self.run(py, move |c| c.all_to_all_v(&i, &send_counts, &mut o, &recv_counts))
        })
    }

    #[pyo3(signature = (input, output, root))]
    fn gather(&self, py: Python<'_>, input: Desc, output: Option<Desc>, root: usize) -> PyResult<()> {
        let dt = match &output {
            Some(o) => common_dtype(&[&input, o])?,
            None => dtype_of(&input)?,
        };
        with_dtype!(dt, T => {
            let i = lend::<T>(&input)?;
            let mut o = output.as_ref().map(lend::<T>).transpose()?;
            self.run(py, move |c| c.gather(&i, o.as_mut(), root))
        })
    }

    #[pyo3(signature = (input, output, root))]
    fn scatter(&self, py: Python<'_>, input: Option<Desc>, output: Desc, root: usize) -> PyResult<()> {
        let dt = match &input {
            Some(i) => common_dtype(&[i, &output])?,
            None => dtype_of(&output)?,
        };
        with_dtype!(dt, T => {
            let i = input.as_ref().map(lend::<T>).transpose()?;
            let mut o = lend::<T>(&output)?;
            self.run(py, move |c| c.scatter(i.as_ref(), &mut o, root))
        })
    }

    fn start_all_reduce(&self, py: Python<'_>, buf: Desc, op: &str, keep: PyObject) -> PyResult<PyWork> {
        let op = reduce_op(op)?;
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            started(py, self.comm.start_all_reduce(b, op), keep)
        })
    }

    fn start_all_reduce_into(
        &self,
        py: Python<'_>,
        input: Desc,
        output: Desc,
        op: &str,
        keep: PyObject,
    ) -> PyResult<PyWork> {
        let op = reduce_op(op)?;
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            started(py, self.comm.start_all_reduce_into(i, o, op), keep)
        })
    }

    fn start_broadcast(&self, py: Python<'_>, buf: Desc, root: usize, keep: PyObject) -> PyResult<PyWork> {
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            started(py, self.comm.start_broadcast(b, root), keep)
        })
    }

    fn start_reduce(&self, py: Python<'_>, buf: Desc, op: &str, root: usize, keep: PyObject) -> PyResult<PyWork> {
        let op = reduce_op(op)?;
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            started(py, self.comm.start_reduce(b, op, root), keep)
        })
    }

    fn start_all_gather(&self, py: Python<'_>, input: Desc, output: Desc, keep: PyObject) -> PyResult<PyWork> {
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            started(py, self.comm.start_all_gather(i, o), keep)
        })
    }

    fn start_reduce_scatter(
        &self,
        py: Python<'_>,
        input: Desc,
        output: Desc,
        op: &str,
        keep: PyObject,
    ) -> PyResult<PyWork> {
        let op = reduce_op(op)?;
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            started(py, self.comm.start_reduce_scatter(i, o, op), keep)
        })
    }

    fn start_all_to_all(&self, py: Python<'_>, input: Desc, output: Desc, keep: PyObject) -> PyResult<PyWork> {
        with_dtype!(common_dtype(&[&input, &output])?, T => {
            let (i, o) = (lend::<T>(&input)?, lend::<T>(&output)?);
            started(py, self.comm.start_all_to_all(i, o), keep)
        })
    }

    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.barrier())
    }

    fn send(&self, py: Python<'_>, buf: Desc, peer: usize, tag: u32) -> PyResult<()> {
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            self.run(py, move |c| c.send(&b, peer, tag))
        })
    }

    /// Returns the number of elements received.
    fn recv(&self, py: Python<'_>, buf: Desc, peer: usize, tag: u32) -> PyResult<usize> {
        with_dtype!(dtype_of(&buf)?, T => {
            let mut b = lend::<T>(&buf)?;
            self.run(py, move |c| c.recv(&mut b, peer, tag))
        })
    }

    /// The first message from `peer` with `tag` not yet received, if one has arrived:
    /// `(dtype name, element count)`, without receiving it. Never blocks.
    fn probe(&self, py: Python<'_>, peer: usize, tag: u32) -> PyResult<Option<(String, usize)>> {
        let info = self.comm.probe(peer, tag).map_err(|e| raise(py, e))?;
        Ok(info.map(|i| (i.dtype.to_string(), i.count)))
    }

    /// Receives the next message with `tag` from any rank; returns `(source, count)`.
    fn recv_any(&self, py: Python<'_>, buf: Desc, tag: u32) -> PyResult<(usize, usize)> {
        with_dtype!(dtype_of(&buf)?, T => {
            let mut b = lend::<T>(&buf)?;
            self.run(py, move |c| c.recv_any(&mut b, tag).map(|i| (i.source, i.count)))
        })
    }

    /// Starts a send; the work completes once the data is on its way.
    fn start_send(&self, py: Python<'_>, buf: Desc, peer: usize, tag: u32, keep: PyObject) -> PyResult<PyWork> {
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            started(py, self.comm.start_send(b, peer, tag), keep)
        })
    }

    /// Starts a receive from `peer`; waiting returns `(peer, count)`.
    fn start_recv(&self, py: Python<'_>, buf: Desc, peer: usize, tag: u32, keep: PyObject) -> PyResult<PyWork> {
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            let w = self.comm.start_recv(b, peer, tag).map_err(|e| raise(py, e))?;
            let message = Box::new(move |(_, count): (Lent<T>, usize)| (peer, count));
            Ok(PyWork::new(Box::new(Receiving { work: Some(w), message }), keep))
        })
    }

    /// Starts a receive from any rank; waiting returns `(source, count)`.
    fn start_recv_any(&self, py: Python<'_>, buf: Desc, tag: u32, keep: PyObject) -> PyResult<PyWork> {
        with_dtype!(dtype_of(&buf)?, T => {
            let b = lend::<T>(&buf)?;
            let w = self.comm.start_recv_any(b, tag).map_err(|e| raise(py, e))?;
            let message = Box::new(|(_, i): (Lent<T>, oxccl::MessageInfo)| (i.source, i.count));
            Ok(PyWork::new(Box::new(Receiving { work: Some(w), message }), keep))
        })
    }

    /// Starts a barrier.
    fn start_barrier(&self, py: Python<'_>) -> PyResult<PyWork> {
        started(py, self.comm.start_barrier(), py.None())
    }

    /// The sub-communicator of the ranks that pass the same `color` (None: not a member),
    /// ordered by `key`, then rank.
    #[pyo3(signature = (color, key))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<PyCommunicator>> {
        Ok(self.run(py, move |c| c.split(color, key))?.map(|comm| PyCommunicator { comm }))
    }

    /// The sub-communicator of `ranks` (every rank calls it; None off the group).
    fn new_group(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<PyCommunicator>> {
        Ok(self.run(py, move |c| c.new_group(&ranks))?.map(|comm| PyCommunicator { comm }))
    }

    /// Fails this rank's pending and future operations (and tells the peers).
    fn abort(&self, reason: &str) {
        self.comm.abort(reason);
    }

    /// Revokes the communicator on every rank (`RevokedError`); it can still be shrunk.
    fn revoke(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        self.run(py, move |c| c.revoke(reason))
    }

    /// Fault-tolerant agreement: `(AND of the live ranks' flags, ranks found dead,
    /// newcomers waiting to join)`.
    fn agree(&self, py: Python<'_>, flag: u64) -> PyResult<(u64, Vec<usize>, usize)> {
        self.run(py, move |c| c.agree(flag)).map(|a| (a.flag, a.failed, a.joiners))
    }

    /// The members and `joiners` newcomers (`oxccl.join()`), the members first.
    fn grow(&self, py: Python<'_>, joiners: usize) -> PyResult<PyCommunicator> {
        Ok(PyCommunicator { comm: self.run(py, move |c| c.grow(joiners))? })
    }

    /// The survivors' communicator, without `exclude` (None on the excluded ranks).
    fn shrink_excluding(&self, py: Python<'_>, exclude: Vec<usize>) -> PyResult<Option<PyCommunicator>> {
        Ok(self.run(py, move |c| c.shrink_excluding(&exclude))?.map(|comm| PyCommunicator { comm }))
    }

    fn __repr__(&self) -> String {
        format!(
            "<oxccl.Communicator rank {} of {} on backend {}>",
            self.comm.rank(),
            self.comm.world_size(),
            self.comm.backend()
        )
    }
}

/// Joins the job this process belongs to (the environment of `oxccl run`, torchrun, mpirun,
/// Slurm) with the settings `options` gives on top of the environment's (`OXCCL_*` names).
#[pyfunction]
#[pyo3(signature = (options=None))]
fn init(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyCommunicator> {
    let cfg = config(py, options)?;
    let comm = py.allow_threads(|| cfg.init()).map_err(|e| raise(py, e))?;
    Ok(PyCommunicator { comm })
}

/// Joins a running job as a newcomer: waits until its members admit it with `grow`.
#[pyfunction]
#[pyo3(signature = (options=None))]
fn join(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyCommunicator> {
    let cfg = config(py, options)?;
    let comm = py.allow_threads(|| cfg.join()).map_err(|e| raise(py, e))?;
    Ok(PyCommunicator { comm })
}

/// A configuration with `options` (`OXCCL_*` names to values) on top of the environment's.
fn config(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<oxccl::Config> {
    let mut cfg = oxccl::Config::new();
    if let Some(opts) = options {
        for (k, v) in opts.iter() {
            let (k, v): (String, String) = (k.extract()?, v.str()?.extract()?);
            cfg = cfg.set(&k, &v).map_err(|e| raise(py, e))?;
        }
    }
    Ok(cfg)
}

/// The backend the settings choose (`OXCCL_BACKEND` from `options`, else the environment):
/// `auto`, or a backend's name. Checks every setting, so a bad one is refused here, naming
/// its variable.
#[pyfunction]
#[pyo3(signature = (options=None))]
fn configured_backend(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let resolved = config(py, options)?.resolve().map_err(|e| raise(py, e))?;
    Ok(match resolved.backend {
        oxccl::config::BackendChoice::Auto => "auto".to_string(),
        oxccl::config::BackendChoice::Named(name) => name,
    })
}

/// A caller's key-value store as oxccl's rendezvous: `set(key: str, value: bytes)` and
/// `get(key: str, timeout_seconds: float) -> bytes` (waits for the key), Python callables
/// (torch.distributed's store, wrapped by `oxccl.torch`).
struct PyStore {
    set: Py<PyAny>,
    get: Py<PyAny>,
}

impl oxccl::bootstrap::Rendezvous for PyStore {
    fn publish(&self, key: &str, value: &[u8]) -> oxccl::Result<()> {
        Python::with_gil(|py| {
            self.set
                .call1(py, (key, pyo3::types::PyBytes::new(py, value)))
                .map(drop)
                .map_err(|e| Error::Store(format!("publishing {key} in the caller's store: {e}")))
        })
    }

    fn lookup(&self, key: &str, timeout: Duration) -> oxccl::Result<Vec<u8>> {
        Python::with_gil(|py| {
            self.get
                .call1(py, (key, timeout.as_secs_f64()))
                .and_then(|v| v.extract::<Vec<u8>>(py))
                .map_err(|e| Error::Store(format!("waiting for {key} in the caller's store: {e}")))
        })
    }
}

/// Creates rank `rank` of `world_size` processes that meet through the caller's store
/// (`set`, `get`: see `PyStore`), their connections authenticated with `secret`; `options`
/// are settings (`OXCCL_*` names) on top of the environment's. The cpu backend, or `nccl`/
/// `rccl` when `OXCCL_BACKEND` names them (`Config::init_rendezvous`).
#[pyfunction]
#[pyo3(signature = (rank, world_size, set, get, secret, options=None))]
fn init_store(
    py: Python<'_>,
    rank: usize,
    world_size: usize,
    set: Py<PyAny>,
    get: Py<PyAny>,
    secret: String,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyCommunicator> {
    let cfg = config(py, options)?;
    let store = PyStore { set, get };
    let comm = py.allow_threads(|| cfg.init_rendezvous(rank, world_size, &store, &secret)).map_err(|e| raise(py, e))?;
    Ok(PyCommunicator { comm })
}

/// DLPack's tensor description (`DLTensor`, ABI 0.x and 1.x alike up to `byte_offset`).
#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `(address, element count, dtype name)` of the tensor in a legacy DLPack capsule
/// (`"dltensor"`, what `__dlpack__()` returns without `max_version`); the caller keeps the
/// capsule alive for the call (its destructor gives the memory back to the producer).
#[pyfunction]
fn dlpack_desc(capsule: &Bound<'_, pyo3::types::PyCapsule>) -> PyResult<Desc> {
    let name = capsule.name()?.map(|n| n.to_string_lossy().into_owned());
    if name.as_deref() != Some("dltensor") {
        return Err(PyValueError::new_err(format!(
            "a DLPack capsule named {name:?} (consumed already, or a versioned one): pass the object itself"
        )));
    }
    // SAFETY: a capsule named "dltensor" holds a DLManagedTensor, whose first member is the
    // DLTensor (DLPack's ABI); the producer keeps it valid while the capsule lives, and the
    // caller holds the capsule.
    let t = unsafe { &*(capsule.pointer() as *const DlTensor) };
    if t.device_type != 1 {
        return Err(PyValueError::new_err(format!(
            "a DLPack tensor on device type {} (not the CPU): the Python package runs on host memory for now",
            t.device_type
        )));
    }
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err("a DLPack tensor with negative ndim"))?;
    // SAFETY: DLPack gives `ndim` shape entries (and strides, where not null) that live as
    // long as the tensor.
    let (shape, strides) = unsafe {
        let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(t.shape, ndim) };
        let strides = (!t.strides.is_null() && ndim > 0).then(|| std::slice::from_raw_parts(t.strides, ndim));
        (shape, strides)
    };
    let mut count: usize = 1;
    for &d in shape {
        count = count
            .checked_mul(
                usize::try_from(d).map_err(|_| PyValueError::new_err("a DLPack tensor with a negative dimension"))?,
            )
            .ok_or_else(|| PyValueError::new_err("a DLPack tensor too large to address"))?;
    }
    if let Some(strides) = strides {
        // Row-major contiguous: each stride is the product of the dimensions after it
        // (dimensions of size 1 may carry any stride).
        let mut want: i64 = 1;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d != 1 && s != want {
                return Err(PyValueError::new_err("a DLPack tensor that is not contiguous; pass a contiguous copy"));
            }
            want = want.saturating_mul(d);
        }
    }
    let dtype = match (t.dtype_code, t.dtype_bits, t.dtype_lanes) {
        (0, 8, 1) => "i8",
        (0, 32, 1) => "i32",
        (0, 64, 1) => "i64",
        (1, 8, 1) => "u8",
        (1, 32, 1) => "u32",
        (1, 64, 1) => "u64",
        (2, 16, 1) => "f16",
        (2, 32, 1) => "f32",
        (2, 64, 1) => "f64",
        (4, 16, 1) => "bf16",
        (c, b, l) => {
            return Err(PyValueError::new_err(format!(
                "a DLPack tensor of type code {c}, {b} bits, {l} lanes, which oxccl does not reduce or move"
            )))
        }
    };
    let addr = (t.data as usize)
        .checked_add(usize::try_from(t.byte_offset).unwrap_or(usize::MAX))
        .ok_or_else(|| PyValueError::new_err("a DLPack tensor whose address overflows"))?;
    Ok((addr, count, dtype.to_string()))
}

/// The dtype names oxccl knows, as `DType` parses them.
#[pyfunction]
fn dtypes() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

#[pymodule]
fn _oxccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCommunicator>()?;
    m.add_class::<PyWork>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(join, m)?)?;
    m.add_function(wrap_pyfunction!(init_store, m)?)?;
    m.add_function(wrap_pyfunction!(configured_backend, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack_desc, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
