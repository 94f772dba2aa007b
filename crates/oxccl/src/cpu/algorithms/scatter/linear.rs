//! Linear scatter: the root sends block i straight to rank i.

use crate::cpu::algorithms::Ctx;
use crate::error::{Error, Result};

/// Scatters `send` (n blocks of `recv.len()` bytes, at `root` only) into every rank's `recv`.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`] when the root has no input buffer.
pub fn run(ctx: &Ctx, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let b = recv.len();
    if ctx.rank() != root {
        return ctx.recv(root, recv);
    }
    let send = send.ok_or_else(|| Error::invalid("scatter: the root needs an input buffer"))?;
    for p in 0..ctx.size() {
        let src = &send[p * b..(p + 1) * b];
        if p == root {
            recv.copy_from_slice(src);
        } else {
            ctx.send(p, src)?;
        }
    }
    Ok(())
}
