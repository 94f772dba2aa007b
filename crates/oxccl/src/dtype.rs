//! Element types: the [`DType`] tag and the [`Element`] trait that maps Rust types to it.

use std::fmt;

use half::{bf16, f16};

/// The element type of a buffer, as it travels through the type-erased backend layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// Signed 8-bit integer.
    I8 = 0,
    /// Unsigned 8-bit integer.
    U8 = 1,
    /// Signed 32-bit integer.
    I32 = 2,
    /// Unsigned 32-bit integer.
    U32 = 3,
    /// Signed 64-bit integer.
    I64 = 4,
    /// Unsigned 64-bit integer.
    U64 = 5,
    /// IEEE 754 half precision (`half::f16`).
    F16 = 6,
    /// bfloat16 (`half::bf16`).
    BF16 = 7,
    /// IEEE 754 single precision.
    F32 = 8,
    /// IEEE 754 double precision.
    F64 = 9,
}

impl DType {
    /// Every dtype, in tag order.
    pub const ALL: [DType; 10] = [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The short name used in tables and environment variables (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// The dtype with wire tag `tag` (see `as u8`), if any.
    pub fn from_tag(tag: u8) -> Option<DType> {
        DType::ALL.get(tag as usize).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that oxccl can communicate: plain old data with a [`DType`] tag.
///
/// Implemented for `i8 u8 i32 u32 i64 u64 f32 f64` and `half::f16`, `half::bf16`.
/// The `bytemuck::Pod` bound lets oxccl view buffers as bytes without `unsafe`.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype tag of this type.
    const DTYPE: DType;
}

/// `with_dtype!(dtype, T => body)`: evaluates the expression `body` with the type alias `T`
/// bound to the Rust type of the [`DType`] `dtype` (`i8`, ..., [`f16`](crate::f16), `f64`): the one
/// bridge from a dtype known at run time to the typed API (a generic function `f::<T>`, a
/// typed buffer). `body` is compiled once per dtype, so it must have the same type for
/// each. It is not a closure: `?` and `return` in it act on the function that invokes the
/// macro.
///
/// ```
/// use oxccl::{DType, Element, Tensor};
///
/// fn zeros(dtype: DType, n: usize) -> oxccl::Result<Tensor> {
///     oxccl::with_dtype!(dtype, T => Tensor::from_vec(vec![T::default(); n], &[n]))
/// }
///
/// // `?` leaves `first`, not the arm.
/// fn first(t: &Tensor) -> oxccl::Result<String> {
///     Ok(oxccl::with_dtype!(t.dtype(), T => format!("{:?}", t.as_slice::<T>()?[0])))
/// }
///
/// for dtype in DType::ALL {
///     let t = zeros(dtype, 3).unwrap();
///     assert_eq!(t.dtype(), dtype);
///     assert_eq!(oxccl::with_dtype!(dtype, T => <T as Element>::DTYPE), dtype);
///     assert_eq!(oxccl::with_dtype!(dtype, T => std::mem::size_of::<T>()), dtype.size());
///     assert!(first(&t).unwrap().starts_with('0'));
/// }
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::dtype::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::dtype::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::dtype::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::dtype::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
         f16 => F16, bf16 => BF16, f32 => F32, f64 => F64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(<f16 as Element>::DTYPE.size(), std::mem::size_of::<f16>());
        assert_eq!(<bf16 as Element>::DTYPE.size(), 2);
        assert_eq!(<f64 as Element>::DTYPE.size(), 8);
        assert_eq!(<i8 as Element>::DTYPE.size(), 1);
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
            assert_eq!(DType::from_tag(d as u8), Some(d));
        }
        assert!("f128".parse::<DType>().is_err());
        assert_eq!(DType::from_tag(10), None);
    }
}
