//! The convolution harness: problems ([`Case`], random ones drawn by [`Rng::case`]), layouts
//! computed independently of the crate ([`Lay`]), the `f64` host reference ([`Geometry`]),
//! per-type tolerances ([`Tol`]) and the sweeps that run every algorithm cuDNN accepts and check
//! each result ([`sweep`], [`forward_sweep`], [`backward_sweep`]).
//!
//! The forward reference adds `x·w` into `y`, backward data adds `dy·w` into `dx` and backward
//! filter adds `x·dy` into `dw`, over the same terms ([`Geometry::for_each_term`]), so the three
//! references are adjoint by construction.

use std::sync::Arc;

use cudnn_safe::conv::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvFwdAlgo, ConvMode,
    MathType,
};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::{Cudnn, DataType, Error, FilterDesc, TensorDesc, TensorFormat, Workspace};

use super::{
    channels_last_strides, download, for_each_index, image, offsets, packed_strides, poison, same,
    scalar, to_f64, Rng,
};

/// The device-0 default stream and a handle on it.
pub struct Gpu {
    pub stream: Arc<CudaStream>,
    pub cudnn: Cudnn,
}

/// The GPU, or `None` (test skipped) without one.
pub fn gpu() -> Option<Gpu> {
    super::gpu().map(|(stream, cudnn)| Gpu { stream, cudnn })
}

// ---------------------------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------------------------

impl Rng {
    /// `n` integers in `-3..=3` (exact in every type, i8 included); never all zero.
    pub fn small_ints<T: DataType>(&mut self, n: usize) -> Vec<T> {
        loop {
            let v: Vec<T> = (0..n)
                .map(|_| T::from_f64(self.range(-3, 4) as f64))
                .collect();
            if v.iter().any(|x| x.to_f64() != 0.0) {
                return v;
            }
        }
    }
    pub fn gen<T: DataType>(&mut self, n: usize, gen: Gen) -> Vec<T> {
        match gen {
            Gen::Uniform => self.values(n),
            Gen::SmallInts => self.small_ints(n),
        }
    }
}

/// How input values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gen {
    /// Uniform in `[-2, 2]`, rounded to the type.
    Uniform,
    /// Integers in `-3..=3` (for i8).
    SmallInts,
}

// ---------------------------------------------------------------------------------------------
// Index walking
// ---------------------------------------------------------------------------------------------

/// Every logical index of `dims`, in row-major order.
pub fn all_indices(dims: &[i64]) -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    for_each_index(dims, |i| out.push(i.to_vec()));
    out
}

// ---------------------------------------------------------------------------------------------
// Layouts, computed here and compared with the crate's
// ---------------------------------------------------------------------------------------------

/// Packed memory formats used by the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fmt {
    /// Channels first: `N, C, spatial...` (filters `K, C, spatial...`).
    Nchw,
    /// Channels last: `N, spatial..., C` (filters `K, spatial..., C`, i.e. KRSC).
    Nhwc,
}

impl Fmt {
    pub fn tensor_format(self) -> TensorFormat {
        match self {
            Fmt::Nchw => TensorFormat::Nchw,
            Fmt::Nhwc => TensorFormat::Nhwc,
        }
    }
}

/// Logical dims and strides (in elements) of a tensor or filter.
#[derive(Clone, Debug)]
pub struct Lay {
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
    /// The packed format these strides come from; `None` for a layout with gaps.
    pub packed: Option<Fmt>,
}

impl Lay {
    /// Packed strides for logical `dims = [N|K, C, spatial...]` in `fmt`.
    pub fn packed(dims: &[i64], fmt: Fmt) -> Lay {
        let strides = match fmt {
            Fmt::Nchw => packed_strides(dims),
            Fmt::Nhwc => channels_last_strides(dims),
        };
        Lay {
            dims: dims.to_vec(),
            strides,
            packed: Some(fmt),
        }
    }

    /// Channels first with gaps: 2 unused elements after every row, 1 after every
    /// higher-dimensional block, 3 after every image.
    pub fn gapped(dims: &[i64]) -> Lay {
        let r = dims.len();
        let mut strides = vec![1i64; r];
        strides[r - 2] = dims[r - 1] + 2;
        for i in (0..r - 2).rev() {
            strides[i] = strides[i + 1] * dims[i + 1] + 1;
        }
        strides[0] += 2;
        Lay {
            dims: dims.to_vec(),
            strides,
            packed: None,
        }
    }

    pub fn count(&self) -> usize {
        self.dims.iter().product::<i64>() as usize
    }

    pub fn span(&self) -> usize {
        1 + self
            .dims
            .iter()
            .zip(&self.strides)
            .map(|(d, s)| (d - 1) * s)
            .sum::<i64>() as usize
    }

    /// Memory offset of every logical element, in row-major logical order.
    pub fn offsets(&self) -> Vec<usize> {
        offsets(&self.dims, &self.strides)
    }

    /// The tensor descriptor, through the constructor matching the layout; its strides and span
    /// must be the ones computed here.
    pub fn desc<T: DataType>(&self) -> TensorDesc<T> {
        let d = match self.packed {
            Some(Fmt::Nchw) => TensorDesc::nchw_nd(&self.dims),
            Some(Fmt::Nhwc) => TensorDesc::nhwc_nd(&self.dims),
            None => TensorDesc::strided(&self.dims, &self.strides),
        }
        .unwrap_or_else(|e| panic!("tensor descriptor {self:?}: {e}"));
        assert_eq!(d.layout().strides(), &self.strides[..], "{self:?}");
        assert_eq!(d.span(), self.span(), "{self:?}");
        d
    }

    /// The filter descriptor (packed layouts only); its strides must be the ones computed here
    /// (KRSC for NHWC).
    pub fn filter<T: DataType>(&self) -> FilterDesc<T> {
        let fmt = self.packed.expect("filters are packed");
        let d = FilterDesc::new(&self.dims, fmt.tensor_format())
            .unwrap_or_else(|e| panic!("filter descriptor {self:?}: {e}"));
        assert_eq!(d.layout().strides(), &self.strides[..], "{self:?}");
        assert_eq!(d.span(), self.span(), "{self:?}");
        d
    }

    /// A host image of a buffer of `span` elements: logical element `i` gets `fill(i)`, every
    /// gap [`SENTINEL`].
    pub fn image<T: DataType>(&self, fill: impl FnMut(usize) -> T) -> Vec<T> {
        image(self.span(), &self.offsets(), fill)
    }

    /// Copies logical-order values to a new device buffer laid out as `self`.
    pub fn upload<T: DataType>(&self, g: &Gpu, vals: &[T]) -> CudaSlice<T> {
        assert_eq!(vals.len(), self.count());
        g.stream.clone_htod(&self.image(|i| vals[i])).unwrap()
    }

    /// An output image before a call: NaN (poison) everywhere, or the old values to accumulate
    /// onto; gaps hold [`SENTINEL`].
    pub fn output_image<T: DataType>(&self, old: Option<&[T]>) -> Vec<T> {
        self.image(|i| old.map_or_else(poison::<T>, |o| o[i]))
    }
}

// ---------------------------------------------------------------------------------------------
// Cases and the reference
// ---------------------------------------------------------------------------------------------

/// One convolution problem. Spatial vectors are per spatial dimension *of the tensors*: a 1-D
/// convolution is stored as `[N, C, 1, W]` with filter `[K, C/groups, 1, R]`, its unit height
/// having pad 0, stride 1 and dilation 1.
#[derive(Clone, Debug)]
pub struct Case {
    /// Spatial rank given to the builder: 1, 2 or 3.
    pub spatial: usize,
    pub n: i64,
    pub c: i64,
    pub k: i64,
    pub groups: i64,
    pub input: Vec<i64>,
    pub kernel: Vec<i64>,
    pub pads: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub mode: ConvMode,
    pub fmt: Fmt,
}

/// `(in + 2·pad − dil·(k − 1) − 1) / stride + 1`.
pub fn out_size(input: i64, k: i64, pad: i64, stride: i64, dil: i64) -> i64 {
    (input + 2 * pad - dil * (k - 1) - 1) / stride + 1
}

impl Case {
    /// A 2-D case with square kernel, symmetric parameters and one group.
    #[allow(clippy::too_many_arguments)]
    pub fn square(
        n: i64,
        c: i64,
        hw: i64,
        k: i64,
        ker: i64,
        pad: i64,
        stride: i64,
        dil: i64,
        fmt: Fmt,
    ) -> Case {
        Case {
            spatial: 2,
            n,
            c,
            k,
            groups: 1,
            input: vec![hw, hw],
            kernel: vec![ker, ker],
            pads: vec![pad, pad],
            strides: vec![stride, stride],
            dilations: vec![dil, dil],
            mode: ConvMode::CrossCorrelation,
            fmt,
        }
    }
    pub fn x_dims(&self) -> Vec<i64> {
        [vec![self.n, self.c], self.input.clone()].concat()
    }
    pub fn w_dims(&self) -> Vec<i64> {
        [vec![self.k, self.c / self.groups], self.kernel.clone()].concat()
    }
    pub fn out(&self) -> Vec<i64> {
        (0..self.input.len())
            .map(|d| {
                out_size(
                    self.input[d],
                    self.kernel[d],
                    self.pads[d],
                    self.strides[d],
                    self.dilations[d],
                )
            })
            .collect()
    }
    pub fn y_dims(&self) -> Vec<i64> {
        [vec![self.n, self.k], self.out()].concat()
    }
    /// The convolution descriptor for data type `T` (default compute type for `T`).
    pub fn conv<T: DataType>(&self, math: MathType) -> ConvDesc {
        // The builder takes one value per declared spatial dimension.
        let per_dim = |v: &[i64]| -> Vec<i64> {
            if self.spatial == 1 {
                v[1..].to_vec()
            } else {
                v.to_vec()
            }
        };
        ConvDesc::builder(self.spatial)
            .pads(&per_dim(&self.pads))
            .strides(&per_dim(&self.strides))
            .dilations(&per_dim(&self.dilations))
            .groups(self.groups)
            .mode(self.mode)
            .math(math)
            .build::<T>()
            .unwrap_or_else(|e| panic!("conv descriptor {self:?}: {e}"))
    }
    pub fn geometry(&self) -> Geometry {
        Geometry {
            n: self.n,
            c: self.c,
            k: self.k,
            groups: self.groups,
            input: self.input.clone(),
            kernel: self.kernel.clone(),
            out: self.out(),
            pads: self.pads.clone(),
            strides: self.strides.clone(),
            dilations: self.dilations.clone(),
            flip: self.mode == ConvMode::Convolution,
        }
    }
    /// Short description for messages.
    pub fn short(&self) -> String {
        format!(
            "{}-D {:?} x{:?} w{:?} g{} pad{:?} str{:?} dil{:?} {:?}",
            self.spatial,
            self.fmt,
            self.x_dims(),
            self.w_dims(),
            self.groups,
            self.pads,
            self.strides,
            self.dilations,
            self.mode
        )
    }
}

/// What random cases may contain.
#[derive(Clone, Copy, Debug)]
pub struct Shapes {
    pub spatial: &'static [usize],
    pub fmts: &'static [Fmt],
    /// Largest group count (1: no groups).
    pub max_groups: i64,
    pub dilation: bool,
    /// Whether true convolution (flipped filter) may be drawn.
    pub flip: bool,
    /// C and K are multiples of this (4 for i8); no groups then.
    pub channel_multiple: i64,
}

impl Rng {
    /// Random case number `i` of a sequence: spatial rank, layout and mode cycle with `i` (every
    /// rank with every layout, alternating modes), the rest is random.
    pub fn case(&mut self, s: &Shapes, i: usize) -> Case {
        let spatial = s.spatial[i % s.spatial.len()];
        let fmt = s.fmts[(i / s.spatial.len()) % s.fmts.len()];
        let (c, k, groups) = if s.channel_multiple > 1 {
            let m = s.channel_multiple;
            (m * self.range(1, 3), m * self.range(1, 3), 1)
        } else {
            let groups = self.range(1, s.max_groups + 1);
            // C and K at most 9.
            let cg = self.range(1, 9 / groups + 1);
            let kg = self.range(1, 9 / groups + 1);
            (cg * groups, kg * groups, groups)
        };
        let sp = if spatial == 3 { 3 } else { 2 };
        let max_in = if spatial == 3 { 6 } else { 10 };
        let (mut input, mut kernel, mut pads, mut strides, mut dilations) =
            (vec![], vec![], vec![], vec![], vec![]);
        for d in 0..sp {
            if spatial == 1 && d == 0 {
                // The unit height of a 1-D convolution.
                input.push(1);
                kernel.push(1);
                pads.push(0);
                strides.push(1);
                dilations.push(1);
                continue;
            }
            let ker = self.range(1, 4);
            let dil = if s.dilation { self.range(1, 3) } else { 1 };
            let stride = self.range(1, 3);
            let extent = dil * (ker - 1) + 1;
            let pad = self.range(0, extent / 2 + 1);
            let lo = (extent - 2 * pad).max(1);
            input.push(self.range(lo, max_in + 1));
            kernel.push(ker);
            pads.push(pad);
            strides.push(stride);
            dilations.push(dil);
        }
        let mode = if s.flip && i % 2 == 1 {
            ConvMode::Convolution
        } else {
            ConvMode::CrossCorrelation
        };
        Case {
            spatial,
            n: self.range(1, 4),
            c,
            k,
            groups,
            input,
            kernel,
            pads,
            strides,
            dilations,
            mode,
            fmt,
        }
    }
}

/// The index arithmetic of a convolution, independent of the crate: logical row-major arrays
/// `x [N, C, in...]`, `w [K, C/groups, kernel...]`, `y [N, K, out...]`.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub n: i64,
    pub c: i64,
    pub k: i64,
    pub groups: i64,
    pub input: Vec<i64>,
    pub kernel: Vec<i64>,
    pub out: Vec<i64>,
    pub pads: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    /// True convolution: the filter flipped in every spatial dimension.
    pub flip: bool,
}

/// A reference result: values, the sum of |terms| of each, and the number of terms per element
/// (an upper bound).
#[derive(Clone, Debug)]
pub struct Ref {
    pub val: Vec<f64>,
    pub abs: Vec<f64>,
    pub red: usize,
}

impl Ref {
    pub fn zeros(len: usize, red: usize) -> Ref {
        Ref {
            val: vec![0.0; len],
            abs: vec![0.0; len],
            red,
        }
    }
}

impl Geometry {
    pub fn in_count(&self) -> i64 {
        self.input.iter().product()
    }
    pub fn ker_count(&self) -> i64 {
        self.kernel.iter().product()
    }
    pub fn out_count(&self) -> i64 {
        self.out.iter().product()
    }
    pub fn x_len(&self) -> usize {
        (self.n * self.c * self.in_count()) as usize
    }
    pub fn w_len(&self) -> usize {
        (self.k * (self.c / self.groups) * self.ker_count()) as usize
    }
    pub fn y_len(&self) -> usize {
        (self.n * self.k * self.out_count()) as usize
    }

    /// Calls `f(xi, wi, yi)` for every term `x[xi]·w[wi]` of the forward sum into `y[yi]`
    /// (flat row-major indices), skipping taps that fall into the zero padding:
    ///
    /// `y[n, k, o] = Σ_{cg, r} x[n, g·Cg + cg, o·stride − pad + r·dilation] · w[k, cg, r']`
    ///
    /// with `g = k / (K / groups)` the group of output channel `k`, `Cg = C / groups`, and
    /// `r' = r` (cross-correlation) or `kernel − 1 − r` in every spatial dimension (convolution).
    pub fn for_each_term(&self, mut f: impl FnMut(usize, usize, usize)) {
        let sp = self.input.len();
        let (cg, kg) = (self.c / self.groups, self.k / self.groups);
        let (in_count, ker_count, out_count) =
            (self.in_count(), self.ker_count(), self.out_count());
        let outs = all_indices(&self.out);
        let kers = all_indices(&self.kernel);
        for n in 0..self.n {
            for k in 0..self.k {
                let g = k / kg;
                for (oi, o) in outs.iter().enumerate() {
                    let yi = (n * self.k + k) * out_count + oi as i64;
                    for (ri, r) in kers.iter().enumerate() {
                        // Row-major position of the tap within one input channel plane.
                        let mut pos = 0i64;
                        let mut inside = true;
                        for d in 0..sp {
                            let p =
                                o[d] * self.strides[d] - self.pads[d] + r[d] * self.dilations[d];
                            if p < 0 || p >= self.input[d] {
                                inside = false;
                                break;
                            }
                            pos = pos * self.input[d] + p;
                        }
                        if !inside {
                            continue;
                        }
                        // Reversing every coordinate of a row-major index maps flat index ri to
                        // ker_count − 1 − ri.
                        let wr = if self.flip {
                            ker_count - 1 - ri as i64
                        } else {
                            ri as i64
                        };
                        for cgi in 0..cg {
                            let ci = g * cg + cgi;
                            let xi = (n * self.c + ci) * in_count + pos;
                            let wi = (k * cg + cgi) * ker_count + wr;
                            f(xi as usize, wi as usize, yi as usize);
                        }
                    }
                }
            }
        }
    }

    /// A reference of `len` elements with `red` terms each: every term of the forward sum
    /// ([`Geometry::for_each_term`]) adds `term(xi, wi, yi) = (element, value)`.
    fn sum_terms(
        &self,
        len: usize,
        red: usize,
        term: impl Fn(usize, usize, usize) -> (usize, f64),
    ) -> Ref {
        let mut r = Ref::zeros(len, red);
        self.for_each_term(|xi, wi, yi| {
            let (i, t) = term(xi, wi, yi);
            r.val[i] += t;
            r.abs[i] += t.abs();
        });
        r
    }

    /// `y = conv(x, w)`.
    pub fn forward(&self, x: &[f64], w: &[f64]) -> Ref {
        assert_eq!((x.len(), w.len()), (self.x_len(), self.w_len()));
        let red = ((self.c / self.groups) * self.ker_count()) as usize;
        self.sum_terms(self.y_len(), red, |xi, wi, yi| (yi, x[xi] * w[wi]))
    }

    /// `dx = ∂⟨conv(x, w), dy⟩/∂x`.
    pub fn backward_data(&self, dy: &[f64], w: &[f64]) -> Ref {
        assert_eq!((dy.len(), w.len()), (self.y_len(), self.w_len()));
        let red = ((self.k / self.groups) * self.ker_count()) as usize;
        self.sum_terms(self.x_len(), red, |xi, wi, yi| (xi, dy[yi] * w[wi]))
    }

    /// `dw = ∂⟨conv(x, w), dy⟩/∂w`.
    pub fn backward_filter(&self, x: &[f64], dy: &[f64]) -> Ref {
        assert_eq!((x.len(), dy.len()), (self.x_len(), self.y_len()));
        let red = (self.n * self.out_count()) as usize;
        self.sum_terms(self.w_len(), red, |xi, wi, yi| (wi, x[xi] * dy[yi]))
    }

    /// `db[k] = Σ_{n, spatial} dy[n, k, ...]`.
    pub fn backward_bias(&self, dy: &[f64]) -> Ref {
        let oc = self.out_count() as usize;
        let mut r = Ref::zeros(self.k as usize, self.n as usize * oc);
        for (i, &v) in dy.iter().enumerate() {
            let k = (i / oc) % self.k as usize;
            r.val[k] += v;
            r.abs[k] += v.abs();
        }
        r
    }

    /// Output channel of flat output index `yi`.
    pub fn channel_of(&self, yi: usize) -> usize {
        (yi / self.out_count() as usize) % self.k as usize
    }
}

// ---------------------------------------------------------------------------------------------
// Tolerances and checks
// ---------------------------------------------------------------------------------------------

/// A tolerance: `|got − want| ≤ abs + sum·√R·(1 + |want|) + terms·Σ|terms|`, plus, for FFT and
/// Winograd algorithms, `transform·max Σ|terms|` over the whole output (their rounding is
/// spread over a tile of the transform, not tied to one output's terms). `R` is the number of
/// terms per output element.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub abs: f64,
    pub sum: f64,
    pub terms: f64,
    pub transform: f64,
    /// The output is i8: compare with `clamp(round(ref), −128, 127)`.
    pub saturate_i8: bool,
}

/// Strict fp32 (FMA math): rounding in an R-term f32 sum grows like √R, so
/// 1e-5·√R·(1 + |ref|), plus 1e-6·Σ|terms| where cancellation makes |ref| small; FFT and
/// Winograd get 1e-5 of the largest Σ|terms| of the output on top.
pub const FP32: Tol = Tol {
    abs: 0.0,
    sum: 1e-5,
    terms: 1e-6,
    transform: 1e-5,
    saturate_i8: false,
};
/// TF32 (f32 data, default math, tensor cores on sm_80+): inputs rounded to 10 mantissa bits
/// (2⁻¹¹ relative each), so 5e-3 of Σ|terms| (and of the largest Σ|terms| for FFT/Winograd).
pub const TF32: Tol = Tol {
    abs: 0.0,
    sum: 1e-5,
    terms: 5e-3,
    transform: 5e-3,
    saturate_i8: false,
};
/// f64: 1e-12·√R·(1 + |ref|) + 1e-14·Σ|terms|; FFT/Winograd 1e-12 of the largest Σ|terms|.
pub const FP64: Tol = Tol {
    abs: 0.0,
    sum: 1e-12,
    terms: 1e-14,
    transform: 1e-12,
    saturate_i8: false,
};
/// f16 data with f32 accumulation and an f16 output (2⁻¹¹ rounding): 1e-2 of Σ|terms| — not of
/// |ref|, which cancellation can make small — and 1e-3 absolute for an output whose taps all
/// fall into the padding (exactly 0).
pub const FP16: Tol = Tol {
    abs: 1e-3,
    sum: 0.0,
    terms: 1e-2,
    transform: 1e-2,
    saturate_i8: false,
};
/// bf16 (2⁻⁸ rounding): 5e-2 of Σ|terms|, 1e-2 absolute.
pub const BF16: Tol = Tol {
    abs: 1e-2,
    sum: 0.0,
    terms: 5e-2,
    transform: 5e-2,
    saturate_i8: false,
};
/// i8 inputs in −3..=3 accumulated in i32 into an f32 output: exact.
pub const EXACT: Tol = Tol {
    abs: 0.0,
    sum: 0.0,
    terms: 0.0,
    transform: 0.0,
    saturate_i8: false,
};
/// i8 output: `clamp(round(ref), −128, 127)`, off by at most one (cuDNN rescales through float).
pub const I8_OUT: Tol = Tol {
    abs: 1.0,
    sum: 0.0,
    terms: 0.0,
    transform: 0.0,
    saturate_i8: true,
};

impl Tol {
    /// Expected values and bounds of `alpha·r + beta·old` (logical order).
    pub fn expect(
        &self,
        r: &Ref,
        alpha: f64,
        beta: f64,
        old: Option<&[f64]>,
        transform: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let scale = r.abs.iter().fold(0.0f64, |m, &a| m.max(a)) * alpha.abs();
        let root = (r.red.max(1) as f64).sqrt();
        r.val
            .iter()
            .zip(&r.abs)
            .enumerate()
            .map(|(i, (&v, &a))| {
                let o = match old {
                    Some(old) if beta != 0.0 => beta * old[i],
                    _ => 0.0,
                };
                let v = alpha * v + o;
                let a = alpha.abs() * a + o.abs();
                let want = if self.saturate_i8 {
                    v.round().clamp(-128.0, 127.0)
                } else {
                    v
                };
                let mut bound = self.abs + self.sum * root * (1.0 + v.abs()) + self.terms * a;
                if transform {
                    bound += self.transform * (scale + o.abs());
                }
                (want, bound)
            })
            .unzip()
    }
}

/// FFT and Winograd algorithms (any direction) transform the data first.
pub fn is_transform<A: ConvAlgorithm>(a: A) -> bool {
    let n = a.name();
    n.contains("FFT") || n.contains("WINOGRAD")
}

/// Logical index of flat row-major position `i` in `dims`.
pub fn unflat(mut i: usize, dims: &[i64]) -> Vec<i64> {
    let mut idx = vec![0i64; dims.len()];
    for d in (0..dims.len()).rev() {
        idx[d] = (i % dims[d] as usize) as i64;
        i /= dims[d] as usize;
    }
    idx
}

/// Checks every logical element of `got` (laid out as `lay`) against `want ± bound` (finite; a
/// bound of 0 means exactly) and every gap against `before`. Returns the worst error/bound
/// ratio.
pub fn check<T: DataType>(
    what: &str,
    got: &[T],
    before: &[T],
    lay: &Lay,
    want: &[f64],
    bound: &[f64],
) -> f64 {
    assert_eq!(got.len(), before.len(), "{what}");
    let offs = lay.offsets();
    assert_eq!(offs.len(), want.len(), "{what}");
    let mut addressed = vec![false; got.len()];
    let mut worst = 0.0f64;
    for (i, &o) in offs.iter().enumerate() {
        addressed[o] = true;
        let g = got[o].to_f64();
        let err = (g - want[i]).abs();
        assert!(
            g.is_finite() && err <= bound[i],
            "{what}: element {:?} (offset {o}): got {g}, want {} ± {:.3e}",
            unflat(i, &lay.dims),
            want[i],
            bound[i]
        );
        if err > 0.0 {
            worst = worst.max(err / bound[i]);
        }
    }
    for (p, (&g, &b)) in got.iter().zip(before).enumerate() {
        if !addressed[p] {
            assert!(
                same(g, b),
                "{what}: gap element {p} changed from {b:?} to {g:?}"
            );
        }
    }
    worst
}

/// Counts for a test's summary line.
#[derive(Debug, Default)]
pub struct Tally {
    pub cases: usize,
    pub tried: usize,
    pub ran: usize,
    pub refused: usize,
    pub worst: f64,
}

impl Tally {
    pub fn line(&self, what: &str) -> String {
        format!(
            "{what}: {} shapes × {} algorithms, {} ran, {} refused by cuDNN; worst error {:.3} of the tolerance",
            self.cases,
            self.tried / self.cases.max(1),
            self.ran,
            self.refused,
            self.worst
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Runners
// ---------------------------------------------------------------------------------------------

/// One problem on the device: descriptors and packed inputs (host values as stored, in logical
/// order, and their device copies).
pub struct Setup<X: DataType> {
    pub case: Case,
    pub geo: Geometry,
    pub conv: ConvDesc,
    pub x_lay: Lay,
    pub w_lay: Lay,
    pub y_lay: Lay,
    pub x_d: TensorDesc<X>,
    pub w_d: FilterDesc<X>,
    pub xf: Vec<f64>,
    pub wf: Vec<f64>,
    pub x: CudaSlice<X>,
    pub w: CudaSlice<X>,
}

impl<X: DataType> Setup<X> {
    pub fn new(g: &Gpu, rng: &mut Rng, case: &Case, math: MathType, gen: Gen) -> Setup<X> {
        let conv = case.conv::<X>(math);
        let x_lay = Lay::packed(&case.x_dims(), case.fmt);
        let w_lay = Lay::packed(&case.w_dims(), case.fmt);
        let y_lay = Lay::packed(&case.y_dims(), case.fmt);
        let x_d = x_lay.desc::<X>();
        let w_d = w_lay.filter::<X>();
        let dims = conv
            .output_dims(x_d.dims(), w_d.dims())
            .unwrap_or_else(|e| panic!("output_dims {}: {e}", case.short()));
        assert_eq!(dims, case.y_dims(), "output_dims {}", case.short());
        let dims = conv
            .cudnn_output_dims(&x_d, &w_d)
            .unwrap_or_else(|e| panic!("cudnn_output_dims {}: {e}", case.short()));
        assert_eq!(dims, case.y_dims(), "cuDNN's output dims {}", case.short());
        let xh: Vec<X> = rng.gen(x_lay.count(), gen);
        let wh: Vec<X> = rng.gen(w_lay.count(), gen);
        Setup {
            case: case.clone(),
            geo: case.geometry(),
            x: x_lay.upload(g, &xh),
            w: w_lay.upload(g, &wh),
            xf: to_f64(&xh),
            wf: to_f64(&wh),
            conv,
            x_lay,
            w_lay,
            y_lay,
            x_d,
            w_d,
        }
    }
}

/// Runs each of `algos` that cuDNN accepts: the workspace query either fails with a cuDNN error
/// (refused, skipped) or the launch must succeed and match `expect(algo)`.
/// Each launch writes a fresh copy of `before`. Returns the algorithms that ran (at least one).
#[allow(clippy::too_many_arguments)]
pub fn sweep<A: ConvAlgorithm, T: DataType>(
    g: &Gpu,
    what: &str,
    algos: &[A],
    out: &Lay,
    before: &[T],
    tally: &mut Tally,
    query: impl Fn(A) -> Result<usize, Error>,
    mut launch: impl FnMut(A, &mut CudaSlice<T>) -> Result<(), Error>,
    expect: impl Fn(A) -> (Vec<f64>, Vec<f64>),
) -> Vec<A> {
    let mut ran = Vec::new();
    for &algo in algos {
        tally.tried += 1;
        let what = format!("{what} {algo}");
        match query(algo) {
            Ok(_) => {}
            Err(Error::Cudnn { .. }) => {
                tally.refused += 1;
                continue;
            }
            Err(e) => panic!("{what}: the workspace query failed with a non-cuDNN error: {e}"),
        }
        let mut buf = g.stream.clone_htod(before).unwrap();
        launch(algo, &mut buf)
            .unwrap_or_else(|e| panic!("{what}: accepted by the workspace query, then: {e}"));
        let got = download(&g.stream, &buf);
        let (want, bound) = expect(algo);
        tally.worst = tally
            .worst
            .max(check(&what, &got, before, out, &want, &bound));
        tally.ran += 1;
        ran.push(algo);
    }
    assert!(!ran.is_empty(), "{what}: cuDNN accepted no algorithm");
    tally.cases += 1;
    ran
}

/// Every algorithm the heuristics list as supported (with the descriptor's math type) ran.
pub fn check_heuristics<A: ConvAlgorithm>(
    what: &str,
    ran: &[A],
    heur: &[AlgoPerf<A>],
    math: MathType,
) {
    for p in heur.iter().filter(|p| p.is_supported() && p.math == math) {
        assert!(
            ran.contains(&p.algo),
            "{what}: the heuristics report {} as supported ({p:?}), but the workspace query refused it",
            p.algo
        );
    }
}

/// Parameters of a forward sweep.
#[derive(Clone, Copy, Debug)]
pub struct Fwd {
    pub math: MathType,
    pub tol: Tol,
    pub gen: Gen,
    pub alpha: f64,
    pub beta: f64,
    /// Write into a channels-first output with gaps (sentinel-filled) instead of a packed one.
    pub gaps: bool,
}

/// `y = alpha·conv(x, w) + beta·y` with every forward algorithm cuDNN accepts for `case`.
pub fn forward_case<X: DataType, Y: DataType<Scalar = X::Scalar>>(
    g: &Gpu,
    ws: &mut Workspace,
    rng: &mut Rng,
    case: &Case,
    p: &Fwd,
    tally: &mut Tally,
) {
    let s = Setup::<X>::new(g, rng, case, p.math, p.gen);
    let y_lay = if p.gaps {
        Lay::gapped(&case.y_dims())
    } else {
        s.y_lay.clone()
    };
    let y_d = y_lay.desc::<Y>();
    let r = s.geo.forward(&s.xf, &s.wf);
    let (alpha_s, alpha) = scalar::<X>(p.alpha);
    let (beta_s, beta) = scalar::<X>(p.beta);
    let old: Option<Vec<Y>> = (beta != 0.0).then(|| rng.values(y_lay.count()));
    let oldf = old.as_deref().map(to_f64);
    let before = y_lay.output_image(old.as_deref());
    let what = format!(
        "forward<{}, {}> {} {:?} alpha {alpha} beta {beta}",
        X::DTYPE,
        Y::DTYPE,
        case.short(),
        p.math
    );
    let ran = sweep::<ConvFwdAlgo, Y>(
        g,
        &what,
        ConvFwdAlgo::ALL,
        &y_lay,
        &before,
        tally,
        |a| {
            g.cudnn
                .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, a)
        },
        |a, y| {
            g.cudnn.conv_forward(
                alpha_s, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, a, ws, beta_s, &y_d, y,
            )
        },
        |a| {
            p.tol
                .expect(&r, alpha, beta, oldf.as_deref(), is_transform(a))
        },
    );
    let heur = g
        .cudnn
        .conv_forward_heuristics(&s.x_d, &s.w_d, &s.conv, &y_d)
        .unwrap_or_else(|e| panic!("{what}: heuristics: {e}"));
    check_heuristics(&what, &ran, &heur, s.conv.math());
}

/// `cases` random shapes, each through every forward algorithm.
pub fn forward_sweep<X: DataType, Y: DataType<Scalar = X::Scalar>>(
    seed: u64,
    label: &str,
    shapes: &Shapes,
    cases: usize,
    p: Fwd,
) {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let mut ws = Workspace::new(g.stream.clone());
    let mut t = Tally::default();
    for i in 0..cases {
        let case = rng.case(shapes, i);
        forward_case::<X, Y>(&g, &mut ws, &mut rng, &case, &p, &mut t);
    }
    println!("{}", t.line(label));
}

/// Parameters of a backward sweep.
#[derive(Clone, Copy, Debug)]
pub struct Bwd {
    pub math: MathType,
    pub tol: Tol,
    pub alpha: f64,
    pub beta: f64,
}

/// `dx = alpha·dgrad(dy, w) + beta·dx` and `dw = alpha·wgrad(x, dy) + beta·dw` with every
/// algorithm cuDNN accepts for `case`.
pub fn backward_case<T: DataType>(
    g: &Gpu,
    ws: &mut Workspace,
    rng: &mut Rng,
    case: &Case,
    p: &Bwd,
    data: &mut Tally,
    filter: &mut Tally,
) {
    let s = Setup::<T>::new(g, rng, case, p.math, Gen::Uniform);
    let dy_d = s.y_lay.desc::<T>();
    let dyh: Vec<T> = rng.values(s.y_lay.count());
    let dyf = to_f64(&dyh);
    let dy = s.y_lay.upload(g, &dyh);
    let (alpha_s, alpha) = scalar::<T>(p.alpha);
    let (beta_s, beta) = scalar::<T>(p.beta);
    let dx_ref = s.geo.backward_data(&dyf, &s.wf);
    let dw_ref = s.geo.backward_filter(&s.xf, &dyf);

    let old_dx: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(s.x_lay.count()));
    let old_dxf = old_dx.as_deref().map(to_f64);
    let before = s.x_lay.output_image(old_dx.as_deref());
    let what = format!(
        "backward data<{}> {} alpha {alpha} beta {beta}",
        T::DTYPE,
        case.short()
    );
    sweep::<ConvBwdDataAlgo, T>(
        g,
        &what,
        ConvBwdDataAlgo::ALL,
        &s.x_lay,
        &before,
        data,
        |a| {
            g.cudnn
                .conv_backward_data_workspace_size(&s.w_d, &dy_d, &s.conv, &s.x_d, a)
        },
        |a, dx| {
            g.cudnn.conv_backward_data(
                alpha_s, &s.w_d, &s.w, &dy_d, &dy, &s.conv, a, ws, beta_s, &s.x_d, dx,
            )
        },
        |a| {
            p.tol
                .expect(&dx_ref, alpha, beta, old_dxf.as_deref(), is_transform(a))
        },
    );

    let old_dw: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(s.w_lay.count()));
    let old_dwf = old_dw.as_deref().map(to_f64);
    let before = s.w_lay.output_image(old_dw.as_deref());
    let what = format!(
        "backward filter<{}> {} alpha {alpha} beta {beta}",
        T::DTYPE,
        case.short()
    );
    sweep::<ConvBwdFilterAlgo, T>(
        g,
        &what,
        ConvBwdFilterAlgo::ALL,
        &s.w_lay,
        &before,
        filter,
        |a| {
            g.cudnn
                .conv_backward_filter_workspace_size(&s.x_d, &dy_d, &s.conv, &s.w_d, a)
        },
        |a, dw| {
            g.cudnn.conv_backward_filter(
                alpha_s, &s.x_d, &s.x, &dy_d, &dy, &s.conv, a, ws, beta_s, &s.w_d, dw,
            )
        },
        |a| {
            p.tol
                .expect(&dw_ref, alpha, beta, old_dwf.as_deref(), is_transform(a))
        },
    );
}

/// `cases` random shapes through every backward-data and backward-filter algorithm; the last
/// case accumulates (`alpha = −0.5`, `beta = 1`).
pub fn backward_sweep<T: DataType>(
    seed: u64,
    label: &str,
    shapes: &Shapes,
    cases: usize,
    math: MathType,
    tol: Tol,
) {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let mut ws = Workspace::new(g.stream.clone());
    let (mut data, mut filter) = (Tally::default(), Tally::default());
    for i in 0..cases {
        let (alpha, beta) = if i + 1 == cases {
            (-0.5, 1.0)
        } else {
            (1.0, 0.0)
        };
        let case = rng.case(shapes, i);
        let p = Bwd {
            math,
            tol,
            alpha,
            beta,
        };
        backward_case::<T>(&g, &mut ws, &mut rng, &case, &p, &mut data, &mut filter);
    }
    println!("{}", data.line(&format!("backward data {label}")));
    println!("{}", filter.line(&format!("backward filter {label}")));
}

/// Logical-order values of a device image laid out as `lay`.
pub fn gather<T: DataType>(lay: &Lay, img: &[T]) -> Vec<f64> {
    lay.offsets().iter().map(|&o| img[o].to_f64()).collect()
}

/// The first algorithm (in C enum order) whose workspace query succeeds.
pub fn first_accepted<A: ConvAlgorithm>(
    what: &str,
    query: impl Fn(A) -> Result<usize, Error>,
) -> A {
    A::ALL
        .iter()
        .copied()
        .find(|&a| query(a).is_ok())
        .unwrap_or_else(|| panic!("{what}: cuDNN accepts no algorithm"))
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

// ---------------------------------------------------------------------------------------------
// Shapes drawn by the tests
// ---------------------------------------------------------------------------------------------

/// f32: 1-D, 2-D and 3-D, both layouts, groups, dilation, both modes.
pub const F32_ANY: Shapes = Shapes {
    spatial: &[1, 2, 3],
    fmts: &[Fmt::Nchw, Fmt::Nhwc],
    max_groups: 3,
    dilation: true,
    flip: true,
    channel_multiple: 1,
};
pub const F32_NCHW_2D: Shapes = Shapes {
    spatial: &[2],
    fmts: &[Fmt::Nchw],
    max_groups: 3,
    dilation: true,
    flip: true,
    channel_multiple: 1,
};
pub const F64_NCHW: Shapes = Shapes {
    spatial: &[1, 2, 3],
    fmts: &[Fmt::Nchw],
    max_groups: 3,
    dilation: true,
    flip: true,
    channel_multiple: 1,
};
pub const F16_NHWC: Shapes = Shapes {
    spatial: &[1, 2],
    fmts: &[Fmt::Nhwc],
    max_groups: 2,
    dilation: true,
    flip: true,
    channel_multiple: 1,
};
pub const F16_NCHW: Shapes = Shapes {
    spatial: &[1, 2],
    fmts: &[Fmt::Nchw],
    max_groups: 2,
    dilation: true,
    flip: true,
    channel_multiple: 1,
};
pub const BF16_NHWC: Shapes = Shapes {
    spatial: &[2],
    fmts: &[Fmt::Nhwc],
    max_groups: 2,
    dilation: true,
    flip: true,
    channel_multiple: 1,
};
/// i8: NHWC, C and K multiples of 4, no groups, no dilation, cross-correlation.
pub const I8_NHWC: Shapes = Shapes {
    spatial: &[2],
    fmts: &[Fmt::Nhwc],
    max_groups: 1,
    dilation: false,
    flip: false,
    channel_multiple: 4,
};

/// Forward parameters with `alpha = 1`, `beta = 0`, uniform values, packed output.
pub fn fwd(math: MathType, tol: Tol) -> Fwd {
    Fwd {
        math,
        tol,
        gen: Gen::Uniform,
        alpha: 1.0,
        beta: 0.0,
        gaps: false,
    }
}
