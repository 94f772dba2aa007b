//! oxccl types to MPI types: [`DType`] to `MPI_Datatype`, [`ReduceOp`] to `MPI_Op`, and the
//! MPI user operations (`MPI_Op_create`) for what MPI has no predefined operation for.
//!
//! | dtype | data movement | Sum / Prod / Avg | Min / Max |
//! |---|---|---|---|
//! | i8 u8 | `MPI_(U)INT8_T` | user op (wrapping; Open MPI 4.1's AVX `MPI_SUM` saturates) / `MPI_PROD` | `MPI_MIN` / `MPI_MAX` |
//! | i32 u32 i64 u64 | `MPI_(U)INTn_T` | `MPI_SUM` / `MPI_PROD` | `MPI_MIN` / `MPI_MAX` |
//! | f32 f64 | `MPI_FLOAT` / `MPI_DOUBLE` | `MPI_SUM` / `MPI_PROD` | user op (minNum/maxNum: a NaN loses) |
//! | f16 bf16 | `MPI_UINT16_T` (bits) | widened to `MPI_FLOAT` (default), or a user op per [`HalfReduce`] | user op on the 16-bit values |
//!
//! `Avg` is `Sum` followed by a division by the world size on the rank(s) that get a result
//! (in f32 before the final rounding for f16/bf16, truncating toward zero for integers:
//! the same semantics as the CPU backends).

use std::ffi::{c_int, c_void};

use mpi::ffi;

use super::check::check;
use crate::config::HalfReduce;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;

/// The MPI datatype that carries `dtype`'s elements.
pub(crate) fn mpi_type(dtype: DType) -> ffi::MPI_Datatype {
    // SAFETY: reading the rsmpi shim's constants (initialised statics of the MPI library).
    unsafe {
        match dtype {
            DType::I8 => ffi::RSMPI_INT8_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::U32 => ffi::RSMPI_UINT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U64 => ffi::RSMPI_UINT64_T,
            DType::F16 | DType::BF16 => ffi::RSMPI_UINT16_T,
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
        }
    }
}

macro_rules! user_fn {
    ($name:ident, $t:ty, $op:expr) => {
        unsafe extern "C" fn $name(a: *mut c_void, b: *mut c_void, len: *mut c_int, _t: *mut ffi::MPI_Datatype) {
            // SAFETY: MPI passes `*len` elements of the datatype the operation was posted
            // with (always the type of `$t`) in `a` (in) and `b` (inout).
            unsafe {
                let n = usize::try_from(*len).unwrap_or(0);
                crate::backend::reduce::combine_unaligned::<$t>($op, a.cast_const().cast(), b.cast(), n)
            }
        }
    };
}
user_fn!(f32_min, f32, ReduceOp::Min);
user_fn!(f32_max, f32, ReduceOp::Max);
user_fn!(f64_min, f64, ReduceOp::Min);
user_fn!(f64_max, f64, ReduceOp::Max);
user_fn!(f16_min, half::f16, ReduceOp::Min);
user_fn!(f16_max, half::f16, ReduceOp::Max);
user_fn!(f16_sum, half::f16, ReduceOp::Sum);
user_fn!(f16_prod, half::f16, ReduceOp::Prod);
user_fn!(bf16_min, half::bf16, ReduceOp::Min);
user_fn!(bf16_max, half::bf16, ReduceOp::Max);
user_fn!(bf16_sum, half::bf16, ReduceOp::Sum);
user_fn!(bf16_prod, half::bf16, ReduceOp::Prod);
user_fn!(i8_sum, i8, ReduceOp::Sum);
user_fn!(u8_sum, u8, ReduceOp::Sum);

type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype);

const USER_FNS: [(DType, ReduceOp, UserFn); 14] = [
    (DType::I8, ReduceOp::Sum, i8_sum),
    (DType::U8, ReduceOp::Sum, u8_sum),
    (DType::F32, ReduceOp::Min, f32_min),
    (DType::F32, ReduceOp::Max, f32_max),
    (DType::F64, ReduceOp::Min, f64_min),
    (DType::F64, ReduceOp::Max, f64_max),
    (DType::F16, ReduceOp::Min, f16_min),
    (DType::F16, ReduceOp::Max, f16_max),
    (DType::F16, ReduceOp::Sum, f16_sum),
    (DType::F16, ReduceOp::Prod, f16_prod),
    (DType::BF16, ReduceOp::Min, bf16_min),
    (DType::BF16, ReduceOp::Max, bf16_max),
    (DType::BF16, ReduceOp::Sum, bf16_sum),
    (DType::BF16, ReduceOp::Prod, bf16_prod),
];

/// The user operations, created once after `MPI_Init` and freed before `MPI_Finalize`.
pub(crate) struct UserOps {
    ops: Vec<(DType, ReduceOp, ffi::MPI_Op)>,
}

// SAFETY: MPI_Op handles are process-wide identifiers; MPI allows using them from any thread
// (under the thread level granted, which the runtime's lock enforces).
unsafe impl Send for UserOps {}
// SAFETY: as above; the handles are only read after creation.
unsafe impl Sync for UserOps {}

impl UserOps {
    /// Creates every user operation (all commutative).
    pub(crate) fn create() -> Result<UserOps> {
        let mut ops = Vec::with_capacity(USER_FNS.len());
        for (d, o, f) in USER_FNS {
            // SAFETY: MPI_Op is a plain handle; zeroed is a valid "unset" value to overwrite.
            let mut op: ffi::MPI_Op = unsafe { std::mem::zeroed() };
            // SAFETY: `f` is an `extern "C"` function of the MPI_User_function signature.
            check(unsafe { ffi::MPI_Op_create(Some(f), 1, &mut op) }, "MPI_Op_create")?;
            ops.push((d, o, op));
        }
        Ok(UserOps { ops })
    }

    fn get(&self, d: DType, o: ReduceOp) -> Option<ffi::MPI_Op> {
        self.ops.iter().find(|(a, b, _)| *a == d && *b == o).map(|x| x.2)
    }

    /// Frees the operations (before `MPI_Finalize`).
    pub(crate) fn free(&mut self) {
        for (_, _, mut op) in self.ops.drain(..) {
            // SAFETY: `op` was created by MPI_Op_create and is not used any more.
            unsafe { ffi::MPI_Op_free(&mut op) };
        }
    }
}

/// How one reduction runs on MPI.
#[derive(Clone, Copy)]
pub(crate) struct Reduction {
    /// The datatype on the wire.
    pub ty: ffi::MPI_Datatype,
    /// The MPI operation.
    pub op: ffi::MPI_Op,
    /// f16/bf16 widened to f32 working buffers.
    pub widen: bool,
    /// `Avg`: divide by the world size afterwards.
    pub divide: bool,
}

/// The plan for reducing `dtype` with `op`.
pub(crate) fn reduction(ops: &UserOps, half: HalfReduce, dtype: DType, op: ReduceOp) -> Result<Reduction> {
    let is_half = matches!(dtype, DType::F16 | DType::BF16);
    let widen = is_half && op != ReduceOp::Min && op != ReduceOp::Max && half == HalfReduce::Widen;
    let wire = if widen { DType::F32 } else { dtype };
    let base = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
    let user = ops.get(wire, base);
    // SAFETY: reading the rsmpi shim's predefined operation constants.
    let predefined = unsafe {
        match base {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Prod => ffi::RSMPI_PROD,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
        }
    };
    let mpi_op = match (wire, base) {
        (DType::F32 | DType::F64, ReduceOp::Min | ReduceOp::Max)
        | (DType::F16 | DType::BF16, _)
        | (DType::I8 | DType::U8, ReduceOp::Sum) => {
            user.ok_or_else(|| Error::Internal(format!("no MPI user operation for {wire} {base}")))?
        }
        _ => predefined,
    };
    Ok(Reduction { ty: mpi_type(wire), op: mpi_op, widen, divide: op == ReduceOp::Avg })
}

/// Whether reducing `dtype` with `op` needs host-side work (user operations on host
/// memory, widening, the division of `Avg`).
pub(crate) fn needs_host_work(dtype: DType, op: ReduceOp) -> bool {
    op == ReduceOp::Avg
        || matches!(dtype, DType::F16 | DType::BF16)
        || (matches!(dtype, DType::I8 | DType::U8) && op == ReduceOp::Sum)
        || (matches!(dtype, DType::F32 | DType::F64) && matches!(op, ReduceOp::Min | ReduceOp::Max))
}
