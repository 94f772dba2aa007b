//! The double's communicators: the ranks of one NCCL communicator meet here, collective by
//! collective, and the last rank to arrive computes the result for all of them, on host
//! memory, sequentially (an independent reference: none of oxccl's algorithms is used).
//!
//! A call whose ranks disagree (another collective, count, dtype, op or root) never
//! completes, as with NCCL, where a mismatch hangs or corrupts: the engine's timeout and
//! fingerprint check are what must catch it. [`World::abort`] ends every wait.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use crate::backend::reduce;
use crate::dtype::DType;
use crate::reduce_op::ReduceOp;
use crate::sync::relock;

/// A collective, with its root or reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coll {
    AllReduce(ReduceOp),
    Reduce(ReduceOp, usize),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
    AllToAll,
    Gather(usize),
    Scatter(usize),
}

/// One rank's part of a collective: NCCL's arguments (`count` as each call counts it:
/// per rank for all_gather/gather send and reduce_scatter/scatter receive, per peer for
/// all_to_all). Pointers are host addresses that stay valid until the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) coll: Coll,
    pub(crate) dtype: DType,
    pub(crate) count: usize,
    pub(crate) send: usize,
    pub(crate) recv: usize,
}

impl Call {
    /// Whether two ranks' calls belong together (same collective, count, dtype).
    fn agrees(&self, other: &Call) -> bool {
        self.coll == other.coll && self.dtype == other.dtype && self.count == other.count
    }
}

/// The ranks of one communicator of the double.
#[derive(Debug)]
pub(crate) struct World {
    n: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Collectives in progress, by their index in each rank's call order.
    rounds: HashMap<u64, Round>,
    /// Receives posted and not yet matched, per (source, destination), oldest first.
    posted: HashMap<(usize, usize), VecDeque<Posted>>,
    /// The outcome of each matched receive, by ticket, until its receiver collects it.
    matched: HashMap<u64, Result<(), String>>,
    /// Numbers posted receives.
    next_ticket: u64,
    aborted: Option<String>,
}

/// A receive waiting for its send: where the message goes and how long it must be.
#[derive(Debug)]
struct Posted {
    ticket: u64,
    into: usize,
    len: usize,
}

#[derive(Debug)]
struct Round {
    calls: Vec<Option<Call>>,
    /// Set once every rank arrived and the result was written (or could not be).
    outcome: Option<Result<(), String>>,
    /// Ranks that have seen the outcome (the round is removed when all have).
    left: usize,
}

impl World {
    /// A communicator of `n` ranks.
    pub(crate) fn new(n: usize) -> World {
        World { n, state: Mutex::new(State::default()), changed: Condvar::new() }
    }

    /// Ends every wait, now and later, with `why`.
    pub(crate) fn abort(&self, why: &str) {
        let mut st = relock(&self.state);
        st.aborted.get_or_insert_with(|| why.to_string());
        drop(st);
        self.changed.notify_all();
    }

    /// The abort reason, once aborted.
    pub(crate) fn aborted(&self) -> Option<String> {
        relock(&self.state).aborted.clone()
    }

    /// Waits until `open` is set (by someone who then calls [`wake`](Self::wake)) or the
    /// world is aborted: a rank's operation "hanging on the GPU".
    ///
    /// # Errors
    /// The abort reason.
    pub(crate) fn hold(&self, open: &AtomicBool) -> Result<(), String> {
        let mut st = relock(&self.state);
        loop {
            if let Some(why) = &st.aborted {
                return Err(format!("the communicator was aborted: {why}"));
            }
            if open.load(Ordering::SeqCst) {
                return Ok(());
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wakes every wait to check its condition again (after setting a [`hold`](Self::hold)'s
    /// flag).
    pub(crate) fn wake(&self) {
        let _held = relock(&self.state);
        self.changed.notify_all();
    }

    /// Rank `rank`'s part of its collective number `index`: waits for every rank's part, and
    /// returns once the result is in every rank's receive buffer.
    ///
    /// # Safety
    /// `call.send` and `call.recv` address host memory of the sizes the collective implies,
    /// valid (and not used by anyone else) until this returns.
    ///
    /// # Errors
    /// The abort reason, or a description of a call that cannot be computed (a root out of
    /// range).
    pub(crate) unsafe fn collective(&self, rank: usize, index: u64, call: Call) -> Result<(), String> {
        let mut st = relock(&self.state);
        let round =
            st.rounds.entry(index).or_insert_with(|| Round { calls: vec![None; self.n], outcome: None, left: 0 });
        round.calls[rank] = Some(call);
        if round.calls.iter().all(Option::is_some) {
            let calls: Vec<Call> = round.calls.iter().flatten().copied().collect();
            if calls.iter().all(|c| c.agrees(&calls[0])) {
                // SAFETY: every rank's buffers are valid while it waits here, which all do
                // until the outcome is set (this function's contract, for every rank).
                round.outcome = Some(unsafe { compute(&calls) });
                self.changed.notify_all();
            }
            // Disagreeing calls are never completed (see the module docs).
        }
        loop {
            if let Some(why) = &st.aborted {
                return Err(format!("the communicator was aborted: {why}"));
            }
            let round = st.rounds.get_mut(&index).ok_or("internal: a collective round vanished")?;
            if let Some(outcome) = round.outcome.clone() {
                round.left += 1;
                if round.left == self.n {
                    st.rounds.remove(&index);
                }
                return outcome;
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Posts a receive of `len` bytes from `src` to `dst` into `into`, and returns its ticket
    /// for [`wait_recv`](Self::wait_recv). Receives from one source match that source's sends
    /// in the order both were made, as NCCL's do.
    ///
    /// # Safety
    /// `into` addresses `len` writable bytes of host memory, unused by others until
    /// [`wait_recv`](Self::wait_recv) has returned for this ticket.
    pub(crate) unsafe fn post_recv(&self, src: usize, dst: usize, into: usize, len: usize) -> u64 {
        let mut st = relock(&self.state);
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.posted.entry((src, dst)).or_default().push_back(Posted { ticket, into, len });
        drop(st);
        self.changed.notify_all();
        ticket
    }

    /// Sends `len` bytes at `from` from `src` to `dst`: waits until `dst` has posted the
    /// matching receive (a send never completes before its receive is posted, as on NCCL),
    /// then copies the message into it.
    ///
    /// # Safety
    /// `from` addresses `len` readable bytes, unchanged until this returns.
    ///
    /// # Errors
    /// The abort reason; a receive of another length (both sides fail: NCCL needs equal
    /// counts).
    pub(crate) unsafe fn send(&self, src: usize, dst: usize, from: usize, len: usize) -> Result<(), String> {
        let mut st = relock(&self.state);
        loop {
            if let Some(why) = &st.aborted {
                return Err(format!("the communicator was aborted: {why}"));
            }
            if let Some(p) = st.posted.get_mut(&(src, dst)).and_then(VecDeque::pop_front) {
                let outcome = if p.len != len {
                    Err(format!("rank {src} sent {len} bytes to rank {dst}, which receives {}", p.len))
                } else {
                    if len > 0 {
                        // SAFETY: `from` holds `len` readable bytes (this function's contract)
                        // and the posted receive `len` writable ones (`post_recv`'s), which its
                        // receiver does not touch before `wait_recv` returns.
                        unsafe { std::ptr::copy_nonoverlapping(from as *const u8, p.into as *mut u8, len) };
                    }
                    Ok(())
                };
                st.matched.insert(p.ticket, outcome.clone());
                drop(st);
                self.changed.notify_all();
                return outcome;
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until the receive with `ticket` has been matched by its send.
    ///
    /// # Errors
    /// The abort reason; the length mismatch its send found.
    pub(crate) fn wait_recv(&self, ticket: u64) -> Result<(), String> {
        let mut st = relock(&self.state);
        loop {
            if let Some(outcome) = st.matched.remove(&ticket) {
                return outcome;
            }
            if let Some(why) = &st.aborted {
                return Err(format!("the communicator was aborted: {why}"));
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Computes one collective for every rank: inputs are copied out first, so in-place calls
/// (send and receive buffers overlapping) get NCCL's result.
///
/// # Safety
/// Every call's buffers are valid for the sizes its collective implies.
unsafe fn compute(calls: &[Call]) -> Result<(), String> {
    let read = |at: usize, len: usize| -> Vec<u8> {
        if len == 0 {
            return Vec::new();
        }
        // SAFETY: every address and length below is one that NCCL defines for the
        // collective's send buffer, valid by this function's contract.
        unsafe { std::slice::from_raw_parts(at as *const u8, len) }.to_vec()
    };
    let write = |at: usize, data: &[u8]| {
        if data.is_empty() {
            return;
        }
        // SAFETY: as above, for receive buffers; every input was copied out before the first
        // write, so overlapping buffers are fine.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at as *mut u8, data.len()) };
    };
    let n = calls.len();
    let c0 = calls[0];
    let blk = c0.count * c0.dtype.size();
    let root_ok = |r: usize| if r < n { Ok(r) } else { Err(format!("root {r} is out of range for {n} ranks")) };
    let inputs: Vec<Vec<u8>> = match c0.coll {
        Coll::AllReduce(_) | Coll::Reduce(..) | Coll::AllGather | Coll::Gather(_) => {
            calls.iter().map(|c| read(c.send, blk)).collect()
        }
        Coll::Broadcast(root) => vec![read(calls[root_ok(root)?].send, blk)],
        Coll::Scatter(root) => vec![read(calls[root_ok(root)?].send, n * blk)],
        Coll::ReduceScatter(_) | Coll::AllToAll => calls.iter().map(|c| read(c.send, n * blk)).collect(),
    };
    let reduce = |op: ReduceOp, len: usize| -> Result<Vec<u8>, String> {
        // The kernels want buffers aligned for the dtype: work in u64-backed storage.
        let words = |src: &[u8]| {
            let mut w = vec![0u64; len.div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..len].copy_from_slice(src);
            w
        };
        let srcs: Vec<Vec<u64>> = inputs.iter().map(|i| words(i)).collect();
        let views: Vec<&[u8]> = srcs.iter().map(|w| &bytemuck::cast_slice::<u64, u8>(w)[..len]).collect();
        let mut dst = vec![0u64; len.div_ceil(8)];
        reduce::reduce_sources(c0.dtype, op, &views, &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dst)[..len])
            .map_err(|e| e.to_string())?;
        Ok(bytemuck::cast_slice::<u64, u8>(&dst)[..len].to_vec())
    };
    match c0.coll {
        Coll::AllReduce(op) => {
            let r = reduce(op, blk)?;
            calls.iter().for_each(|c| write(c.recv, &r));
        }
        Coll::Reduce(op, root) => write(calls[root_ok(root)?].recv, &reduce(op, blk)?),
        Coll::Broadcast(_) => calls.iter().for_each(|c| write(c.recv, &inputs[0])),
        Coll::AllGather => {
            let all = inputs.concat();
            calls.iter().for_each(|c| write(c.recv, &all));
        }
        Coll::Gather(root) => write(calls[root_ok(root)?].recv, &inputs.concat()),
        Coll::ReduceScatter(op) => {
            let r = reduce(op, n * blk)?;
            calls.iter().enumerate().for_each(|(i, c)| write(c.recv, &r[i * blk..(i + 1) * blk]));
        }
        Coll::AllToAll => {
            for (j, c) in calls.iter().enumerate() {
                let got: Vec<u8> = inputs.iter().flat_map(|inp| inp[j * blk..(j + 1) * blk].iter().copied()).collect();
                write(c.recv, &got);
            }
        }
        Coll::Scatter(_) => {
            calls.iter().enumerate().for_each(|(i, c)| write(c.recv, &inputs[0][i * blk..(i + 1) * blk]))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Runs one collective on `n` threads, rank r sending `send(r)`, and returns each rank's
    /// receive buffer (`recv_len` f32 each, initialised to -1).
    fn run(n: usize, coll: Coll, count: usize, send: impl Fn(usize) -> Vec<f32>, recv_len: usize) -> Vec<Vec<f32>> {
        let w = Arc::new(World::new(n));
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let w = Arc::clone(&w);
                let input = send(r);
                std::thread::spawn(move || {
                    let mut out = vec![-1.0f32; recv_len];
                    let call = Call {
                        coll,
                        dtype: DType::F32,
                        count,
                        send: input.as_ptr() as usize,
                        recv: out.as_mut_ptr() as usize,
                    };
                    // SAFETY: `input` and `out` live past the call and have the sizes used.
                    unsafe { w.collective(r, 0, call) }.expect("collective");
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    }

    #[test]
    fn collectives_match_a_sequential_reference() {
        let n = 3;
        let v = |r: usize| vec![r as f32 + 1.0, 10.0 * (r as f32 + 1.0)];
        assert!(run(n, Coll::AllReduce(ReduceOp::Sum), 2, v, 2).iter().all(|o| o == &[6.0, 60.0]));
        assert!(run(n, Coll::AllReduce(ReduceOp::Avg), 2, v, 2).iter().all(|o| o == &[2.0, 20.0]));
        let red = run(n, Coll::Reduce(ReduceOp::Max, 2), 2, v, 2);
        assert_eq!(red, vec![vec![-1.0, -1.0], vec![-1.0, -1.0], vec![3.0, 30.0]]);
        assert!(run(n, Coll::Broadcast(1), 2, v, 2).iter().all(|o| o == &[2.0, 20.0]));
        assert!(run(n, Coll::AllGather, 2, v, 6).iter().all(|o| o == &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]));
        let rs = run(n, Coll::ReduceScatter(ReduceOp::Sum), 1, |r| vec![r as f32, 1.0, 2.0], 1);
        assert_eq!(rs, vec![vec![3.0], vec![3.0], vec![6.0]]);
        let a2a = run(n, Coll::AllToAll, 1, |r| (0..3).map(|j| (10 * r + j) as f32).collect(), 3);
        assert_eq!(a2a, vec![vec![0.0, 10.0, 20.0], vec![1.0, 11.0, 21.0], vec![2.0, 12.0, 22.0]]);
        let g = run(n, Coll::Gather(0), 2, v, 6);
        assert_eq!(g[0], vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        assert_eq!(g[1], vec![-1.0; 6]);
        let sc = run(n, Coll::Scatter(2), 1, |r| vec![r as f32 * 100.0, 1.0 + r as f32, 2.0 + r as f32], 1);
        assert_eq!(sc, vec![vec![200.0], vec![3.0], vec![4.0]]);
    }

    #[test]
    fn in_place_all_reduce_reads_before_writing() {
        let n = 2;
        let w = Arc::new(World::new(n));
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let w = Arc::clone(&w);
                std::thread::spawn(move || {
                    let mut buf = vec![r as i32 + 1; 5];
                    let p = buf.as_mut_ptr() as usize;
                    let call =
                        Call { coll: Coll::AllReduce(ReduceOp::Prod), dtype: DType::I32, count: 5, send: p, recv: p };
                    // SAFETY: `buf` outlives the call.
                    unsafe { w.collective(r, 7, call) }.expect("collective");
                    buf
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().expect("rank"), vec![2; 5]);
        }
    }

    #[test]
    fn a_mismatch_waits_until_aborted_and_p2p_checks_lengths() {
        let w = Arc::new(World::new(2));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            let x = [1.0f32; 2];
            let call = Call { coll: Coll::AllGather, dtype: DType::F32, count: 2, send: x.as_ptr() as usize, recv: 0 };
            // SAFETY: never computed (the other rank disagrees); `x` outlives the call.
            unsafe { w2.collective(1, 0, call) }
        });
        let x = [1.0f32; 2];
        let mut out = [0.0f32; 2];
        let call = Call {
            coll: Coll::AllReduce(ReduceOp::Sum),
            dtype: DType::F32,
            count: 2,
            send: x.as_ptr() as usize,
            recv: out.as_mut_ptr() as usize,
        };
        let w3 = Arc::clone(&w);
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            w3.abort("test");
        });
        // SAFETY: buffers outlive the call.
        let r = unsafe { w.collective(0, 0, call) };
        assert!(r.expect_err("aborted").contains("aborted: test"));
        assert!(t.join().expect("rank 1").is_err());
        aborter.join().expect("aborter");
        // A send waits for its receive; a receive of another length fails on both sides.
        let w = Arc::new(World::new(2));
        let w2 = Arc::clone(&w);
        let sender = std::thread::spawn(move || {
            let (a, b) = ([1u8, 2, 3], [4u8, 5]);
            // SAFETY: both arrays outlive the sends.
            let first = unsafe { w2.send(0, 1, a.as_ptr() as usize, 3) };
            // SAFETY: as above.
            let second = unsafe { w2.send(0, 1, b.as_ptr() as usize, 2) };
            (first, second)
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!sender.is_finished(), "a send completed before its receive was posted");
        let mut got = [0u8; 3];
        // SAFETY: `got` has 3 bytes and outlives the wait.
        let t = unsafe { w.post_recv(0, 1, got.as_mut_ptr() as usize, 3) };
        w.wait_recv(t).expect("recv");
        assert_eq!(got, [1, 2, 3]);
        // SAFETY: as above.
        let t = unsafe { w.post_recv(0, 1, got.as_mut_ptr() as usize, 3) };
        let e = w.wait_recv(t).expect_err("length");
        let (first, second) = sender.join().expect("sender");
        assert!(first.is_ok() && second.is_err());
        assert!(e.contains("sent 2 bytes") && e.contains("receives 3"), "{e}");
    }
}
