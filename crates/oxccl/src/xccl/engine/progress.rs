//! Delivery of buffered sends while the sending rank's thread is busy elsewhere.
//!
//! A send is buffered (`p2p.rs`): it completes once its payload is copied, and its NCCL call
//! joins this rank's next group, issued when the rank next calls the communicator. A rank
//! that sends and then waits on something else (another communicator, a host barrier, its
//! own join) would keep the message back, and a receiver waiting for it would time out.
//! So a receiver that finds nothing announced-and-issued to wait for *pulls* the sender (a
//! host message, at most one per sender group, carrying how many of the sender's flush marks
//! it has read, so that a pull that crossed a mark is not taken for a request for the next
//! group: `host_side.rs`), and while buffered sends are queued, one
//! thread per engine looks for pulls every [`POLL`] and issues the buffered sends at the
//! head of the queue when one came and this rank's thread has not called the communicator
//! for [`GRACE`].
//!
//! Issuing on a pull cannot deadlock the streams: the receiver's receive is already on its
//! way (it pulled because it waits for this very group), and the receiver takes the whole
//! group in one group of its own (`take_rest_of_group`). The thread runs only while
//! buffered sends wait, and ends when the queue has none or the engine is gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::state::Inner;
use crate::sync::relock;

/// How often the thread looks for pulls.
const POLL: Duration = Duration::from_millis(1);
/// How long this rank's thread must have stayed away from the communicator before a pull
/// is answered. A thread that sends and then receives at once issues its sends with its
/// receives, in one group: answered in between, the sends would go out in a group of their
/// own, ahead of that receive on this rank's stream, and in a ring where every rank does
/// the same, each send group would wait for a receive queued behind its peer's.
const GRACE: Duration = Duration::from_millis(20);

impl Inner {
    /// Makes sure the progress thread runs (buffered sends were just queued). Called with
    /// the order lock held, which is what the thread holds when it decides to end.
    pub(crate) fn wake_progress(self: &Arc<Self>) {
        let mut running = relock(&self.progress);
        if *running {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name(format!("oxccl-{}-progress-{}", self.name, self.rank))
            .spawn(move || run(&weak));
        match spawned {
            Ok(_) => *running = true,
            // The sends still go out at this rank's next call on the communicator.
            Err(e) => tracing::warn!("rank {}: cannot start the point-to-point progress thread: {e}", self.rank),
        }
    }
}

/// The thread (see the module documentation). Pulls are taken and answered under the order
/// lock, so a flush by this rank's own thread in between cannot leave an answered pull
/// looking fresh.
fn run(weak: &Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        {
            let mut order = relock(&inner.order);
            let peers = inner.buffered_peers(&order);
            if peers.is_empty() || inner.poisoned().is_err() {
                *relock(&inner.progress) = false;
                return;
            }
            let mut pulled = false;
            for p in peers {
                match inner.host.take_pulls(p, inner.timeout) {
                    Ok(asked) => pulled |= asked,
                    Err(e) => {
                        tracing::debug!("rank {}: looking for pulls from rank {p}: {e}", inner.rank);
                    }
                }
            }
            if pulled && order.touched.elapsed() >= GRACE {
                if let Err(e) = inner.flush_buffered(&mut order) {
                    tracing::debug!("rank {}: issuing buffered sends on a pull: {e}", inner.rank);
                }
            }
        }
        drop(inner);
        std::thread::sleep(POLL);
    }
}
