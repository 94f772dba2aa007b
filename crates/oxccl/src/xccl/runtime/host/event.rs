//! Events. Each record makes a fresh [`Point`], the place in its stream that the record
//! marks; the event remembers its latest point. A wait on the event (a stream's or the
//! host's) holds on to the point current when it was asked for, so recording the event again
//! later does not move a wait already queued, as in CUDA.

use std::sync::{Arc, Mutex};

use super::wake::Wake;
use crate::error::{Error, Result};
use crate::sync::relock;

/// What became of a point.
#[derive(Debug, Clone)]
enum Mark {
    /// Its stream has not reached it yet.
    Pending,
    /// Its stream reached it.
    Fired,
    /// Its stream broke before reaching it; the stream's error.
    Failed(Error),
}

/// One record of an event: a place in a stream's queue.
#[derive(Debug)]
pub(super) struct Point {
    /// Its state.
    mark: Mutex<Mark>,
}

impl Point {
    /// A point its stream has yet to reach.
    pub(super) fn pending() -> Arc<Point> {
        Arc::new(Point { mark: Mutex::new(Mark::Pending) })
    }

    /// Marks the point reached (a failed point stays failed) and wakes its waiters.
    pub(super) fn fire(&self, wake: &Wake) {
        {
            let mut mark = relock(&self.mark);
            if matches!(*mark, Mark::Pending) {
                *mark = Mark::Fired;
            }
        }
        wake.notify();
    }

    /// Marks the point failed with its stream's error (a fired point stays fired) and wakes
    /// its waiters.
    pub(super) fn fail(&self, error: Error, wake: &Wake) {
        {
            let mut mark = relock(&self.mark);
            if matches!(*mark, Mark::Pending) {
                *mark = Mark::Failed(error);
            }
        }
        wake.notify();
    }

    /// `None` while pending, `Ok` once fired, the stream's error once failed.
    pub(super) fn outcome(&self) -> Option<Result<()>> {
        match &*relock(&self.mark) {
            Mark::Pending => None,
            Mark::Fired => Some(Ok(())),
            Mark::Failed(e) => Some(Err(e.clone())),
        }
    }
}

/// An event: its device and its latest record.
#[derive(Debug)]
pub(super) struct Event {
    /// The device it was created on.
    pub(super) device: u32,
    /// The latest record; `None` for an event never recorded (which counts as fired).
    last: Mutex<Option<Arc<Point>>>,
}

impl Event {
    /// A fresh event of `device`, never recorded.
    pub(super) fn new(device: u32) -> Event {
        Event { device, last: Mutex::new(None) }
    }

    /// Makes `point` the event's latest record.
    pub(super) fn record(&self, point: Arc<Point>) {
        *relock(&self.last) = Some(point);
    }

    /// The latest record, if any.
    pub(super) fn last(&self) -> Option<Arc<Point>> {
        relock(&self.last).clone()
    }
}
