//! The completion slot of one operation: where an engine puts the result and where the
//! caller's [`Work`](crate::Work) finds it. Every engine uses it (the `cpu` engine waits on
//! its condition variable; the `mpi` engine polls MPI and peeks).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Completion, Pending};
use crate::error::Result;
use crate::sync::relock;

/// The result of one operation, once it is known. The first result stays: a later
/// [`CompletionSlot::complete`] is ignored, so a late failure cannot overwrite a success a caller saw.
#[derive(Default)]
pub struct CompletionSlot {
    result: Mutex<Option<Result<Completion>>>,
    cv: Condvar,
}

impl CompletionSlot {
    /// A slot that is already complete with `r`.
    pub fn done(r: Result<Completion>) -> Arc<CompletionSlot> {
        Arc::new(CompletionSlot { result: Mutex::new(Some(r)), cv: Condvar::new() })
    }

    /// Records `r` (unless a result is already there) and wakes every waiter.
    pub fn complete(&self, r: Result<Completion>) {
        let mut g = relock(&self.result);
        if g.is_none() {
            *g = Some(r);
        }
        drop(g);
        self.cv.notify_all();
    }

    /// The result, if the operation has finished.
    pub fn peek(&self) -> Option<Result<Completion>> {
        relock(&self.result).clone()
    }
}

impl Pending for CompletionSlot {
    fn wait(&self, timeout: Option<Duration>) -> Option<Result<Completion>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = relock(&self.result);
        loop {
            if let Some(r) = g.as_ref() {
                return Some(r.clone());
            }
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    g = self.cv.wait_timeout(g, d - now).unwrap_or_else(|p| p.into_inner()).0;
                }
            }
        }
    }

    fn is_completed(&self) -> bool {
        relock(&self.result).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn the_first_result_stays_and_wakes_a_waiter() {
        let slot = Arc::new(CompletionSlot::default());
        assert!(!slot.is_completed());
        assert!(slot.wait(Some(Duration::from_millis(1))).is_none());
        let s2 = Arc::clone(&slot);
        let t = std::thread::spawn(move || s2.wait(None));
        slot.complete(Ok(Completion { received: vec![3], sources: vec![1] }));
        slot.complete(Err(Error::Aborted { reason: "late".into() }));
        assert_eq!(t.join().unwrap().unwrap().unwrap().received, vec![3]);
        assert!(slot.peek().unwrap().is_ok());
        assert!(CompletionSlot::done(Ok(Completion::default())).is_completed());
    }
}
