//! The vocabulary read from text: [`FromStr`] for [`DType`], [`ReduceOp`] and [`Algorithm`],
//! each error listing the accepted names. Settings, the CLI and the Python package parse here.

use std::str::FromStr;

use crate::algorithm::Algorithm;
use crate::dtype::DType;
use crate::error::Error;
use crate::reduce_op::ReduceOp;

impl FromStr for DType {
    type Err = Error;

    /// Parses `f32`, `float32`, `float`, `bf16`, `half`, `int32`, ... (case-insensitive).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] listing the accepted names.
    fn from_str(s: &str) -> Result<Self, Error> {
        let d = match s.to_ascii_lowercase().as_str() {
            "i8" | "int8" | "char" => DType::I8,
            "u8" | "uint8" => DType::U8,
            "i32" | "int32" | "int" => DType::I32,
            "u32" | "uint32" => DType::U32,
            "i64" | "int64" | "long" => DType::I64,
            "u64" | "uint64" => DType::U64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            _ => {
                return Err(Error::invalid(format!(
                    "unknown dtype `{s}`; expected one of i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64"
                )))
            }
        };
        Ok(d)
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    /// Parses `sum`, `prod`, `min`, `max`, `avg` (case-insensitive).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] listing the accepted names.
    fn from_str(s: &str) -> Result<Self, Error> {
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::invalid(format!("unknown reduce op `{s}`; expected sum, prod, min, max or avg")))
    }
}

impl FromStr for Algorithm {
    type Err = Error;

    /// Parses an algorithm name (case-insensitive; `-` and `_` are interchangeable;
    /// `tree` is accepted for `binomial_tree`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] listing the accepted names.
    fn from_str(s: &str) -> Result<Self, Error> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        if norm == "tree" {
            return Ok(Algorithm::BinomialTree);
        }
        if norm == "shm" {
            return Ok(Algorithm::SharedMemory);
        }
        Algorithm::ALL.into_iter().find(|a| a.name() == norm).ok_or_else(|| {
            let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            Error::invalid(format!("unknown algorithm `{s}`; expected one of {}", names.join(", ")))
        })
    }
}
