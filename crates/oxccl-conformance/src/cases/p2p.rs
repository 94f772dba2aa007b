//! Point-to-point cases: send/recv rings, tags and ordering, receives into larger buffers,
//! probe, batches that would deadlock with blocking sends, and async send/recv in a scope.

use std::time::{Duration, Instant};

use oxccl::{with_dtype, Algorithm, Communicator, DType, MessageInfo, OpKind};

use super::support::{algos, case, counts, dtypes, Case};
use crate::check::{call, placed, Check, Cx, Placed, PlacedIn, Point, Verdict};
use crate::element::TestElement;
use crate::inputs::Dist;
use crate::options::SuiteOptions;

pub(crate) fn cases(v: &mut Vec<Case>, n: usize, opts: &SuiteOptions) {
    for d in dtypes(opts) {
        let counts = counts(n, opts, false);
        v.push(case(
            format!("p2p/ring/{d}"),
            move |c, cx| with_dtype!(d, T => ring::<T>(c, cx, Algorithm::Auto, &counts)),
        ));
    }
    for a in algos(OpKind::Send) {
        v.push(case(format!("p2p/ring_algorithm/{a}"), move |c, cx| ring::<i32>(c, cx, a, &[0, 1, 13])));
    }
    v.push(case("p2p/recv_into_larger_buffer".into(), recv_into_larger_buffer));
    v.push(case("p2p/tags_and_order".into(), tags_and_order));
    v.push(case("p2p/probe".into(), probe));
    let batch_types = if opts.quick { vec![DType::I64] } else { vec![DType::U8, DType::I64, DType::BF16, DType::F32] };
    for d in batch_types {
        v.push(case(
            format!("p2p/batch_all_pairs/{d}"),
            move |c, cx| with_dtype!(d, T => batch_all_pairs::<T>(c, cx, false)),
        ));
        v.push(case(
            format!("p2p/batch_all_pairs_async/{d}"),
            move |c, cx| with_dtype!(d, T => batch_all_pairs::<T>(c, cx, true)),
        ));
    }
    v.push(case("p2p/batch_two_tags_reversed".into(), batch_two_tags_reversed));
    v.push(case("p2p/async_send_recv".into(), async_send_recv));
    v.push(case("p2p/recv_any".into(), |c, cx| recv_any(c, cx, false)));
    v.push(case("p2p/recv_any_async".into(), |c, cx| recv_any(c, cx, true)));
}

const TAG: u32 = 7;

fn next_prev(comm: &Communicator) -> (usize, usize) {
    let (n, me) = (comm.world_size(), comm.rank());
    ((me + 1) % n, (me + n - 1) % n)
}

/// Every rank sends to the next and receives from the previous (blocking send first: sends
/// return once the data is handed over). In a world of one the rank talks to itself.
pub(crate) fn ring<T: TestElement>(comm: &Communicator, cx: &Cx, algo: Algorithm, counts: &[usize]) -> Verdict {
    let c = comm.with_algorithm(algo);
    let me = comm.rank();
    let (next, prev) = next_prev(comm);
    let mut chk = Check::new(comm);
    for &count in counts {
        let key = cx.sub(count as u64);
        let mine = cx.input::<T>(key, me, count, Dist::Bits);
        let p = Point::new("send/recv", comm)
            .dtype(T::DTYPE)
            .algo(algo)
            .count(count)
            .note(format!("to={next} from={prev}"));
        placed!(chk, p, cx; [mine] [] => c.send(&mine, next, TAG));
        let mut buf = cx.sentinel::<T>(key, me, count);
        let got = placed!(chk, p, cx; [] [buf] => c.recv(&mut buf, prev, TAG));
        chk.that(got == count, || format!("{p}: recv returned {got} elements, expected {count}"));
        chk.bits(&p, "received", &buf, &cx.input::<T>(key, prev, count, Dist::Bits));
    }
    chk.finish()
}

/// A message shorter than the receive buffer fills its prefix and reports its length; the
/// rest of the buffer is untouched. Zero-length messages too.
fn recv_into_larger_buffer(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let (next, prev) = next_prev(comm);
    let mut chk = Check::new(comm);
    let key = cx.sub(0);
    let p = Point::new("send/recv", comm).dtype(DType::F32).note("5-element message into a 13-element buffer");
    let mine = cx.input::<f32>(key, me, 5, Dist::Bits);
    placed!(chk, p, cx; [mine] [] => comm.send(&mine, next, TAG));
    let empty: Vec<f32> = Vec::new();
    placed!(chk, p, cx; [empty] [] => comm.send(&empty, next, TAG));
    let before = cx.sentinel::<f32>(key, me, 13);
    let mut buf = before.clone();
    let got = placed!(chk, p, cx; [] [buf] => comm.recv(&mut buf, prev, TAG));
    chk.that(got == 5, || format!("{p}: recv returned {got}, expected 5"));
    chk.bits(&p, "received prefix", &buf[..5], &cx.input::<f32>(key, prev, 5, Dist::Bits));
    chk.bits(&p, "rest of the buffer (must be unchanged)", &buf[5..], &before[5..]);
    let p0 = Point::new("send/recv", comm).dtype(DType::F32).note("0-element message into a 4-element buffer");
    let mut small = before[..4].to_vec();
    let got = placed!(chk, p0, cx; [] [small] => comm.recv(&mut small, prev, TAG));
    chk.that(got == 0, || format!("{p0}: recv returned {got}, expected 0"));
    chk.bits(&p0, "buffer (must be unchanged)", &small, &before[..4]);
    chk.finish()
}

/// Messages match by (source, tag) and arrive in order within a tag: A(tag 1), B(tag 2),
/// C(tag 1) are received as B, A, C.
fn tags_and_order(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let (next, prev) = next_prev(comm);
    let mut chk = Check::new(comm);
    let sends = [(1u32, 3usize), (2, 5), (1, 7)];
    let data = |r: usize, k: usize| cx.input::<i64>(cx.sub(k as u64), r, sends[k].1, Dist::Bits);
    for (k, &(tag, count)) in sends.iter().enumerate() {
        let p = Point::new("send", comm).dtype(DType::I64).count(count).note(format!("tag={tag} to={next}"));
        let msg = data(me, k);
        placed!(chk, p, cx; [msg] [] => comm.send(&msg, next, tag));
    }
    for k in [1usize, 0, 2] {
        let (tag, count) = sends[k];
        let p = Point::new("recv", comm).dtype(DType::I64).count(count).note(format!("tag={tag} from={prev}"));
        let mut buf = vec![0i64; 8];
        let got = placed!(chk, p, cx; [] [buf] => comm.recv(&mut buf, prev, tag));
        chk.that(got == count, || format!("{p}: got a {got}-element message, expected the {count}-element one"));
        chk.bits(&p, "message", &buf[..got.min(8)], &data(prev, k)[..count.min(got)]);
    }
    chk.finish()
}

/// probe: nothing on an unused tag; a sent message is reported (source, tag, dtype, count)
/// without being consumed; after recv it is gone. Zero-length messages are reported too.
fn probe(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let (next, prev) = next_prev(comm);
    let mut chk = Check::new(comm);
    let p = Point::new("probe", comm).note(format!("from={prev}"));
    let none = call!(chk, p, comm.probe(prev, 0xDEAD));
    chk.that(none.is_none(), || format!("{p}: probe of a tag nobody uses returned {none:?}"));

    let key = cx.sub(0);
    let mine = cx.input::<f64>(key, me, 11, Dist::Bits);
    placed!(chk, p, cx; [mine] [] => comm.send(&mine, next, 5));
    let empty: Vec<u8> = Vec::new();
    placed!(chk, p, cx; [empty] [] => comm.send(&empty, next, 6));
    let want = MessageInfo { source: prev, tag: 5, dtype: DType::F64, count: 11 };
    let deadline = Instant::now() + cx.opts.timeout;
    let info = loop {
        match call!(chk, p, comm.probe(prev, 5)) {
            Some(i) => break Some(i),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    chk.that(info == Some(want), || format!("{p}: probe reported {info:?}, expected {want:?}"));
    let again = call!(chk, p, comm.probe(prev, 5));
    chk.that(again == Some(want), || format!("{p}: a second probe reported {again:?} (probe must not consume)"));
    let empty = loop {
        match call!(chk, p, comm.probe(prev, 6)) {
            Some(i) => break Some(i),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    let want_empty = MessageInfo { source: prev, tag: 6, dtype: DType::U8, count: 0 };
    chk.that(empty == Some(want_empty), || format!("{p}: probe of a 0-element message reported {empty:?}"));

    let mut buf = vec![0f64; 11];
    let got = placed!(chk, p, cx; [] [buf] => comm.recv(&mut buf, prev, 5));
    chk.that(got == 11, || format!("{p}: recv after probe returned {got}, expected 11"));
    chk.bits(&p, "received", &buf, &cx.input::<f64>(key, prev, 11, Dist::Bits));
    let mut nothing = [0u8; 0];
    let got = placed!(chk, p, cx; [] [nothing] => comm.recv(&mut nothing, prev, 6));
    chk.that(got == 0, || format!("{p}: recv of the 0-element message returned {got}"));
    let after = call!(chk, p, comm.probe(prev, 5));
    chk.that(after.is_none(), || format!("{p}: probe after the recv still reports {after:?}"));
    chk.finish()
}

/// Elements sent from rank i to rank j in [`batch_all_pairs`] (zeros included).
fn pair_count(n: usize, i: usize, j: usize) -> usize {
    ((i + 1) * (j + 2) + n) % 6
}

/// One batch per rank that receives from and sends to every rank (itself included), with all
/// receives listed before the sends: with blocking sends this order deadlocks. Receive
/// buffers are two elements longer than the messages, so the reported counts matter.
fn batch_all_pairs<T: TestElement>(comm: &Communicator, cx: &Cx, in_scope: bool) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let data = |i: usize, j: usize| cx.input::<T>(cx.sub((i * n + j) as u64), i, pair_count(n, i, j), Dist::Bits);
    let sends: Vec<Vec<T>> = (0..n).map(|j| data(me, j)).collect();
    let before: Vec<Vec<T>> =
        (0..n).map(|j| cx.sentinel::<T>(cx.sub((j * n + me) as u64), me, pair_count(n, j, me) + 2)).collect();
    let mut bufs = before.clone();
    let p = Point::new(if in_scope { "run_batch (async)" } else { "run_batch" }, comm)
        .dtype(T::DTYPE)
        .note("recvs from every rank (descending) listed before sends to every rank");
    // One placed buffer per peer (the macro shadows single bindings, not a Vec's elements).
    let mut placed_bufs: Vec<Placed<T>> = Vec::with_capacity(n);
    for buf in bufs.iter_mut() {
        placed_bufs.push(call!(chk, p, cx.place_mut(buf)));
    }
    let mut placed_sends: Vec<PlacedIn<T>> = Vec::with_capacity(n);
    for s in &sends {
        placed_sends.push(call!(chk, p, cx.place(s)));
    }
    let mut b = comm.batch();
    for (j, buf) in placed_bufs.iter_mut().enumerate().rev() {
        call!(chk, p, b.recv(buf, j, TAG));
    }
    for (j, s) in placed_sends.iter().enumerate() {
        call!(chk, p, b.send(s, j, TAG));
    }
    chk.that(b.len() == 2 * n, || format!("{p}: batch has {} operations, expected {}", b.len(), 2 * n));
    let got =
        if in_scope { call!(chk, p, comm.scope(|s| s.run_batch(b)?.wait())) } else { call!(chk, p, comm.run_batch(b)) };
    drop(placed_sends);
    for buf in placed_bufs {
        call!(chk, p, buf.back());
    }
    let want: Vec<usize> = (0..n).rev().map(|j| pair_count(n, j, me)).collect();
    chk.that(got == want, || format!("{p}: receive counts {got:?}, expected {want:?}"));
    for j in 0..n {
        let c = pair_count(n, j, me);
        let pj = p.clone().count(c).note(format!("message from rank {j}"));
        chk.bits(&pj, "received", &bufs[j][..c], &data(j, me));
        chk.bits(&pj, "buffer beyond the message (must be unchanged)", &bufs[j][c..], &before[j][c..]);
    }
    chk.finish()
}

/// One batch per rank sending two messages (tags 1 and 2) to the next rank and receiving
/// them from the previous one in the opposite tag order.
fn batch_two_tags_reversed(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let (next, prev) = next_prev(comm);
    let mut chk = Check::new(comm);
    let msg = |r: usize, tag: u32| cx.input::<u32>(cx.sub(u64::from(tag)), r, 3 + tag as usize, Dist::Bits);
    let (s1, s2) = (msg(me, 1), msg(me, 2));
    let (mut r1, mut r2) = (vec![0u32; 4], vec![0u32; 5]);
    let p = Point::new("run_batch", comm).dtype(DType::U32).note(format!("two tags to={next} from={prev}"));
    let got = placed!(chk, p, cx; [s1, s2] [r1, r2] => {
        let mut b = comm.batch();
        call!(chk, p, b.send(&s1, next, 1));
        call!(chk, p, b.recv(&mut r2, prev, 2));
        call!(chk, p, b.send(&s2, next, 2));
        call!(chk, p, b.recv(&mut r1, prev, 1));
        comm.run_batch(b)
    });
    chk.that(got == vec![5, 4], || format!("{p}: receive counts {got:?}, expected [5, 4]"));
    chk.bits(&p, "tag 1 message", &r1, &msg(prev, 1));
    chk.bits(&p, "tag 2 message", &r2, &msg(prev, 2));
    chk.finish()
}

/// Async send then recv in a scope (in stream order: the send is issued first, so the ring
/// cannot deadlock), with the buffer handed back by `wait`.
fn async_send_recv(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let (next, prev) = next_prev(comm);
    let mut chk = Check::new(comm);
    let key = cx.sub(0);
    let mine = cx.input::<f16>(key, me, 131, Dist::Bits);
    let mut buf = cx.sentinel::<f16>(key, me, 131);
    let p = Point::new("scope send/recv", comm).dtype(DType::F16).count(131);
    // The result is read from the buffer `wait` hands back (the device copy when placed).
    let (got, count) = placed!(chk, p, cx; [mine] [buf] => comm.scope(|s| {
        let ws = s.send(&mine, next, TAG)?;
        let wr = s.recv(&mut buf, prev, TAG)?;
        ws.wait()?;
        let (b, c) = wr.wait()?;
        Ok((b.to_vec()?, c))
    }));
    chk.that(count == 131, || format!("{p}: recv reported {count} elements"));
    chk.bits(&p, "received", &got, &cx.input::<f16>(key, prev, 131, Dist::Bits));
    chk.finish()
}

/// Receives from any source: every rank sends the last rank one message on another tag, then
/// two (of different lengths) on `ANY_TAG`; the last rank takes 2n messages with
/// `recv_any` and checks that each rank's two came once each, in their order, whole, and
/// from whom `recv_any` says; then receives the other tag's messages by name (`recv_any` did
/// not take them). `nccl` and `rccl` refuse it with an argument error.
fn recv_any(comm: &Communicator, cx: &Cx, in_scope: bool) -> Verdict {
    const ANY_TAG: u32 = 8;
    const OTHER_TAG: u32 = 9;
    let (n, me) = (comm.world_size(), comm.rank());
    let root = n - 1;
    let mut chk = Check::new(comm);
    let msg = |r: usize, k: usize| cx.input::<i32>(cx.sub(k as u64), r, r % 4 + k + 1, Dist::Bits);
    let p = Point::new(if in_scope { "recv_any (async)" } else { "recv_any" }, comm)
        .dtype(DType::I32)
        .note(format!("every rank sends 2 messages to rank {root}"));
    let mut buf = vec![0i32; 8];
    if matches!(comm.backend(), "nccl" | "rccl") {
        let r = comm.recv_any(&mut buf, ANY_TAG);
        chk.that(matches!(r, Err(oxccl::Error::InvalidArgument(_))), || {
            format!("{p}: {} should refuse a receive from any source, got {r:?}", comm.backend())
        });
        return chk.finish();
    }
    for k in 0..3 {
        let tag = if k == 0 { OTHER_TAG } else { ANY_TAG };
        call!(chk, p, comm.send(&msg(me, k), root, tag));
    }
    if me == root {
        let mut seen = vec![0usize; n];
        for _ in 0..2 * n {
            buf.fill(-1);
            let info = if in_scope {
                call!(chk, p, comm.scope(|s| s.recv_any(&mut buf, ANY_TAG)?.wait().map(|(_, info)| info)))
            } else {
                call!(chk, p, comm.recv_any(&mut buf, ANY_TAG))
            };
            let r = info.source;
            if r >= n || seen[r] >= 2 {
                chk.fail(format!("{p}: a message from rank {r} (already {} from it)", seen.get(r).unwrap_or(&0)));
                continue;
            }
            seen[r] += 1;
            let want = msg(r, seen[r]);
            chk.that(info.tag == ANY_TAG && info.dtype == DType::I32 && info.count == want.len(), || {
                format!("{p}: message {} from rank {r} reported as {info:?}, {} elements sent", seen[r], want.len())
            });
            let pr = p.clone().count(want.len()).note(format!("message {} from rank {r}", seen[r]));
            chk.bits(&pr, "received", &buf[..want.len().min(8)], &want);
        }
        chk.that(seen.iter().all(|&c| c == 2), || format!("{p}: messages per rank {seen:?}, expected 2 each"));
        for r in 0..n {
            let got = call!(chk, p, comm.recv(&mut buf, r, OTHER_TAG));
            let pr = p.clone().note(format!("tag {OTHER_TAG} from rank {r}, after the receives from any source"));
            chk.bits(&pr, "received", &buf[..got.min(8)], &msg(r, 0));
        }
    }
    chk.finish()
}

use half::f16;
