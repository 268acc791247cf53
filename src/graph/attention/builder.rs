//! [`Sdpa`]: attention described by its sizes and buffer layout; it declares q, k, v (and o,
//! dO, stats), the inputs its options need, and builds the forward or backward graph.
use super::{SdpaGrads, SdpaOptions, SdpaOutputs};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};

/// How q, k, v, o and their gradients lie in memory. The graph tensors are always the logical
/// `[batch, heads, seq, dim]`; the layout gives their strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SdpaLayout {
    /// `[batch, seq, heads, dim]` in memory (the output of a linear projection reshaped to
    /// heads, as cudnn-frontend's samples store q, k, v): strides `[s·h·d, d, h·d, 1]`.
    #[default]
    Bshd,
    /// `[batch, heads, seq, dim]` in memory, packed: strides `[h·s·d, s·d, d, 1]`.
    Bhsd,
}

impl SdpaLayout {
    /// The strides (in elements) of a logical `[b, h, s, d]` tensor stored in this layout.
    /// Products saturate at `i64::MAX` (no panic on absurd sizes): such strides describe a
    /// span that [`Graph::tensor`] refuses.
    ///
    /// ```
    /// use cudnn_safe::graph::SdpaLayout;
    /// assert_eq!(SdpaLayout::Bshd.strides([2, 8, 128, 64]), [65536, 64, 512, 1]);
    /// assert_eq!(SdpaLayout::Bhsd.strides([2, 8, 128, 64]), [65536, 8192, 64, 1]);
    /// ```
    pub fn strides(self, [_, h, s, d]: [i64; 4]) -> [i64; 4] {
        let m = i64::saturating_mul;
        match self {
            SdpaLayout::Bshd => [m(m(s, h), d), d, m(h, d), 1],
            SdpaLayout::Bhsd => [m(m(h, s), d), m(s, d), d, 1],
        }
    }
}

/// Scaled dot-product attention described by its sizes: [`Sdpa::forward`] and
/// [`Sdpa::backward`] declare q, k, v (and o, dO, stats) with the strides of
/// [`Sdpa::layout`], create the graph inputs the options need (bias, ALiBi slopes, dropout seed
/// and offset, sequence lengths) and add [`Graph::sdpa`] / [`Graph::sdpa_backward`] to a
/// graph.
///
/// Plain data: the fields are the settings, the methods of the same names set them. The
/// sizes, the layout and the data type are checked when a graph is built from it, before the
/// graph changes; the rules of the options are those of [`SdpaOptions`].
///
/// ```no_run
/// use cudnn_safe::graph::{Args, PlanFilter, Sdpa};
/// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// // 8 query heads sharing 2 key/value heads, causal, buffers [batch, seq, heads, dim].
/// let attn = Sdpa::new(2, 8, 1024, 1024, 64).kv_heads(2).causal(true).dtype(DType::BF16);
/// let mut g = attn.graph();
/// let fwd = attn.forward(&mut g)?;
/// let og = g.build(&cudnn)?;
/// let plan = og.plan(&cudnn, &PlanFilter::default())?;
///
/// let qb = stream.alloc_zeros::<half::bf16>(og.span(fwd.q)?).unwrap();
/// let kb = stream.alloc_zeros::<half::bf16>(og.span(fwd.k)?).unwrap();
/// let vb = stream.alloc_zeros::<half::bf16>(og.span(fwd.v)?).unwrap();
/// let mut ob = stream.alloc_zeros::<half::bf16>(og.span(fwd.out.o)?).unwrap();
/// let mut ws = Workspace::new(stream.clone());
/// let mut args = Args::new(&cudnn);
/// args.input(fwd.q, &qb)?.input(fwd.k, &kb)?.input(fwd.v, &vb)?;
/// args.output(fwd.out.o, &mut ob)?;
/// cudnn.execute(&plan, &args, &mut ws)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Sdpa {
    /// Batch size `b`.
    pub batch: i64,
    /// Query heads `h`.
    pub heads: i64,
    /// Key and value heads (dividing `heads`; smaller for grouped-query attention, 1 for
    /// multi-query attention). Default: `heads`.
    pub kv_heads: i64,
    /// Query sequence length `s_q`.
    pub seq_q: i64,
    /// Key and value sequence length `s_kv`.
    pub seq_kv: i64,
    /// Head dimension `d` of q and k.
    pub head_dim: i64,
    /// Head dimension of v and o. Default: `head_dim`.
    pub head_dim_v: i64,
    /// Buffer layout of q, k, v, o, dO and the gradients. Default [`SdpaLayout::Bshd`].
    pub layout: SdpaLayout,
    /// Data type of q, k, v, o, dO and the gradients: f16 or bf16. Default bf16.
    pub dtype: DType,
    /// Scale, causal mask, sliding window, training, determinism and bias gradient, as
    /// [`SdpaOptions`] (its tensor settings, bias, ALiBi, dropout and padding, come from the
    /// fields below).
    pub options: SdpaOptions,
    /// With [`Sdpa::bias`]: the bias's batch and head extents (each 1 or the full extent).
    pub bias: Option<[i64; 2]>,
    /// ALiBi with the standard slopes' input ([`SdpaOptions::alibi`]).
    pub alibi: bool,
    /// Dropout probability ([`SdpaOptions::dropout`]).
    pub dropout: Option<f64>,
    /// Padding masks by per-batch sequence lengths ([`SdpaOptions::padding`]).
    pub padding: bool,
}

/// The graph inputs an [`Sdpa`] creates for its options besides q, k, v (and o, dO, stats);
/// `None` for options not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SdpaInputs {
    /// The additive bias `[b or 1, h or 1, s_q, s_kv]`, packed, of the data type.
    pub bias: Option<TensorId>,
    /// The ALiBi slopes (f32 `[1, h, 1, 1]`; bind [`alibi_slopes`](super::alibi_slopes)).
    pub alibi_slopes: Option<TensorId>,
    /// The dropout seed (one `i64`, [`Graph::rng_input`]).
    pub dropout_seed: Option<TensorId>,
    /// The dropout offset (one `i64`, [`Graph::rng_input`]).
    pub dropout_offset: Option<TensorId>,
    /// The query lengths per batch entry ([`Graph::seq_len_input`]).
    pub seq_len_q: Option<TensorId>,
    /// The key and value lengths per batch entry ([`Graph::seq_len_input`]).
    pub seq_len_kv: Option<TensorId>,
}

/// The tensors of a forward pass added by [`Sdpa::forward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SdpaForward {
    /// Queries, logical `[b, h, s_q, d]`.
    pub q: TensorId,
    /// Keys, logical `[b, h_kv, s_kv, d]` (described to cuDNN transposed, see [`Graph::sdpa`]).
    pub k: TensorId,
    /// Values, logical `[b, h_kv, s_kv, d_v]`.
    pub v: TensorId,
    /// The outputs (o, and the statistics in training).
    pub out: SdpaOutputs,
    /// The inputs of the options.
    pub inputs: SdpaInputs,
}

/// The tensors of a backward pass added by [`Sdpa::backward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SdpaBackward {
    /// Queries, logical `[b, h, s_q, d]`.
    pub q: TensorId,
    /// Keys, logical `[b, h_kv, s_kv, d]`.
    pub k: TensorId,
    /// Values, logical `[b, h_kv, s_kv, d_v]`.
    pub v: TensorId,
    /// The forward output, logical `[b, h, s_q, d_v]`.
    pub o: TensorId,
    /// The gradient of the output, `o`'s dimensions and layout.
    pub d_o: TensorId,
    /// The forward statistics, f32 `[b, h, s_q, 1]` packed.
    pub stats: TensorId,
    /// The gradients and scratch tensors.
    pub grads: SdpaGrads,
    /// The inputs of the options.
    pub inputs: SdpaInputs,
}

impl Sdpa {
    /// Attention of `batch` entries with `heads` query heads (and as many key and value heads),
    /// `seq_q` queries attending to `seq_kv` keys, head dimension `head_dim`; BSHD buffers of
    /// bf16, the defaults of [`SdpaOptions`].
    pub fn new(batch: i64, heads: i64, seq_q: i64, seq_kv: i64, head_dim: i64) -> Sdpa {
        Sdpa {
            batch,
            heads,
            kv_heads: heads,
            seq_q,
            seq_kv,
            head_dim,
            head_dim_v: head_dim,
            layout: SdpaLayout::Bshd,
            dtype: DType::BF16,
            options: SdpaOptions::new(),
            bias: None,
            alibi: false,
            dropout: None,
            padding: false,
        }
    }
    /// Key and value heads: fewer than the query heads for grouped-query attention, 1 for
    /// multi-query attention.
    #[must_use]
    pub fn kv_heads(mut self, kv_heads: i64) -> Self {
        self.kv_heads = kv_heads;
        self
    }
    /// The head dimension of v and o, when it differs from q's and k's.
    #[must_use]
    pub fn head_dim_v(mut self, head_dim_v: i64) -> Self {
        self.head_dim_v = head_dim_v;
        self
    }
    /// The buffer layout.
    #[must_use]
    pub fn layout(mut self, layout: SdpaLayout) -> Self {
        self.layout = layout;
        self
    }
    /// The data type of the buffers (f16 or bf16).
    #[must_use]
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    /// All options at once (the bias, ALiBi, dropout and padding tensors set there are ignored:
    /// [`Sdpa`] creates its own from its fields).
    #[must_use]
    pub fn options(mut self, options: SdpaOptions) -> Self {
        self.options = options;
        self
    }
    /// [`SdpaOptions::scale`].
    #[must_use]
    pub fn scale(mut self, scale: f64) -> Self {
        self.options = self.options.scale(scale);
        self
    }
    /// [`SdpaOptions::causal`] (top-left aligned).
    #[must_use]
    pub fn causal(mut self, causal: bool) -> Self {
        self.options = self.options.causal(causal);
        self
    }
    /// [`SdpaOptions::causal_bottom_right`].
    #[must_use]
    pub fn causal_bottom_right(mut self, causal: bool) -> Self {
        self.options = self.options.causal_bottom_right(causal);
        self
    }
    /// [`SdpaOptions::sliding_window`].
    #[must_use]
    pub fn sliding_window(mut self, window: i64) -> Self {
        self.options = self.options.sliding_window(window);
        self
    }
    /// [`SdpaOptions::training`]: the forward pass also outputs the statistics.
    #[must_use]
    pub fn training(mut self, training: bool) -> Self {
        self.options = self.options.training(training);
        self
    }
    /// [`SdpaOptions::deterministic`] (backward).
    #[must_use]
    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.options = self.options.deterministic(deterministic);
        self
    }
    /// An additive bias input `[batch_extent, head_extent, s_q, s_kv]` (each extent 1, a
    /// broadcast, or the full one), packed ([`SdpaOptions::bias`]).
    #[must_use]
    pub fn bias(mut self, batch_extent: i64, head_extent: i64) -> Self {
        self.bias = Some([batch_extent, head_extent]);
        self
    }
    /// [`SdpaOptions::bias_grad`]: the backward pass also outputs dBias.
    #[must_use]
    pub fn bias_grad(mut self, grad: bool) -> Self {
        self.options = self.options.bias_grad(grad);
        self
    }
    /// ALiBi ([`SdpaOptions::alibi`]): creates the slopes input.
    #[must_use]
    pub fn alibi(mut self, alibi: bool) -> Self {
        self.alibi = alibi;
        self
    }
    /// Dropout with `probability` ([`SdpaOptions::dropout`]): creates the seed and offset
    /// inputs.
    #[must_use]
    pub fn dropout(mut self, probability: f64) -> Self {
        self.dropout = Some(probability);
        self
    }
    /// [`SdpaOptions::dump_dropout_mask`] (forward).
    #[must_use]
    pub fn dump_dropout_mask(mut self, dump: bool) -> Self {
        self.options = self.options.dump_dropout_mask(dump);
        self
    }
    /// A padding mask ([`SdpaOptions::padding`]): creates the two sequence-length inputs.
    #[must_use]
    pub fn padding(mut self, padding: bool) -> Self {
        self.padding = padding;
        self
    }

    /// An empty graph of the data type with the f32 intermediate and compute types attention
    /// needs.
    pub fn graph(&self) -> Graph {
        Graph::new(self.dtype, DType::F32, DType::F32)
    }

    /// Adds the forward pass to `g`: declares q, k, v (and the inputs of the options) and calls
    /// [`Graph::sdpa`]. On error `g` is left as it was.
    #[doc(alias = "scaled_dot_product_attention")]
    pub fn forward(&self, g: &mut Graph) -> Result<SdpaForward> {
        self.check()?;
        let mut n = g.clone();
        let [q, k, v] = self.qkv(&mut n)?;
        let (opts, inputs) = self.inputs(&mut n)?;
        let out = n.sdpa(q, k, v, &opts)?;
        *g = n;
        Ok(SdpaForward {
            q,
            k,
            v,
            out,
            inputs,
        })
    }

    /// Adds the backward pass to `g`: declares q, k, v, o, dO, stats (and the inputs of the
    /// options) and calls [`Graph::sdpa_backward`]. On error `g` is left as it was.
    #[doc(alias = "scaled_dot_product_attention_backward")]
    pub fn backward(&self, g: &mut Graph) -> Result<SdpaBackward> {
        self.check()?;
        let mut n = g.clone();
        let [q, k, v] = self.qkv(&mut n)?;
        let o_dims = [self.batch, self.heads, self.seq_q, self.head_dim_v];
        let o_strides = self.layout.strides(o_dims);
        let o = n.tensor("o", &o_dims, &o_strides, self.dtype)?;
        let d_o = n.tensor("dO", &o_dims, &o_strides, self.dtype)?;
        let stats = n.tensor_nchw(
            "stats",
            &[self.batch, self.heads, self.seq_q, 1],
            DType::F32,
        )?;
        let (opts, inputs) = self.inputs(&mut n)?;
        let grads = n.sdpa_backward(q, k, v, o, d_o, stats, &opts)?;
        *g = n;
        Ok(SdpaBackward {
            q,
            k,
            v,
            o,
            d_o,
            stats,
            grads,
            inputs,
        })
    }

    /// The sizes are at least 1, the key and value heads divide the query heads, the data type
    /// is f16 or bf16, and the bias extents are 1 or full.
    fn check(&self) -> Result<()> {
        let sizes = [
            ("batch", self.batch),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("seq_q", self.seq_q),
            ("seq_kv", self.seq_kv),
            ("head_dim", self.head_dim),
            ("head_dim_v", self.head_dim_v),
        ];
        if let Some((name, n)) = sizes.iter().find(|(_, n)| *n < 1) {
            return Err(Error::invalid(
                "attention size",
                "every size at least 1",
                format!("{name} {n}"),
            ));
        }
        if self.heads % self.kv_heads != 0 {
            return Err(Error::invalid(
                "attention key/value heads",
                "a divisor of the query heads",
                format!("{} kv heads for {} heads", self.kv_heads, self.heads),
            ));
        }
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDataType {
                op: "scaled dot-product attention",
                detail: format!("{} buffers (attention takes f16 or bf16)", self.dtype),
            });
        }
        if let Some([b, h]) = self.bias {
            if !(b == 1 || b == self.batch) || !(h == 1 || h == self.heads) {
                return Err(Error::invalid(
                    "attention bias extents",
                    format!(
                        "1 or {} for the batch, 1 or {} for the heads",
                        self.batch, self.heads
                    ),
                    format!("[{b}, {h}]"),
                ));
            }
        }
        Ok(())
    }

    /// Declares q, k, v with the layout's strides.
    fn qkv(&self, g: &mut Graph) -> Result<[TensorId; 3]> {
        let q_dims = [self.batch, self.heads, self.seq_q, self.head_dim];
        let k_dims = [self.batch, self.kv_heads, self.seq_kv, self.head_dim];
        let v_dims = [self.batch, self.kv_heads, self.seq_kv, self.head_dim_v];
        let mut t =
            |name, dims: [i64; 4]| g.tensor(name, &dims, &self.layout.strides(dims), self.dtype);
        Ok([t("q", q_dims)?, t("k", k_dims)?, t("v", v_dims)?])
    }

    /// Creates the inputs of the bias, ALiBi, dropout and padding settings; returns the options
    /// naming them.
    fn inputs(&self, g: &mut Graph) -> Result<(SdpaOptions, SdpaInputs)> {
        // Tensors of another graph set through `Sdpa::options` are not this graph's.
        let mut opts = SdpaOptions {
            bias: None,
            alibi: None,
            dropout: None,
            padding: None,
            ..self.options
        };
        let mut inputs = SdpaInputs::default();
        if let Some([b, h]) = self.bias {
            let dims = [b, h, self.seq_q, self.seq_kv];
            let bias = g.tensor_nchw("attn_bias", &dims, self.dtype)?;
            opts = opts.bias(bias);
            inputs.bias = Some(bias);
        }
        if self.alibi {
            let slopes = g.alibi_slopes_input("alibi_slopes", self.heads)?;
            opts = opts.alibi(slopes);
            inputs.alibi_slopes = Some(slopes);
        }
        if let Some(p) = self.dropout {
            let seed = g.rng_input("dropout_seed");
            let offset = g.rng_input("dropout_offset");
            opts = opts.dropout(p, seed, offset);
            (inputs.dropout_seed, inputs.dropout_offset) = (Some(seed), Some(offset));
        }
        if self.padding {
            let sq = g.seq_len_input("seq_len_q", self.batch)?;
            let skv = g.seq_len_input("seq_len_kv", self.batch)?;
            opts = opts.padding(sq, skv);
            (inputs.seq_len_q, inputs.seq_len_kv) = (Some(sq), Some(skv));
        }
        Ok((opts, inputs))
    }
}
