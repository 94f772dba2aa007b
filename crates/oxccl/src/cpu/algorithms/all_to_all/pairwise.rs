//! Pairwise all-to-all: in step s (1..n) rank r sends its block for r+s and receives the
//! block from r−s, so every pair exchanges exactly once and no rank is a hot spot. Block
//! sizes may differ per pair (all_to_all_v).

use std::ops::Range;

use crate::cpu::algorithms::Ctx;
use crate::error::{Error, Result};

/// Exchanges blocks: `send[send_blocks[j]]` goes to rank j, `recv[recv_blocks[j]]` comes
/// from rank j (byte ranges).
///
/// # Errors
/// Communication errors; [`Error::Mismatch`] when a peer sends a block of another size.
pub fn run(
    ctx: &Ctx,
    send: &[u8],
    send_blocks: &[Range<usize>],
    recv: &mut [u8],
    recv_blocks: &[Range<usize>],
) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank();
    let own_in = &send[send_blocks[r].clone()];
    let own_out = &mut recv[recv_blocks[r].clone()];
    if own_in.len() != own_out.len() {
        return Err(Error::invalid(format!(
            "rank {r} sends {} bytes to itself but expects {}",
            own_in.len(),
            own_out.len()
        )));
    }
    own_out.copy_from_slice(own_in);
    for s in 1..n {
        let to = (r + s) % n;
        let from = (r + n - s) % n;
        ctx.send_recv(to, &send[send_blocks[to].clone()], from, &mut recv[recv_blocks[from].clone()])?;
    }
    Ok(())
}
