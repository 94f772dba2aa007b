//! The grow protocol's records and keys, without I/O (the store calls are in `mod.rs`).
//!
//! A lineage is the world communicator made through a store and the communicators shrunk or
//! grown from it; its keys live under the world's store prefix `P`:
//! - `P/join/tickets`: a counter; a newcomer takes ticket `t` by adding 1 (`t` = the result
//!   minus 1), so newcomers are ordered by their arrival at the store.
//! - `P/join/admit/t`: the admission of ticket `t`, written by the members when they grow
//!   (by every member, the same bytes: a member that dies while writing leaves it to the
//!   others). The newcomer waits for it.
//! - `P/grow/g`: the store prefix of grown world `g`, where members and newcomers meet as
//!   any world does.
//!
//! Members hold the same lineage state (how many grows it has seen, how many tickets it has
//! admitted) because every grow is collective over them and its count is agreed first; a
//! newcomer learns that state from its admission. Members never poll the store for
//! newcomers: rank 0 of a communicator reads the ticket counter once per `agree`, whose
//! result then says whether newcomers wait (the same on every survivor).

use crate::error::{Error, Result};

/// The key of the ticket counter.
pub(crate) fn tickets_key(prefix: &str) -> String {
    format!("{prefix}/join/tickets")
}

/// The key of ticket `t`'s admission.
pub(crate) fn admit_key(prefix: &str, ticket: u64) -> String {
    format!("{prefix}/join/admit/{ticket}")
}

/// The store prefix of grown world `grow`.
pub(crate) fn world_prefix(prefix: &str, grow: u64) -> String {
    format!("{prefix}/grow/{grow}")
}

/// Where one newcomer goes: the same record on every member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admission {
    /// The grow's number in the lineage (1 for the first): names the new world's keys.
    pub(crate) grow: u64,
    /// The newcomer's rank in the new communicator.
    pub(crate) rank: usize,
    /// The new communicator's size.
    pub(crate) size: usize,
    /// Tickets admitted by the lineage once this grow is done.
    pub(crate) admitted: u64,
}

/// The record's magic and version, first on the wire.
const MAGIC: &[u8; 4] = b"OXG1";
const LEN: usize = 4 + 4 * 8;

impl Admission {
    /// The record as bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.extend_from_slice(MAGIC);
        for x in [self.grow, self.rank as u64, self.size as u64, self.admitted] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    /// A record read from the store.
    ///
    /// # Errors
    /// [`Error::Store`] for a record of the wrong length or magic, or one that contradicts
    /// itself (a rank outside its size, a grow 0).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Admission> {
        let bad = |why: &str| Error::Store(format!("a malformed grow admission in the store ({why})"));
        if bytes.len() != LEN || &bytes[..4] != MAGIC {
            return Err(bad("wrong length or magic: another program's key, or another oxccl version"));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[4 + 8 * i..12 + 8 * i]);
            u64::from_le_bytes(b)
        };
        let (grow, rank, size, admitted) = (word(0), word(1), word(2), word(3));
        let rank = usize::try_from(rank).map_err(|_| bad("rank out of range"))?;
        let size = usize::try_from(size).map_err(|_| bad("size out of range"))?;
        if grow == 0 || rank >= size || rank == 0 || admitted == 0 {
            return Err(bad("its fields contradict each other"));
        }
        Ok(Admission { grow, rank, size, admitted })
    }
}

/// The admissions of one grow: a communicator of `members` ranks at lineage state
/// (`grows`, `admitted`) admits `joiners` newcomers, tickets `admitted..admitted + joiners`,
/// as ranks `members..members + joiners` in ticket order.
///
/// # Errors
/// [`Error::InvalidArgument`] for no newcomers, or sizes past the counters' range.
pub(crate) fn plan(members: usize, joiners: usize, grows: u64, admitted: u64) -> Result<Vec<(u64, Admission)>> {
    if joiners == 0 {
        return Err(Error::invalid("grow: admit at least one newcomer (joiners is 0)"));
    }
    let size = members
        .checked_add(joiners)
        .filter(|&s| u32::try_from(s).is_ok())
        .ok_or_else(|| Error::invalid(format!("grow: {members} members and {joiners} newcomers is too many ranks")))?;
    let after = admitted + joiners as u64;
    Ok((0..joiners)
        .map(|i| {
            let ticket = admitted + i as u64;
            (ticket, Admission { grow: grows + 1, rank: members + i, size, admitted: after })
        })
        .collect())
}

/// Whether newcomers wait: tickets taken (the counter's value) past those admitted.
pub(crate) fn waiting(taken: i64, admitted: u64) -> u64 {
    u64::try_from(taken).unwrap_or(0).saturating_sub(admitted)
}
