//! Several connections per peer (`OXCCL_SOCKETS_PER_PEER`): striped payloads read from every
//! lane in order, and ranks that disagree on the count.

use super::*;

/// The collectives over 2 and 3 lanes per peer: frames from 128 KiB on are striped (the
/// large ring all_reduce's blocks), with the progress thread and with polling receivers.
#[test]
fn collectives_match_references_over_several_connections_per_peer() {
    collectives_match_references(&lanes(3), 2..=3);
    collectives_match_references(&TcpOptions { poll_for: Duration::from_secs(1), ..lanes(2) }, 2..=3);
}

#[test]
fn striped_payloads_are_read_from_every_lane_in_order() {
    let frames = payloads(&[5, STRIPE_FROM - 1, STRIPE_FROM, 200_003, 1 << 20, 64, 300_001]);
    for k in [2, 3, 8] {
        let streams = striped_streams(&frames, k);
        let mb = Mailbox::new();
        let mut inc = Incoming::default();
        let mut src: &[u8] = &streams[0];
        let mut others: Vec<&[u8]> = streams[1..].iter().map(|v| &v[..]).collect();
        loop {
            match inc.pump(&mut src, &mut others[..], 0, &mb, 1 << 26, None, Wait::Now) {
                Ok(_) => {}
                Err(End::Closed) => break,
                Err(e) => panic!("k={k}: {e:?}"),
            }
        }
        assert!(others.iter().all(|l| l.is_empty()), "k={k}: stripes left unread");
        for f in &frames {
            let mut buf = vec![0u8; f.len()];
            let got = mb.try_recv(0, 9, header(9).channel, None, &mut buf).unwrap().map(|g| g.len);
            assert_eq!(got, Some(f.len()), "k={k}");
            assert!(buf == *f, "k={k}: a payload of {} bytes differs", f.len());
        }
        // A lane that ends inside a stripe ends the stream.
        let mut src: &[u8] = &streams[0];
        let short = &streams[1][..streams[1].len() - 1];
        let mut others: Vec<&[u8]> = std::iter::once(short).chain(streams[2..].iter().map(|v| &v[..])).collect();
        let mut inc = Incoming::default();
        let end = loop {
            if let Err(e) = inc.pump(&mut src, &mut others[..], 0, &Mailbox::new(), 1 << 26, None, Wait::Now) {
                break e;
            }
        };
        assert!(matches!(end, End::Truncated), "k={k}: {end:?}");
    }
}

/// A caller reading a striped payload in place without waiting resumes each stripe where it
/// stopped; one that gives up leaves the stream in step, the payload whole in the mailbox.
#[test]
fn a_striped_payload_read_in_place_resumes_per_lane() {
    let frames = payloads(&[400_000, 10]);
    let streams = striped_streams(&frames, 3);
    let trickle = |s: &Vec<u8>, open: usize| Trickle { data: s.clone(), at: 0, open: open.min(s.len()), eof: false };
    let ch = header(9).channel;
    // Only lane 0 (header and half its stripe) and half of lane 2 have arrived.
    let mut src = trickle(&streams[0], HEADER_LEN + 60_000);
    let mut others = vec![trickle(&streams[1], 0), trickle(&streams[2], 70_000)];
    let mb = Mailbox::new();
    let mut inc = Incoming::default();
    let mut buf = vec![0u8; frames[0].len()];
    let pump = |inc: &mut Incoming, src: &mut Trickle, others: &mut Vec<Trickle>, buf: &mut Vec<u8>| {
        let direct = Direct { comm_id: 9, channel: ch, buf, wait: Wait::Now };
        inc.pump(src, &mut others[..], 0, &mb, 1 << 26, Some(direct), Wait::Now).unwrap()
    };
    assert_eq!(pump(&mut inc, &mut src, &mut others, &mut buf), Pumped::Nothing);
    assert!(inc.reading_direct() && inc.awaits(0) && inc.awaits(1) && inc.awaits(2));
    // Lane 0 completes: only the other lanes are awaited now.
    src.open = src.data.len();
    assert_eq!(pump(&mut inc, &mut src, &mut others, &mut buf), Pumped::Nothing);
    assert!(!inc.awaits(0) && inc.awaits(1) && inc.awaits(2));
    for o in &mut others {
        o.open = o.data.len();
    }
    let got = pump(&mut inc, &mut src, &mut others, &mut buf);
    assert_eq!(got, Pumped::Took(crate::cpu::transport::Received { header: header(9), len: frames[0].len() }));
    assert!(buf == frames[0]);
    // The same payload given up half-way reaches the mailbox whole once the rest arrives.
    let mut src = trickle(&streams[0], HEADER_LEN + 1000);
    let mut others = vec![trickle(&streams[1], 5000), trickle(&streams[2], 0)];
    let mut inc = Incoming::default();
    buf.fill(0);
    assert_eq!(pump(&mut inc, &mut src, &mut others, &mut buf), Pumped::Nothing);
    inc.abandon_direct(&buf, &mb);
    assert!(!inc.reading_direct());
    src.open = src.data.len();
    for o in &mut others {
        o.open = o.data.len();
    }
    assert_eq!(inc.pump(&mut src, &mut others[..], 0, &mb, 1 << 26, None, Wait::Now).unwrap(), Pumped::Delivered);
    let mut whole = vec![0u8; frames[0].len()];
    assert_eq!(mb.try_recv(0, 9, ch, None, &mut whole).unwrap().map(|g| g.len), Some(frames[0].len()));
    assert!(whole == frames[0]);
    let mut small = vec![0u8; 10];
    assert_eq!(mb.try_recv(0, 9, ch, None, &mut small).unwrap().map(|g| g.len), Some(10));
    assert!(small == frames[1]);
}

#[test]
fn ranks_that_disagree_on_the_connections_per_peer_are_refused_by_name() {
    let rdv = MemRdv::default();
    let fast = TcpOptions { connect_timeout: Duration::from_secs(3), ..opts() };
    let two = TcpOptions { lanes: 2, ..fast.clone() };
    let l0 = establish_lazy(0, 2, &rdv, &secret(), &two).unwrap();
    let l1 = establish_lazy(1, 2, &rdv, &secret(), &fast).unwrap();
    let (r0, r1) = thread::scope(|s| {
        let a = s.spawn(|| l0.1.connect_all(Instant::now() + fast.connect_timeout));
        let b = s.spawn(|| l1.1.connect_all(Instant::now() + fast.connect_timeout));
        (a.join().unwrap(), b.join().unwrap())
    });
    let Err(e) = r0 else { panic!("rank 0 must be refused") };
    assert!(e.to_string().contains(LANES_ENV), "{e}");
    assert!(r1.is_err(), "rank 1 must not complete its setup");
    for k in [0, MAX_LANES + 1] {
        let bad = TcpOptions { lanes: k, ..TcpOptions::default() };
        assert!(matches!(bad.check(), Err(Error::Config(m)) if m.contains(LANES_ENV)), "{k}");
    }
    assert!(matches!(registry::SOCKETS_PER_PEER.kind, Kind::Count { min: 1, max } if max == MAX_LANES as u64));
    assert_eq!(registry::SOCKETS_PER_PEER.default, super::super::options::DEFAULT_LANES.to_string());
}

#[test]
fn a_background_reader_thread_runs_as_sched_batch() {
    // Where callers poll their sockets, the progress thread must not preempt them when bytes
    // come (see `progress::run_in_background`): it runs as SCHED_BATCH; other threads keep their class.
    let policy = thread::spawn(|| {
        super::super::progress::run_in_background();
        // SAFETY: pid 0 is the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    })
    .join()
    .unwrap();
    assert_eq!(policy, libc::SCHED_BATCH);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
    // Callers poll where they spin (a CPU per rank) and where they yield (crowded); only
    // callers that sleep at once leave every frame to the readers.
    assert!(super::super::links::readers_in_background(&polling(Duration::from_micros(50))));
    assert!(super::super::links::readers_in_background(&TcpOptions { yield_for: Duration::from_millis(2), ..opts() }));
    assert!(!super::super::links::readers_in_background(&opts()));
}
