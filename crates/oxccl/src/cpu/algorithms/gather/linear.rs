//! Linear gather: every rank sends its block straight to the root, which receives them in
//! rank order. The root's link carries everything once, which is optimal for bandwidth.

use crate::cpu::algorithms::Ctx;
use crate::error::{Error, Result};

/// Gathers `send` (this rank's block) into `recv` at `root` (n blocks of `send.len()` bytes;
/// `None` on the other ranks).
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`] when the root has no output buffer.
pub fn run(ctx: &Ctx, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let b = send.len();
    if ctx.rank() != root {
        return ctx.send(root, send);
    }
    let recv = recv.ok_or_else(|| Error::invalid("gather: the root needs an output buffer"))?;
    for p in 0..ctx.size() {
        let dst = &mut recv[p * b..(p + 1) * b];
        if p == root {
            dst.copy_from_slice(send);
        } else {
            ctx.recv(p, dst)?;
        }
    }
    Ok(())
}
