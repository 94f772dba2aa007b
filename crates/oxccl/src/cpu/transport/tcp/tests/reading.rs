//! The reader on arbitrary bytes: large payloads, trickling sources, frames taken in place by
//! a waiting caller, and a polling receiver beside the reader thread.

use super::*;

#[test]
fn payloads_above_the_first_allocation_are_read_whole() {
    let len = PREALLOC + PREALLOC / 2 + 3;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let h = header(1);
    let stream = [&frame::encode_header(FrameKind::Data, &h, len)[..], &data].concat();
    let mb = Mailbox::new();
    assert!(matches!(pump_to_end(&stream, 0, &mb, usize::MAX), End::Closed));
    let mut buf = vec![0u8; len];
    let got = mb.try_recv(0, 1, h.channel, None, &mut buf).unwrap().map(|g| g.len);
    assert_eq!(got, Some(len));
    assert!(buf == data);
    // One byte short: the stream ends inside the frame.
    assert!(matches!(pump_to_end(&stream[..stream.len() - 1], 0, &mb, usize::MAX), End::Truncated));
}

fn data_frame(comm_id: u64, payload: &[u8]) -> Vec<u8> {
    [&frame::encode_header(FrameKind::Data, &header(comm_id), payload.len())[..], payload].concat()
}

#[test]
fn a_waiting_caller_takes_its_frame_in_place_and_leaves_the_rest_in_order() {
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    // Ahead of the frame waited for: one of another communicator. Behind it: one more, not
    // yet wanted.
    let data = [data_frame(11, b"other"), data_frame(9, &big), data_frame(9, b"after")].concat();
    let open = data.len();
    let mut src = Trickle { data, at: 0, open, eof: false };
    let mb = Mailbox::new();
    let mut inc = Incoming::default();
    let mut buf = vec![0u8; big.len()];
    let deadline = Instant::now() + Duration::from_secs(5);
    let direct = Direct { comm_id: 9, channel: header(9).channel, buf: &mut buf, wait: Wait::Until(deadline) };
    let got = inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, Some(direct), Wait::Now).unwrap();
    assert_eq!(got, Pumped::Took(crate::cpu::transport::Received { header: header(9), len: big.len() }));
    assert!(buf == big);
    // The frame before it is in the mailbox; the one after it is still on the stream.
    let mut small = [0u8; 5];
    let take = |comm, small: &mut [u8; 5]| mb.try_recv(0, comm, header(9).channel, None, small).unwrap().map(|g| g.len);
    assert_eq!(take(11, &mut small), Some(5));
    assert_eq!(&small, b"other");
    assert_eq!(take(9, &mut small), None);
    assert_eq!(
        inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, None, Wait::Now).unwrap(),
        Pumped::Delivered
    );
    assert_eq!(take(9, &mut small), Some(5));
    assert_eq!(&small, b"after");
    src.eof = true;
    assert!(matches!(inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, None, Wait::Now), Err(End::Closed)));
}

#[test]
fn a_frame_of_another_length_ahead_on_the_callers_channel_is_not_passed() {
    // A broadcast whose ranks named different roots: each sent the other 8 bytes, and the
    // barrier that follows waits for an empty frame on the same channel. Taking the empty
    // one in place would pass the 8 bytes (left in the mailbox), and the mismatch would go
    // unnoticed (CI, conformance over TCP, errors/mismatch/root at 2 ranks, once the reader
    // threads stopped preempting their callers): everything goes to the mailbox, in order.
    let data = [data_frame(9, b"8 bytes!"), data_frame(9, b""), data_frame(9, b"after")].concat();
    let open = data.len();
    let mut src = Trickle { data, at: 0, open, eof: false };
    let mb = Mailbox::new();
    let mut inc = Incoming::default();
    let mut empty = [0u8; 0];
    let deadline = Instant::now() + Duration::from_secs(5);
    let direct = Direct { comm_id: 9, channel: header(9).channel, buf: &mut empty, wait: Wait::Until(deadline) };
    let got = inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, Some(direct), Wait::Now).unwrap();
    assert_eq!(got, Pumped::Delivered);
    let mut buf = [0u8; 8];
    let mut take = || mb.try_recv(0, 9, header(9).channel, None, &mut buf).unwrap().map(|g| g.len);
    assert_eq!(take(), Some(8));
    assert_eq!(take(), Some(0));
    assert_eq!(take(), Some(5));
    assert_eq!(take(), None);
}

#[test]
fn a_payload_late_past_the_callers_deadline_still_reaches_the_mailbox_whole() {
    let big: Vec<u8> = (0..70_000u32).map(|i| (i % 241) as u8).collect();
    let data = [data_frame(9, &big), data_frame(9, b"after")].concat();
    // The header and part of the payload have arrived.
    let mut src = Trickle { data, at: 0, open: HEADER_LEN + 1000, eof: false };
    let mb = Mailbox::new();
    let mut inc = Incoming::default();
    let mut buf = vec![0u8; big.len()];
    let direct = Direct { comm_id: 9, channel: header(9).channel, buf: &mut buf, wait: Wait::Until(Instant::now()) };
    assert_eq!(
        inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, Some(direct), Wait::Now).unwrap(),
        Pumped::TimedOut
    );
    // Nothing more has arrived: nothing moves, and nothing is delivered half.
    assert_eq!(inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, None, Wait::Now).unwrap(), Pumped::Nothing);
    assert_eq!(mb.try_recv(0, 9, header(9).channel, None, &mut buf).unwrap(), None);
    // The rest arrives: the frame is whole, and the stream is still in step.
    src.open = src.data.len();
    assert_eq!(
        inc.pump(&mut src, &mut [] as &mut [&[u8]], 0, &mb, 1 << 20, None, Wait::Now).unwrap(),
        Pumped::Delivered
    );
    buf.fill(0);
    assert_eq!(mb.try_recv(0, 9, header(9).channel, None, &mut buf).unwrap().map(|g| g.len), Some(big.len()));
    assert!(buf == big);
    let mut small = [0u8; 5];
    assert_eq!(mb.try_recv(0, 9, header(9).channel, None, &mut small).unwrap().map(|g| g.len), Some(5));
    assert_eq!(&small, b"after");
}

#[test]
fn a_polling_receiver_over_a_real_socket_keeps_order_with_the_reader_thread() {
    // Rank 1 reads its socket itself; frames arrive while it waits, and while it does not
    // (then its progress thread takes them): every one comes out once, in order.
    let rdv = &MemRdv::default();
    let (mut to1, (mb1, l1)) = thread::scope(|s| {
        let real = s.spawn(move || establish_lazy(1, 2, rdv, &secret(), &polling(Duration::from_secs(2))));
        let me = Ident::new(0, 2, 1, PREFIX);
        let deadline = Instant::now() + Duration::from_secs(10);
        let fake = dial(1, 0, lookup(rdv, PREFIX, 1, deadline).unwrap(), &secret(), &me, deadline, None).unwrap();
        (fake, real.join().unwrap().unwrap())
    });
    let t1 = transport(1, 2, mb1, &Arc::new(l1));
    let writer = thread::spawn(move || {
        for i in 0..200u32 {
            let len = [0usize, 7, 40_000, 3][i as usize % 4];
            let payload: Vec<u8> = (0..len).map(|j| (j as u32 + i) as u8).collect();
            to1.write_all(&data_frame(9, &payload)).unwrap();
            if i % 16 == 0 {
                thread::sleep(Duration::from_millis(3));
            }
        }
        to1
    });
    for i in 0..200u32 {
        let len = [0usize, 7, 40_000, 3][i as usize % 4];
        let mut buf = vec![0u8; len];
        let got = t1.recv(0, 9, header(9).channel, None, &mut buf, Instant::now() + Duration::from_secs(10)).unwrap();
        assert_eq!(got.len, len, "frame {i}");
        assert!(buf.iter().enumerate().all(|(j, &b)| b == (j as u32 + i) as u8), "frame {i}: wrong bytes");
    }
    drop(writer.join().unwrap());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn readers_take_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400), max in 0usize..512) {
        let mb = Mailbox::new();
        let end = pump_to_end(bytes.as_slice(), 1, &mb, max);
        prop_assert!(!matches!(end, End::Failed(_)));
    }

    #[test]
    fn readers_deliver_valid_frames_in_order(
        frames in prop::collection::vec((frame::fuzz::header(), prop::collection::vec(any::<u8>(), 0..64)), 0..8),
        junk in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut bytes = Vec::new();
        for (h, p) in &frames {
            let mut h = *h;
            h.comm_id = 1;
            bytes.extend_from_slice(&frame::encode_header(FrameKind::Data, &h, p.len()));
            bytes.extend_from_slice(p);
        }
        bytes.extend_from_slice(&junk);
        let mb = Mailbox::new();
        let end = pump_to_end(bytes.as_slice(), 0, &mb, 64);
        prop_assert!(!matches!(end, End::Failed(_)));
        let deadline = Instant::now();
        for (h, p) in &frames {
            let mut buf = [0u8; 64];
            let got = mb.recv(0, 1, h.channel, Some(Stage::Collective(0)), &mut buf, deadline);
            let got = got.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(got.header.fingerprint, h.fingerprint);
            prop_assert_eq!(&buf[..got.len], &p[..]);
        }
    }
}
