//! Point-to-point operations involve only some ranks, so they must not consume the
//! collective sequence number: a collective after a send/recv between two of three ranks
//! must still match on every rank.

use oxccl::{local, ReduceOp};

#[test]
fn a_collective_after_p2p_between_some_ranks_still_matches() {
    let out = local::run(3, |comm| -> oxccl::Result<i32> {
        if comm.rank() == 0 {
            comm.send(&[1u8; 4], 1, 0)?;
        }
        if comm.rank() == 1 {
            comm.recv(&mut [0u8; 4], 0, 0)?;
        }
        let mut x = [comm.rank() as i32 + 1];
        comm.all_reduce(&mut x, ReduceOp::Sum)?;
        // And splits (whose ids derive from the sequence number) still meet.
        let sub = comm.split(Some(0), comm.rank() as i64)?.ok_or_else(|| oxccl::Error::invalid("no group"))?;
        sub.barrier()?;
        Ok(x[0])
    })
    .unwrap();
    for r in out {
        assert_eq!(r.unwrap(), 6);
    }
}
