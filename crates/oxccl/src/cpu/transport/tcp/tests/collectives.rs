//! Collectives over worlds of TCP links on loopback match sequential references.

use super::*;

#[test]
fn collectives_over_tcp_match_sequential_references() {
    collectives_match_references(&opts(), 2..=5);
}

/// The same with receivers that read their sockets themselves (payloads land in place),
/// briefly (most waits end in the progress thread) and for long (most end in the caller),
/// spinning or yielding.
#[test]
fn collectives_match_references_with_polling_receivers() {
    collectives_match_references(&polling(Duration::from_micros(50)), 2..=3);
    collectives_match_references(&polling(Duration::from_secs(1)), 2..=4);
    // As on a host whose ranks outnumber its CPUs: no spin, reads between yields.
    collectives_match_references(&TcpOptions { yield_for: Duration::from_secs(1), ..opts() }, 2..=4);
}
