//! Batch norm folded into the convolution before it, for inference.
use crate::error::{Error, Result};

/// The filters and bias of a convolution followed by an inference-mode batch norm, folded into
/// one convolution: with `s_k = γ_k / √(var_k + ε)`, filter `k` becomes `w_k·s_k` and the bias
/// `β_k + (b_k − mean_k)·s_k`, so that `conv(x, w') + b' = bn(conv(x, w) + b)`.
///
/// `w` holds the `K` filters one after another (`[K, C, R, S]` or `[K, R, S, C]`: output
/// channel outermost); `bias` is the convolution's own bias (`None`: zero); the four batch-norm
/// vectors hold `K` values each. Computed in `f64`, returned as `f32` (convert to the network's
/// type after folding, not before). Errors name the argument whose length disagrees, or an
/// `ε` or variance that would divide by zero.
///
/// ```
/// // One 1×1 filter of 2 input channels, batch norm with γ 2, β 1, mean 0.5, variance 3 (ε 1).
/// let (w, b) = cudnn_safe::norm::fold_batch_norm(&[1.0, -2.0], None, &[2.0], &[1.0], &[0.5], &[3.0], 1.0)?;
/// assert_eq!(w, [1.0, -2.0]); // s = 2 / √4 = 1
/// assert_eq!(b, [0.5]);       // 1 + (0 − 0.5)·1
/// # Ok::<(), cudnn_safe::Error>(())
/// ```
pub fn fold_batch_norm(
    w: &[f32],
    bias: Option<&[f32]>,
    gamma: &[f32],
    beta: &[f32],
    mean: &[f32],
    var: &[f32],
    epsilon: f64,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let k = gamma.len();
    let vectors = [
        ("beta", beta.len()),
        ("mean", mean.len()),
        ("var", var.len()),
    ];
    let bias_len = bias.map(<[f32]>::len);
    for (name, len) in vectors.into_iter().chain(bias_len.map(|n| ("bias", n))) {
        if len != k {
            return Err(Error::invalid(
                name,
                format!("{k} values (one per output channel, as `gamma`)"),
                format!("{len} values"),
            ));
        }
    }
    if k == 0 || w.len() % k != 0 {
        return Err(Error::invalid(
            "w",
            format!("a whole number of filters, one per output channel ({k}), at least one"),
            format!("{} values", w.len()),
        ));
    }
    if !(epsilon.is_finite() && epsilon >= 0.0) {
        return Err(Error::invalid(
            "epsilon",
            "a finite value ≥ 0",
            format!("{epsilon}"),
        ));
    }
    let per_filter = w.len() / k;
    let mut folded = Vec::with_capacity(w.len());
    let mut shift = Vec::with_capacity(k);
    for c in 0..k {
        let denom = f64::from(var[c]) + epsilon;
        if !(denom > 0.0 && denom.is_finite()) {
            return Err(Error::invalid(
                "var",
                "var + epsilon > 0 and finite for every channel",
                format!("{} + {epsilon} at channel {c}", var[c]),
            ));
        }
        let s = f64::from(gamma[c]) / denom.sqrt();
        let filter = &w[c * per_filter..(c + 1) * per_filter];
        folded.extend(filter.iter().map(|&v| (f64::from(v) * s) as f32));
        let b = bias.map_or(0.0, |b| f64::from(b[c]));
        shift.push((f64::from(beta[c]) + (b - f64::from(mean[c])) * s) as f32);
    }
    Ok((folded, shift))
}
