//! Layer normalization in a graph (`CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR` and
//! `..._NORM_BACKWARD_DESCRIPTOR` in `CUDNN_LAYER_NORM` mode).
use super::{stride_order, Graph, Op, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Outputs of [`Graph::layer_norm_backward`]: virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormGrads {
    /// Gradient with respect to x (x's dimensions, laid out like dy).
    pub dx: TensorId,
    /// Gradient with respect to the scale (the scale's dimensions and layout).
    pub dscale: TensorId,
    /// Gradient with respect to the bias (the scale's dimensions and layout).
    pub dbias: TensorId,
}

/// Outputs of [`Graph::layer_norm`]: virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormOutputs {
    /// The normalized, scaled and shifted x (x's dimensions and layout).
    pub y: TensorId,
    /// Training phase only: the per-row mean `[N, 1, ...]` and inverse standard deviation
    /// `1 / √(var + ε)` (biased variance), which [`Graph::layer_norm_backward`] reads.
    pub stats: Option<(TensorId, TensorId)>,
}

impl Graph {
    /// `x` must be an ordinary tensor of rank 4 or 5 (`[N, D, 1, 1]` for rows of length D).
    fn ln_check_x(&self, op: &'static str, xi: usize) -> Result<()> {
        let xt = &self.tensors[xi];
        if !(4..=5).contains(&xt.dims.len()) || xt.scalar.is_some() {
            return Err(Error::invalid(
                "layer norm operand rank",
                format!("{op}: x of 4 or 5 dimensions ([N, D, 1, 1] for rows of length D)"),
                format!("`{}` with dims {:?}", xt.name, xt.dims),
            ));
        }
        Ok(())
    }

    /// `t` has dimensions `want` (and is not a by-value scalar).
    fn ln_check_dims(&self, xi: usize, ti: usize, want: &[i64], rule: &'static str) -> Result<()> {
        let (xt, tt) = (&self.tensors[xi], &self.tensors[ti]);
        if tt.dims != want || tt.scalar.is_some() {
            return Err(Error::ShapeMismatch {
                a: xt.name,
                a_dims: xt.dims.clone(),
                b: tt.name,
                b_dims: tt.dims.clone(),
                rule,
            });
        }
        Ok(())
    }

    /// `[1, D...]` and `[N, 1...]` for x `[N, D...]`.
    fn ln_shapes(&self, xi: usize) -> (Vec<i64>, Vec<i64>) {
        let d = &self.tensors[xi].dims;
        let mut param = d.clone();
        param[0] = 1;
        let mut stats = vec![1; d.len()];
        stats[0] = d[0];
        (param, stats)
    }

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
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        training: bool,
    ) -> Result<LayerNormOutputs> {
        const OP: &str = "layer norm forward";
        let (xi, si, bi) = (self.index(x)?, self.index(scale)?, self.index(bias)?);
        self.ln_check_x(OP, xi)?;
        let (param, stats_dims) = self.ln_shapes(xi);
        const RULE: &str = "layer norm scale and bias have x's dimensions with N = 1";
        self.ln_check_dims(xi, si, &param, RULE)?;
        self.ln_check_dims(xi, bi, &param, RULE)?;
        if !epsilon.is_finite() || epsilon < 0.0 {
            return Err(Error::invalid(
                "layer norm epsilon",
                "a finite value ≥ 0",
                format!("{epsilon}"),
            ));
        }
        let r = self.tensors[xi].dims.len();
        let dims = self.tensors[xi].dims.clone();
        let order = stride_order(&self.tensors[xi].strides);
        let eps = self.scalar("layer_norm.epsilon", epsilon, DType::F32)?;
        let xi = self.operand(x, None, OP)?;
        let si = self.operand(scale, None, OP)?;
        let bi = self.operand(bias, None, OP)?;
        let ei = self.operand(eps, Some(r), OP)?;
        let op = self.ops.len();
        let y = self.output("layer_norm.y", dims, &order, op)?;
        let stats = if training {
            let mean = self.output("layer_norm.mean", stats_dims.clone(), &order, op)?;
            let inv_var = self.output("layer_norm.inv_var", stats_dims, &order, op)?;
            Some((mean, inv_var))
        } else {
            None
        };
        self.ops.push(Op::LayerNorm {
            x: xi,
            scale: si,
            bias: bi,
            epsilon: ei,
            y: y.index,
            stats: stats.map(|(m, v)| (m.index, v.index)),
        });
        Ok(LayerNormOutputs { y, stats })
    }

    /// Layer normalization backward (`CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR`,
    /// `CUDNN_LAYER_NORM`): from the gradient `dy`, the forward input `x`, the `scale` and the
    /// saved `mean` and `inv_var` of the training forward pass, the gradients dx (x's
    /// dimensions, laid out like dy), dscale and dbias (the scale's dimensions and layout).
    ///
    /// Shapes as in [`Graph::layer_norm`]: dy and x `[N, D, 1, 1]`, scale `[1, D, 1, 1]`, mean
    /// and inv_var `[N, 1, 1, 1]`. cudnn-frontend's sample binds f32 scale, statistics, dscale
    /// and dbias with f16 x, dy and dx. No epsilon is needed: inv_var already holds it.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    pub fn layer_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<LayerNormGrads> {
        const OP: &str = "layer norm backward";
        let dyi = self.index(dy)?;
        let xi = self.index(x)?;
        let si = self.index(scale)?;
        let mi = self.index(mean)?;
        let vi = self.index(inv_var)?;
        self.ln_check_x(OP, xi)?;
        let x_dims = self.tensors[xi].dims.clone();
        self.ln_check_dims(xi, dyi, &x_dims, "dy and x have the same dimensions")?;
        let (param, stats_dims) = self.ln_shapes(xi);
        self.ln_check_dims(
            xi,
            si,
            &param,
            "layer norm scale has x's dimensions with N = 1",
        )?;
        const STATS: &str = "layer norm mean and inv_var are [N, 1, ...] for x [N, ...]";
        self.ln_check_dims(xi, mi, &stats_dims, STATS)?;
        self.ln_check_dims(xi, vi, &stats_dims, STATS)?;
        let dx_order = stride_order(&self.tensors[dyi].strides);
        let p_order = stride_order(&self.tensors[si].strides);
        let dyi = self.operand(dy, None, OP)?;
        let xi = self.operand(x, None, OP)?;
        let si = self.operand(scale, None, OP)?;
        let mi = self.operand(mean, None, OP)?;
        let vi = self.operand(inv_var, None, OP)?;
        let op = self.ops.len();
        let dx = self.output("layer_norm_bwd.dx", x_dims, &dx_order, op)?;
        let dscale = self.output("layer_norm_bwd.dscale", param.clone(), &p_order, op)?;
        let dbias = self.output("layer_norm_bwd.dbias", param, &p_order, op)?;
        self.ops.push(Op::LayerNormBwd {
            dy: dyi,
            x: xi,
            scale: si,
            mean: mi,
            inv_var: vi,
            dx: dx.index,
            dscale: dscale.index,
            dbias: dbias.index,
        });
        Ok(LayerNormGrads { dx, dscale, dbias })
    }
}
