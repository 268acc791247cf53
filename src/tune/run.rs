//! The convolution calls of the [`Autotuner`]: a decision made or recalled, the union search
//! where it applies, and the legacy ranking run with fallback.
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaView};

use super::autotuner::Prepared;
use super::cache::{encode, Entry};
use super::key::{call_key, dtype_code, Key};
use super::search::{scratch, trial, Trial};
use super::union::{self as gunion, ConvGraph, Ids};
use super::{
    Autotuner, Candidate, Choice, ConvApi, FixedAlgos, GraphSearch, Policy, Source,
    COMPOSED_MIN_SPEEDUP,
};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::conv::graph::{exec_graph, UnionGraph};
use crate::conv::{
    AlgoPerf, ConvAlgorithm, ConvBackwardData, ConvBackwardFilter, ConvBiasActivation,
    ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvDirection, ConvForward, ConvFwdAlgo, ConvOp,
    ConvTranspose, FusedActivation,
};
use crate::dtype::{DataType, Scalar};
use crate::error::{Error, Result};
use crate::graph::{EngineConfig, Plan};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, TensorDesc};
use crate::workspace::Workspace;

/// A decision for a call: the entry, where it came from, and its cache key (none under a fixed
/// policy).
pub(super) struct Decided {
    pub(super) entry: Arc<Entry>,
    pub(super) source: Source,
    pub(super) key: Option<Arc<Key>>,
}

impl Autotuner {
    /// Decides (or recalls) the ranking for a problem. `heuristics` and `find` are only called
    /// on a miss; `find` receives the tuner's workspace. With `untimed_legacy` (a problem the
    /// union search will time, under [`SearchEffort::Quick`], in half precision), a benchmark
    /// policy ranks the legacy algorithms by the heuristics instead of running `find`.
    ///
    /// [`SearchEffort::Quick`]: super::SearchEffort::Quick
    pub(super) fn decide<A: ConvAlgorithm>(
        &mut self,
        cudnn: &Cudnn,
        prepared: Prepared,
        heuristics: impl FnOnce() -> Result<Vec<AlgoPerf<A>>>,
        find: impl FnMut(&mut Workspace) -> Result<Vec<AlgoPerf<A>>>,
        fixed: A,
        untimed_legacy: bool,
    ) -> Result<Decided> {
        let key = match prepared {
            Prepared::Fixed => {
                return Ok(Decided {
                    entry: Arc::new(Entry::legacy(vec![(fixed.raw_value(), 0, -1.0)])),
                    source: Source::Fixed,
                    key: None,
                });
            }
            Prepared::Known(key, entry) => {
                self.stats.hits += 1;
                return Ok(Decided {
                    entry,
                    source: Source::Cache,
                    key: Some(key),
                });
            }
            Prepared::Unknown(key) => key,
        };
        self.stats.misses += 1;
        let started = Instant::now();
        let limit = self.limit;
        let (perf, source) = if self.policy == Policy::Heuristic {
            (heuristics()?, Source::Heuristic)
        } else {
            crate::capture::refuse_during_capture(
                cudnn.stream(),
                "benchmarking algorithms (a tuner's first decision for this problem)",
            )?;
            self.stats.benchmarks += 1;
            if untimed_legacy {
                // The union search that follows times the legacy favourite against the plans.
                (heuristics()?, Source::Benchmark)
            } else {
                let runs = self.effort.find_runs();
                let found = benchmark(self.workspace(cudnn), runs, find);
                self.stats.find += started.elapsed();
                (found?, Source::Benchmark)
            }
        };
        let (ranking, refused) = rank(&perf, limit, self.policy == Policy::Deterministic);
        if ranking.is_empty() {
            return Err(Error::NoAlgorithm {
                op: direction_op(A::DIRECTION),
                detail: format!(
                    "policy {} with a workspace limit of {limit} bytes; refused: {}",
                    self.policy.name(),
                    refused.join(", ")
                ),
            });
        }
        log::info!(
            "conv {} autotune ({}, {:.1} ms): {} — {} ms, {} bytes of workspace; {} candidates{}",
            A::DIRECTION.name(),
            self.policy.name(),
            started.elapsed().as_secs_f64() * 1e3,
            ranking[0].algo,
            ranking[0].time_ms,
            ranking[0].workspace,
            ranking.len(),
            if refused.is_empty() {
                String::new()
            } else {
                format!("; refused {}", refused.join(", "))
            }
        );
        let entry = Arc::new(Entry::legacy(encode(&ranking)));
        self.cache.insert((*key).clone(), entry.clone());
        self.persist();
        Ok(Decided {
            entry,
            source,
            key: Some(key),
        })
    }

    /// Runs the legacy candidates in order until one succeeds. Errors from this crate's argument
    /// checks end the attempt at once (no algorithm can fix them); cuDNN refusals and workspace
    /// failures move on to the next candidate, and refused candidates leave the cached ranking.
    pub(super) fn run<A: ConvAlgorithm>(
        &mut self,
        cudnn: &Cudnn,
        d: Decided,
        mut launch: impl FnMut(A, &mut Workspace) -> Result<()>,
    ) -> Result<Choice<A>> {
        let mut failures = Vec::new();
        let mut refused = Vec::new();
        for (rank, &(raw, _, _)) in d.entry.ranking.iter().enumerate() {
            let Some(algo) = A::from_raw_value(raw) else {
                continue;
            };
            let ws = self.workspace(cudnn);
            match launch(algo, ws) {
                Ok(()) => {
                    if rank > 0 {
                        self.stats.fallbacks += 1;
                        log::warn!(
                            "conv {}: fell back to {algo} (rank {rank}) after {}",
                            A::DIRECTION.name(),
                            failures.join("; ")
                        );
                    }
                    if let (Some(key), false) = (&d.key, refused.is_empty()) {
                        if let Some(r) = self.cache.get_mut(&**key) {
                            Arc::make_mut(r)
                                .ranking
                                .retain(|(a, _, _)| !refused.contains(a));
                        }
                        self.recent.clear();
                    }
                    let workspace = self.workspace_bytes();
                    return Ok(Choice {
                        algo,
                        source: d.source,
                        rank,
                        workspace,
                        api: ConvApi::Legacy,
                    });
                }
                Err(e) if falls_back(&e) => {
                    if matches!(e, Error::Cudnn { .. }) {
                        refused.push(raw);
                    }
                    failures.push(format!("{algo}: {e}"));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoAlgorithm {
            op: direction_op(A::DIRECTION),
            detail: failures.join("; "),
        })
    }

    /// [`Autotuner::prepare`] for a backward problem; `x_desc` describes the convolution's input
    /// (dx for backward data).
    pub(super) fn prepare_backward<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        direction: ConvDirection,
        x_desc: &TensorDesc<T>,
        w_desc: &FilterDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
    ) -> Prepared {
        let kind = match direction {
            ConvDirection::Forward => 0,
            ConvDirection::BackwardData => 1,
            ConvDirection::BackwardFilter => 2,
        };
        let gmode = self.graph;
        self.prepare(
            cudnn,
            [kind, x_desc.id(), w_desc.id(), conv.id(), dy_desc.id(), 0],
            |policy, limit| {
                let descs = (x_desc, w_desc, dy_desc);
                call_key(direction, descs, conv, (policy, limit, gmode))
            },
        )
    }

    /// The body of [`forward`](Self::forward), [`backward_data`](Self::backward_data) and
    /// [`backward_filter`](Self::backward_filter): decides (a benchmark runs on scratch memory
    /// when `beta ≠ 0`), searches and runs the graph engines where the union search applies,
    /// else runs the legacy ranking.
    #[allow(clippy::too_many_arguments)] // the direction, its buffers and the decision
    pub(super) fn tune<C: UnionGraph>(
        &mut self,
        cudnn: &Cudnn,
        op: &C,
        inputs: (&impl DeviceBuffer<C::In>, &impl DeviceBuffer<C::In>),
        prepared: Prepared,
        fixed: C::Algo,
        (alpha, beta): (C::Scalar, C::Scalar),
        out: &mut impl DeviceBufferMut<C::Out>,
    ) -> Result<Choice<C::Algo>> {
        let accumulate = beta.to_f64() != 0.0;
        let untimed_legacy = self.effort.untimed_legacy(<C::In as DataType>::DTYPE)
            && self.union_on()
            && op.eligible();
        let d = self.decide(
            cudnn,
            prepared,
            || op.heuristics(cudnn),
            |ws| {
                if accumulate {
                    let mut scratch = alloc::<C::Out>(cudnn, op.out_len())?;
                    op.find(cudnn, inputs, &mut scratch, ws)
                } else {
                    op.find(cudnn, inputs, out, ws)
                }
            },
            fixed,
            untimed_legacy,
        )?;
        let best = d.entry.first::<C::Algo>();
        let name = <C::Algo as ConvAlgorithm>::DIRECTION.name();
        if let (true, Some(best)) = (self.union_on() && op.eligible(), best) {
            let plain = alpha.to_f64() == 1.0 && !accumulate;
            let conv = op.conv();
            let build = || op.graph(cudnn);
            let key = d.key.clone();
            let ran = self.graph_call(
                cudnn,
                &d,
                plain,
                name,
                conv,
                out,
                &build,
                |me, out| {
                    let key = key.as_ref()?;
                    let legacy = (best.algo.to_string(), best.time_ms);
                    if accumulate {
                        let mut s = scratch::<C::Out>(cudnn, op.out_len())?;
                        let t = trial(cudnn, op, inputs, best.algo, &mut s);
                        me.union_search(cudnn, key, name, legacy, conv, build, t)
                    } else {
                        let t = trial(cudnn, op, inputs, best.algo, out);
                        me.union_search(cudnn, key, name, legacy, conv, build, t)
                    }
                },
                |plan, ids, ws, out| op.exec(cudnn, plan, ids, ws, inputs, out),
            )?;
            if let Some(config) = ran {
                return Ok(self.graph_choice(best.algo, d.source, config));
            }
            if !plain && op.can_combine() {
                let legacy_ms = best.time_ms;
                let len = op.out_len();
                let ran = self.composed(
                    cudnn,
                    &d,
                    legacy_ms,
                    name,
                    conv,
                    &build,
                    len,
                    |plan, ids, ws, s| op.exec(cudnn, plan, ids, ws, inputs, s),
                )?;
                if let Some((config, s)) = ran {
                    op.combine(cudnn, (alpha.to_f64(), beta.to_f64()), &s, out)?;
                    return Ok(self.graph_choice(best.algo, d.source, config));
                }
            }
        }
        self.run(cudnn, d, |algo, ws| {
            op.launch(cudnn, algo, (alpha, beta), inputs, ws, out)
        })
    }

    /// A call with `alpha ≠ 1` or `beta ≠ 0` whose decision holds a graph plan at least
    /// [`COMPOSED_MIN_SPEEDUP`] times faster than its legacy favourite (`legacy_ms`), or any
    /// graph plan under [`GraphSearch::Prefer`]: the plan writes a plain result into scratch
    /// memory (`exec`), which the caller then combines with the output. `None` when there is no
    /// such plan, the scratch cannot be allocated, or the plan does not run (the legacy call runs
    /// instead).
    #[allow(clippy::too_many_arguments)] // the parts of one call
    fn composed<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        d: &Decided,
        legacy_ms: f32,
        op: &'static str,
        conv: &ConvDesc,
        build: &dyn Fn() -> Result<ConvGraph>,
        len: usize,
        exec: impl FnOnce(&Plan, Ids, &mut Workspace, &mut CudaSlice<T>) -> Result<()>,
    ) -> Result<Option<(Arc<EngineConfig>, CudaSlice<T>)>> {
        let Some(key) = &d.key else {
            return Ok(None);
        };
        let Some(pick) = self.cache.get(&**key).and_then(|e| e.graph.clone()) else {
            return Ok(None);
        };
        let faster = pick.ms > 0.0 && pick.ms * COMPOSED_MIN_SPEEDUP <= legacy_ms;
        if !(faster || self.graph == GraphSearch::Prefer) {
            return Ok(None);
        }
        let Some(mut s) = scratch::<T>(cudnn, len) else {
            return Ok(None);
        };
        if !self.ensure_held(cudnn, key, op, conv, build) {
            return Ok(None);
        }
        let ran = self.exec_held(cudnn, key, op, |plan, ids, ws| exec(plan, ids, ws, &mut s))?;
        Ok(ran.map(|config| (config, s)))
    }

    /// `y = alpha·conv(x, w) + beta·y` with the algorithm the policy picks (see
    /// [`Cudnn::conv_forward`] for the types and checks). With `beta ≠ 0` a benchmark runs on
    /// scratch memory, so `y`'s contents are preserved for the accumulation.
    ///
    /// Under [`Policy::Benchmark`] and [`Policy::Deterministic`] the graph engines are searched
    /// too ([`Autotuner::with_graph_search`]); [`Choice::api`] says which API ran. A graph plan runs
    /// after the same checks as the legacy call (buffer spans, data types, contexts, output
    /// layout not overlapping itself, workspace within the limit) and the graph's 16-byte
    /// alignment of every buffer (a misaligned view runs the legacy call). The plan computes the
    /// plain result: a call with `alpha ≠ 1` or `beta ≠ 0` runs it into scratch memory and adds
    /// `alpha·scratch + beta·y` into `y` (`cudnnAddTensor`; `y` packed, or strided with 4 or 5
    /// dimensions) when the plan is at least
    /// [`COMPOSED_MIN_SPEEDUP`](super::COMPOSED_MIN_SPEEDUP) times faster than the legacy
    /// favourite (any plan under [`GraphSearch::Prefer`]), else runs the legacy favourite.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn forward<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &mut self,
        cudnn: &Cudnn,
        alpha: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        beta: X::Scalar,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<Choice<ConvFwdAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.forward,
            _ => ConvFwdAlgo::ImplicitGemm,
        };
        let op = ConvForward::new(conv, x_desc, w_desc, y_desc)?;
        let prepared = self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc);
        self.tune(cudnn, &op, (x, w), prepared, fixed, (alpha, beta), y)
    }

    /// The fused `y = act(alpha1·conv(x, w) + alpha2·z + bias)` (see
    /// [`Cudnn::conv_bias_activation_forward`]) with the forward algorithm the policy picks for
    /// this convolution (the same legacy decision [`forward`](Self::forward) makes and caches).
    /// [`FusedActivation::Identity`] always runs `IMPLICIT_PRECOMP_GEMM` on the legacy path, the
    /// only algorithm cuDNN supports for it.
    ///
    /// Under the benchmark policies with the union search on, the fused operation is also
    /// searched as a graph, `conv_fprop → bias (pointwise add) → ReLU` (no ReLU for the identity
    /// activation), against the legacy fused call timed alike; the winner is remembered under its
    /// own key (convolution, bias descriptor and activation). The graph runs for calls with
    /// `alpha1 = 1` and no `z` (a residual takes the legacy call), with the bias of the output's
    /// type.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn bias_activation_forward<X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha1: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        alpha2: X::Scalar,
        z: Option<CudaView<'_, Y>>,
        bias_desc: &TensorDesc<B>,
        bias: &impl DeviceBuffer<B>,
        activation: FusedActivation,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<Choice<ConvFwdAlgo>> {
        let fwd = ConvForward::new(conv, x_desc, w_desc, y_desc)?;
        // Every check of the fused call before a benchmark may write y: a refused bias or z
        // leaves y untouched.
        ConvBiasActivation::new(fwd, bias_desc, activation)?;
        cudnn.check_tensor("bias", bias_desc.layout(), bias, false)?;
        if let Some(z) = &z {
            cudnn.check_tensor("z", y_desc.layout(), z, false)?;
        }
        cudnn.check_tensor("y", y_desc.layout(), y, true)?;
        let d = if activation == FusedActivation::Identity {
            Decided {
                entry: Arc::new(Entry::legacy(vec![(
                    ConvFwdAlgo::ImplicitPrecompGemm.raw_value(),
                    0,
                    -1.0,
                )])),
                source: Source::Fixed,
                key: None,
            }
        } else {
            let fixed = match self.policy {
                Policy::Fixed(f) => f.forward,
                _ => ConvFwdAlgo::ImplicitGemm,
            };
            let prepared = self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc);
            // The fused output is written, never read (z is a separate buffer), so a benchmark
            // may use `y` itself as its trial output.
            self.decide(
                cudnn,
                prepared,
                || fwd.heuristics(cudnn),
                |ws| fwd.find(cudnn, (x, w), y, ws),
                fixed,
                false,
            )?
        };
        let best = d.entry.first::<ConvFwdAlgo>();
        // The graph's pointwise add would broadcast any bias shape: only the legacy call's
        // `[1, K, 1, ...]` takes the graph path (others get the legacy call's error).
        let (bd, yd) = (bias_desc.dims(), y_desc.dims());
        let per_channel = bd.len() == yd.len()
            && bd
                .iter()
                .enumerate()
                .all(|(i, &d)| d == if i == 1 { yd[1] } else { 1 });
        let graph_ok = self.union_on() && per_channel && B::DTYPE == Y::DTYPE && fwd.eligible();
        if let (true, Some(best)) = (graph_ok, best) {
            let plain = alpha1.to_f64() == 1.0 && z.is_none();
            let ran = self.fused_graph(
                cudnn,
                (&d, best, plain),
                fwd,
                (x, w),
                (bias_desc, bias, activation),
                y,
            )?;
            if let Some(config) = ran {
                return Ok(self.graph_choice(best.algo, d.source, config));
            }
        }
        self.run(cudnn, d, |algo, ws| {
            let z = z.as_ref().map(|z| z.slice(..));
            ConvBiasActivation::new(fwd, bias_desc, activation)?.launch(
                cudnn,
                algo,
                (alpha1, alpha2),
                (x, w),
                z,
                bias,
                ws,
                y,
            )
        })
    }

    /// The graph side of [`bias_activation_forward`](Self::bias_activation_forward): the fused
    /// decision under its own key (made beside the legacy decision `d`, whose favourite is
    /// `best`), searched and, for a `plain` call, run. `Some(config)` when the graph ran.
    #[allow(clippy::too_many_arguments)] // the parts of one call, grouped as the C call takes them
    fn fused_graph<X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType>(
        &mut self,
        cudnn: &Cudnn,
        (d, best, plain): (&Decided, Candidate<ConvFwdAlgo>, bool),
        fwd: ConvForward<'_, X, Y>,
        (x, w): (&impl DeviceBuffer<X>, &impl DeviceBuffer<X>),
        (bias_desc, bias, activation): (&TensorDesc<B>, &impl DeviceBuffer<B>, FusedActivation),
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<Option<Arc<EngineConfig>>> {
        const OP: &str = "fused forward";
        let (x_desc, w_desc, conv, y_desc) = (fwd.x(), fwd.w(), fwd.conv(), fwd.y());
        let act = gunion::fused_mode(activation);
        let gmode = self.graph;
        let prepared = self.prepare(
            cudnn,
            [
                16 + activation as u64,
                x_desc.id(),
                w_desc.id(),
                conv.id(),
                y_desc.id(),
                bias_desc.id(),
            ],
            |policy, limit| {
                let descs = (x_desc, w_desc, y_desc);
                let forward = ConvDirection::Forward;
                let mut k = call_key(forward, descs, conv, (policy, limit, gmode));
                // A call kind of its own: no plain forward key can equal a fused one.
                k[0] = 16 + activation as i64;
                k.push(dtype_code(B::DTYPE));
                k.extend_from_slice(bias_desc.dims());
                k.extend_from_slice(bias_desc.layout().strides());
                k
            },
        );
        // The fused decision keeps the legacy ranking beside its graph engine; this second
        // key counts no hit, miss or benchmark (the call made one legacy decision; the
        // search counts in `graph_searches`), and the choice reports the legacy decision's
        // source.
        let fd = match prepared {
            Prepared::Known(key, entry) => Some(Decided {
                entry,
                source: Source::Cache,
                key: Some(key),
            }),
            Prepared::Unknown(key) => {
                let entry = Arc::new(Entry::legacy(d.entry.ranking.clone()));
                self.cache.insert((*key).clone(), entry.clone());
                Some(Decided {
                    entry,
                    source: Source::Benchmark,
                    key: Some(key),
                })
            }
            Prepared::Fixed => None,
        };
        let Some(fd) = fd else {
            return Ok(None);
        };
        let bias_t = (bias_desc.layout(), B::DTYPE, act);
        let build = || gunion::fprop_graph(cudnn, x_desc, w_desc, conv, y_desc, Some(bias_t));
        let key = fd.key.clone();
        let ran = self.graph_call(
            cudnn,
            &fd,
            plain,
            OP,
            conv,
            y,
            &build,
            |me, y| {
                let key = key.as_ref()?;
                let legacy = (best.algo.to_string(), best.time_ms);
                let one = X::Scalar::from_f64(1.0);
                let zero = X::Scalar::from_f64(0.0);
                me.union_search(
                    cudnn,
                    key,
                    OP,
                    legacy,
                    conv,
                    build,
                    |t: Trial<'_>, ws: &mut Workspace| match t {
                        Trial::Plan(plan, ids) => {
                            exec_graph(cudnn, plan, ids, ws, (x, w, Some(bias)), &mut *y)
                        }
                        Trial::Legacy => ConvBiasActivation::new(fwd, bias_desc, activation)?
                            .launch(
                                cudnn,
                                best.algo,
                                (one, zero),
                                (x, w),
                                None,
                                bias,
                                ws,
                                &mut *y,
                            ),
                    },
                )
            },
            |plan, ids, ws, y| exec_graph(cudnn, plan, ids, ws, (x, w, Some(bias)), y),
        )?;
        Ok(ran)
    }

    /// `dx = alpha·backward_data(dy, w) + beta·dx` with the algorithm the policy picks (see
    /// [`Cudnn::conv_backward_data`]). With `beta ≠ 0` a benchmark runs on scratch memory.
    ///
    /// Under the benchmark policies the graph engines (`conv_dgrad`) are searched too, as for
    /// [`forward`](Self::forward), `alpha ≠ 1` and `beta ≠ 0` included.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn backward_data<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<Choice<ConvBwdDataAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.backward_data,
            _ => ConvBwdDataAlgo::Algo1,
        };
        let op = ConvBackwardData::new(conv, w_desc, dy_desc, dx_desc)?;
        let prepared = self.prepare_backward(
            cudnn,
            ConvDirection::BackwardData,
            dx_desc,
            w_desc,
            dy_desc,
            conv,
        );
        self.tune(cudnn, &op, (w, dy), prepared, fixed, (alpha, beta), dx)
    }

    /// Transposed convolution `y = alpha·conv_transpose(x, w) + beta·y` (see
    /// [`Cudnn::conv_transpose`] for the shapes, every output padding PyTorch accepts) with the
    /// backward-data algorithm the policy picks.
    ///
    /// The decision is the one [`backward_data`](Self::backward_data) makes for the pass the
    /// transposed convolution runs (`dy` = `x`, `dx` = `y` or, when an output padding reaches
    /// the stride, the part of `y` backward data can address), cached and searched (graph
    /// engines included) exactly as that call's; a problem met through either method is decided
    /// once. Errors name the transposed convolution's arguments (`x`, `w`, `y`), and every check
    /// runs before anything is enqueued. When no element of `y` receives a term, `y = beta·y`
    /// and the choice is the policy's fixed backward-data algorithm, nothing decided.
    ///
    /// ```no_run
    /// use cudnn_safe::{conv::ConvDesc, cuda_context, Autotuner, Cudnn, FilterDesc, TensorDesc, TensorFormat};
    /// use cudnn_safe::tune::Policy;
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let mut tuner = Autotuner::new(Policy::Benchmark);
    /// // Stride 1, dilation 2, output padding 1 (below the dilation, as PyTorch allows).
    /// let conv = ConvDesc::builder(2).pads(&[2, 2]).dilations(&[2, 2]).build::<f32>()?;
    /// let x_d = TensorDesc::<f32>::nchw(1, 8, 16, 16)?;
    /// let w_d = FilterDesc::<f32>::new(&[8, 4, 3, 3], TensorFormat::Nchw)?;
    /// let y_d = TensorDesc::<f32>::nchw_nd(
    ///     &conv.transpose_output_dims(x_d.dims(), w_d.dims(), &[1, 1])?,
    /// )?;
    /// assert_eq!(y_d.dims(), [1, 4, 17, 17]);
    /// let x = stream.clone_htod(&vec![1.0f32; x_d.span()]).unwrap();
    /// let w = stream.clone_htod(&vec![0.5f32; w_d.span()]).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
    /// let choice = tuner.conv_transpose(&cudnn, 1.0, &x_d, &x, &w_d, &w, &conv, 0.0, &y_d,
    ///                                   &mut y)?;
    /// println!("ran {}", choice.describe());
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_transpose<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<Choice<ConvBwdDataAlgo>> {
        let op = ConvTranspose::new(conv, x_desc, w_desc, y_desc)?;
        op.check_buffers(cudnn, x, w, y)?;
        // Allocated before the first launch, so that a failure refuses the call with y
        // untouched.
        let mut mem = op.memory(cudnn, beta)?;
        let choice = match (op.backward_data(), &mut mem.scratch) {
            (Some(b), Some(s)) => {
                let zero = T::Scalar::from_f64(0.0);
                let (bconv, dx) = (b.conv(), b.dx());
                self.backward_data(cudnn, alpha, w_desc, w, x_desc, x, bconv, zero, dx, s)?
            }
            (Some(b), None) => {
                let (bconv, dx) = (b.conv(), b.dx());
                self.backward_data(cudnn, alpha, w_desc, w, x_desc, x, bconv, beta, dx, y)?
            }
            (None, _) => Choice {
                algo: match self.policy {
                    Policy::Fixed(f) => f.backward_data,
                    _ => FixedAlgos::default().backward_data,
                },
                source: Source::Fixed,
                rank: 0,
                workspace: self.workspace_bytes(),
                api: ConvApi::Legacy,
            },
        };
        op.finish(cudnn, &mem, beta, y)?;
        Ok(choice)
    }

    /// `dw = alpha·backward_filter(x, dy) + beta·dw` with the algorithm the policy picks (see
    /// [`Cudnn::conv_backward_filter`]). With `beta ≠ 0` (gradient accumulation) a benchmark
    /// runs on scratch memory, so the accumulated gradient is preserved.
    ///
    /// Under the benchmark policies the graph engines (`conv_wgrad`) are searched too, as for
    /// [`forward`](Self::forward), `alpha ≠ 1` and `beta ≠ 0` included.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn backward_filter<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        dw_desc: &FilterDesc<T>,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<Choice<ConvBwdFilterAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.backward_filter,
            _ => ConvBwdFilterAlgo::Algo1,
        };
        let op = ConvBackwardFilter::new(conv, x_desc, dy_desc, dw_desc)?;
        let prepared = self.prepare_backward(
            cudnn,
            ConvDirection::BackwardFilter,
            x_desc,
            dw_desc,
            dy_desc,
            conv,
        );
        self.tune(cudnn, &op, (x, dy), prepared, fixed, (alpha, beta), dw)
    }
}

/// cuDNN's benchmark of every algorithm (`find`, on `ws`), sorted: supported algorithms first,
/// fastest first. cuDNN times each algorithm once; the first launch of a kernel in a process
/// also pays for loading it (CUDA lazy module loading), which can misrank small problems by 1.5x
/// or more. So find runs `runs` times (2 under [`SearchEffort::Thorough`]) and each algorithm
/// keeps its best time; once under [`SearchEffort::Quick`] (the union search times the
/// legacy favourite again).
///
/// [`SearchEffort::Thorough`]: super::SearchEffort::Thorough
/// [`SearchEffort::Quick`]: super::SearchEffort::Quick
fn benchmark<A: ConvAlgorithm>(
    ws: &mut Workspace,
    runs: usize,
    mut find: impl FnMut(&mut Workspace) -> Result<Vec<AlgoPerf<A>>>,
) -> Result<Vec<AlgoPerf<A>>> {
    let mut best = find(ws)?;
    for _ in 1..runs {
        let first = best;
        best = find(ws)?;
        for p in &mut best {
            if let Some(q) = first
                .iter()
                .find(|q| q.algo == p.algo && q.math == p.math && q.is_supported())
            {
                if p.is_supported() && q.time_ms >= 0.0 && q.time_ms < p.time_ms {
                    p.time_ms = q.time_ms;
                }
            }
        }
    }
    best.sort_by(|a, b| {
        (!a.is_supported(), a.time_ms)
            .partial_cmp(&(!b.is_supported(), b.time_ms))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(best)
}

/// The candidates of `perf` a decision may run (supported, within `limit`, deterministic when
/// asked), in order, and the others with why they were refused.
fn rank<A: ConvAlgorithm>(
    perf: &[AlgoPerf<A>],
    limit: usize,
    deterministic_only: bool,
) -> (Vec<Candidate<A>>, Vec<String>) {
    let mut refused = Vec::new();
    let ranking = perf
        .iter()
        .filter(|p| {
            let ok = p.is_supported()
                && p.workspace <= limit
                && (!deterministic_only || p.deterministic);
            if !ok {
                refused.push(format!(
                    "{} ({})",
                    p.algo,
                    if !p.is_supported() {
                        p.status.name().to_string()
                    } else if p.workspace > limit {
                        format!("needs {} bytes > limit {limit}", p.workspace)
                    } else {
                        "non-deterministic".to_string()
                    }
                ));
            }
            ok
        })
        .map(|p| Candidate {
            algo: p.algo,
            workspace: p.workspace,
            time_ms: p.time_ms,
        })
        .collect();
    (ranking, refused)
}

pub(super) fn alloc<T: DataType>(
    cudnn: &Cudnn,
    len: usize,
) -> Result<cudarc::driver::CudaSlice<T>> {
    cudnn
        .stream()
        .alloc_zeros::<T>(len)
        .map_err(|e| Error::driver("allocating benchmark scratch memory", e))
}

/// Errors after which another algorithm may still succeed.
pub(super) fn falls_back(e: &Error) -> bool {
    matches!(
        e,
        Error::Cudnn { .. }
            | Error::WorkspaceLimit { .. }
            | Error::WorkspaceTooSmall { .. }
            | Error::Driver { .. }
    )
}

fn direction_op(d: ConvDirection) -> &'static str {
    match d {
        ConvDirection::Forward => "convolution forward",
        ConvDirection::BackwardData => "convolution backward-data",
        ConvDirection::BackwardFilter => "convolution backward-filter",
    }
}
