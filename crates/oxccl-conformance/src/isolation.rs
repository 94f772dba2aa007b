//! Each case's own communicator: a fresh one split off the suite's (see the crate docs,
//! "Isolation").

use oxccl::Communicator;

/// A communicator with the same ranks as `parent`, fresh (its own sequence numbers and
/// failure state).
pub(crate) fn fresh_communicator(parent: &Communicator) -> Result<Communicator, String> {
    let (n, me) = (parent.world_size(), parent.rank());
    match parent.split(Some(0), me as i64) {
        Ok(Some(c)) if c.world_size() == n && c.rank() == me => Ok(c),
        Ok(Some(c)) => Err(format!(
            "split(Some(0), rank) of the suite's communicator gave rank {} of {}, expected rank {me} of {n}; \
             the remaining cases are not run",
            c.rank(),
            c.world_size()
        )),
        Ok(None) => Err("split(Some(0), rank) of the suite's communicator returned None; \
                         the remaining cases are not run"
            .into()),
        Err(e) => Err(format!(
            "split(Some(0), rank) of the suite's communicator failed: {e}; the remaining cases are not run"
        )),
    }
}
