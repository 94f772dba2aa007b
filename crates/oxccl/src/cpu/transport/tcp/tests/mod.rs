//! Tests of the TCP transport: worlds of threads over loopback, hostile and broken peers,
//! the reader on arbitrary bytes, interface choice and options. The shared fixtures are here
//! (a rendezvous in memory, worlds of links and communicators); the tests are by subject.

mod collectives;
mod failures;
mod on_demand;
mod options;
mod reading;
mod striping;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::connection::{set_liveness, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES, USER_TIMEOUT_MS};
use super::handshake::{address_key, dial, lookup, DialError, Ident, Verdict, REPLY_LEN};
use super::incoming::{pump_to_end, Direct, End, Incoming, Pumped, Source, Wait};
use super::interface::{pick, pick_preferring, Iface};
use super::options::{LANES_ENV, MAX_LANES};
use super::stripes::PREALLOC;
use super::stripes::{Stripes, STRIPE_FROM};
use super::{remaining, select_address, TcpLinks, TcpOptions, AUTH_CONTEXT, IFNAME_ENV, MAX_FRAME_ENV};
use crate::bootstrap::auth::{self, Secret, SECRET_ENV};
use crate::bootstrap::Rendezvous;
use crate::communicator::Communicator;
use crate::config::parse::format_size;
use crate::config::registry::{self, Kind};
use crate::config::Config;
use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
use crate::cpu::transport::frame::{self, FrameKind, HEADER_LEN, MAX_NOTICE_LEN};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::{Link, RoutedTransport};
use crate::cpu::transport::{Channel, Header, Stage, Transport, TransportError};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;
use crate::{Algorithm, DType, ReduceOp};

/// A map of published values and the condition signalled when one is published.
type Published = (Mutex<HashMap<String, Vec<u8>>>, Condvar);

/// An in-memory rendezvous shared by the threads of a test (clones share the map).
#[derive(Default, Clone)]
struct MemRdv(Arc<Published>);

impl Rendezvous for MemRdv {
    fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
        self.0 .0.lock().unwrap().insert(key.to_string(), value.to_vec());
        self.0 .1.notify_all();
        Ok(())
    }

    fn lookup(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut map = self.0 .0.lock().unwrap();
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(Error::Store(format!("`{key}` was not published in time")));
            }
            map = self.0 .1.wait_timeout(map, left).unwrap().0;
        }
    }
}

const PREFIX: &str = "job-1";

fn opts() -> TcpOptions {
    TcpOptions {
        ifname: None,
        bind_addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        prefer: None,
        connect_timeout: Duration::from_secs(10),
        max_frame: 1 << 26,
        poll_for: Duration::ZERO,
        yield_for: Duration::ZERO,
        lanes: 1,
    }
}

/// [`opts`] with receivers that read their sockets themselves for `poll_for` before they
/// sleep (the progress thread delivers the rest).
fn polling(poll_for: Duration) -> TcpOptions {
    TcpOptions { poll_for, ..opts() }
}

fn secret() -> Secret {
    Secret::from_text("tcp-test-secret").unwrap()
}

fn all_but(r: usize, n: usize) -> Vec<usize> {
    (0..n).filter(|&p| p != r).collect()
}

/// Rank `r`'s links, connecting on demand.
fn establish_lazy(
    r: usize,
    n: usize,
    rdv: &MemRdv,
    secret: &Secret,
    opts: &TcpOptions,
) -> Result<(Arc<Mailbox>, TcpLinks)> {
    let mb = Arc::new(Mailbox::new());
    let links = TcpLinks::establish(r, n, &all_but(r, n), rdv, PREFIX, secret, opts, Arc::clone(&mb))?;
    Ok((mb, links.with_directory(Arc::new(rdv.clone()))))
}

/// Rank `r`'s links, connected to every peer before they are returned.
fn establish(r: usize, n: usize, rdv: &MemRdv, secret: &Secret, opts: &TcpOptions) -> Result<(Arc<Mailbox>, TcpLinks)> {
    let (mb, links) = establish_lazy(r, n, rdv, secret, opts)?;
    links.connect_all(Instant::now() + opts.connect_timeout)?;
    Ok((mb, links))
}

/// Establishes every rank of a world on its own thread.
fn links_world(
    n: usize,
    secret_of: impl Fn(usize) -> Secret + Sync,
    opts: &TcpOptions,
) -> Vec<Result<(Arc<Mailbox>, TcpLinks)>> {
    let rdv = MemRdv::default();
    thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (rdv, secret_of) = (&rdv, &secret_of);
                s.spawn(move || establish(r, n, rdv, &secret_of(r), opts))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn transport(r: usize, n: usize, mb: Arc<Mailbox>, links: &Arc<TcpLinks>) -> RoutedTransport {
    let routes = (0..n).map(|p| if p == r { None } else { Some(Arc::clone(links) as Arc<dyn Link>) }).collect();
    RoutedTransport::new(r, mb, routes).unwrap()
}

fn communicator(r: usize, n: usize, mb: Arc<Mailbox>, links: &Arc<TcpLinks>) -> Communicator {
    let cfg = Config::new().timeout(Duration::from_secs(20)).resolve_with(|_| None).unwrap();
    let ranks: Arc<[usize]> = (0..n).collect();
    let t = Arc::new(transport(r, n, mb, links));
    Communicator::from_backend(Arc::new(CpuBackend::new("tcp-test", t, WORLD_COMM_ID, ranks, r, cfg).unwrap()))
}

fn tcp_world(n: usize) -> Vec<(Communicator, Arc<TcpLinks>)> {
    tcp_world_with(n, &opts())
}

fn tcp_world_with(n: usize, opts: &TcpOptions) -> Vec<(Communicator, Arc<TcpLinks>)> {
    links_world(n, |_| secret(), opts)
        .into_iter()
        .enumerate()
        .map(|(r, res)| {
            let (mb, links) = res.unwrap();
            let links = Arc::new(links);
            (communicator(r, n, mb, &links), links)
        })
        .collect()
}

fn on_threads<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let f = &f;
    thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn input(r: usize, count: usize) -> Vec<i64> {
    (0..count).map(|i| (r * 1000 + i) as i64 - 500).collect()
}

fn collectives_match_references(opts: &TcpOptions, worlds: std::ops::RangeInclusive<usize>) {
    for n in worlds {
        let world = tcp_world_with(n, opts);
        let comms: Vec<Communicator> = world.iter().map(|(c, _)| c.clone()).collect();
        let count = 1031;
        for algo in [Algorithm::Ring, Algorithm::RecursiveDoubling] {
            let sum: Vec<i64> = (0..count).map(|i| (0..n).map(|r| input(r, count)[i]).sum()).collect();
            let max: Vec<f64> =
                (0..count).map(|i| (0..n).map(|r| input(r, count)[i] as f64).fold(f64::MIN, f64::max)).collect();
            let got = on_threads(&comms, |c| {
                let c = c.with_algorithm(algo);
                let mut x = input(c.rank(), count);
                c.all_reduce(&mut x, ReduceOp::Sum)?;
                let mut y: Vec<f64> = input(c.rank(), count).iter().map(|&v| v as f64).collect();
                c.all_reduce(&mut y, ReduceOp::Max)?;
                Ok::<_, Error>((x, y))
            });
            for (r, g) in got.into_iter().enumerate() {
                let (x, y) = g.unwrap_or_else(|e| panic!("n={n} {algo:?} rank {r}: {e}"));
                assert_eq!(x, sum, "n={n} {algo:?} rank {r}");
                assert_eq!(y, max, "n={n} {algo:?} rank {r}");
            }
        }
        // A large ring all_reduce: frames far above the coalescing size.
        let big = 1 << 18;
        let got = on_threads(&comms, |c| {
            let mut x: Vec<f32> = (0..big).map(|i| ((i % 97) + c.rank()) as f32).collect();
            c.with_algorithm(Algorithm::Ring).all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
        });
        let want: Vec<f32> = (0..big).map(|i| (0..n).map(|r| ((i % 97) + r) as f32).sum()).collect();
        for g in got {
            assert!(g.unwrap() == want, "n={n}: large all_reduce differs");
        }
        let got = on_threads(&comms, |c| {
            let mine = vec![c.rank() as i32 * 10 + 1; 7];
            let mut all = vec![0i32; 7 * n];
            c.all_gather(&mine, &mut all).map(|()| all)
        });
        let want: Vec<i32> = (0..n).flat_map(|r| vec![r as i32 * 10 + 1; 7]).collect();
        for g in got {
            assert_eq!(g.unwrap(), want);
        }
        let root = n - 1;
        let got = on_threads(&comms, |c| {
            let mut b = if c.rank() == root { input(root, 300) } else { vec![0; 300] };
            c.broadcast(&mut b, root).map(|()| b)
        });
        for g in got {
            assert_eq!(g.unwrap(), input(root, 300));
        }
        let got = on_threads(&comms, |c| {
            let (r, n) = (c.rank(), c.world_size());
            let msg: Vec<u32> = (0..r as u32 + 3).collect();
            c.send(&msg, (r + 1) % n, 5)?;
            let mut buf = vec![0u32; 16];
            let len = c.recv(&mut buf, (r + n - 1) % n, 5)?;
            buf.truncate(len);
            c.barrier()?;
            Ok::<_, Error>(buf)
        });
        for (r, g) in got.into_iter().enumerate() {
            let from = (r + n - 1) % n;
            assert_eq!(g.unwrap(), (0..from as u32 + 3).collect::<Vec<_>>(), "n={n} rank {r}");
        }
        for (r, (_, links)) in world.iter().enumerate() {
            assert_eq!(links.peers(), all_but(r, n));
            assert!(links.local_addr().ip().is_loopback());
        }
    }
}

fn header(comm_id: u64) -> Header {
    Header {
        comm_id,
        channel: Channel::PointToPoint(3),
        fingerprint: Fingerprint {
            seq: 0,
            op: OpKind::Send,
            dtype: DType::U8,
            count: 5,
            root: None,
            reduce: None,
            algorithm: Algorithm::Linear,
        },
    }
}

/// A stream of which only the first `open` bytes have arrived: reads past them would block,
/// or end the stream once all arrived and `eof` is set.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    open: usize,
    eof: bool,
}

impl Source for Trickle {
    fn read_some(&mut self, buf: &mut [std::mem::MaybeUninit<u8>], _: Wait) -> io::Result<usize> {
        if self.at == self.open {
            return if self.eof && self.at == self.data.len() { Ok(0) } else { Err(io::ErrorKind::WouldBlock.into()) };
        }
        let n = buf.len().min(self.open - self.at);
        for (d, s) in buf.iter_mut().zip(&self.data[self.at..self.at + n]) {
            d.write(*s);
        }
        self.at += n;
        Ok(n)
    }
}

fn payloads(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes.iter().enumerate().map(|(k, &n)| (0..n).map(|i| ((i * 7 + k * 3) % 251) as u8).collect()).collect()
}

/// `frames` as the streams of `k` lanes: each header with stripe 0 on lane 0, stripe j on
/// lane j.
fn striped_streams(frames: &[Vec<u8>], k: usize) -> Vec<Vec<u8>> {
    let mut out = vec![Vec::new(); k];
    for p in frames {
        let st = Stripes::of(p.len(), k);
        out[0].extend_from_slice(&frame::encode_header(FrameKind::Data, &header(9), p.len()));
        for (j, lane) in out.iter_mut().enumerate().take(st.lanes()) {
            lane.extend_from_slice(&p[st.range(j)]);
        }
    }
    out
}

fn lanes(k: usize) -> TcpOptions {
    TcpOptions { lanes: k, ..opts() }
}
