//! Hostile and broken peers: a vanished peer, a wrong secret, garbage clients, bad frames,
//! peers that do not read, dead-peer probes, notices and malformed streams.

use super::*;

fn names_rank_1(e: &Error) -> bool {
    match e {
        Error::PeerLost { rank, .. } => *rank == 1,
        Error::Aborted { reason } => reason.contains("rank 1"),
        _ => false,
    }
}

#[test]
fn a_vanished_peer_fails_the_others_fast() {
    // Abrupt: the connections close as when the process dies. Graceful: the communicator
    // is dropped first (release notices), then the links.
    for abrupt in [true, false] {
        let mut world = tcp_world(3);
        let (c1, l1) = world.remove(1);
        let comms: Vec<Communicator> = world.iter().map(|(c, _)| c.clone()).collect();
        let started = Instant::now();
        let got = thread::scope(|s| {
            s.spawn(move || {
                thread::sleep(Duration::from_millis(200));
                if abrupt {
                    l1.shutdown();
                }
                drop(c1);
                drop(l1);
            });
            on_threads(&comms, |c| {
                let mut x = vec![1i64; 4096];
                let r = c.with_algorithm(Algorithm::Ring).all_reduce(&mut x, ReduceOp::Sum);
                (r, started.elapsed())
            })
        });
        for (r, took) in got {
            let e = r.expect_err("the collective cannot succeed without rank 1");
            assert!(names_rank_1(&e), "abrupt={abrupt}: {e:?}");
            assert!(took < Duration::from_secs(5), "abrupt={abrupt}: took {took:?}");
        }
    }
}

fn short_opts() -> TcpOptions {
    TcpOptions { connect_timeout: Duration::from_secs(2), ..opts() }
}

#[test]
fn a_client_with_the_wrong_secret_cannot_join() {
    let bad = Secret::from_text("not the job's secret").unwrap();
    // Either rank may hold the wrong secret: both dial (and both serve), and each names the
    // variable, the good side naming the other rank. The links stay up until both tried.
    for wrong in [0, 1] {
        let rdv = MemRdv::default();
        let opts = short_opts();
        let links: Vec<_> = (0..2)
            .map(|r| establish_lazy(r, 2, &rdv, &if r == wrong { bad.clone() } else { secret() }, &opts).unwrap())
            .collect();
        let errors: Vec<String> = thread::scope(|s| {
            let hs: Vec<_> = links
                .iter()
                .map(|(_, l)| s.spawn(move || l.connect_all(Instant::now() + opts.connect_timeout)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap_err().to_string()).collect()
        });
        let good = 1 - wrong;
        assert!(errors[good].contains(SECRET_ENV) && errors[good].contains(&format!("rank {wrong}")), "{errors:?}");
        assert!(errors[wrong].contains(SECRET_ENV), "{errors:?}");
    }
}

fn read_until_closed(s: &mut TcpStream) {
    // Longer than a silent client's handshake may last.
    s.set_read_timeout(Some(super::super::progress::HANDSHAKE_TIMEOUT + Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => return,
            Err(e) => panic!("the connection was not closed: {e}"),
        }
    }
}

#[test]
fn garbage_clients_are_refused_without_disturbing_the_world() {
    let rdv = &MemRdv::default();
    let n = 3;
    let (world, mut silent) = thread::scope(|s| {
        let top = s.spawn(|| establish(2, n, rdv, &secret(), &opts()));
        let addr: SocketAddr =
            String::from_utf8(rdv.lookup("job-1/tcp/2", Duration::from_secs(5)).unwrap()).unwrap().parse().unwrap();
        // Plain garbage.
        let mut g = TcpStream::connect(addr).unwrap();
        g.write_all(&[0xAB; 100]).unwrap();
        read_until_closed(&mut g);
        // A frame header with an absurd length instead of a handshake.
        let mut g = TcpStream::connect(addr).unwrap();
        let mut head = frame::encode_header(FrameKind::Data, &header(3), 0);
        head[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
        g.write_all(&head).unwrap();
        g.write_all(&[0; 16]).unwrap();
        read_until_closed(&mut g);
        // A truncated handshake.
        let mut g = TcpStream::connect(addr).unwrap();
        let mut challenge = [0u8; 40];
        g.read_exact(&mut challenge).unwrap();
        g.write_all(&challenge[..10]).unwrap();
        g.shutdown(Shutdown::Write).unwrap();
        read_until_closed(&mut g);
        // Authenticated, but claiming impossible identities.
        for (src, world, prefix) in [(7, n, PREFIX), (2, n, PREFIX), (0, n + 1, PREFIX), (0, n, "other-job")] {
            let mut g = TcpStream::connect(addr).unwrap();
            auth::connect(&mut g, &secret(), AUTH_CONTEXT).unwrap();
            g.write_all(&Ident::new(src, world, 1, prefix).hello(2, 0)).unwrap();
            let mut reply = [0u8; REPLY_LEN];
            g.read_exact(&mut reply).unwrap();
            assert_ne!(reply[16], Verdict::Accepted as u8, "src {src} world {world} prefix {prefix}");
            read_until_closed(&mut g);
        }
        // A client that says nothing must not hold the others up.
        let silent = TcpStream::connect(addr).unwrap();
        let lower: Vec<_> = (0..2).map(|r| s.spawn(move || establish(r, n, rdv, &secret(), &opts()))).collect();
        let mut world: Vec<_> = lower.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        world.push(top.join().unwrap().unwrap());
        (world, silent)
    });
    read_until_closed(&mut silent);
    let comms: Vec<Communicator> =
        world.into_iter().enumerate().map(|(r, (mb, links))| communicator(r, n, mb, &Arc::new(links))).collect();
    let got = on_threads(&comms, |c| {
        let mut x = input(c.rank(), 100);
        c.all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
    });
    let want: Vec<i64> = (0..100).map(|i| (0..n).map(|r| input(r, 100)[i]).sum()).collect();
    for g in got {
        assert_eq!(g.unwrap(), want);
    }
}

fn lost_detail(mb: &Mailbox, peer: usize) -> String {
    match mb.recv(
        peer,
        99,
        Channel::Collective,
        Some(Stage::Collective(0)),
        &mut [],
        Instant::now() + Duration::from_secs(5),
    ) {
        Err(TransportError::PeerLost { peer: p, detail }) if p == peer => detail,
        other => panic!("expected rank {peer} to be lost, got {other:?}"),
    }
}

/// A world of `n` in which rank 0 is played by hand: its authenticated connections to
/// ranks 1.., and the real ranks' mailboxes and links.
fn with_fake_rank0(n: usize) -> (Vec<TcpStream>, Vec<(Arc<Mailbox>, TcpLinks)>) {
    let rdv = &MemRdv::default();
    thread::scope(|s| {
        let real: Vec<_> = (1..n).map(|r| s.spawn(move || establish_lazy(r, n, rdv, &secret(), &opts()))).collect();
        let me = Ident::new(0, n, 1, PREFIX);
        let deadline = Instant::now() + Duration::from_secs(10);
        let fake = (1..n)
            .map(|p| dial(p, 0, lookup(rdv, PREFIX, p, deadline).unwrap(), &secret(), &me, deadline, None).unwrap());
        let fake = fake.collect();
        (fake, real.into_iter().map(|h| h.join().unwrap().unwrap()).collect())
    })
}

#[test]
fn bad_frames_from_an_authenticated_peer_lose_only_that_peer() {
    let n = 3;
    let (fake, real) = with_fake_rank0(n);
    let (mut fake, mut real) = (fake.into_iter(), real.into_iter());
    let (mut to1, mut to2) = (fake.next().unwrap(), fake.next().unwrap());
    let ((mb1, l1), (mb2, l2)) = (real.next().unwrap(), real.next().unwrap());
    // A good frame first, then one with an absurd length.
    to1.write_all(&frame::encode_header(FrameKind::Data, &header(9), 5)).unwrap();
    to1.write_all(b"hello").unwrap();
    let mut buf = [0u8; 8];
    let got =
        mb1.recv(0, 9, Channel::PointToPoint(3), None, &mut buf, Instant::now() + Duration::from_secs(5)).unwrap();
    assert_eq!(&buf[..got.len], b"hello");
    let mut head = frame::encode_header(FrameKind::Data, &header(9), 0);
    head[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
    to1.write_all(&head).unwrap();
    let d = lost_detail(&mb1, 0);
    assert!(d.contains("limit") && d.contains("closed"), "{d}");
    read_until_closed(&mut to1);
    // The peer dials again: it is told it was lost (not to wait for a connection of rank 1's
    // own, as a duplicate dial is), and its dial fails for good.
    let me = Ident::new(0, n, 1, PREFIX);
    let deadline = Instant::now() + Duration::from_secs(5);
    match dial(1, 0, l1.local_addr(), &secret(), &me, deadline, None) {
        Err(DialError::Failed(Error::Io { kind: io::ErrorKind::ConnectionAborted, message, .. })) => {
            assert!(message.contains("has lost rank 0"), "{message}")
        }
        other => panic!("rank 0's dial again should fail as lost, got {other:?}"),
    }
    // A truncated frame.
    to2.write_all(&frame::encode_header(FrameKind::Data, &header(9), 1000)).unwrap();
    to2.write_all(&[1; 10]).unwrap();
    to2.shutdown(Shutdown::Write).unwrap();
    let d = lost_detail(&mb2, 0);
    assert!(d.contains("middle of a frame"), "{d}");
    // Ranks 1 and 2 still talk, both ways.
    let (l1, l2) = (Arc::new(l1), Arc::new(l2));
    let (t1, t2) = (transport(1, n, mb1, &l1), transport(2, n, mb2, &l2));
    let deadline = Instant::now() + Duration::from_secs(5);
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    t1.send(2, &header(5), &big, deadline).unwrap();
    t2.send(1, &header(5), b"back", deadline).unwrap();
    let mut buf = vec![0u8; big.len()];
    let got = t2.recv(1, 5, Channel::PointToPoint(3), None, &mut buf, deadline).unwrap();
    assert_eq!(got.len, big.len());
    assert!(buf == big);
    let got = t1.recv(2, 5, Channel::PointToPoint(3), None, &mut buf, deadline).unwrap();
    assert_eq!(&buf[..got.len], b"back");
    // Sends to the lost fake peer fail; a frame above the limit is refused before sending.
    assert!(matches!(t1.send(0, &header(5), b"x", deadline), Err(TransportError::PeerLost { peer: 0, .. })));
    let huge = vec![0u8; (1 << 26) + 1];
    assert!(matches!(
        l1.send_frame(2, FrameKind::Data, &header(5), &huge, deadline),
        Err(TransportError::Other(Error::Config(_)))
    ));
    drop(to2);
}

#[test]
fn sends_to_a_peer_that_does_not_read_time_out() {
    let (fake, real) = with_fake_rank0(2);
    let mut to1 = fake.into_iter().next().unwrap();
    let (_mb, l1) = real.into_iter().next().unwrap();
    // A deadline that has passed: nothing is written, the connection stays usable.
    let past = Instant::now();
    assert_eq!(l1.send_frame(0, FrameKind::Data, &header(2), b"late", past), Err(TransportError::Timeout { peer: 0 }));
    l1.send_frame(0, FrameKind::Data, &header(2), b"ok", Instant::now() + Duration::from_secs(5)).unwrap();
    let mut head = [0u8; HEADER_LEN + 2];
    to1.read_exact(&mut head).unwrap();
    let f = frame::decode_header(&head, 16).unwrap();
    assert_eq!((f.header, f.payload_len, &head[HEADER_LEN..]), (header(2), 2, &b"ok"[..]));
    // More than the socket buffers hold, to a peer that does not read: the deadline holds,
    // and the half-written frame closes the connection.
    let big = vec![7u8; 48 << 20];
    let started = Instant::now();
    let r = l1.send_frame(0, FrameKind::Data, &header(2), &big, started + Duration::from_millis(300));
    assert_eq!(r, Err(TransportError::Timeout { peer: 0 }));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let r = l1.send_frame(0, FrameKind::Data, &header(2), b"x", Instant::now() + Duration::from_secs(5));
    assert!(matches!(&r, Err(TransportError::PeerLost { peer: 0, detail }) if detail.contains("timed out")), "{r:?}");
}

#[test]
fn connections_probe_for_dead_peers() {
    use std::os::fd::AsRawFd;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    set_liveness(&c).unwrap();
    let get = |level, name| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into a live c_int with its size.
        let r = unsafe { libc::getsockopt(c.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len) };
        assert_eq!(r, 0);
        v
    };
    assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), KEEPALIVE_IDLE_S);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), KEEPALIVE_INTERVAL_S);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), KEEPALIVE_PROBES);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), USER_TIMEOUT_MS);
}

#[test]
fn failure_and_release_notices_reach_the_mailbox() {
    let mut stream = Vec::new();
    for (kind, payload) in [
        (FrameKind::Data, b"abc".to_vec()),
        (FrameKind::Failure, frame::encode_error(&Error::Aborted { reason: "boom".into() })),
    ] {
        let mut h = header(4);
        if kind == FrameKind::Failure {
            // Failed at collective 5: the stage travels in the sequence number.
            h.comm_id = 6;
            h.fingerprint.seq = 5;
        }
        stream.extend_from_slice(&frame::encode_header(kind, &h, payload.len()));
        stream.extend_from_slice(&payload);
    }
    stream.extend_from_slice(&frame::encode_header(FrameKind::Release, &header(4), 0));
    let mb = Mailbox::new();
    assert!(matches!(pump_to_end(stream.as_slice(), 2, &mb, 1 << 20), End::Closed));
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 3];
    assert_eq!(mb.recv(2, 4, Channel::PointToPoint(3), None, &mut buf, deadline).unwrap().len, 3);
    assert!(matches!(
        mb.probe(2, 4, Channel::Collective, Some(Stage::Collective(0))),
        Err(TransportError::PeerLost { peer: 2, .. })
    ));
    match mb.probe(2, 6, Channel::Collective, Some(Stage::Collective(0))) {
        Err(TransportError::PeerFailed { peer: 2, error: Error::Aborted { reason } }) => assert_eq!(reason, "boom"),
        other => panic!("{other:?}"),
    }
    // Waits on another peer end from stage 5 on, not before.
    assert!(matches!(mb.probe(1, 6, Channel::Collective, Some(Stage::Collective(4))), Ok(None)));
    assert!(matches!(
        mb.probe(1, 6, Channel::Collective, Some(Stage::Collective(5))),
        Err(TransportError::PeerFailed { peer: 2, .. })
    ));
}

#[test]
fn malformed_streams_end_the_reader_cleanly() {
    let mb = Mailbox::new();
    let good = frame::encode_header(FrameKind::Data, &header(1), 4);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "closed"),
        (good[..30].to_vec(), "truncated"),
        ([&good[..], b"ab"].concat(), "truncated"),
        (vec![0xFF; 100], "magic"),
        (frame::encode_header(FrameKind::Release, &header(1), 3).to_vec(), "release"),
        (frame::encode_header(FrameKind::Failure, &header(1), MAX_NOTICE_LEN + 1).to_vec(), "failure notice of"),
        ([&frame::encode_header(FrameKind::Failure, &header(1), 1)[..], &[42]].concat(), "cannot be decoded"),
        (frame::encode_header(FrameKind::Data, &header(1), (1 << 20) + 1).to_vec(), "limit"),
    ];
    for (bytes, want) in cases {
        let end = pump_to_end(bytes.as_slice(), 0, &mb, 1 << 20);
        let text = format!("{end:?}").to_lowercase();
        assert!(text.contains(want), "{want}: {text}");
    }
    // A huge length within the limit, with the bytes missing: no huge allocation up front.
    let head = frame::encode_header(FrameKind::Data, &header(1), 1 << 40);
    assert!(matches!(pump_to_end(&head[..], 0, &mb, usize::MAX), End::Truncated));
}
