//! The agreement's messages as bytes: which agreement (its number on the communicator), then
//! the message. Little-endian; every field is checked when read, so a malformed frame is an
//! error naming what is wrong, never a panic.
//!
//! ```text
//! number u64 | kind u8 | body
//! Report:   and u64 | or u64 | dead | acked? u8 (0 or 1) | [round u32 | decision]
//! Request:  (empty)      Ack: (empty)
//! Propose, Commit, Decided: decision
//! decision: and u64 | or u64 | dead
//! dead:     count u32 | rank u32 × count (each below the world size, increasing)
//! ```

use super::protocol::{Contribution, Decision, Msg};

const REPORT: u8 = 1;
const REQUEST: u8 = 2;
const PROPOSE: u8 = 3;
const ACK: u8 = 4;
const COMMIT: u8 = 5;
const DECIDED: u8 = 6;

/// Message `msg` of agreement `number`, as bytes.
pub(crate) fn encode(number: u64, msg: &Msg) -> Vec<u8> {
    let mut b = number.to_le_bytes().to_vec();
    match msg {
        Msg::Report { contribution, dead, acked } => {
            b.push(REPORT);
            b.extend_from_slice(&contribution.and.to_le_bytes());
            b.extend_from_slice(&contribution.or.to_le_bytes());
            put_ranks(&mut b, dead);
            match acked {
                None => b.push(0),
                Some((round, d)) => {
                    b.push(1);
                    b.extend_from_slice(&(*round as u32).to_le_bytes());
                    put_decision(&mut b, d);
                }
            }
        }
        Msg::Request => b.push(REQUEST),
        Msg::Ack => b.push(ACK),
        Msg::Propose(d) => {
            b.push(PROPOSE);
            put_decision(&mut b, d);
        }
        Msg::Commit(d) => {
            b.push(COMMIT);
            put_decision(&mut b, d);
        }
        Msg::Decided(d) => {
            b.push(DECIDED);
            put_decision(&mut b, d);
        }
    }
    b
}

fn put_ranks(b: &mut Vec<u8>, ranks: &[usize]) {
    b.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
    for &r in ranks {
        b.extend_from_slice(&(r as u32).to_le_bytes());
    }
}

fn put_decision(b: &mut Vec<u8>, d: &Decision) {
    b.extend_from_slice(&d.and.to_le_bytes());
    b.extend_from_slice(&d.or.to_le_bytes());
    put_ranks(b, &d.dead);
}

/// The agreement number and message in `bytes`, from a world of `n` ranks.
///
/// # Errors
/// What is malformed: a short or long frame, an unknown kind, a rank out of range, dead
/// ranks out of order, a round out of range.
pub(crate) fn decode(bytes: &[u8], n: usize) -> Result<(u64, Msg), String> {
    let mut r = Reader { bytes, at: 0, n };
    let number = r.u64()?;
    let msg = match r.u8()? {
        REPORT => {
            let contribution = Contribution { and: r.u64()?, or: r.u64()? };
            let dead = r.ranks()?;
            let acked = match r.u8()? {
                0 => None,
                1 => {
                    let round = r.rank()?;
                    Some((round, r.decision()?))
                }
                x => return Err(format!("a report's acknowledged-proposal flag is {x}, not 0 or 1")),
            };
            Msg::Report { contribution, dead, acked }
        }
        REQUEST => Msg::Request,
        ACK => Msg::Ack,
        PROPOSE => Msg::Propose(r.decision()?),
        COMMIT => Msg::Commit(r.decision()?),
        DECIDED => Msg::Decided(r.decision()?),
        k => return Err(format!("unknown agreement message kind {k}")),
    };
    if r.at != bytes.len() {
        return Err(format!("{} bytes after the message's end", bytes.len() - r.at));
    }
    Ok((number, msg))
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    n: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.at + N;
        let s = self.bytes.get(self.at..end).ok_or_else(|| format!("the frame ends at byte {}", self.bytes.len()))?;
        self.at = end;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn rank(&mut self) -> Result<usize, String> {
        let r = u32::from_le_bytes(self.take()?) as usize;
        if r >= self.n {
            return Err(format!("rank {r} in a world of {}", self.n));
        }
        Ok(r)
    }

    fn ranks(&mut self) -> Result<Vec<usize>, String> {
        let count = u32::from_le_bytes(self.take()?) as usize;
        if count > self.n {
            return Err(format!("{count} dead ranks in a world of {}", self.n));
        }
        let ranks = (0..count).map(|_| self.rank()).collect::<Result<Vec<usize>, String>>()?;
        if ranks.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("dead ranks out of order: {ranks:?}"));
        }
        Ok(ranks)
    }

    fn decision(&mut self) -> Result<Decision, String> {
        Ok(Decision { and: self.u64()?, or: self.u64()?, dead: self.ranks()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(dead: Vec<usize>) -> Decision {
        Decision { and: 0xfeed_beef, or: 1 << 63, dead }
    }

    #[test]
    fn every_message_reads_back_as_written() {
        let msgs = [
            Msg::Report { contribution: Contribution { and: u64::MAX, or: 0 }, dead: vec![], acked: None },
            Msg::Report {
                contribution: Contribution { and: 3, or: 5 },
                dead: vec![0, 4],
                acked: Some((2, d(vec![0]))),
            },
            Msg::Request,
            Msg::Ack,
            Msg::Propose(d(vec![1, 2, 3])),
            Msg::Commit(d(vec![])),
            Msg::Decided(d(vec![6])),
        ];
        for (i, m) in msgs.iter().enumerate() {
            let bytes = encode(40 + i as u64, m);
            assert_eq!(decode(&bytes, 7), Ok((40 + i as u64, m.clone())));
        }
    }

    #[test]
    fn malformed_frames_are_errors_naming_the_fault() {
        let good = encode(1, &Msg::Propose(d(vec![1, 2])));
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() - 1].to_vec(), "the frame ends"),
            ([good.clone(), vec![0]].concat(), "after the message's end"),
            (
                {
                    let mut b = good.clone();
                    b[8] = 99;
                    b
                },
                "unknown agreement message kind 99",
            ),
            (encode(1, &Msg::Propose(d(vec![1, 9]))), "rank 9 in a world of 3"),
            (encode(1, &Msg::Propose(d(vec![2, 1]))), "out of order"),
            (encode(1, &Msg::Propose(d(vec![1, 1]))), "out of order"),
            (vec![], "the frame ends"),
            (
                {
                    let mut b = encode(
                        1,
                        &Msg::Report { contribution: Contribution { and: 0, or: 0 }, dead: vec![], acked: None },
                    );
                    *b.last_mut().expect("flag") = 7;
                    b
                },
                "flag is 7",
            ),
            (
                {
                    let mut b = encode(1, &Msg::Commit(d(vec![])));
                    b[25..29].copy_from_slice(&u32::MAX.to_le_bytes());
                    b
                },
                "dead ranks in a world of 3",
            ),
        ];
        for (bytes, want) in cases {
            let e = decode(&bytes, 3).expect_err(want);
            assert!(e.contains(want), "{e:?} does not say {want:?}");
        }
    }
}
