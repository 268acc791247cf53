//! Element types cuDNN understands, tied to Rust types by a sealed trait.
use cudnn_safe_sys::cudnnDataType_t;
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i8 {}
    impl Sealed for u8 {}
    impl Sealed for i32 {}
}

/// A cuDNN element type, as a value (for messages, descriptors and run-time dispatch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit float (`CUDNN_DATA_FLOAT`).
    F32,
    /// 64-bit float (`CUDNN_DATA_DOUBLE`).
    F64,
    /// IEEE half (`CUDNN_DATA_HALF`).
    F16,
    /// bfloat16 (`CUDNN_DATA_BFLOAT16`).
    BF16,
    /// Signed 8-bit integer (`CUDNN_DATA_INT8`).
    I8,
    /// Unsigned 8-bit integer (`CUDNN_DATA_UINT8`).
    U8,
    /// Signed 32-bit integer (`CUDNN_DATA_INT32`).
    I32,
    /// Signed 64-bit integer (`CUDNN_DATA_INT64`): graph tensors only, such as the seed and
    /// offset of a dropout mask ([`crate::graph::Graph::rng_input`]), bound with
    /// [`crate::graph::Args::input_i64`]. Not a [`DataType`]: no legacy cuDNN call takes it.
    I64,
}

impl DType {
    pub(crate) fn raw(self) -> cudnnDataType_t {
        match self {
            DType::F32 => cudnnDataType_t::CUDNN_DATA_FLOAT,
            DType::F64 => cudnnDataType_t::CUDNN_DATA_DOUBLE,
            DType::F16 => cudnnDataType_t::CUDNN_DATA_HALF,
            DType::BF16 => cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            DType::I8 => cudnnDataType_t::CUDNN_DATA_INT8,
            DType::U8 => cudnnDataType_t::CUDNN_DATA_UINT8,
            DType::I32 => cudnnDataType_t::CUDNN_DATA_INT32,
            DType::I64 => cudnnDataType_t::CUDNN_DATA_INT64,
        }
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// Whether cuDNN reads alpha/beta for tensors of this type as `double` (only f64).
    pub fn scalar_is_f64(self) -> bool {
        self == DType::F64
    }

    /// Short name (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The host type cuDNN reads scaling factors (alpha, beta) as: `f64` for `f64` tensors, `f32` for
/// every other type, half and integer types included.
pub trait Scalar: sealed::Sealed + Copy + Send + Sync + 'static + std::fmt::Debug {
    /// Converts from `f64` (rounding as `as` does).
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64`.
    fn to_f64(self) -> f64;
}

impl Scalar for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Scalar for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
}

/// An element type cuDNN can hold in a tensor. Sealed: implemented for `f32`, `f64`,
/// [`half::f16`], [`half::bf16`], `i8`, `u8` and `i32`.
///
/// The type parameter of a descriptor and the element type of the buffer passed with it are the
/// same `T`, so a dtype mismatch between them does not compile.
pub trait DataType:
    sealed::Sealed
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Copy
    + Default
    + Send
    + Sync
    + 'static
    + std::fmt::Debug
{
    /// The cuDNN data type.
    const DTYPE: DType;
    /// How cuDNN reads alpha/beta for tensors of this type.
    type Scalar: Scalar;
    /// Converts from `f64` (rounding to nearest for floats, saturating for integers).
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` exactly.
    fn to_f64(self) -> f64;
}

macro_rules! float_dtype {
    ($t:ty, $d:expr, $s:ty, $from:expr, $to:expr) => {
        impl DataType for $t {
            const DTYPE: DType = $d;
            type Scalar = $s;
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
        }
    };
}

float_dtype!(f32, DType::F32, f32, |v: f64| v as f32, |x: f32| x as f64);
float_dtype!(f64, DType::F64, f64, |v: f64| v, |x: f64| x);
float_dtype!(f16, DType::F16, f32, f16::from_f64, f16::to_f64);
float_dtype!(bf16, DType::BF16, f32, bf16::from_f64, bf16::to_f64);
float_dtype!(i8, DType::I8, f32, |v: f64| v.round() as i8, |x: i8| x
    as f64);
float_dtype!(u8, DType::U8, f32, |v: f64| v.round() as u8, |x: u8| x
    as f64);
float_dtype!(i32, DType::I32, f32, |v: f64| v.round() as i32, |x: i32| x
    as f64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_types_follow_cudnn_rule() {
        fn is_f64<T: DataType>() -> bool {
            std::any::TypeId::of::<T::Scalar>() == std::any::TypeId::of::<f64>()
        }
        assert!(is_f64::<f64>());
        assert!(!is_f64::<f32>() && !is_f64::<f16>() && !is_f64::<bf16>());
        assert!(!is_f64::<i8>() && !is_f64::<u8>() && !is_f64::<i32>());
        for d in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I8,
            DType::U8,
            DType::I32,
            DType::I64,
        ] {
            assert_eq!(d.scalar_is_f64(), d == DType::F64);
        }
    }

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F16.size(), std::mem::size_of::<f16>());
        assert_eq!(DType::BF16.size(), std::mem::size_of::<bf16>());
        assert_eq!(DType::F64.size(), std::mem::size_of::<f64>());
        assert_eq!(DType::I64.size(), std::mem::size_of::<i64>());
        assert_eq!(<i8 as DataType>::from_f64(300.0), i8::MAX);
        assert_eq!(<u8 as DataType>::from_f64(-3.0), 0);
    }
}
