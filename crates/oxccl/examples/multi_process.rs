//! One rank per process, as real jobs run: `oxccl::init()` joins the job its launcher
//! started, whichever launcher that is. Each rank checks its results against a sequential
//! computation and exits non-zero on any difference.
//!
//! ```sh
//! cargo build --release -p oxccl --example multi_process -p oxccl-cli
//! # under oxccl's own launcher (it sets the job secret and hosts the store):
//! target/release/oxccl run -n 4 -- target/release/examples/multi_process
//! # under torchrun (the secret is derived from torchrun's run id, with a warning):
//! torchrun --nproc-per-node 4 --no-python target/release/examples/multi_process
//! # under Open MPI, on the cpu backend (or the mpi backend when built with `--features mpi`):
//! mpirun -np 4 target/release/examples/multi_process
//! ```
//!
//! It also shows several async operations of different kinds in flight at once: inside one
//! `scope`, a broadcast of weights, an all_gather of metadata and an all_reduce of a counter
//! are started together, overlap with local work, and are waited for in any order.

use std::process::ExitCode;

use oxccl::{Communicator, ReduceOp};

fn main() -> ExitCode {
    let comm = match oxccl::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("could not join the job: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&comm) {
        Ok(summary) => {
            println!("rank {} of {} on `{}`: {summary}", comm.rank(), comm.world_size(), comm.backend());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {}: {e}", comm.rank());
            ExitCode::FAILURE
        }
    }
}

fn run(comm: &Communicator) -> Result<String, String> {
    let (rank, n) = (comm.rank(), comm.world_size());

    // Blocking: sum "gradients" over every rank.
    let len = 1000;
    let mut grads: Vec<f32> = (0..len).map(|i| (i * (rank + 1)) as f32).collect();
    comm.all_reduce(&mut grads, ReduceOp::Sum).map_err(|e| e.to_string())?;
    let ranks_sum = (n * (n + 1) / 2) as f32;
    if let Some(i) = (0..len).find(|&i| grads[i] != i as f32 * ranks_sum) {
        return Err(format!("all_reduce: element {i} is {}, expected {}", grads[i], i as f32 * ranks_sum));
    }

    // Async, several kinds at once.
    let mut weights: Vec<f64> = if rank == 0 { (0..64).map(|i| i as f64 * 0.5).collect() } else { vec![0.0; 64] };
    let meta = [rank as u32, (rank * rank) as u32];
    let mut all_meta = vec![0u32; 2 * n];
    let mut steps = [1u64];
    let busy = comm
        .scope(|s| {
            let w = s.broadcast(&mut weights, 0)?;
            let g = s.all_gather(&meta, &mut all_meta)?;
            let c = s.all_reduce(&mut steps, ReduceOp::Sum)?;
            // Local work overlaps with the three operations.
            let busy: f64 = (0..10_000).map(|i| (i as f64).sqrt()).sum();
            // Any order: the counter first, then the gather, then the weights.
            let steps = c.wait()?[0];
            let gathered = g.wait()?.to_vec();
            let first = w.wait()?[1];
            Ok((busy, steps, gathered, first))
        })
        .map_err(|e| e.to_string())?;
    let (_, steps, gathered, first) = busy;
    if steps != n as u64 {
        return Err(format!("all_reduce of 1 on every rank gave {steps}, expected {n}"));
    }
    let want: Vec<u32> = (0..n).flat_map(|r| [r as u32, (r * r) as u32]).collect();
    if gathered != want {
        return Err(format!("all_gather gave {gathered:?}, expected {want:?}"));
    }
    if first != 0.5 || weights.iter().enumerate().any(|(i, w)| *w != i as f64 * 0.5) {
        return Err("broadcast: the weights differ from rank 0's".into());
    }
    Ok(format!("all_reduce, broadcast, all_gather and a second all_reduce agree with the reference ({len} gradients)"))
}
