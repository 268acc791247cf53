//! Tensor layouts, tensor and filter descriptors, and the checks every launch runs on them.
//!
//! A [`Layout`] is pure arithmetic (no cuDNN needed): dimensions, strides in elements, the
//! *span* (how many elements the layout addresses: `1 + Σ (dimᵢ − 1)·strideᵢ`), and whether it is
//! safe as an output (no element addressed twice). All arithmetic is checked `i64`, and every
//! value handed to cuDNN must fit its `int`.
//!
//! A [`TensorDesc<T>`] / [`FilterDesc<T>`] owns the cuDNN descriptor built from a layout, with the
//! element type `T` in its type, so the buffer passed beside it at launch has the same dtype.
//!
//! A 3-D tensor `[N, C, W]` (and a 3-D filter `[K, C/groups, S]`) is what a user of a 1-D
//! convolution, pooling, softmax or activation has; cuDNN's legacy calls take 4 dimensions or
//! more, so its cuDNN descriptor is created as `[N, C, 1, W]` (`[K, C/groups, 1, S]`), while the
//! Rust value keeps the dims it was given ([`Layout::legacy_view`] is that 4-D view).
//!
//! [`Layout::pack`] and [`Layout::unpack`] move host data between logical row-major order
//! (`NCHW`, `NCDHW`, `NCW`) and any layout, for filling and reading device buffers.
use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;

use cudnn_safe_sys as sys;

use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::raw;

/// Most dimensions a cuDNN tensor descriptor takes (`CUDNN_DIM_MAX`).
pub const MAX_DIMS: usize = sys::CUDNN_DIM_MAX as usize;

/// cuDNN's Nd tensor descriptors take at least this many dimensions; shorter layouts are padded
/// with trailing dimensions of size 1 when the descriptor is built (which changes neither the
/// span nor the addressing). A 3-D layout is handed to cuDNN as its 4-D
/// [`legacy_view`](Layout::legacy_view).
pub const MIN_DESCRIPTOR_DIMS: usize = 3;

/// How the dimensions of a tensor are ordered in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TensorFormat {
    /// Channels first, packed: `N, C, [D,] H, W` with `W` fastest (also NCDHW).
    Nchw,
    /// Channels last, packed: `C` fastest, then `W`, `H`, `[D]`, `N` (also NDHWC).
    Nhwc,
    /// `NCHW` with channels grouped in vectors of `width` (4 or 32) elements stored
    /// contiguously: memory order `N, C/width, H, W, width`. For `i8`/`u8` only.
    NchwVectC {
        /// Vector width: 4 or 32.
        width: u8,
    },
    /// Arbitrary strides given by the caller.
    Strided,
}

impl TensorFormat {
    pub(crate) fn raw(self) -> sys::cudnnTensorFormat_t {
        match self {
            TensorFormat::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
            TensorFormat::NchwVectC { .. } => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW_VECT_C,
            TensorFormat::Nchw | TensorFormat::Strided => {
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
            }
        }
    }
}

/// Dimensions and strides of a tensor, validated.
///
/// Invariants (checked by every constructor): 1 to [`MAX_DIMS`] dimensions; every dimension and
/// stride in `1..=i32::MAX`; element count and span computed without overflow and at most
/// `i32::MAX` (the addressing limit of cuDNN's `int`-based descriptors).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    dims: Vec<i64>,
    strides: Vec<i64>,
    format: TensorFormat,
    span: i64,
    count: i64,
    /// Derived from dims and strides once, at construction: launches only read it.
    non_overlapping: bool,
}

fn to_c_int(what: &'static str, v: i64) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::Overflow {
        what,
        detail: format!("{v} does not fit cuDNN's 32-bit int"),
    })
}

fn checked_product(what: &'static str, values: &[i64]) -> Result<i64> {
    values.iter().try_fold(1i64, |acc, &d| {
        acc.checked_mul(d).ok_or_else(|| Error::Overflow {
            what,
            detail: format!("product of {values:?}"),
        })
    })
}

/// Packed row-major strides for `dims` in the given memory order (`order[0]` slowest).
fn packed_strides(dims: &[i64], order: &[usize]) -> Result<Vec<i64>> {
    let mut strides = vec![0i64; dims.len()];
    let mut acc = 1i64;
    for &axis in order.iter().rev() {
        strides[axis] = acc;
        acc = acc.checked_mul(dims[axis]).ok_or_else(|| Error::Overflow {
            what: "tensor strides",
            detail: format!("packed strides of {dims:?}"),
        })?;
    }
    Ok(strides)
}

/// The no-overlap rule of [`Layout::is_non_overlapping`], on validated dims and strides.
pub(crate) fn strides_non_overlapping(dims: &[i64], strides: &[i64]) -> bool {
    let mut axes: Vec<(i64, i64)> = dims
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (s, d))
        .collect();
    axes.sort_unstable();
    let mut extent = 1i64; // span of the dimensions seen so far
    for (s, d) in axes {
        if s < extent {
            return false;
        }
        // Cannot overflow: bounded by the validated span.
        extent += (d - 1) * s;
    }
    true
}

impl Layout {
    /// A layout with explicit strides (in elements).
    pub fn strided(dims: &[i64], strides: &[i64]) -> Result<Layout> {
        Self::validate(dims.to_vec(), strides.to_vec(), TensorFormat::Strided)
    }

    /// Packed channels-first layout for `dims = [N, C, spatial...]` (row-major; any rank 1–8).
    pub fn nchw_nd(dims: &[i64]) -> Result<Layout> {
        Self::check_dims(dims)?;
        let order: Vec<usize> = (0..dims.len()).collect();
        let strides = packed_strides(dims, &order)?;
        Self::validate(dims.to_vec(), strides, TensorFormat::Nchw)
    }

    /// Packed channels-last layout for logical `dims = [N, C, spatial...]` (rank 3–8): memory order
    /// `N, spatial..., C`.
    pub fn nhwc_nd(dims: &[i64]) -> Result<Layout> {
        Self::check_dims(dims)?;
        if dims.len() < 3 {
            return Err(Error::invalid(
                "channels-last layout",
                "at least 3 dimensions (N, C, spatial...)",
                format!("{} dimensions {dims:?}", dims.len()),
            ));
        }
        let mut order = vec![0usize];
        order.extend(2..dims.len());
        order.push(1);
        let strides = packed_strides(dims, &order)?;
        Self::validate(dims.to_vec(), strides, TensorFormat::Nhwc)
    }

    /// Packed `N, C, H, W`.
    pub fn nchw(n: i64, c: i64, h: i64, w: i64) -> Result<Layout> {
        Self::nchw_nd(&[n, c, h, w])
    }

    /// Packed `N, H, W, C` (logical dims still given as `n, c, h, w`).
    pub fn nhwc(n: i64, c: i64, h: i64, w: i64) -> Result<Layout> {
        Self::nhwc_nd(&[n, c, h, w])
    }

    /// Packed `N, C, D, H, W`.
    pub fn ncdhw(n: i64, c: i64, d: i64, h: i64, w: i64) -> Result<Layout> {
        Self::nchw_nd(&[n, c, d, h, w])
    }

    /// Packed `N, D, H, W, C` (logical dims given as `n, c, d, h, w`).
    pub fn ndhwc(n: i64, c: i64, d: i64, h: i64, w: i64) -> Result<Layout> {
        Self::nhwc_nd(&[n, c, d, h, w])
    }

    /// `NCHW_VECT_C`: logical `n, c, h, w` with `c` a multiple of `width` (4 or 32); memory order
    /// `N, C/width, H, W, width`. The strides reported are those of the logical dims where they
    /// exist (`C` gets stride 1 within a vector); span and count are of the packed buffer.
    pub fn nchw_vect_c(n: i64, c: i64, h: i64, w: i64, width: u8) -> Result<Layout> {
        let dims = [n, c, h, w];
        Self::check_dims(&dims)?;
        if width != 4 && width != 32 {
            return Err(Error::invalid("NCHW_VECT_C vector width", "4 or 32", width));
        }
        let v = i64::from(width);
        if c % v != 0 {
            return Err(Error::invalid(
                "NCHW_VECT_C channel count",
                format!("a multiple of the vector width {width}"),
                c,
            ));
        }
        // Physical [N, C/v, H, W, v] is packed: validate it, then keep the logical dims.
        let phys = [n, c / v, h, w, v];
        let ps = packed_strides(&phys, &[0, 1, 2, 3, 4])?;
        let physical = Self::validate(phys.to_vec(), ps.clone(), TensorFormat::Strided)?;
        Ok(Layout {
            dims: dims.to_vec(),
            strides: vec![ps[0], 1, ps[2], ps[3]],
            format: TensorFormat::NchwVectC { width },
            span: physical.span,
            count: physical.count,
            non_overlapping: physical.non_overlapping,
        })
    }

    fn check_dims(dims: &[i64]) -> Result<()> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(Error::invalid(
                "tensor rank",
                format!("1 to {MAX_DIMS} dimensions"),
                format!("{} dimensions", dims.len()),
            ));
        }
        for (i, &d) in dims.iter().enumerate() {
            if d < 1 {
                return Err(Error::invalid(
                    "tensor dimension",
                    "every dimension ≥ 1",
                    format!("dimension {i} = {d} in {dims:?}"),
                ));
            }
            to_c_int("tensor dimension", d)?;
        }
        Ok(())
    }

    fn validate(dims: Vec<i64>, strides: Vec<i64>, format: TensorFormat) -> Result<Layout> {
        Self::check_dims(&dims)?;
        if strides.len() != dims.len() {
            return Err(Error::invalid(
                "tensor strides",
                format!("{} strides, one per dimension", dims.len()),
                format!("{} strides {strides:?}", strides.len()),
            ));
        }
        for (i, &s) in strides.iter().enumerate() {
            if s < 1 {
                return Err(Error::invalid(
                    "tensor stride",
                    "every stride ≥ 1 (cuDNN takes no zero or negative strides)",
                    format!("stride {i} = {s} in {strides:?}"),
                ));
            }
            to_c_int("tensor stride", s)?;
        }
        let count = checked_product("tensor element count", &dims)?;
        let mut span = 1i64;
        for (&d, &s) in dims.iter().zip(&strides) {
            span = (d - 1)
                .checked_mul(s)
                .and_then(|x| span.checked_add(x))
                .ok_or_else(|| Error::Overflow {
                    what: "tensor span",
                    detail: format!("dims {dims:?}, strides {strides:?}"),
                })?;
        }
        to_c_int("tensor span (elements addressed)", span)?;
        to_c_int("tensor element count", count)?;
        let non_overlapping = strides_non_overlapping(&dims, &strides);
        Ok(Layout {
            dims,
            strides,
            format,
            span,
            count,
            non_overlapping,
        })
    }

    /// Logical dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }
    /// Strides in elements, one per logical dimension.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// The memory format.
    pub fn format(&self) -> TensorFormat {
        self.format
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    /// Number of logical elements (product of the dimensions).
    pub fn element_count(&self) -> usize {
        self.count as usize
    }
    /// Elements a buffer must hold for this layout: `1 + Σ (dimᵢ − 1)·strideᵢ`.
    pub fn span(&self) -> usize {
        self.span as usize
    }
    /// Whether the layout is packed (span equals element count and nothing overlaps).
    pub fn is_packed(&self) -> bool {
        self.span == self.count
    }

    /// Whether no element is addressed twice, so the layout may be written.
    ///
    /// Decided on the dimensions of size > 1 sorted by stride: each stride must be at least the
    /// extent (span) of all smaller-stride dimensions together. This is exact for every layout
    /// built from packed layouts by permutation, padding or slicing; an exotic interleaved
    /// layout that happens to be injective may be rejected, never the other way round.
    pub fn is_non_overlapping(&self) -> bool {
        self.non_overlapping
    }

    /// Offsets (in elements) of every logical element, in row-major logical order (the last
    /// dimension fastest, whatever the memory order): entry `i` is where the `i`-th element of
    /// logical `NCHW` (`NCDHW`, `NCW`, ...) data is stored. Allocates `element_count()`
    /// entries; [`pack`](Self::pack) and [`unpack`](Self::unpack) move data by this map.
    pub fn offsets(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.element_count());
        self.for_each_offset(|o| out.push(o as i64));
        out
    }

    /// Calls `f` with the offset of every logical element, in row-major logical order.
    fn for_each_offset(&self, mut f: impl FnMut(usize)) {
        let mut idx = vec![0i64; self.dims.len()];
        loop {
            // In range, so non-negative and below the span (a `usize`).
            f(self.offset_in_range(&idx) as usize);
            let mut axis = self.dims.len();
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                idx[axis] += 1;
                if idx[axis] < self.dims[axis] {
                    break;
                }
                idx[axis] = 0;
            }
        }
    }

    /// Stores logical row-major data (`NCHW`, `NCDHW`, `NCW`: the last dimension fastest) in
    /// this layout: a buffer of [`span`](Self::span) elements with `logical[i]` at
    /// `offsets()[i]` and every gap `T::default()` (zero for numbers), ready to copy to the
    /// device.
    ///
    /// Errors: [`Error::InvalidArgument`] when `logical` does not hold exactly
    /// [`element_count`](Self::element_count) elements; [`Error::OverlappingOutput`] for a
    /// layout that addresses some element twice (two values would share one place).
    ///
    /// ```
    /// use cudnn_safe::Layout;
    /// # fn main() -> cudnn_safe::Result<()> {
    /// // [N, C, H, W] = [1, 2, 1, 3] in NCHW order: channel 0 is 0 1 2, channel 1 is 10 11 12.
    /// let logical = [0, 1, 2, 10, 11, 12];
    /// let nhwc = Layout::nhwc(1, 2, 1, 3)?;
    /// let stored = nhwc.pack(&logical)?;
    /// assert_eq!(stored, [0, 10, 1, 11, 2, 12]);
    /// assert_eq!(nhwc.unpack(&stored)?, logical);
    ///
    /// // [N, C, W] = [1, 2, 2] with a gap after each channel: gaps are zero.
    /// let padded = Layout::strided(&[1, 2, 2], &[6, 3, 1])?;
    /// assert_eq!(padded.pack(&[1, 2, 3, 4])?, [1, 2, 0, 3, 4]);
    /// assert!(padded.pack(&[1, 2, 3]).is_err()); // three values for four elements
    /// # Ok(()) }
    /// ```
    pub fn pack<T: Copy + Default>(&self, logical: &[T]) -> Result<Vec<T>> {
        if logical.len() != self.element_count() {
            return Err(Error::invalid(
                "length of `logical` (Layout::pack)",
                format!(
                    "{} elements, the element count of dims {:?}",
                    self.element_count(),
                    self.dims
                ),
                format!("{} elements", logical.len()),
            ));
        }
        self.check_output("Layout::pack destination")?;
        let mut stored = vec![T::default(); self.span()];
        let mut values = logical.iter();
        self.for_each_offset(|o| {
            if let Some(&v) = values.next() {
                stored[o] = v;
            }
        });
        Ok(stored)
    }

    /// Reads data stored in this layout back into logical row-major order (`NCHW`, `NCDHW`,
    /// `NCW`): `element_count()` values, the `i`-th read from `stored[offsets()[i]]`. The
    /// inverse of [`pack`](Self::pack); gaps are not read, and a layout that addresses an
    /// element twice reads it twice.
    ///
    /// Errors: [`Error::BufferTooSmall`] (naming `stored`) when `stored` holds fewer than
    /// [`span`](Self::span) elements. A longer buffer is fine (its tail is not read).
    pub fn unpack<T: Copy>(&self, stored: &[T]) -> Result<Vec<T>> {
        if stored.len() < self.span() {
            return Err(Error::BufferTooSmall {
                name: "stored",
                len: stored.len(),
                required: self.span(),
            });
        }
        let mut logical = Vec::with_capacity(self.element_count());
        self.for_each_offset(|o| logical.push(stored[o]));
        Ok(logical)
    }

    /// Offset of the element at logical index `idx` (one entry per dimension, each in
    /// `0..dim`); `None` for an index of another length or outside the dimensions.
    pub fn offset_of(&self, idx: &[i64]) -> Option<i64> {
        let inside = idx.len() == self.dims.len()
            && idx
                .iter()
                .zip(&self.dims)
                .all(|(&i, &d)| (0..d).contains(&i));
        inside.then(|| self.offset_in_range(idx))
    }

    /// [`offset_of`](Self::offset_of) of an index known to lie inside the dimensions: every
    /// term is then bounded by the validated span, so nothing overflows.
    fn offset_in_range(&self, idx: &[i64]) -> i64 {
        if let TensorFormat::NchwVectC { width } = self.format {
            let v = i64::from(width);
            let (n, c, h, w) = (idx[0], idx[1], idx[2], idx[3]);
            return n * self.strides[0]
                + (c / v) * (self.dims[2] * self.dims[3] * v)
                + h * self.strides[2]
                + w * self.strides[3]
                + c % v;
        }
        idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum()
    }

    /// Errors unless an output may be written through this layout.
    pub fn check_output(&self, name: &'static str) -> Result<()> {
        if self.is_non_overlapping() {
            Ok(())
        } else {
            Err(Error::OverlappingOutput {
                name,
                dims: self.dims.clone(),
                strides: self.strides.clone(),
            })
        }
    }

    /// The layout cuDNN's legacy calls see: a 3-D `[N, C, W]` layout as `[N, C, 1, W]`, every
    /// other layout as it is. The inserted dimension has size 1, so it addresses nothing new:
    /// span, element count and every element's offset are unchanged. Its stride is `W`'s
    /// extent (`W·stride(W)`, capped at `i32::MAX`), what a packed NCHW or NHWC layout would
    /// give it, so cuDNN recognises those formats.
    pub fn legacy_view(&self) -> Layout {
        if self.dims.len() != 3 {
            return self.clone();
        }
        let (mut dims, mut strides) = (self.dims.clone(), self.strides.clone());
        // Both factors are validated to fit `int`, so the product fits `i64`.
        let h_stride = (strides[2] * dims[2]).min(i64::from(c_int::MAX));
        dims.insert(2, 1);
        strides.insert(2, h_stride);
        Layout {
            dims,
            strides,
            ..self.clone()
        }
    }

    /// The dims and strides handed to cuDNN: those of the [`legacy_view`](Self::legacy_view)
    /// (or of the layout itself with `exact`), padded with trailing 1s to
    /// [`MIN_DESCRIPTOR_DIMS`].
    fn descriptor_dims(&self, exact: bool) -> Result<(Vec<c_int>, Vec<c_int>)> {
        let view = if exact {
            self.clone()
        } else {
            self.legacy_view()
        };
        let (mut d, mut s) = (view.dims, view.strides);
        while d.len() < MIN_DESCRIPTOR_DIMS {
            d.push(1);
            s.push(1);
        }
        let d = d
            .into_iter()
            .map(|v| to_c_int("dimension", v))
            .collect::<Result<_>>()?;
        let s = s
            .into_iter()
            .map(|v| to_c_int("stride", v))
            .collect::<Result<_>>()?;
        Ok((d, s))
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} dims {:?} strides {:?}",
            self.format, self.dims, self.strides
        )
    }
}

/// A validating builder for tensor layouts and descriptors.
///
/// ```no_run
/// # fn main() -> cudnn_safe::Result<()> {
/// use cudnn_safe::{TensorBuilder, TensorDesc, TensorFormat};
/// let x: TensorDesc<f32> = TensorBuilder::default()
///     .dims(&[8, 3, 32, 32])
///     .format(TensorFormat::Nhwc)
///     .build()?;
/// assert_eq!(x.layout().strides(), &[3072, 1, 96, 3]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorBuilder {
    dims: Vec<i64>,
    strides: Option<Vec<i64>>,
    format: Option<TensorFormat>,
}

impl TensorBuilder {
    /// Logical dimensions (`N, C, spatial...` for the NCHW-family formats).
    #[must_use]
    pub fn dims(mut self, dims: &[i64]) -> Self {
        self.dims = dims.to_vec();
        self
    }
    /// Explicit strides in elements (implies [`TensorFormat::Strided`]).
    #[must_use]
    pub fn strides(mut self, strides: &[i64]) -> Self {
        self.strides = Some(strides.to_vec());
        self
    }
    /// Memory format for a packed layout (default [`TensorFormat::Nchw`]).
    #[must_use]
    pub fn format(mut self, format: TensorFormat) -> Self {
        self.format = Some(format);
        self
    }

    /// Validates and returns the layout (no cuDNN needed).
    pub fn layout(&self) -> Result<Layout> {
        match (&self.strides, self.format) {
            (Some(s), None | Some(TensorFormat::Strided)) => Layout::strided(&self.dims, s),
            (Some(_), Some(f)) => Err(Error::invalid(
                "tensor builder",
                "either explicit strides or a packed format, not both",
                format!("strides and format {f:?}"),
            )),
            (None, None | Some(TensorFormat::Nchw)) => Layout::nchw_nd(&self.dims),
            (None, Some(TensorFormat::Nhwc)) => Layout::nhwc_nd(&self.dims),
            (None, Some(TensorFormat::NchwVectC { width })) => match self.dims[..] {
                [n, c, h, w] => Layout::nchw_vect_c(n, c, h, w, width),
                _ => Err(Error::invalid(
                    "NCHW_VECT_C dimensions",
                    "4 dimensions (n, c, h, w)",
                    format!("{:?}", self.dims),
                )),
            },
            (None, Some(TensorFormat::Strided)) => Err(Error::invalid(
                "tensor builder",
                "strides for TensorFormat::Strided",
                "no strides",
            )),
        }
    }

    /// Validates the layout and creates the cuDNN descriptor.
    pub fn build<T: DataType>(&self) -> Result<TensorDesc<T>> {
        TensorDesc::new(self.layout()?)
    }
}

/// Host-side data type of a descriptor; `NCHW_VECT_C` uses cuDNN's vector types.
fn descriptor_dtype(dtype: DType, format: TensorFormat) -> Result<sys::cudnnDataType_t> {
    use sys::cudnnDataType_t as D;
    match format {
        TensorFormat::NchwVectC { width } => match (dtype, width) {
            (DType::I8, 4) => Ok(D::CUDNN_DATA_INT8x4),
            (DType::I8, 32) => Ok(D::CUDNN_DATA_INT8x32),
            (DType::U8, 4) => Ok(D::CUDNN_DATA_UINT8x4),
            _ => Err(Error::UnsupportedDataType {
                op: "NCHW_VECT_C tensor",
                detail: format!("{dtype} with vector width {width} (cuDNN has i8×4, i8×32, u8×4)"),
            }),
        },
        _ => Ok(dtype.raw()),
    }
}

/// The accessors tensor and filter descriptors share: the layout, its dims and span, cuDNN's
/// byte size (through `$size_fn`), the raw handle and the descriptor id.
macro_rules! descriptor_accessors {
    ($alias:literal, $size_fn:ident, $raw:ty) => {
        /// The layout it was built from (a filter's is packed in its format).
        pub fn layout(&self) -> &Layout {
            &self.layout
        }
        /// Logical dimensions: `[N, C, spatial...]`, or `[K, C/groups, spatial...]` for a
        /// filter.
        pub fn dims(&self) -> &[i64] {
            &self.layout.dims
        }
        /// Elements a buffer must hold (the layout's span).
        pub fn span(&self) -> usize {
            self.layout.span()
        }

        /// cuDNN's own idea of the buffer size in bytes, for cross-checks.
        #[doc(alias = $alias)]
        pub fn size_in_bytes(&self) -> Result<usize> {
            let mut n = 0usize;
            // SAFETY: live descriptor and a valid out-pointer.
            unsafe { raw::$size_fn(self.raw.lib(), self.raw.as_ptr(), &mut n) }?;
            Ok(n)
        }

        /// The raw descriptor, for calling cuDNN functions this crate does not wrap (a 3-D
        /// layout's is 4-D, see [`Layout::legacy_view`]). It stays owned by `self` and must not
        /// be destroyed or modified.
        pub fn as_raw(&self) -> $raw {
            self.raw.as_ptr()
        }

        /// Process-unique id of this descriptor.
        pub(crate) fn id(&self) -> u64 {
            self.raw.id()
        }
    };
}

/// An owned cuDNN tensor descriptor (`cudnnTensorDescriptor_t`) for elements of type `T`.
///
/// `Send` (it is plain host memory that cuDNN only reads), not `Sync`.
pub struct TensorDesc<T: DataType> {
    raw: raw::OwnedTensor,
    layout: Layout,
    _t: PhantomData<fn() -> T>,
}

impl<T: DataType> fmt::Debug for TensorDesc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorDesc<{}>({})", T::DTYPE, self.layout)
    }
}

impl<T: DataType> TensorDesc<T> {
    /// Creates the descriptor for a validated layout. A 3-D layout `[N, C, W]` is created in
    /// cuDNN as its 4-D [`legacy_view`](Layout::legacy_view) `[N, C, 1, W]`, which every legacy
    /// call (convolution, pooling, softmax, activation, element-wise, reduction) takes; the
    /// value keeps the layout given ([`dims`](Self::dims), [`span`](Self::span)).
    #[doc(alias = "cudnnCreateTensorDescriptor")]
    #[doc(alias = "cudnnSetTensorNdDescriptor")]
    #[doc(alias = "cudnnSetTensorNdDescriptorEx")]
    pub fn new(layout: Layout) -> Result<Self> {
        Self::create(layout, false)
    }

    /// A packed channels-first descriptor created in cuDNN with exactly these dims (a 3-D one
    /// stays 3-D), for the calls that require it: the RNN's hidden and cell states.
    pub(crate) fn nchw_nd_exact(dims: &[i64]) -> Result<Self> {
        Self::create(Layout::nchw_nd(dims)?, true)
    }

    fn create(layout: Layout, exact: bool) -> Result<Self> {
        let lib = raw::lib()?;
        let dtype = descriptor_dtype(T::DTYPE, layout.format)?;
        // Owned from here: dropping it destroys the descriptor if a set call fails.
        let desc = TensorDesc {
            raw: raw::OwnedTensor::new(lib)?,
            layout,
            _t: PhantomData,
        };
        let l = &desc.layout;
        if let TensorFormat::NchwVectC { .. } = l.format {
            let dims: Vec<c_int> = l.dims.iter().map(|&d| d as c_int).collect();
            // SAFETY: live descriptor; `dims` holds 4 values validated to fit `int`.
            unsafe {
                raw::cudnnSetTensorNdDescriptorEx(
                    lib,
                    desc.raw.as_ptr(),
                    l.format.raw(),
                    dtype,
                    dims.len() as c_int,
                    dims.as_ptr(),
                )
            }?;
        } else {
            let (dims, strides) = l.descriptor_dims(exact)?;
            // SAFETY: live descriptor; `dims` and `strides` have `nb_dims` (≤ 8) entries each.
            unsafe {
                raw::cudnnSetTensorNdDescriptor(
                    lib,
                    desc.raw.as_ptr(),
                    dtype,
                    dims.len() as c_int,
                    dims.as_ptr(),
                    strides.as_ptr(),
                )
            }?;
        }
        Ok(desc)
    }

    /// Packed NCHW descriptor.
    pub fn nchw(n: i64, c: i64, h: i64, w: i64) -> Result<Self> {
        Self::new(Layout::nchw(n, c, h, w)?)
    }
    /// Packed NHWC descriptor (logical dims `n, c, h, w`).
    pub fn nhwc(n: i64, c: i64, h: i64, w: i64) -> Result<Self> {
        Self::new(Layout::nhwc(n, c, h, w)?)
    }
    /// Packed channels-first descriptor of any rank 3–8 (`[N, C, spatial...]`).
    pub fn nchw_nd(dims: &[i64]) -> Result<Self> {
        Self::new(Layout::nchw_nd(dims)?)
    }
    /// Packed channels-last descriptor of any rank 3–8 (logical dims `[N, C, spatial...]`).
    pub fn nhwc_nd(dims: &[i64]) -> Result<Self> {
        Self::new(Layout::nhwc_nd(dims)?)
    }
    /// Descriptor with explicit strides.
    pub fn strided(dims: &[i64], strides: &[i64]) -> Result<Self> {
        Self::new(Layout::strided(dims, strides)?)
    }

    descriptor_accessors!(
        "cudnnGetTensorSizeInBytes",
        cudnnGetTensorSizeInBytes,
        sys::cudnnTensorDescriptor_t
    );
}

/// An owned cuDNN filter descriptor (`cudnnFilterDescriptor_t`): convolution weights
/// `[K, C/groups, spatial...]`, packed, in channels-first (`KCRS`) or channels-last (`KRSC`)
/// order.
pub struct FilterDesc<T: DataType> {
    raw: raw::OwnedFilter,
    layout: Layout,
    _t: PhantomData<fn() -> T>,
}

impl<T: DataType> fmt::Debug for FilterDesc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FilterDesc<{}>({})", T::DTYPE, self.layout)
    }
}

impl<T: DataType> FilterDesc<T> {
    /// Creates a filter descriptor for `dims = [K, C, spatial...]` (3 to 8 dimensions) in
    /// `format` ([`TensorFormat::Nchw`], [`TensorFormat::Nhwc`] or `NchwVectC`).
    ///
    /// A 3-D filter `[K, C/groups, S]` (a 1-D convolution's) is created in cuDNN as
    /// `[K, C/groups, 1, S]`; the value keeps the dims given.
    #[doc(alias = "cudnnCreateFilterDescriptor")]
    #[doc(alias = "cudnnSetFilterNdDescriptor")]
    pub fn new(dims: &[i64], format: TensorFormat) -> Result<Self> {
        if dims.len() < 3 {
            return Err(Error::invalid(
                "filter rank",
                "3 to 8 dimensions (K, C, spatial...)",
                format!("{} dimensions {dims:?}", dims.len()),
            ));
        }
        let layout = match format {
            TensorFormat::Nchw => Layout::nchw_nd(dims)?,
            TensorFormat::Nhwc => Layout::nhwc_nd(dims)?,
            TensorFormat::NchwVectC { width } => match dims {
                &[k, c, h, w] => Layout::nchw_vect_c(k, c, h, w, width)?,
                _ => {
                    return Err(Error::invalid(
                        "NCHW_VECT_C filter",
                        "4 dimensions",
                        format!("{dims:?}"),
                    ))
                }
            },
            TensorFormat::Strided => {
                return Err(Error::invalid(
                    "filter format",
                    "Nchw, Nhwc or NchwVectC (filters are packed)",
                    "Strided",
                ))
            }
        };
        let lib = raw::lib()?;
        let dtype = descriptor_dtype(T::DTYPE, format)?;
        let desc = FilterDesc {
            raw: raw::OwnedFilter::new(lib)?,
            layout,
            _t: PhantomData,
        };
        let mut cdims: Vec<c_int> = dims.iter().map(|&d| d as c_int).collect();
        if cdims.len() == 3 {
            cdims.insert(2, 1);
        }
        // SAFETY: live descriptor; `cdims` has `nb_dims` entries validated to fit `int`.
        unsafe {
            raw::cudnnSetFilterNdDescriptor(
                lib,
                desc.raw.as_ptr(),
                dtype,
                format.raw(),
                cdims.len() as c_int,
                cdims.as_ptr(),
            )
        }?;
        Ok(desc)
    }

    descriptor_accessors!(
        "cudnnGetFilterSizeInBytes",
        cudnnGetFilterSizeInBytes,
        sys::cudnnFilterDescriptor_t
    );

    /// The memory format the filter was declared with.
    pub fn format(&self) -> TensorFormat {
        self.layout.format
    }
}
