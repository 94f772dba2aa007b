//! How many times the calling thread called each function of the double that makes
//! communicators ([`Calls`]), so a test can tell which way the engine made one.

/// How many times the calling thread called each function of the double that makes
/// communicators (every call, failed ones included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    /// `ncclCommInitRankConfig`.
    pub(crate) init: u32,
    /// `ncclCommSplit`.
    pub(crate) split: u32,
    /// `ncclCommShrink`.
    pub(crate) shrink: u32,
    /// `ncclCommGetUniqueId`.
    pub(crate) get_unique_id: u32,
    /// `ncclCommGrow`.
    pub(crate) grow: u32,
}

thread_local! {
    /// This thread's [`Calls`].
    static CALLS: std::cell::Cell<Calls> = const { std::cell::Cell::new(Calls { init: 0, split: 0, shrink: 0, get_unique_id: 0, grow: 0 }) };
}

/// The calling thread's [`Calls`] so far (a test takes the difference around what it runs).
#[cfg_attr(not(test), allow(dead_code))] // the tests read it
pub(crate) fn calls() -> Calls {
    CALLS.with(std::cell::Cell::get)
}

/// Counts a call of the calling thread.
pub(super) fn counted(count: impl FnOnce(&mut Calls)) {
    CALLS.with(|c| {
        let mut calls = c.get();
        count(&mut calls);
        c.set(calls);
    });
}
