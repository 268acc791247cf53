//! The [`Graph`] builder methods of the normalization operations.
use super::super::{stride_order, Graph, Op, TensorId};
use super::ops::{NormBwdOp, NormFwdOp, RunningIdx};
use super::{
    names, param_rule, stats_rule, BatchNormOutputs, BatchNormRunning, FwdOut, LayerNormGrads,
    LayerNormOutputs, NormMode, RmsNormGrads, RmsNormOutputs, Shapes,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A [`Graph`] builder method of a normalization with a mean and a bias (layer, instance and
/// batch norm): `forward` adds the forward operation (x, scale, bias, epsilon, training phase;
/// [`LayerNormOutputs`]), `backward` the backward one (dy, x, scale, mean, inverse standard
/// deviation; [`LayerNormGrads`]), of the mode named. Documented by the attributes given.
macro_rules! stats_norm_op {
    ($(#[$m:meta])* fn $name:ident = forward $mode:ident;) => {
        stats_norm_op!(@fn $(#[$m])* $name = norm_forward_stats($mode) -> LayerNormOutputs;
            x: TensorId, scale: TensorId, bias: TensorId, epsilon: f64, training: bool);
    };
    ($(#[$m:meta])* fn $name:ident = backward $mode:ident;) => {
        stats_norm_op!(@fn $(#[$m])* $name = norm_backward_grads($mode) -> LayerNormGrads;
            dy: TensorId, x: TensorId, scale: TensorId, mean: TensorId, inv_var: TensorId);
    };
    (@fn $(#[$m:meta])* $name:ident = $add:ident($mode:ident) -> $out:ty;
        $($arg:ident: $ty:ty),*) => {
        $(#[$m])*
        pub fn $name(&mut self, $($arg: $ty),*) -> Result<$out> {
            self.$add(NormMode::$mode, $($arg),*)
        }
    };
}

impl Graph {
    /// `x` must be an ordinary tensor of rank 4 or 5.
    pub(super) fn norm_check_x(&self, mode: NormMode, op: &'static str, xi: usize) -> Result<()> {
        let xt = &self.tensors[xi];
        if !(4..=5).contains(&xt.dims.len()) || xt.scalar.is_some() {
            let want = match mode {
                NormMode::Layer | NormMode::Rms => {
                    "x of 4 or 5 dimensions ([N, D, 1, 1] for rows of length D)"
                }
                NormMode::Instance | NormMode::Batch => {
                    "x of 4 or 5 dimensions ([N, C, spatial...])"
                }
            };
            return Err(Error::invalid(
                "normalization operand rank",
                format!("{op}: {want}"),
                format!("`{}` with dims {:?}", xt.name, xt.dims),
            ));
        }
        Ok(())
    }

    /// `t` has dimensions `want` (and is not a by-value scalar).
    pub(super) fn norm_check_dims(
        &self,
        xi: usize,
        ti: usize,
        want: &[i64],
        rule: &'static str,
    ) -> Result<()> {
        let (xt, tt) = (&self.tensors[xi], &self.tensors[ti]);
        if tt.dims != want || tt.scalar.is_some() {
            return Err(xt.shape_mismatch(tt, rule));
        }
        Ok(())
    }

    pub(super) fn norm_check_epsilon(mode: NormMode, epsilon: f64) -> Result<()> {
        if !epsilon.is_finite() || epsilon < 0.0 {
            return Err(Error::invalid(
                "normalization epsilon",
                format!("{}: a finite value ≥ 0", mode.label()),
                format!("{epsilon}"),
            ));
        }
        Ok(())
    }

    /// The checks of a forward operation's `x`, `scale` and optional `bias` (of the parameter
    /// dimensions of `shapes`, else of the mode's own). Returns x's index and the parameter and
    /// statistics dimensions.
    fn norm_check_affine(
        &self,
        mode: NormMode,
        op: &'static str,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        shapes: Option<Shapes>,
    ) -> Result<(usize, Shapes)> {
        let xi = self.index(x)?;
        let si = self.index(scale)?;
        let bi = bias.map(|b| self.index(b)).transpose()?;
        self.norm_check_x(mode, op, xi)?;
        let (param, stats_dims) = shapes.unwrap_or_else(|| {
            let d = &self.tensors[xi].dims;
            (mode.param_dims(d), mode.stats_dims(d))
        });
        self.norm_check_dims(xi, si, &param, param_rule(mode))?;
        if let Some(bi) = bi {
            self.norm_check_dims(xi, bi, &param, param_rule(mode))?;
        }
        Ok((xi, (param, stats_dims)))
    }

    /// `x`, `scale` and the optional `bias` as operands of the forward operation `op` (once
    /// [`norm_check_affine`](Self::norm_check_affine) passed): their indices.
    fn norm_affine_operands(
        &mut self,
        op: &'static str,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
    ) -> Result<(usize, usize, Option<usize>)> {
        let xi = self.operand(x, None, op)?;
        let si = self.operand(scale, None, op)?;
        let bi = bias.map(|b| self.operand(b, None, op)).transpose()?;
        Ok((xi, si, bi))
    }

    /// Adds a forward operation in the training phase (or the inference phase of layer, RMS
    /// and instance norm). Every check runs before the graph changes, so a rejected call
    /// leaves it as it was.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_forward(
        &mut self,
        mode: NormMode,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: f64,
        training: bool,
        running: Option<BatchNormRunning>,
        shapes: Option<Shapes>,
    ) -> Result<FwdOut> {
        let n = names(mode);
        let op = n.fwd;
        let (xi, (_, stats_dims)) = self.norm_check_affine(mode, op, x, scale, bias, shapes)?;
        Self::norm_check_epsilon(mode, epsilon)?;
        if let Some(r) = running {
            let (mi, vi) = (self.index(r.mean)?, self.index(r.var)?);
            self.norm_check_dims(xi, mi, &stats_dims, stats_rule(mode))?;
            self.norm_check_dims(xi, vi, &stats_dims, stats_rule(mode))?;
            if !(0.0..=1.0).contains(&r.momentum) {
                return Err(Error::invalid(
                    "batch norm momentum",
                    "a value in [0, 1]",
                    format!("{}", r.momentum),
                ));
            }
        }
        let r = self.tensors[xi].dims.len();
        let dims = self.tensors[xi].dims.clone();
        let order = stride_order(&self.tensors[xi].strides);
        let eps = self.scalar(n.epsilon, epsilon, DType::F32)?;
        let (xi, si, bi) = self.norm_affine_operands(op, x, scale, bias)?;
        let ei = self.operand(eps, Some(r), op)?;
        let running_in = match running {
            Some(run) => {
                let m = self.scalar("batch_norm.momentum", run.momentum, DType::F32)?;
                let mi = self.operand(m, Some(r), op)?;
                let pm = self.operand(run.mean, None, op)?;
                let pv = self.operand(run.var, None, op)?;
                let p_order = stride_order(&self.tensors[pm].strides);
                Some((mi, pm, pv, p_order))
            }
            None => None,
        };
        let opi = self.ops.len();
        let y = self.output(n.y, dims, &order, opi)?;
        let mean = if training && mode != NormMode::Rms {
            Some(self.output(n.mean, stats_dims.clone(), &order, opi)?)
        } else {
            None
        };
        let inv_var = if training {
            Some(self.output(n.inv_var, stats_dims.clone(), &order, opi)?)
        } else {
            None
        };
        let (next, running) = match running_in {
            Some((mi, pm, pv, p_order)) => {
                let nm = self.output(
                    "batch_norm.next_running_mean",
                    stats_dims.clone(),
                    &p_order,
                    opi,
                )?;
                let nv = self.output("batch_norm.next_running_var", stats_dims, &p_order, opi)?;
                let idx = RunningIdx {
                    momentum: mi,
                    prev_mean: pm,
                    prev_var: pv,
                    next_mean: nm.index,
                    next_var: nv.index,
                };
                (Some((nm, nv)), Some(idx))
            }
            None => (None, None),
        };
        self.ops.push(Op::NormFwd(NormFwdOp {
            mode,
            x: xi,
            scale: si,
            bias: bi,
            epsilon: Some(ei),
            y: y.index,
            training,
            mean: mean.map(|t| t.index),
            inv_var: inv_var.map(|t| t.index),
            running,
        }));
        Ok((y, mean, inv_var, next))
    }

    /// Adds a backward operation: dx (laid out like dy), dscale and, with `with_dbias`, dbias
    /// (laid out like the scale).
    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        &mut self,
        mode: NormMode,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: Option<TensorId>,
        inv_var: TensorId,
        with_dbias: bool,
    ) -> Result<(TensorId, TensorId, Option<TensorId>)> {
        let n = names(mode);
        let op = n.bwd;
        let dyi = self.index(dy)?;
        let xi = self.index(x)?;
        let si = self.index(scale)?;
        let mi = mean.map(|m| self.index(m)).transpose()?;
        let vi = self.index(inv_var)?;
        self.norm_check_x(mode, op, xi)?;
        let x_dims = self.tensors[xi].dims.clone();
        self.norm_check_dims(xi, dyi, &x_dims, "dy and x have the same dimensions")?;
        let param = mode.param_dims(&x_dims);
        let stats_dims = mode.stats_dims(&x_dims);
        let rule = match mode {
            NormMode::Layer => "layer norm scale has x's dimensions with N = 1",
            NormMode::Rms => "RMS norm scale has x's dimensions with N = 1",
            NormMode::Instance => "instance norm scale is [1, C, 1, ...] for x [N, C, ...]",
            NormMode::Batch => "batch norm scale is [1, C, 1, ...] for x [N, C, ...]",
        };
        self.norm_check_dims(xi, si, &param, rule)?;
        if let Some(mi) = mi {
            self.norm_check_dims(xi, mi, &stats_dims, stats_rule(mode))?;
        }
        self.norm_check_dims(xi, vi, &stats_dims, stats_rule(mode))?;
        let dx_order = stride_order(&self.tensors[dyi].strides);
        let p_order = stride_order(&self.tensors[si].strides);
        let dyi = self.operand(dy, None, op)?;
        let xi = self.operand(x, None, op)?;
        let si = self.operand(scale, None, op)?;
        let mi = mean.map(|m| self.operand(m, None, op)).transpose()?;
        let vi = self.operand(inv_var, None, op)?;
        let opi = self.ops.len();
        let dx = self.output(n.dx, x_dims, &dx_order, opi)?;
        let dscale = self.output(n.dscale, param.clone(), &p_order, opi)?;
        let dbias = if with_dbias {
            Some(self.output(n.dbias, param, &p_order, opi)?)
        } else {
            None
        };
        self.ops.push(Op::NormBwd(NormBwdOp {
            mode,
            dy: dyi,
            x: xi,
            scale: si,
            mean: mi,
            inv_var: vi,
            dx: dx.index,
            dscale: dscale.index,
            dbias: dbias.map(|t| t.index),
        }));
        Ok((dx, dscale, dbias))
    }

    /// A forward operation with a bias and no running statistics, its mean and inverse
    /// variance paired (layer and instance norm).
    fn norm_forward_stats(
        &mut self,
        mode: NormMode,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        training: bool,
    ) -> Result<LayerNormOutputs> {
        let (y, mean, inv_var, _) =
            self.norm_forward(mode, x, scale, Some(bias), epsilon, training, None, None)?;
        Ok(LayerNormOutputs {
            y,
            stats: mean.zip(inv_var),
        })
    }

    /// A backward operation reading the mean and giving dbias (layer, instance and batch norm).
    fn norm_backward_grads(
        &mut self,
        mode: NormMode,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<LayerNormGrads> {
        let (dx, dscale, dbias) =
            self.norm_backward(mode, dy, x, scale, Some(mean), inv_var, true)?;
        Ok(LayerNormGrads {
            dx,
            dscale,
            dbias: dbias.expect("asked for dbias"),
        })
    }

    stats_norm_op! {
        /// Layer normalization forward (`CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR`,
        /// `CUDNN_LAYER_NORM`): each row `x[n, ...]` is normalized over all its other dimensions,
        /// `y = (x − mean) · inv_var · scale + bias` with `inv_var = 1 / √(var + epsilon)` (biased
        /// variance).
        ///
        /// x is `[N, D, 1, 1]` (or any rank-4/5 `[N, ...]`); `scale` and `bias` are `[1, D, 1, 1]`
        /// (x's dimensions with N = 1). cudnn-frontend's samples describe x channels-last
        /// ([`Graph::tensor_nhwc`], strides `[D, 1, D, D]`), with f32 scale and bias also for f16 /
        /// bf16 x, and f32 statistics. `epsilon` (finite, ≥ 0) is handed to cuDNN as an f32 by-value
        /// scalar, as cudnn-frontend does.
        ///
        /// With `training`, the phase is `CUDNN_NORM_FWD_TRAINING` and the per-row mean and inverse
        /// standard deviation `[N, 1, 1, 1]` are outputs too (mark them, typically as f32, or feed
        /// them to [`Graph::layer_norm_backward`]); otherwise the phase is `CUDNN_NORM_FWD_INFERENCE`
        /// and only y is written. y has x's dimensions and memory order.
        ///
        /// Speed: give f16 / bf16 x a scale and bias of x's own type. With f32 scale and bias,
        /// cuDNN 9.14 and 9.19 offer such a layer norm one generic engine only; with scale and bias
        /// of x's type, their fused normalization engines.
        ///
        /// Data types: f32, f16 or bf16 for every tensor of the operation; [`Graph::build`] and
        /// [`Graph::check`] return [`Error::UnsupportedDataType`] for f64 (cuDNN has no f64 norm
        /// engine).
        ///
        /// ```no_run
        /// use cudnn_safe::graph::{Args, Graph, PlanFilter};
        /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
        /// # fn main() -> cudnn_safe::Result<()> {
        /// let ctx = cuda_context(0)?;
        /// let stream = ctx.default_stream();
        /// let cudnn = Cudnn::new(stream.clone())?;
        /// // Rows of length 1024: half data, f32 scale, bias and statistics.
        /// let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        /// let x = g.tensor_nhwc("x", &[4096, 1024, 1, 1], DType::F16)?;
        /// let scale = g.tensor_nhwc("scale", &[1, 1024, 1, 1], DType::F32)?;
        /// let bias = g.tensor_nhwc("bias", &[1, 1024, 1, 1], DType::F32)?;
        /// let out = g.layer_norm(x, scale, bias, 1e-5, true)?;
        /// let (mean, inv_var) = out.stats.expect("training phase");
        /// g.mark_output(out.y)?;
        /// g.mark_output_as(mean, DType::F32)?;
        /// g.mark_output_as(inv_var, DType::F32)?;
        /// let og = g.build(&cudnn)?;
        /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
        ///
        /// let xb = stream.alloc_zeros::<half::f16>(og.span(x)?).unwrap();
        /// let sb = stream.alloc_zeros::<f32>(og.span(scale)?).unwrap();
        /// let bb = stream.alloc_zeros::<f32>(og.span(bias)?).unwrap();
        /// let mut yb = stream.alloc_zeros::<half::f16>(og.span(out.y)?).unwrap();
        /// let mut mb = stream.alloc_zeros::<f32>(og.span(mean)?).unwrap();
        /// let mut vb = stream.alloc_zeros::<f32>(og.span(inv_var)?).unwrap();
        /// let mut ws = Workspace::new(stream.clone());
        /// let mut args = Args::new(&cudnn);
        /// args.input(x, &xb)?.input(scale, &sb)?.input(bias, &bb)?;
        /// args.output(out.y, &mut yb)?.output(mean, &mut mb)?.output(inv_var, &mut vb)?;
        /// cudnn.execute(&plan, &args, &mut ws)?;
        /// # Ok(()) }
        /// ```
        #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
        #[doc(alias = "CUDNN_LAYER_NORM")]
        fn layer_norm = forward Layer;
    }

    stats_norm_op! {
        /// Layer normalization backward (`CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR`,
        /// `CUDNN_LAYER_NORM`): from the gradient `dy`, the forward input `x`, the `scale` and the
        /// saved `mean` and `inv_var` of the training forward pass, the gradients dx (x's
        /// dimensions, laid out like dy), dscale and dbias (the scale's dimensions and layout).
        ///
        /// Shapes as in [`Graph::layer_norm`]: dy and x `[N, D, 1, 1]`, scale `[1, D, 1, 1]`, mean
        /// and inv_var `[N, 1, 1, 1]`. cudnn-frontend's sample binds f32 scale, statistics, dscale
        /// and dbias with f16 x, dy and dx. No epsilon is needed: inv_var already holds it.
        #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
        fn layer_norm_backward = backward Layer;
    }

    /// RMS normalization forward (`CUDNN_RMS_NORM`): each row `x[n, ...]` is scaled by its
    /// inverse root mean square, `y = x · inv_rms · scale (+ bias)` with
    /// `inv_rms = 1 / √(mean(x²) + epsilon)`; no mean is subtracted.
    ///
    /// Shapes as in [`Graph::layer_norm`]: x `[N, D, 1, 1]` (or any rank-4/5 `[N, ...]`),
    /// `scale` and the optional `bias` `[1, D, 1, 1]`. With `training` the phase is
    /// `CUDNN_NORM_FWD_TRAINING` and `inv_rms` `[N, 1, 1, 1]` is an output too (no mean: RMS norm
    /// has none); otherwise only y is written. cudnn-frontend's samples use x `[N, D, 1, 1]`
    /// with strides `[D, 1, D, D]`, f32 statistics, and f32 or half data.
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Args, Graph, PlanFilter};
    /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    /// let x = g.tensor_nhwc("x", &[4096, 4096, 1, 1], DType::BF16)?;
    /// let scale = g.tensor_nhwc("scale", &[1, 4096, 1, 1], DType::F32)?;
    /// let out = g.rms_norm(x, scale, None, 1e-6, true)?;
    /// let inv_rms = out.inv_rms.expect("training phase");
    /// g.mark_output(out.y)?;
    /// g.mark_output_as(inv_rms, DType::F32)?;
    /// let og = g.build(&cudnn)?;
    /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
    ///
    /// let xb = stream.alloc_zeros::<half::bf16>(og.span(x)?).unwrap();
    /// let sb = stream.alloc_zeros::<f32>(og.span(scale)?).unwrap();
    /// let mut yb = stream.alloc_zeros::<half::bf16>(og.span(out.y)?).unwrap();
    /// let mut rb = stream.alloc_zeros::<f32>(og.span(inv_rms)?).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let mut args = Args::new(&cudnn);
    /// args.input(x, &xb)?.input(scale, &sb)?;
    /// args.output(out.y, &mut yb)?.output(inv_rms, &mut rb)?;
    /// cudnn.execute(&plan, &args, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_RMS_NORM")]
    pub fn rms_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: f64,
        training: bool,
    ) -> Result<RmsNormOutputs> {
        let (y, _, inv_rms, _) =
            self.norm_forward(NormMode::Rms, x, scale, bias, epsilon, training, None, None)?;
        Ok(RmsNormOutputs { y, inv_rms })
    }

    /// RMS normalization backward (`CUDNN_RMS_NORM`): from `dy`, the forward input `x`, the
    /// `scale` and the saved `inv_rms` `[N, 1, 1, 1]` of the training forward pass, the
    /// gradients dx (laid out like dy), dscale and, with `with_dbias` (a forward pass with a
    /// bias), dbias (the scale's dimensions and layout).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_RMS_NORM")]
    pub fn rms_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        inv_rms: TensorId,
        with_dbias: bool,
    ) -> Result<RmsNormGrads> {
        let (dx, dscale, dbias) =
            self.norm_backward(NormMode::Rms, dy, x, scale, None, inv_rms, with_dbias)?;
        Ok(RmsNormGrads { dx, dscale, dbias })
    }

    stats_norm_op! {
        /// Instance normalization forward (`CUDNN_INSTANCE_NORM`): each plane `x[n, c, ...]` is
        /// normalized over its spatial dimensions, `y = (x − mean) · inv_var · scale[c] + bias[c]`
        /// with `inv_var = 1 / √(var + epsilon)` (biased variance).
        ///
        /// x is `[N, C, spatial...]` (rank 4 or 5); `scale` and `bias` are `[1, C, 1, 1]`. With
        /// `training` the per-plane mean and inverse standard deviation `[N, C, 1, 1]` are outputs
        /// too. cudnn-frontend's tests run channels-last f16 / bf16 x, scale and bias in x's type or
        /// f32, and f32 statistics.
        #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
        #[doc(alias = "CUDNN_INSTANCE_NORM")]
        fn instance_norm = forward Instance;
    }

    stats_norm_op! {
        /// Instance normalization backward (`CUDNN_INSTANCE_NORM`): from `dy`, the forward input
        /// `x`, the `scale` `[1, C, 1, 1]` and the saved `mean` and `inv_var` `[N, C, 1, 1]`, the
        /// gradients dx (laid out like dy), dscale and dbias (the scale's dimensions and layout).
        #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
        #[doc(alias = "CUDNN_INSTANCE_NORM")]
        fn instance_norm_backward = backward Instance;
    }

    /// Batch normalization forward, training phase (`CUDNN_BATCH_NORM`,
    /// `CUDNN_NORM_FWD_TRAINING`): each channel `x[:, c, ...]` is normalized over the batch and
    /// spatial dimensions, `y = (x − mean) · inv_var · scale[c] + bias[c]` with
    /// `inv_var = 1 / √(var + epsilon)` (biased variance). The batch mean and inverse standard
    /// deviation `[1, C, 1, 1]` are outputs (for [`Graph::batch_norm_backward`]).
    ///
    /// With `running`, the previous running mean and variance are read and their update
    /// `(1 − momentum) · prev + momentum · batch` is written to two more outputs
    /// ([`BatchNormOutputs::running`]; bind them to other buffers than the previous statistics);
    /// the momentum is an f32 by-value scalar. cuDNN's legacy batch norm and PyTorch update the
    /// running variance with the unbiased batch variance (`· m / (m − 1)` for `m = N·spatial`
    /// elements per channel).
    ///
    /// x is `[N, C, spatial...]` (rank 4 or 5); scale, bias and the running statistics are
    /// `[1, C, 1, 1]`. cudnn-frontend's samples use channels-last f16 x with f32 scale, bias and
    /// statistics.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_BATCH_NORM")]
    pub fn batch_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        running: Option<BatchNormRunning>,
    ) -> Result<BatchNormOutputs> {
        let (y, mean, inv_var, running) = self.norm_forward(
            NormMode::Batch,
            x,
            scale,
            Some(bias),
            epsilon,
            true,
            running,
            None,
        )?;
        Ok(BatchNormOutputs {
            y,
            mean: mean.expect("training phase"),
            inv_var: inv_var.expect("training phase"),
            running,
        })
    }

    /// Batch normalization forward, inference phase (`CUDNN_BATCH_NORM`,
    /// `CUDNN_NORM_FWD_INFERENCE`): `y = (x − mean) · inv_var · scale + bias` per channel with
    /// the given statistics `mean` and `inv_var` `[1, C, 1, 1]` (inputs; `inv_var` is
    /// `1 / √(running_var + ε)`, so no epsilon is taken, as in cudnn-frontend's
    /// `batchnorm_inference`). Returns y (x's dimensions and layout).
    ///
    /// The descriptor is set as cudnn-frontend's `BatchnormInferenceNode` sets it (mode, phase,
    /// x, mean, inverse variance, scale, bias, y; no epsilon, no running statistics), but
    /// cudnn-frontend runs batch-norm inference only fused into the pattern
    /// `batch_norm_inference → ReLU backward (PointwiseMode::ReluBwd) → batch_norm_backward`
    /// (its sample `BN_inference DRelu DBN Graph`: f16 channels-last x `[4, 32, 16, 16]`, f32
    /// scale, bias, mean and inverse variance `[1, 32, 1, 1]`, y virtual in f32, the ReLU
    /// gradient virtual in f16). A graph of this operation alone was refused by cuDNN 9.14
    /// (f32 channels-last: the heuristics' descriptor did not finalize,
    /// `CUDNN_STATUS_NOT_SUPPORTED`), so [`crate::graph::OperationGraph::plans`] may return a
    /// typed error for it; the legacy `cudnnBatchNormalizationForwardInference`
    /// ([`crate::norm`]) covers standalone inference.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_BATCH_NORM")]
    pub fn batch_norm_inference(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "batch norm forward";
        let mode = NormMode::Batch;
        let (xi, (param, _)) = self.norm_check_affine(mode, OP, x, scale, Some(bias), None)?;
        let (mi, vi) = (self.index(mean)?, self.index(inv_var)?);
        self.norm_check_dims(xi, mi, &param, stats_rule(mode))?;
        self.norm_check_dims(xi, vi, &param, stats_rule(mode))?;
        let dims = self.tensors[xi].dims.clone();
        let order = stride_order(&self.tensors[xi].strides);
        let (xi, si, bi) = self.norm_affine_operands(OP, x, scale, Some(bias))?;
        let mi = self.operand(mean, None, OP)?;
        let vi = self.operand(inv_var, None, OP)?;
        let y = self.output("batch_norm.y", dims, &order, self.ops.len())?;
        self.ops.push(Op::NormFwd(NormFwdOp {
            mode,
            x: xi,
            scale: si,
            bias: bi,
            epsilon: None,
            y: y.index,
            training: false,
            mean: Some(mi),
            inv_var: Some(vi),
            running: None,
        }));
        Ok(y)
    }

    stats_norm_op! {
        /// Batch normalization backward (`CUDNN_BATCH_NORM`): from `dy`, the forward input `x`, the
        /// `scale` and the saved batch `mean` and `inv_var` `[1, C, 1, 1]` of the training forward
        /// pass, the gradients dx (laid out like dy), dscale and dbias (the scale's dimensions and
        /// layout).
        #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
        #[doc(alias = "CUDNN_BATCH_NORM")]
        fn batch_norm_backward = backward Batch;
    }
}
