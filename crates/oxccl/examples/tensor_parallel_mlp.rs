//! Megatron-style tensor parallelism of a 2-layer MLP over 4 ranks, checked against the same
//! MLP computed on one rank without communication.
//!
//! The model is `y = relu(x W1 + b1) W2 + b2` with the loss `L = 0.5 * sum((y - t)^2)`.
//!
//! * Layer 1 is column-parallel: rank r holds the columns `W1[:, shard_r]` and `b1[shard_r]`
//!   and computes its slice of the hidden activation `h[:, shard_r]` with no communication.
//! * Layer 2 is row-parallel: rank r holds the rows `W2[shard_r, :]`, so `h[:, shard_r] W2_r`
//!   is a partial sum of `y`; one all_reduce(Sum) completes it, and `b2` is added once.
//! * Backward mirrors it: `dW2_r`, `dW1_r`, `db1_r` stay sharded, `db2` is replicated, and the
//!   input gradient `dx = dz W1^T` is again a sum of per-shard partials (one all_reduce).
//!
//! So one step costs exactly two all_reduces of `[batch, features]` tensors. For the check,
//! the sharded hidden activation and weight gradients are reassembled with
//! `all_gather_tensor` along their sharded dimension.
//!
//! Run with `cargo run -p oxccl --example tensor_parallel_mlp`.

use std::process::ExitCode;
use std::time::Instant;

use oxccl::{Communicator, Error, ReduceOp, Result, Tensor};

const RANKS: usize = 4;
const BATCH: usize = 8;
const IN: usize = 16;
const HIDDEN: usize = 32;
const OUT: usize = 16;
const SEED: u64 = 0x0123_4567_89ab_cdef;
/// Allowed error, relative to the largest magnitude of the reference value (at least 1).
const TOLERANCE: f32 = 1e-4;

// ---- deterministic data ------------------------------------------------------------------

/// SplitMix64: a tiny deterministic generator, so every rank draws the same numbers.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-scale, scale).
    fn uniform(&mut self, scale: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        (2.0 * unit - 1.0) * scale
    }

    fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(scale)).collect()
    }
}

/// The full (unsharded) model and one batch, all row-major.
struct Problem {
    w1: Vec<f32>, // [IN, HIDDEN]
    b1: Vec<f32>, // [HIDDEN]
    w2: Vec<f32>, // [HIDDEN, OUT]
    b2: Vec<f32>, // [OUT]
    x: Vec<f32>,  // [BATCH, IN]
    t: Vec<f32>,  // [BATCH, OUT]
}

impl Problem {
    fn generate(seed: u64) -> Problem {
        let mut rng = Rng(seed);
        Problem {
            w1: rng.vec(IN * HIDDEN, 1.0 / (IN as f32).sqrt()),
            b1: rng.vec(HIDDEN, 0.1),
            w2: rng.vec(HIDDEN * OUT, 1.0 / (HIDDEN as f32).sqrt()),
            b2: rng.vec(OUT, 0.1),
            x: rng.vec(BATCH * IN, 1.0),
            t: rng.vec(BATCH * OUT, 1.0),
        }
    }
}

// ---- plain-loop matrix math (row-major) ---------------------------------------------------

/// `a[m, k] · b[k, n]`.
fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let aip = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += aip * b[p * n + j];
            }
        }
    }
    c
}

/// `a[k, m]ᵀ · b[k, n]` → `[m, n]`.
fn matmul_tn(a: &[f32], b: &[f32], k: usize, m: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for p in 0..k {
        for i in 0..m {
            let api = a[p * m + i];
            for j in 0..n {
                c[i * n + j] += api * b[p * n + j];
            }
        }
    }
    c
}

/// `a[m, k] · b[n, k]ᵀ` → `[m, n]`.
fn matmul_nt(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
        }
    }
    c
}

/// Adds `bias[n]` to every row of `a[_, n]`.
fn add_rows(a: &mut [f32], bias: &[f32]) {
    for row in a.chunks_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// The sum over rows of `a[_, n]` → `[n]`.
fn column_sums(a: &[f32], n: usize) -> Vec<f32> {
    let mut s = vec![0.0; n];
    for row in a.chunks(n) {
        for (acc, v) in s.iter_mut().zip(row) {
            *acc += v;
        }
    }
    s
}

/// Everything the check compares: the forward output and loss, the hidden activation, and
/// every gradient (all unsharded).
struct Results {
    y: Vec<f32>,
    loss: f32,
    h: Vec<f32>,
    dw1: Vec<f32>,
    db1: Vec<f32>,
    dw2: Vec<f32>,
    db2: Vec<f32>,
    dx: Vec<f32>,
}

/// `dy = y - t` and `L = 0.5 * sum(dy^2)`.
fn loss_and_grad(y: &[f32], t: &[f32]) -> (f32, Vec<f32>) {
    let dy: Vec<f32> = y.iter().zip(t).map(|(a, b)| a - b).collect();
    (0.5 * dy.iter().map(|d| d * d).sum::<f32>(), dy)
}

// ---- the reference: one rank, no communication -------------------------------------------

fn reference(p: &Problem) -> Results {
    let mut z = matmul(&p.x, &p.w1, BATCH, IN, HIDDEN);
    add_rows(&mut z, &p.b1);
    let h: Vec<f32> = z.iter().map(|v| v.max(0.0)).collect();
    let mut y = matmul(&h, &p.w2, BATCH, HIDDEN, OUT);
    add_rows(&mut y, &p.b2);
    let (loss, dy) = loss_and_grad(&y, &p.t);

    let db2 = column_sums(&dy, OUT);
    let dw2 = matmul_tn(&h, &dy, BATCH, HIDDEN, OUT);
    let dh = matmul_nt(&dy, &p.w2, BATCH, OUT, HIDDEN);
    let dz: Vec<f32> = dh.iter().zip(&z).map(|(g, z)| if *z > 0.0 { *g } else { 0.0 }).collect();
    let dw1 = matmul_tn(&p.x, &dz, BATCH, IN, HIDDEN);
    let db1 = column_sums(&dz, HIDDEN);
    let dx = matmul_nt(&dz, &p.w1, BATCH, HIDDEN, IN);
    Results { y, loss, h, dw1, db1, dw2, db2, dx }
}

// ---- the tensor-parallel version: one call per rank --------------------------------------

fn tensor_parallel(comm: &Communicator) -> Result<Results> {
    let (rank, tp) = (comm.rank(), comm.world_size());
    if !HIDDEN.is_multiple_of(tp) {
        return Err(Error::invalid(format!("the hidden size {HIDDEN} does not divide by {tp} ranks")));
    }
    let hs = HIDDEN / tp; // this rank's hidden shard: columns rank*hs .. (rank+1)*hs

    // Every rank generates the same full weights and keeps only its shard.
    let full = Problem::generate(SEED);
    let w1 = Tensor::from_vec(full.w1, &[IN, HIDDEN])?.narrow(1, rank * hs, hs)?; // [IN, hs]
    let b1 = Tensor::from_vec(full.b1, &[HIDDEN])?.narrow(0, rank * hs, hs)?; // [hs]
    let w2 = Tensor::from_vec(full.w2, &[HIDDEN, OUT])?.narrow(0, rank * hs, hs)?; // [hs, OUT]
    let b2 = full.b2; // replicated
    let (w1, b1, w2) = (w1.as_slice::<f32>()?, b1.as_slice::<f32>()?, w2.as_slice::<f32>()?);

    // The batch is loaded by rank 0 and broadcast to the group (every TP rank needs all of x).
    let mut x = if rank == 0 {
        Tensor::from_vec(full.x, &[BATCH, IN])?
    } else {
        Tensor::zeros(&[BATCH, IN], oxccl::DType::F32)?
    };
    comm.broadcast_tensor(&mut x, 0)?;
    let x = x.as_slice::<f32>()?;

    // Forward. Layer 1, column-parallel: this rank's hidden columns, no communication.
    let mut z = matmul(x, w1, BATCH, IN, hs);
    add_rows(&mut z, b1);
    let h: Vec<f32> = z.iter().map(|v| v.max(0.0)).collect();
    // Layer 2, row-parallel: a partial sum of y over this rank's hidden rows; all_reduce it.
    let mut y = Tensor::from_vec(matmul(&h, w2, BATCH, hs, OUT), &[BATCH, OUT])?;
    comm.all_reduce_tensor(&mut y, ReduceOp::Sum)?;
    let mut y = y.to_vec::<f32>()?;
    add_rows(&mut y, &b2); // once, after the reduction
    let (loss, dy) = loss_and_grad(&y, &full.t);

    // Backward. dy is replicated, so db2 is too and the layer-2 gradients are local.
    let db2 = column_sums(&dy, OUT);
    let dw2 = matmul_tn(&h, &dy, BATCH, hs, OUT); // [hs, OUT] = W2's shard
    let dh = matmul_nt(&dy, w2, BATCH, OUT, hs); // [BATCH, hs]: only this rank's columns
    let dz: Vec<f32> = dh.iter().zip(&z).map(|(g, z)| if *z > 0.0 { *g } else { 0.0 }).collect();
    let dw1 = matmul_tn(x, &dz, BATCH, IN, hs); // [IN, hs] = W1's shard
    let db1 = column_sums(&dz, hs);
    // dx = dz W1ᵀ sums over the hidden dimension, which is sharded: all_reduce the partials.
    let mut dx = Tensor::from_vec(matmul_nt(&dz, w1, BATCH, hs, IN), &[BATCH, IN])?;
    comm.all_reduce_tensor(&mut dx, ReduceOp::Sum)?;

    // Reassemble the sharded tensors along their sharded dimension for the check.
    let gather = |v: Vec<f32>, shape: &[usize], dim: usize| -> Result<Vec<f32>> {
        comm.all_gather_tensor(&Tensor::from_vec(v, shape)?, dim)?.to_vec::<f32>()
    };
    Ok(Results {
        y,
        loss,
        h: gather(h, &[BATCH, hs], 1)?,
        dw1: gather(dw1, &[IN, hs], 1)?,
        db1: gather(db1, &[hs], 0)?,
        dw2: gather(dw2, &[hs, OUT], 0)?,
        db2,
        dx: dx.to_vec::<f32>()?,
    })
}

// ---- the check ---------------------------------------------------------------------------

/// `(max |got - want|, allowed)` where `allowed = TOLERANCE * max(1, max |want|)`.
fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let allowed = TOLERANCE * scale;
    if got.len() != want.len() {
        return (f32::INFINITY, allowed);
    }
    // A NaN anywhere must fail the check (f32::max would skip it).
    if got.iter().any(|v| v.is_nan()) {
        return (f32::NAN, allowed);
    }
    (got.iter().zip(want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs())), allowed)
}

fn main() -> ExitCode {
    let start = Instant::now();
    let want = reference(&Problem::generate(SEED));
    let per_rank = match oxccl::local::run(RANKS, |comm| tensor_parallel(&comm)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: could not start the local world: {e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = start.elapsed();

    println!("tensor-parallel MLP  y = relu(x W1 + b1) W2 + b2,  L = 0.5 * sum((y - t)^2)");
    println!(
        "  {RANKS} ranks (local backend), batch {BATCH}, in {IN}, hidden {HIDDEN} ({} per rank), out {OUT}, f32",
        HIDDEN / RANKS
    );
    println!("  layer 1 column-parallel (W1[:, shard], b1[shard]), layer 2 row-parallel (W2[shard, :])");
    println!("  per step: 1 broadcast (x), 2 all_reduce (y, dx); check: 4 all_gather_tensor (h, dW1, db1, dW2)");
    println!();

    let mut failed = false;
    let mut results = Vec::with_capacity(RANKS);
    for (rank, r) in per_rank.into_iter().enumerate() {
        match r {
            Ok(r) => results.push(r),
            Err(e) => {
                eprintln!("error: rank {rank} failed: {e}");
                failed = true;
            }
        }
    }
    if failed {
        return ExitCode::FAILURE;
    }

    type Field = fn(&Results) -> &[f32];
    let loss_of: Field = |r| std::slice::from_ref(&r.loss);
    let fields: [(&str, String, Field); 8] = [
        ("y", format!("[{BATCH}, {OUT}]"), |r| &r.y),
        ("loss", "scalar".into(), loss_of),
        ("h", format!("[{BATCH}, {HIDDEN}]"), |r| &r.h),
        ("dW1", format!("[{IN}, {HIDDEN}]"), |r| &r.dw1),
        ("db1", format!("[{HIDDEN}]"), |r| &r.db1),
        ("dW2", format!("[{HIDDEN}, {OUT}]"), |r| &r.dw2),
        ("db2", format!("[{OUT}]"), |r| &r.db2),
        ("dx", format!("[{BATCH}, {IN}]"), |r| &r.dx),
    ];
    println!("  {:<5} {:<9} {:>14} {:>12}  result", "value", "shape", "max abs error", "allowed");
    for (name, shape, get) in fields {
        // The worst rank: every rank holds the full (replicated or reassembled) value.
        let (mut err, mut allowed) = (0.0f32, 0.0f32);
        for r in &results {
            let (e, a) = compare(get(r), get(&want));
            if e.is_nan() || e > err {
                err = e;
            }
            allowed = a;
        }
        let ok = err <= allowed; // false for NaN
        failed |= !ok;
        println!("  {name:<5} {shape:<9} {err:>14.3e} {allowed:>12.1e}  {}", if ok { "ok" } else { "MISMATCH" });
    }
    println!();
    println!("  loss = {:.6} (reference {:.6}), {:.1} ms", results[0].loss, want.loss, elapsed.as_secs_f64() * 1e3);
    if failed {
        eprintln!(
            "error: the tensor-parallel results differ from the single-rank reference by more than \
             {TOLERANCE:e} (relative); see MISMATCH above"
        );
        return ExitCode::FAILURE;
    }
    println!("OK: the tensor-parallel forward and backward match the single-rank reference on all {RANKS} ranks");
    ExitCode::SUCCESS
}
