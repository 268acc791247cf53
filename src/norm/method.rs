//! How layer, group and instance normalization are put together from cuDNN calls: the choice of
//! batch-norm view for the statistics, and of the call that applies the affine map and computes
//! the parameter gradients. Every combination computes the same function; they differ in the
//! kernels cuDNN picks and in the number of passes over the tensor (see [`NormMethod`]).

/// How the per-group statistics and `x̂` are computed: which spatial batch-normalization view
/// of the packed tensor is handed to `cudnnBatchNormalizationForwardTraining` (and to its
/// backward).
///
/// `R` is the number of normalized groups (rows of a layer norm, `N·G` for a group norm) and
/// `M` the elements per group; every view addresses the same memory, packed. (A
/// per-activation batch norm on the transposed view `[M, R, 1, 1]` was tried too and
/// dropped: slower than every spatial view, and wrong `dγ` in bf16.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum NormStats {
    /// Spatial batch norm on `[1, R, M, 1]`: one "channel" per group.
    #[default]
    SpatialColumn,
    /// Spatial batch norm on `[1, R, 1, M]`: the same, with the group along `W`.
    SpatialRow,
    /// Spatial batch norm on `[1, R, H, W]` with `H·W = M` and `W` the largest divisor
    /// of `M` not above `√M` (a near-square spatial plane; `[1, R, M, 1]` when `M` is prime).
    SpatialSquare,
    /// `CUDNN_BATCHNORM_SPATIAL_PERSISTENT` on `[1, R, M, 1]`: cuDNN's faster spatial kernels,
    /// which NVIDIA documents may overflow (NaN/Inf) for inputs of very large range.
    SpatialPersistent,
}

impl NormStats {
    /// Every variant, in declaration order.
    pub const ALL: [NormStats; 4] = [
        NormStats::SpatialColumn,
        NormStats::SpatialRow,
        NormStats::SpatialSquare,
        NormStats::SpatialPersistent,
    ];
}

/// How `y = x̂·γ + β` is applied (and `dx̂ = dy·γ` in the backward pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NormAffine {
    /// `cudnnOpTensor` (multiply by `γ` broadcast) then `cudnnAddTensor` (add `β`): two passes
    /// over the tensor. The plain forward works in place in `y`: no scratch tensor.
    OpTensor,
    /// One `cudnnBatchNormalizationForwardInference` on the feature view (see
    /// [`FeatureLayout`]) with scale `γ`, bias `β`, mean 0, variance 1 and epsilon 0: one pass.
    /// For f16 and bf16 data `γ` and `β` are first converted to f32 (cuDNN's parameter type),
    /// two small extra launches. The plain forward then writes `x̂` into a tensor-sized scratch
    /// buffer kept by the normalization object (rather than into `y`, which would need
    /// cuDNN to support an in-place inference call, which it does not document).
    BatchNormInference,
}

/// How `dγ = Σ dy·x̂` and `dβ = Σ dy` are computed in the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NormParamGrads {
    /// `cudnnReduceTensor` of `dy`, `cudnnOpTensor` for `dy·x̂`, `cudnnReduceTensor` of that:
    /// uses the caller's workspace.
    Reduce,
    /// One `cudnnBatchNormalizationBackward` on the feature view with `x = x̂` and saved mean
    /// 0 / inverse standard deviation 1, whose scale and bias gradients are exactly `dγ` and
    /// `dβ` (its data gradient goes to scratch and is discarded). No workspace; f32 gradients
    /// converted to f16/bf16 for those data types. A layer norm of a single row (one value per
    /// feature, too few for a batch-norm training call) uses [`Reduce`](Self::Reduce).
    BatchNormBackward,
    /// As [`Reduce`](Self::Reduce), but each sum over the rows is split in two
    /// `cudnnReduceTensor` calls through an intermediate tensor of partial sums, because
    /// cuDNN's one-call reduction over many rows into a few features is slow (two calls
    /// through partial sums give the same sums, to rounding, in a fraction of the time).
    ///
    /// A layer norm's `R` rows are split as `R = S1·S2` with `S2` the largest divisor of `R`
    /// not above `√R`, the tensor is viewed as `[S1, S2, D, 1]`, `S2` is summed first (into
    /// `[S1, 1, D, 1]`), then `S1`. A group norm `[N, C, S]` sums its `S` spatial positions
    /// first (into `[N, C, 1, 1]`), then `N` (with `N = 1`, `S` is split as the rows above).
    /// When there is no such split (`R` prime, or below 4; `S` prime with `N = 1`) the sums
    /// are computed in one call, as [`Reduce`](Self::Reduce) does.
    ///
    /// The partial sums are kept in the parameter type ([`NormType::Param`](super::NormType),
    /// f32 for f16 and bf16 data) in a buffer owned by the normalization object; for f16 and
    /// bf16 the final sums are also formed in f32, then converted once. Uses the caller's
    /// workspace (the larger of the two reductions' needs; for bf16 data, which cuDNN
    /// reduces through f32, it includes an f32 copy of the tensor).
    TwoStageReduce,
}

impl NormParamGrads {
    /// Every variant, in declaration order.
    pub const ALL: [NormParamGrads; 3] = [
        NormParamGrads::Reduce,
        NormParamGrads::BatchNormBackward,
        NormParamGrads::TwoStageReduce,
    ];
}

/// How the feature (affine) axis is described to the batch-norm calls of
/// [`NormAffine::BatchNormInference`] and [`NormParamGrads::BatchNormBackward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FeatureLayout {
    /// The packed `[A, B, S, 1]` tensor itself (`B` features or channels as batch-norm
    /// channels): NCHW.
    ChannelsFirst,
    /// For a layer norm (`S = 1`): the same memory as the channels-last `[1, B, A, 1]` (NHWC,
    /// rows along `H`), the layout cuDNN's fastest batch-norm kernels are written for. A group
    /// norm with spatial positions has no channels-last description of its memory and uses
    /// [`ChannelsFirst`](Self::ChannelsFirst).
    ChannelsLast,
}

/// The formulation of a [`LayerNorm`](super::LayerNorm) or [`GroupNorm`](super::GroupNorm).
///
/// Every method computes the same result (up to rounding); they differ in speed, which
/// depends on the shape and the GPU (`benches/norm.rs` measures each). `LayerNorm::new` uses
/// [`default_for_layer`](Self::default_for_layer), `GroupNorm::new` (and `instance`)
/// [`default_for_group`](Self::default_for_group); their `with_method` picks another. The
/// first formulation, [`reductions`](Self::reductions), is the baseline the others are
/// checked against. In passes over the tensor:
///
/// | part | [`reductions`](Self::reductions) | defaults |
/// |---|---|---|
/// | affine map | 2 reads + 2 writes | 1 read + 1 write ([`NormAffine::BatchNormInference`]) |
/// | `dγ`, `dβ` | 4 reads + 1 write, workspace | layer norm: the same passes, each sum in two calls ([`NormParamGrads::TwoStageReduce`]), workspace; group norm: one batch-norm backward ([`NormParamGrads::BatchNormBackward`]), no workspace |
///
/// The defaults are the fastest formulations `cargo bench --bench norm` found (it times every
/// formulation and its parts, and checks each against `reductions`): for a layer norm of many
/// rows the parameter gradients, sums over the rows into a few features, are where the time
/// goes, and one `cudnnReduceTensor` does them slowly, hence
/// [`NormParamGrads::TwoStageReduce`] in [`default_for_layer`](Self::default_for_layer) (its
/// backward is the bench's `ln_fp32_32768x1024-bwd-default`; the former default, with
/// batch-norm gradients, is `-bwd-default_grads_bn`). For a group norm one batch-norm backward
/// gives the gradients in less time than the two-stage sums alone take: it keeps
/// [`NormParamGrads::BatchNormBackward`]. The feature view matters too: a layer norm's
/// batch-norm affine map runs fast on the channels-last view only.
///
/// ```
/// use cudnn_safe::norm::{FeatureLayout, NormAffine, NormMethod, NormParamGrads, NormStats};
/// let m = NormMethod::reductions()
///     .with_stats(NormStats::SpatialRow)
///     .with_affine(NormAffine::BatchNormInference)
///     .with_feature_layout(FeatureLayout::ChannelsLast);
/// assert_eq!(m.param_grads, NormParamGrads::Reduce);
/// let layer = NormMethod::default_for_layer();
/// assert_eq!(layer.affine, NormAffine::BatchNormInference);
/// assert_eq!(layer.param_grads, NormParamGrads::TwoStageReduce);
/// let group = NormMethod::default_for_group();
/// assert_eq!(group.feature_layout, FeatureLayout::ChannelsFirst);
/// assert_eq!(group.param_grads, NormParamGrads::BatchNormBackward);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[must_use]
pub struct NormMethod {
    /// The statistics view.
    pub stats: NormStats,
    /// The affine map.
    pub affine: NormAffine,
    /// The parameter gradients.
    pub param_grads: NormParamGrads,
    /// The feature view of the batch-norm affine and gradient calls.
    pub feature_layout: FeatureLayout,
}

impl NormMethod {
    /// The first formulation: spatial batch norm on `[1, R, M, 1]` for the statistics,
    /// `cudnnOpTensor` + `cudnnAddTensor` for the affine map, `cudnnReduceTensor` for `dγ`,
    /// `dβ`. The plain forward needs no tensor-sized scratch; the backward needs a workspace.
    pub fn reductions() -> Self {
        NormMethod {
            stats: NormStats::SpatialColumn,
            affine: NormAffine::OpTensor,
            param_grads: NormParamGrads::Reduce,
            feature_layout: FeatureLayout::ChannelsFirst,
        }
    }
    /// The default of [`LayerNorm`](super::LayerNorm): batch-norm inference on the
    /// channels-last feature view for the affine map, two-stage reductions for `dγ`, `dβ`
    /// (the fastest of the formulations for the layer norm; [`NormMethod`] says why).
    pub fn default_for_layer() -> Self {
        NormMethod {
            stats: NormStats::SpatialColumn,
            affine: NormAffine::BatchNormInference,
            param_grads: NormParamGrads::TwoStageReduce,
            feature_layout: FeatureLayout::ChannelsLast,
        }
    }
    /// The default of [`GroupNorm`](super::GroupNorm) and instance normalization: batch-norm
    /// inference for the affine map and batch-norm backward for `dγ`, `dβ`, on the
    /// channels-first feature view (the tensor as it is).
    pub fn default_for_group() -> Self {
        NormMethod {
            stats: NormStats::SpatialColumn,
            affine: NormAffine::BatchNormInference,
            param_grads: NormParamGrads::BatchNormBackward,
            feature_layout: FeatureLayout::ChannelsFirst,
        }
    }
    /// Sets the statistics view.
    pub fn with_stats(mut self, stats: NormStats) -> Self {
        self.stats = stats;
        self
    }
    /// Sets how the affine map is applied.
    pub fn with_affine(mut self, affine: NormAffine) -> Self {
        self.affine = affine;
        self
    }
    /// Sets how the parameter gradients are computed.
    pub fn with_param_grads(mut self, param_grads: NormParamGrads) -> Self {
        self.param_grads = param_grads;
        self
    }
    /// Sets the feature view of the batch-norm affine and gradient calls.
    pub fn with_feature_layout(mut self, feature_layout: FeatureLayout) -> Self {
        self.feature_layout = feature_layout;
        self
    }
    /// Whether some call runs on the feature view (and needs its constant vectors).
    pub(crate) fn uses_feature_view(&self) -> bool {
        self.affine == NormAffine::BatchNormInference
            || self.param_grads == NormParamGrads::BatchNormBackward
    }
}

/// `(H, W)` with `H·W = m` and `W` the largest divisor of `m` not above `√m`.
pub(crate) fn near_square(m: i64) -> (i64, i64) {
    let mut w = (m as f64).sqrt() as i64;
    // Correct the float estimate of ⌊√m⌋ in both directions.
    while w > 1 && w * w > m {
        w -= 1;
    }
    while (w + 1) * (w + 1) <= m {
        w += 1;
    }
    let w = (1..=w.max(1)).rev().find(|d| m % d == 0).unwrap_or(1);
    (m / w, w)
}

/// The dimensions of the views of [`NormParamGrads::TwoStageReduce`] for a packed
/// `[a, b, s, 1]` tensor (`b` features, summed over `a` and `s`): the tensor as the first
/// reduction reads it, the partial sums it writes, and the per-feature sums (`b` elements) the
/// second writes; all packed. `None` when the sum has no two-stage split (it is then one
/// reduction):
///
/// * `s = 1` (layer norm): the `a` rows split as `S1·S2` by [`near_square`] — `[S1, S2, b, 1]`
///   → `[S1, 1, b, 1]` → `[1, 1, b, 1]` — unless `S2 = 1` (`a` prime or below 4);
/// * `s > 1`, `a ≥ 2`: the contiguous `s` first — `[a, b, s, 1]` → `[a, b, 1, 1]` →
///   `[1, b, 1, 1]`;
/// * `s > 1`, `a = 1`: `s` split as the rows above — `[1, b, S1, S2]` → `[1, b, S1, 1]` →
///   `[1, b, 1, 1]` — unless `S2 = 1`.
///
/// Every reduction of these reduces at least one axis of extent ≥ 2, so none is the "reduce
/// nothing" copy cuDNN refuses.
pub(crate) fn two_stage_split(a: i64, b: i64, s: i64) -> Option<[[i64; 4]; 3]> {
    if s == 1 {
        let (s1, s2) = near_square(a);
        (s2 >= 2).then_some([[s1, s2, b, 1], [s1, 1, b, 1], [1, 1, b, 1]])
    } else if a >= 2 {
        Some([[a, b, s, 1], [a, b, 1, 1], [1, b, 1, 1]])
    } else {
        let (s1, s2) = near_square(s);
        (s2 >= 2).then_some([[1, b, s1, s2], [1, b, s1, 1], [1, b, 1, 1]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_square_factorizations() {
        assert_eq!(near_square(1024), (32, 32));
        assert_eq!(near_square(25088), (196, 128));
        assert_eq!(near_square(40), (8, 5));
        assert_eq!(near_square(37), (37, 1));
        assert_eq!(near_square(1), (1, 1));
        assert_eq!(near_square(2), (2, 1));
        for m in 1..2000i64 {
            let (h, w) = near_square(m);
            assert_eq!(h * w, m);
            assert!(w <= h, "{m}: {h}×{w}");
        }
    }

    #[test]
    fn setters_and_presets() {
        let d = NormMethod::reductions();
        assert_eq!(d.stats, NormStats::SpatialColumn);
        assert_eq!(d.affine, NormAffine::OpTensor);
        assert_eq!(d.param_grads, NormParamGrads::Reduce);
        assert_eq!(d.feature_layout, FeatureLayout::ChannelsFirst);
        assert!(!d.uses_feature_view());
        assert!(d
            .with_param_grads(NormParamGrads::BatchNormBackward)
            .uses_feature_view());
        let l = NormMethod::default_for_layer();
        assert_eq!(
            (l.stats, l.affine, l.param_grads, l.feature_layout),
            (
                NormStats::SpatialColumn,
                NormAffine::BatchNormInference,
                NormParamGrads::TwoStageReduce,
                FeatureLayout::ChannelsLast
            )
        );
        assert!(l.uses_feature_view());
        let g = NormMethod::default_for_group();
        assert_eq!(
            g,
            l.with_feature_layout(FeatureLayout::ChannelsFirst)
                .with_param_grads(NormParamGrads::BatchNormBackward)
        );
        assert!(!d
            .with_param_grads(NormParamGrads::TwoStageReduce)
            .uses_feature_view());
        assert_eq!(NormParamGrads::ALL.len(), 3);
        let m = d.with_stats(NormStats::SpatialPersistent);
        assert_eq!(m.stats, NormStats::SpatialPersistent);
        assert_eq!(m.affine, NormAffine::OpTensor);
        assert_eq!(NormStats::ALL.len(), 4);
        assert_eq!(NormStats::default(), NormStats::SpatialColumn);
    }

    #[test]
    fn two_stage_splits() {
        // The bench's layer norm: 32768 = 256·128, the 128 axis summed first.
        assert_eq!(
            two_stage_split(32768, 1024, 1),
            Some([[256, 128, 1024, 1], [256, 1, 1024, 1], [1, 1, 1024, 1]])
        );
        assert_eq!(
            two_stage_split(6, 40, 1),
            Some([[3, 2, 40, 1], [3, 1, 40, 1], [1, 1, 40, 1]])
        );
        // Prime or too few rows: one stage.
        for rows in [1, 2, 3, 5, 13, 37, 8191] {
            assert_eq!(two_stage_split(rows, 7, 1), None, "{rows} rows");
        }
        assert!(two_stage_split(4, 7, 1).is_some());
        // Group norm: spatial first, then the batch.
        assert_eq!(
            two_stage_split(32, 256, 3136),
            Some([[32, 256, 3136, 1], [32, 256, 1, 1], [1, 256, 1, 1]])
        );
        // One sample: the spatial positions split, unless prime.
        assert_eq!(
            two_stage_split(1, 6, 20),
            Some([[1, 6, 5, 4], [1, 6, 5, 1], [1, 6, 1, 1]])
        );
        assert_eq!(two_stage_split(1, 6, 7), None);
        // Every split views the same element count and ends in the features.
        for a in 1..40i64 {
            for s in 1..40i64 {
                if let Some([data, partial, sums]) = two_stage_split(a, 3, s) {
                    assert_eq!(data.iter().product::<i64>(), a * 3 * s, "{a}, {s}");
                    assert_eq!(sums.iter().product::<i64>(), 3);
                    for i in 0..4 {
                        assert!(partial[i] == data[i] || partial[i] == 1);
                        assert!(sums[i] == partial[i] || sums[i] == 1);
                    }
                    assert_ne!(data, partial, "{a}, {s}: first stage reduces nothing");
                    assert_ne!(partial, sums, "{a}, {s}: second stage reduces nothing");
                }
            }
        }
    }
}
