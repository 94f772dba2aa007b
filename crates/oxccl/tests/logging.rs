//! oxccl logs through `tracing`: an application with its own subscriber (set before any
//! communicator) sees oxccl's events there, by oxccl's targets, and oxccl installs no
//! subscriber of its own. A test binary of its own: the subscriber is process-wide.

use std::sync::{Arc, Mutex};

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn an_applications_subscriber_sees_the_selectors_decisions() {
    let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = Arc::clone(&buf);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("oxccl::cpu::selector=debug"))
        .with_writer(move || Sink(Arc::clone(&sink)))
        .with_ansi(false)
        .init();
    oxccl::local::run(2, |c| {
        let mut v = vec![1.0f32; 1 << 18];
        c.all_reduce(&mut v[..], oxccl::ReduceOp::Sum).unwrap();
    })
    .unwrap();
    let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
    assert!(text.contains("DEBUG oxccl::cpu::selector") && text.contains("all_reduce on 2 ranks"), "{text}");
}
