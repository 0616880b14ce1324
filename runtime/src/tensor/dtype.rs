//! Element types ([`DType`]) and the [`Element`] trait that ties a Rust type to one.

use crate::op::{coded, CodeError};
use serde::{Deserialize, Serialize};
use std::fmt;

pub use half::{bf16, f16};

/// The element type of a [`Tensor`](crate::Tensor), as torch names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[repr(u8)]
pub enum DType {
    /// IEEE 754 binary16 (`torch.float16`).
    F16 = 1,
    /// bfloat16 (`torch.bfloat16`).
    BF16 = 2,
    /// `torch.float32`.
    F32 = 3,
    /// `torch.float64`.
    F64 = 4,
    /// `torch.int8`.
    I8 = 5,
    /// `torch.uint8`.
    U8 = 6,
    /// `torch.int32`.
    I32 = 7,
    /// `torch.int64`.
    I64 = 8,
    /// `torch.bool`, stored as one byte that is 0 or 1.
    Bool = 9,
    /// `torch.int16`.
    I16 = 10,
    /// `torch.uint16` (torch's c10d back ends do not reduce it; collectix does: see
    /// [`crate::tensor::reduce`]).
    U16 = 11,
    /// `torch.uint32` (reduced by collectix; see [`DType::U16`]).
    U32 = 12,
    /// `torch.uint64` (reduced by collectix; see [`DType::U16`]).
    U64 = 13,
}

coded!(
    DType,
    "dtype",
    [F16, BF16, F32, F64, I8, U8, I32, I64, Bool, I16, U16, U32, U64]
);

impl DType {
    /// Every dtype, in declaration order (handy for test matrices).
    pub const ALL: [DType; 13] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Floating-point types (`torch.is_floating_point`).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Integer types (bool excluded).
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::U8
                | DType::I16
                | DType::U16
                | DType::I32
                | DType::U32
                | DType::I64
                | DType::U64
        )
    }

    /// The torch spelling, e.g. `float32`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be the element of a tensor.
///
/// Implemented for `f16`, `bf16`, `f32`, `f64`, `i8`, `u8`, `i16`, `u16`, `i32`, `u32`, `i64`,
/// `u64` and `bool`. The
/// `CheckedBitPattern` bound lets bytes from a peer be validated before they are viewed as
/// elements (only 0 and 1 are valid `bool`s).
pub trait Element:
    bytemuck::NoUninit
    + bytemuck::CheckedBitPattern
    + Copy
    + Send
    + Sync
    + PartialEq
    + fmt::Debug
    + 'static
{
    /// The dtype this type stands for.
    const DTYPE: DType;
    /// Converts from `f64`, rounding as `as` does (used by tests and the local tensor ops).
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` (exact for every type but `i64` beyond 2^53).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $d:ident, |$v:ident| $from:expr, |$s:ident| $to:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn from_f64($v: f64) -> Self {
                $from
            }
            fn to_f64(self) -> f64 {
                let $s = self;
                $to
            }
        }
    };
}

element!(f16, F16, |v| f16::from_f64(v), |s| s.to_f64());
element!(bf16, BF16, |v| bf16::from_f64(v), |s| s.to_f64());
element!(f32, F32, |v| v as f32, |s| s as f64);
element!(f64, F64, |v| v, |s| s);
element!(i8, I8, |v| v as i8, |s| s as f64);
element!(u8, U8, |v| v as u8, |s| s as f64);
element!(i32, I32, |v| v as i32, |s| s as f64);
element!(i64, I64, |v| v as i64, |s| s as f64);
element!(bool, Bool, |v| v != 0.0, |s| if s { 1.0 } else { 0.0 });
element!(i16, I16, |v| v as i16, |s| s as f64);
element!(u16, U16, |v| v as u16, |s| s as f64);
element!(u32, U32, |v| v as u32, |s| s as f64);
element!(u64, U64, |v| v as u64, |s| s as f64);

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`, with `bool` mapped to `u8`
/// (its storage type; the reduce kernels treat bool as 0/1 bytes).
#[macro_export]
#[doc(hidden)]
macro_rules! with_storage_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F16 => {
                type $T = $crate::tensor::dtype::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::tensor::dtype::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::U8 | $crate::DType::Bool => {
                type $T = u8;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DType::U16 => {
                type $T = u16;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F16.size(), std::mem::size_of::<f16>());
        assert_eq!(DType::Bool.size(), std::mem::size_of::<bool>());
        assert_eq!(DType::I64.size(), 8);
        assert!(DType::BF16.is_float() && !DType::Bool.is_integer() && DType::U8.is_integer());
    }
}
