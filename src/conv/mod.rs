//! Convolution: the descriptor, the algorithm enums and perf records, and (in `ops`) the checked
//! forward, backward-data, backward-filter, backward-bias and fused conv+bias+activation calls;
//! (in `transpose`) the transposed convolution, [`Cudnn::conv_transpose`], for every output
//! padding PyTorch accepts.
//!
//! Three ways to choose an algorithm, as in cuDNN itself:
//! * heuristic — [`Cudnn::conv_forward_heuristics`] (and the backward ones): cuDNN's ranked
//!   list from `cudnnGetConvolution*Algorithm_v7`, nothing is run;
//! * benchmark — [`Cudnn::conv_forward_find`]: every algorithm run and timed
//!   (`cudnnFindConvolution*AlgorithmEx`);
//! * manual — pass any [`ConvFwdAlgo`] to [`Cudnn::conv_forward`]; an algorithm that does not
//!   support the case is reported by cuDNN's workspace query before anything is enqueued.
//!
//! [`crate::Autotuner`] wraps the three into policies with a persistent cache.
//!
//! ```no_run
//! use cudnn_safe::{conv::{ConvDesc, ConvFwdAlgo}, cuda_context, Cudnn, FilterDesc, TensorDesc,
//!                  TensorFormat, Workspace};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let x_d = TensorDesc::<f32>::nchw(8, 16, 32, 32)?;
//! let w_d = FilterDesc::<f32>::new(&[32, 16, 3, 3], TensorFormat::Nchw)?;
//! let conv = ConvDesc::builder(2).pads(&[1, 1]).build::<f32>()?;
//! let y_d = TensorDesc::<f32>::nchw_nd(&conv.output_dims(x_d.dims(), w_d.dims())?)?;
//! let x = stream.clone_htod(&vec![0.5f32; x_d.span()]).unwrap();
//! let w = stream.clone_htod(&vec![0.1f32; w_d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
//! let mut ws = Workspace::new(stream.clone());
//! cudnn.conv_forward(1.0, &x_d, &x, &w_d, &w, &conv, ConvFwdAlgo::ImplicitGemm, &mut ws,
//!                    0.0, &y_d, &mut y)?;
//! # Ok(()) }
//! ```
use std::ffi::c_int;
use std::fmt;

use cudnn_safe_sys as sys;

use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::handle::Cudnn;
use crate::raw;

mod ops;
mod transpose;

/// Whether the filter is flipped (true convolution) or not (cross-correlation, what deep-learning
/// frameworks call convolution).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum ConvMode {
    /// No flip: `y[i] = Σ x[i + k]·w[k]` (PyTorch's `conv2d`). The default.
    #[default]
    CrossCorrelation,
    /// The filter is flipped: `y[i] = Σ x[i + k]·w[K − 1 − k]`.
    Convolution,
}

impl ConvMode {
    fn raw(self) -> sys::cudnnConvolutionMode_t {
        match self {
            ConvMode::Convolution => sys::cudnnConvolutionMode_t::CUDNN_CONVOLUTION,
            ConvMode::CrossCorrelation => sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
        }
    }
}

/// Which arithmetic cuDNN may use (`cudnnMathType_t`).
///
/// For f32 data, [`MathType::Fma`] is strict fp32 (PyTorch's `allow_tf32 = False`) and
/// [`MathType::Default`] lets cuDNN use TF32 tensor cores (`allow_tf32 = True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MathType {
    /// cuDNN's default: tensor cores where the data type allows (TF32 for f32 on sm_80+).
    #[default]
    Default,
    /// Tensor-core math.
    TensorOp,
    /// Tensor-core math, allowing down-conversion of f32 data to f16/bf16.
    TensorOpAllowConversion,
    /// Plain FMA arithmetic: no tensor cores, strict fp32 for f32 data.
    Fma,
}

impl MathType {
    pub(crate) fn raw(self) -> sys::cudnnMathType_t {
        match self {
            MathType::Default => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            MathType::TensorOp => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            MathType::TensorOpAllowConversion => {
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
            }
            MathType::Fma => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        }
    }
    pub(crate) fn from_raw(raw: sys::cudnnMathType_t) -> Option<Self> {
        Some(match raw.0 {
            0 => MathType::Default,
            1 => MathType::TensorOp,
            2 => MathType::TensorOpAllowConversion,
            3 => MathType::Fma,
            _ => return None,
        })
    }
    /// Short name (`"default"`, `"tensor-op"`, `"tensor-op-conv"`, `"fma"`).
    pub fn name(self) -> &'static str {
        match self {
            MathType::Default => "default",
            MathType::TensorOp => "tensor-op",
            MathType::TensorOpAllowConversion => "tensor-op-conv",
            MathType::Fma => "fma",
        }
    }
}

/// Builder for a [`ConvDesc`]: spatial rank, padding, stride, dilation, groups, mode, math and
/// compute type. Plain data; [`ConvBuilder::build`] validates.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct ConvBuilder {
    spatial: usize,
    pads: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    groups: i64,
    mode: ConvMode,
    math: MathType,
    compute: Option<DType>,
}

impl ConvBuilder {
    /// Symmetric zero padding per spatial dimension (default 0).
    pub fn pads(mut self, pads: &[i64]) -> Self {
        self.pads = pads.to_vec();
        self
    }
    /// Filter strides per spatial dimension (default 1).
    pub fn strides(mut self, strides: &[i64]) -> Self {
        self.strides = strides.to_vec();
        self
    }
    /// Dilations per spatial dimension (default 1).
    pub fn dilations(mut self, dilations: &[i64]) -> Self {
        self.dilations = dilations.to_vec();
        self
    }
    /// Group count (default 1; equal to the input channels for a depthwise convolution).
    pub fn groups(mut self, groups: i64) -> Self {
        self.groups = groups;
        self
    }
    /// Cross-correlation (default) or convolution.
    pub fn mode(mut self, mode: ConvMode) -> Self {
        self.mode = mode;
        self
    }
    /// Math type (default [`MathType::Default`]).
    pub fn math(mut self, math: MathType) -> Self {
        self.math = math;
        self
    }
    /// Accumulation type. Without it, [`build`](Self::build) uses the usual one for the data type
    /// `T`: f64 for f64, i32 for i8/u8, f32 otherwise (f16 may also accumulate in f16).
    pub fn compute(mut self, compute: DType) -> Self {
        self.compute = Some(compute);
        self
    }

    /// Validates and creates the descriptor for data of type `T` (which picks the default
    /// compute type).
    #[doc(alias = "cudnnCreateConvolutionDescriptor")]
    #[doc(alias = "cudnnSetConvolutionNdDescriptor")]
    #[doc(alias = "cudnnSetConvolutionMathType")]
    #[doc(alias = "cudnnSetConvolutionGroupCount")]
    pub fn build<T: DataType>(&self) -> Result<ConvDesc> {
        let n = self.spatial;
        if !(1..=3).contains(&n) {
            return Err(Error::invalid(
                "convolution spatial rank",
                "1, 2 or 3",
                n.to_string(),
            ));
        }
        let fill = |v: &[i64], what: &'static str, default: i64, min: i64| -> Result<Vec<i64>> {
            let v = if v.is_empty() {
                vec![default; n]
            } else {
                v.to_vec()
            };
            if v.len() != n {
                return Err(Error::invalid(
                    what,
                    format!("{n} values (one per spatial dimension)"),
                    format!("{v:?}"),
                ));
            }
            if let Some(bad) = v.iter().find(|&&x| x < min || x > i64::from(c_int::MAX)) {
                return Err(Error::invalid(
                    what,
                    format!("values in {min}..=2147483647"),
                    format!("{bad} in {v:?}"),
                ));
            }
            Ok(v)
        };
        let pads = fill(&self.pads, "convolution padding", 0, 0)?;
        let strides = fill(&self.strides, "convolution stride", 1, 1)?;
        let dilations = fill(&self.dilations, "convolution dilation", 1, 1)?;
        if self.groups < 1 || self.groups > i64::from(c_int::MAX) {
            return Err(Error::invalid(
                "convolution groups",
                "at least 1",
                self.groups.to_string(),
            ));
        }
        let compute = self.compute.unwrap_or(match T::DTYPE {
            DType::F64 => DType::F64,
            DType::I8 | DType::U8 | DType::I32 => DType::I32,
            _ => DType::F32,
        });
        if !matches!(compute, DType::F32 | DType::F64 | DType::F16 | DType::I32) {
            return Err(Error::UnsupportedDataType {
                op: "convolution compute type",
                detail: format!("{compute} (cuDNN accumulates in f32, f64, f16 or i32)"),
            });
        }
        // cuDNN's legacy convolution needs 4-D or 5-D tensors: a 1-D convolution runs as a 2-D
        // one over a height of 1, exactly as PyTorch does it.
        let (cp, cs, cd) = if n == 1 {
            (vec![0, pads[0]], vec![1, strides[0]], vec![1, dilations[0]])
        } else {
            (pads.clone(), strides.clone(), dilations.clone())
        };
        let lib = raw::lib()?;
        let desc = raw::OwnedConv::new(lib)?;
        let to_c = |v: &[i64]| v.iter().map(|&x| x as c_int).collect::<Vec<c_int>>();
        let (p, s, d) = (to_c(&cp), to_c(&cs), to_c(&cd));
        // SAFETY: live descriptor; the three arrays hold `array_length` values each, validated to
        // fit `int`.
        unsafe {
            raw::cudnnSetConvolutionNdDescriptor(
                lib,
                desc.as_ptr(),
                p.len() as c_int,
                p.as_ptr(),
                s.as_ptr(),
                d.as_ptr(),
                self.mode.raw(),
                compute.raw(),
            )
        }?;
        // SAFETY: live descriptor; a valid enum value.
        unsafe { raw::cudnnSetConvolutionMathType(lib, desc.as_ptr(), self.math.raw()) }?;
        // SAFETY: live descriptor; groups validated to fit `int`.
        unsafe { raw::cudnnSetConvolutionGroupCount(lib, desc.as_ptr(), self.groups as c_int) }?;
        Ok(ConvDesc {
            raw: desc,
            spatial: n,
            pads: cp,
            strides: cs,
            dilations: cd,
            groups: self.groups,
            mode: self.mode,
            math: self.math,
            compute,
        })
    }
}

/// An owned convolution descriptor (`cudnnConvolutionDescriptor_t`) with its parameters.
///
/// Immutable once built; `Send`. Build one with [`ConvDesc::builder`].
pub struct ConvDesc {
    raw: raw::OwnedConv,
    spatial: usize,
    // As handed to cuDNN (a 1-D convolution is stored as 2-D with a unit height).
    pads: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    groups: i64,
    mode: ConvMode,
    math: MathType,
    compute: DType,
}

impl fmt::Debug for ConvDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConvDesc")
            .field("spatial", &self.spatial)
            .field("pads", &self.pads)
            .field("strides", &self.strides)
            .field("dilations", &self.dilations)
            .field("groups", &self.groups)
            .field("mode", &self.mode)
            .field("math", &self.math)
            .field("compute", &self.compute)
            .finish()
    }
}

impl ConvDesc {
    /// A builder for a convolution over `spatial` (1, 2 or 3) dimensions, with no padding, unit
    /// strides and dilations, one group, cross-correlation and default math.
    ///
    /// A 1-D convolution takes `[N, C, W]` tensors with `[K, C/groups, S]` filters (or the same
    /// with a unit height, `[N, C, 1, W]` and `[K, C/groups, 1, S]`): cuDNN runs it as a 2-D
    /// convolution over a height of 1, with padding 0, stride 1 and dilation 1 in that height.
    pub fn builder(spatial: usize) -> ConvBuilder {
        ConvBuilder {
            spatial,
            pads: Vec::new(),
            strides: Vec::new(),
            dilations: Vec::new(),
            groups: 1,
            mode: ConvMode::default(),
            math: MathType::default(),
            compute: None,
        }
    }

    /// Spatial rank as declared (1, 2 or 3).
    pub fn spatial_rank(&self) -> usize {
        self.spatial
    }
    /// Tensor rank of the convolution in cuDNN: 4 for 1-D and 2-D, 5 for 3-D. A 1-D convolution
    /// also takes 3-D tensors and filters (`[N, C, W]`, `[K, C/groups, S]`), which cuDNN sees
    /// with a unit height.
    pub fn tensor_rank(&self) -> usize {
        self.pads.len() + 2
    }
    /// Padding per spatial dimension of the tensors (a 1-D convolution shows a leading 0).
    pub fn pads(&self) -> &[i64] {
        &self.pads
    }
    /// Strides per spatial dimension of the tensors.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// Dilations per spatial dimension of the tensors.
    pub fn dilations(&self) -> &[i64] {
        &self.dilations
    }
    /// Group count.
    pub fn groups(&self) -> i64 {
        self.groups
    }
    /// Convolution or cross-correlation.
    pub fn mode(&self) -> ConvMode {
        self.mode
    }
    /// Math type.
    pub fn math(&self) -> MathType {
        self.math
    }
    /// Accumulation type.
    pub fn compute(&self) -> DType {
        self.compute
    }
    /// The raw descriptor (still owned by `self`).
    pub fn as_raw(&self) -> sys::cudnnConvolutionDescriptor_t {
        self.raw.as_ptr()
    }
    pub(crate) fn id(&self) -> u64 {
        self.raw.id()
    }

    /// Output dimensions `[N, K, out...]` of a forward convolution of input `x_dims`
    /// (`[N, C, in...]`) with filter `w_dims` (`[K, C/groups, k...]`), with
    /// `out = (in + 2·pad − dilation·(k − 1) − 1) / stride + 1`. A 1-D convolution of 3-D
    /// `[N, C, W]` and `[K, C/groups, S]` gives 3-D `[N, K, out]`.
    ///
    /// Errors: ranks not matching the convolution, channels not matching the groups, or a
    /// (dilated) kernel larger than the padded input.
    pub fn output_dims(&self, x_dims: &[i64], w_dims: &[i64]) -> Result<Vec<i64>> {
        let (dims, len) = self.output_dims_array(x_dims, w_dims)?;
        Ok(dims[..len].to_vec())
    }

    /// [`output_dims`](Self::output_dims) without allocating (the shape check of every
    /// convolution call): the dimensions in a fixed array, and how many there are.
    pub(crate) fn output_dims_array(
        &self,
        x_dims: &[i64],
        w_dims: &[i64],
    ) -> Result<([i64; MAX_TENSOR_RANK], usize)> {
        if let Some((x4, w4)) = self.unit_height_view(x_dims, w_dims) {
            let (d, _) = self.output_dims_array(&x4, &w4)?;
            return Ok(([d[0], d[1], d[3], 0, 0], 3));
        }
        self.check_ranks(x_dims, w_dims)?;
        let (c, k, wc) = (x_dims[1], w_dims[0], w_dims[1]);
        if wc.checked_mul(self.groups) != Some(c) {
            return Err(Error::ShapeMismatch {
                a: "x",
                a_dims: x_dims.to_vec(),
                b: "w",
                b_dims: w_dims.to_vec(),
                rule: "input channels must equal filter channels × groups",
            });
        }
        if k % self.groups != 0 {
            return Err(Error::invalid(
                "convolution groups",
                format!("a divisor of the filter count K = {k}"),
                self.groups.to_string(),
            ));
        }
        let mut out = [0; MAX_TENSOR_RANK];
        (out[0], out[1]) = (x_dims[0], k);
        for i in 0..self.pads.len() {
            // Dims (checked by `check_ranks`), pads, strides and dilations are all in
            // `0..2^31`: every term below is far from i64's limits.
            let input = x_dims[2 + i];
            let padded = input + 2 * self.pads[i];
            let span = self.dilations[i] * (w_dims[2 + i] - 1) + 1;
            if span > padded {
                return Err(Error::invalid(
                    "convolution kernel",
                    format!(
                        "a dilated kernel extent ≤ the padded input in spatial dimension {i} ({padded})"
                    ),
                    format!(
                        "extent {span} (kernel {}, dilation {})",
                        w_dims[2 + i],
                        self.dilations[i]
                    ),
                ));
            }
            out[2 + i] = (padded - span) / self.strides[i] + 1;
        }
        Ok((out, self.tensor_rank()))
    }

    /// Output dimensions of a transposed convolution (the backward-data pass used as an
    /// up-sampling layer, PyTorch's `conv_transpose1d/2d/3d`) of `x_dims = [N, K, in...]` with
    /// filter `w_dims = [K, C/groups, k...]`:
    /// `out = (in − 1)·stride − 2·pad + dilation·(k − 1) + 1 + output_padding`.
    ///
    /// `output_padding` (one per declared spatial dimension; empty for none) picks among the
    /// sizes a strided forward convolution maps to the same `in`; each value must satisfy
    /// `0 ≤ output_padding < max(stride, dilation)`, PyTorch's rule. A 1-D convolution takes one
    /// value (its unit height has none), and 3-D `[N, K, W]` and `[K, C/groups, S]` give a 3-D
    /// result (`[N, K, 1, W]` and `[K, C/groups, 1, S]`, the 4-D form, give a 4-D one).
    /// [`Cudnn::conv_transpose`] accepts exactly the output dimensions this returns.
    ///
    /// Errors: ranks not matching the convolution, `x`'s channels not equal to the filter count
    /// `K` or `K` not divisible by the groups, an output padding out of range, or an output
    /// smaller than one element.
    ///
    /// ```no_run
    /// use cudnn_safe::conv::ConvDesc;
    /// # fn main() -> cudnn_safe::Result<()> {
    /// // Stride 1, dilation 2: output padding 1 is allowed (it is below the dilation).
    /// let conv = ConvDesc::builder(1).pads(&[1]).dilations(&[2]).build::<f32>()?;
    /// let y = conv.transpose_output_dims(&[1, 8, 1, 5], &[8, 4, 1, 3], &[1])?;
    /// assert_eq!(y, [1, 4, 1, 8]); // (5 − 1)·1 − 2·1 + 2·(3 − 1) + 1 + 1
    /// // The same problem on the 3-D tensors of PyTorch's conv_transpose1d.
    /// assert_eq!(conv.transpose_output_dims(&[1, 8, 5], &[8, 4, 3], &[1])?, [1, 4, 8]);
    /// # Ok(()) }
    /// ```
    pub fn transpose_output_dims(
        &self,
        x_dims: &[i64],
        w_dims: &[i64],
        output_padding: &[i64],
    ) -> Result<Vec<i64>> {
        if let Some((x4, w4)) = self.unit_height_view(x_dims, w_dims) {
            return self
                .transpose_output_dims(&x4, &w4, output_padding)
                .map(drop_unit_height);
        }
        let mut out = self.transpose_base(x_dims, w_dims)?;
        let n = self.pads.len();
        let op: Vec<i64> = if self.spatial == 1 && output_padding.len() == 1 {
            vec![0, output_padding[0]]
        } else if output_padding.is_empty() {
            vec![0; n]
        } else {
            output_padding.to_vec()
        };
        if op.len() != n {
            return Err(Error::invalid(
                "output padding",
                format!("{} values", self.spatial),
                format!("{output_padding:?}"),
            ));
        }
        for i in 0..n {
            let (s, d) = (self.strides[i], self.dilations[i]);
            if op[i] < 0 || op[i] >= s.max(d) {
                return Err(Error::invalid(
                    "output padding",
                    format!("0 ≤ value < max(stride {s}, dilation {d})"),
                    op[i].to_string(),
                ));
            }
            let o = out[2 + i]
                .checked_add(op[i])
                .ok_or_else(|| Error::Overflow {
                    what: "transposed convolution output",
                    detail: format!("spatial dimension {i} of x {x_dims:?} and w {w_dims:?}"),
                })?;
            if o < 1 {
                return Err(Error::invalid(
                    "transposed convolution output",
                    "at least 1 element per spatial dimension",
                    format!("{o} in spatial dimension {i}"),
                ));
            }
            out[2 + i] = o;
        }
        Ok(out)
    }

    /// `[N, C, base...]`: a transposed convolution's output dimensions without output padding
    /// (`base = (in − 1)·stride − 2·pad + dilation·(k − 1) + 1`, possibly < 1), after checking
    /// the ranks, channels and groups of `x` and `w`.
    fn transpose_base(&self, x_dims: &[i64], w_dims: &[i64]) -> Result<Vec<i64>> {
        self.check_ranks(x_dims, w_dims)?;
        let k = w_dims[0];
        if x_dims[1] != k {
            return Err(Error::ShapeMismatch {
                a: "x",
                a_dims: x_dims.to_vec(),
                b: "w",
                b_dims: w_dims.to_vec(),
                rule: "a transposed convolution's input channels equal the filter count K",
            });
        }
        if k % self.groups != 0 {
            return Err(Error::invalid(
                "convolution groups",
                format!("a divisor of the filter count K = {k}"),
                self.groups.to_string(),
            ));
        }
        let mut out = vec![x_dims[0], w_dims[1] * self.groups];
        for i in 0..self.pads.len() {
            let (s, d) = (self.strides[i], self.dilations[i]);
            // Each product is below 2^62 (dims, strides, dilations and pads are in `0..2^31`,
            // checked), but two of them can pass i64: checked sums. Output padding (below
            // 2^31) is added by the caller with a checked sum too.
            let o = ((x_dims[2 + i] - 1) * s)
                .checked_add(d * (w_dims[2 + i] - 1) + 1)
                .map(|o| o - 2 * self.pads[i])
                .ok_or_else(|| Error::Overflow {
                    what: "transposed convolution output",
                    detail: format!("spatial dimension {i} of x {x_dims:?} and w {w_dims:?}"),
                })?;
            out.push(o);
        }
        Ok(out)
    }

    /// The output padding (per spatial dimension of the tensors) that makes `y_dims` the output
    /// of a transposed convolution of `x_dims` with `w_dims`: the inverse of
    /// [`transpose_output_dims`](Self::transpose_output_dims), accepting exactly what it returns.
    /// A `y` it cannot produce is a [`Error::ShapeMismatch`] naming `y`.
    ///
    /// The result has one entry per spatial dimension of the 4-D or 5-D tensors the backward
    /// data pass sees: for a 1-D convolution given 3-D `x`, `w` and `y`, two entries, the unit
    /// height's (0) first, as for the same problem in its 4-D form.
    pub(crate) fn transpose_output_padding(
        &self,
        x_dims: &[i64],
        w_dims: &[i64],
        y_dims: &[i64],
    ) -> Result<Vec<i64>> {
        let unit = self.unit_height_view(x_dims, w_dims);
        let y4 = match (&unit, y_dims) {
            (Some(_), &[n, c, w]) => Some([n, c, 1, w]),
            _ => None,
        };
        // With 3-D x and w, a y of another rank is given no dimensions: never the 4-D base.
        let (xv, wv, yv): (&[i64], &[i64], &[i64]) = match (&unit, &y4) {
            (Some((x4, w4)), Some(y4)) => (x4, w4, y4),
            (Some((x4, w4)), None) => (x4, w4, &[]),
            (None, _) => (x_dims, w_dims, y_dims),
        };
        let base = self.transpose_base(xv, wv)?;
        let mismatch = || Error::ShapeMismatch {
            a: "y",
            a_dims: y_dims.to_vec(),
            b: "conv_transpose(x, w)",
            b_dims: {
                let b: Vec<i64> = base.iter().map(|&b| b.max(1)).collect();
                if unit.is_some() {
                    drop_unit_height(b)
                } else {
                    b
                }
            },
            rule: "y is [N, C, out...] with out = (in − 1)·stride − 2·pad + dilation·(k − 1) + 1 \
                   + output_padding, 0 ≤ output_padding < max(stride, dilation)",
        };
        if yv.len() != base.len() || yv[..2] != base[..2] {
            return Err(mismatch());
        }
        let mut op = Vec::with_capacity(self.pads.len());
        for i in 0..self.pads.len() {
            let p = yv[2 + i] - base[2 + i];
            if p < 0 || p >= self.strides[i].max(self.dilations[i]) || yv[2 + i] < 1 {
                return Err(mismatch());
            }
            op.push(p);
        }
        Ok(op)
    }

    /// The same convolution with other paddings (one per spatial dimension of the tensors).
    pub(crate) fn with_pads(&self, pads: &[i64]) -> Result<ConvDesc> {
        let declared = |v: &[i64]| -> Vec<i64> {
            if self.spatial == 1 {
                v[1..].to_vec()
            } else {
                v.to_vec()
            }
        };
        ConvDesc::builder(self.spatial)
            .pads(&declared(pads))
            .strides(&declared(&self.strides))
            .dilations(&declared(&self.dilations))
            .groups(self.groups)
            .mode(self.mode)
            .math(self.math)
            .compute(self.compute)
            .build::<f32>()
    }

    /// For a 1-D convolution given 3-D `x` and `w` (`[N, C, W]`, `[K, C/groups, S]`): both with
    /// the unit height cuDNN sees (`[N, C, 1, W]`, `[K, C/groups, 1, S]`); `None` otherwise.
    fn unit_height_view(&self, x_dims: &[i64], w_dims: &[i64]) -> Option<([i64; 4], [i64; 4])> {
        match (self.spatial, x_dims, w_dims) {
            (1, &[n, c, w], &[k, wc, s]) => Some(([n, c, 1, w], [k, wc, 1, s])),
            _ => None,
        }
    }

    fn check_ranks(&self, x_dims: &[i64], w_dims: &[i64]) -> Result<()> {
        let rank = self.tensor_rank();
        let hint = if self.spatial == 1 {
            " (a 1-D convolution takes [N, C, W] tensors with [K, C, S] filters, or [N, C, 1, W] \
             with [K, C, 1, S])"
        } else {
            ""
        };
        if x_dims.len() != rank {
            return Err(Error::invalid(
                "convolution input rank",
                format!("{rank} dimensions{hint}"),
                format!("{x_dims:?}"),
            ));
        }
        if w_dims.len() != rank {
            return Err(Error::invalid(
                "convolution filter rank",
                format!("{rank} dimensions{hint}"),
                format!("{w_dims:?}"),
            ));
        }
        for (what, dims) in [
            ("convolution input dimension", x_dims),
            ("convolution filter dimension", w_dims),
        ] {
            if let Some(bad) = dims
                .iter()
                .find(|&&d| !(1..=i64::from(c_int::MAX)).contains(&d))
            {
                return Err(Error::invalid(
                    what,
                    "dimensions in 1..=2147483647",
                    format!("{bad} in {dims:?}"),
                ));
            }
        }
        if self.spatial == 1 && (x_dims[2] != 1 || w_dims[2] != 1) {
            return Err(Error::invalid(
                "1-D convolution shapes",
                "a height of 1 in both tensor and filter".to_string(),
                format!("x {x_dims:?}, w {w_dims:?}"),
            ));
        }
        Ok(())
    }

    /// cuDNN's own output-dimension query (`cudnnGetConvolutionNdForwardOutputDim`), for
    /// cross-checking [`output_dims`](Self::output_dims); 3-D for the 3-D tensors of a 1-D
    /// convolution, as there.
    #[doc(alias = "cudnnGetConvolutionNdForwardOutputDim")]
    pub fn cudnn_output_dims<T: DataType>(
        &self,
        x: &crate::TensorDesc<T>,
        w: &crate::FilterDesc<T>,
    ) -> Result<Vec<i64>> {
        let three_d = self.unit_height_view(x.dims(), w.dims());
        match three_d {
            // cuDNN holds both descriptors with the unit height (see `TensorDesc::new`).
            Some((x4, w4)) => self.check_ranks(&x4, &w4)?,
            None => self.check_ranks(x.dims(), w.dims())?,
        }
        let mut out = vec![0 as c_int; self.tensor_rank()];
        // SAFETY: live descriptors; `out` holds `nb_dims` ints.
        unsafe {
            raw::cudnnGetConvolutionNdForwardOutputDim(
                self.raw.lib(),
                self.as_raw(),
                x.as_raw(),
                w.as_raw(),
                out.len() as c_int,
                out.as_mut_ptr(),
            )
        }?;
        let out: Vec<i64> = out.into_iter().map(i64::from).collect();
        Ok(if three_d.is_some() {
            drop_unit_height(out)
        } else {
            out
        })
    }

    /// Checks the (input, output, compute) data types of a forward convolution against the
    /// configurations cuDNN supports.
    pub(crate) fn check_forward_types(&self, x: DType, y: DType) -> Result<()> {
        use DType::*;
        let ok = match (x, y) {
            (F32, F32) => self.compute == F32,
            (F64, F64) => self.compute == F64,
            (F16, F16) => matches!(self.compute, F32 | F16),
            (BF16, BF16) => self.compute == F32,
            (I8, I8) | (I8, F32) => self.compute == I32,
            _ => false,
        };
        if ok {
            return Ok(());
        }
        Err(Error::UnsupportedDataType {
            op: "convolution",
            detail: format!(
                "input {x}, output {y}, compute {}: cuDNN supports f32/f32/f32, f64/f64/f64, \
                 f16/f16/(f32|f16), bf16/bf16/f32 and i8/(i8|f32)/i32",
                self.compute
            ),
        })
    }

    /// Backward passes exist for the floating-point configurations only, with the forward
    /// pass's compute-type rules.
    pub(crate) fn check_backward_types(&self, op: &'static str, t: DType) -> Result<()> {
        let float = matches!(t, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
        if float && self.check_forward_types(t, t).is_ok() {
            return Ok(());
        }
        Err(Error::UnsupportedDataType {
            op,
            detail: format!(
                "data {t} with compute {}: backward convolution supports f32/f32, f64/f64, \
                 f16/(f32|f16) and bf16/f32",
                self.compute
            ),
        })
    }
}

/// The largest tensor rank of a convolution (three spatial dimensions).
const MAX_TENSOR_RANK: usize = 5;

/// `[N, C, 1, W]` → `[N, C, W]`: the dims of a 1-D problem's unit-height view as the caller
/// gave them.
fn drop_unit_height(mut dims: Vec<i64>) -> Vec<i64> {
    dims.remove(2);
    dims
}

mod algo;
mod block;
mod direction;
mod fused;
pub(crate) mod graph;

pub use block::{Epilogue, FusedConv};
pub use direction::{ConvBackwardData, ConvBackwardFilter, ConvForward, ConvOp};
pub use fused::ConvBiasActivation;
pub use transpose::ConvTranspose;

pub use algo::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDirection, ConvFwdAlgo,
    FusedActivation,
};
