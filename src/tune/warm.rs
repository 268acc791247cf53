//! [`Autotuner::warm_up`]: remembered decisions replayed at start-up, so that the first call of
//! each problem builds no plan and loads no kernel.
use std::sync::Arc;
use std::time::Instant;

use super::key::{Key, KeyProblem};
use super::run::alloc;
use super::{Autotuner, Policy, WarmUp};
use crate::conv::{ConvDesc, ConvDirection};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::graph::plans_from_configs;
use crate::handle::Cudnn;
use crate::tune::union::{self as gunion, ConvGraph};

impl Autotuner {
    /// Replays every remembered convolution decision of this GPU and cuDNN version that this
    /// tuner's policy, workspace limit and search mode would look up (typically those read from
    /// the cache file), once, on scratch buffers of the problem's size: the graph decisions'
    /// plans are rebuilt first, all together (those of engines that compile at run time on
    /// [`crate::graph::build_threads`] threads), and held; then every decision runs once, which
    /// loads its kernels. Call it at
    /// start-up, after [`crate::graph::preload`]: the first real call of each problem then builds
    /// nothing and loads nothing. Without it, the first execution of a cached plan in a new
    /// process pays for CUDA's lazy loading of its kernel; after the warm-up it costs what the
    /// steady state does.
    ///
    /// Decisions of fused bias-activation calls and of data types the graph path does not cover
    /// (f64, int8) are left for their first call ([`WarmUp::skipped`]), as are those of other
    /// policies, limits and search modes. A replay that fails is logged and counted as skipped;
    /// the decision stays as it was. Replays count as cache hits in [`Autotuner::stats`].
    ///
    /// ```no_run
    /// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
    /// use cudnn_safe::Autotuner;
    /// use cudnn_safe::tune::Policy;
    /// cudnn_safe::graph::preload(cudnn)?;
    /// let mut tuner = Autotuner::new(Policy::Benchmark).cache_file("/var/cache/app/conv.txt");
    /// let w = tuner.warm_up(cudnn)?;
    /// println!("{} decisions ready ({} graph plans) in {:?}", w.replayed, w.graph, w.elapsed);
    /// # Ok(()) }
    /// ```
    pub fn warm_up(&mut self, cudnn: &Cudnn) -> Result<WarmUp> {
        let started = Instant::now();
        let mut done = WarmUp::default();
        if let Policy::Fixed(_) = self.policy {
            return Ok(done);
        }
        let device = self.device(cudnn);
        let mut problems: Vec<Vec<i64>> = self
            .cache
            .keys()
            .filter(|k| k.device == device)
            .map(|k| k.problem.clone())
            .collect();
        problems.sort();
        let t = Instant::now();
        done.built = self.prebuild(cudnn, &device, &problems);
        done.building = t.elapsed();
        for p in problems {
            match self.replay(cudnn, &p) {
                Ok(Some(graph)) => {
                    done.replayed += 1;
                    done.graph += usize::from(graph);
                }
                Ok(None) => done.skipped += 1,
                Err(e) => {
                    log::info!("autotune warm-up: a remembered decision was not replayed: {e}");
                    done.skipped += 1;
                }
            }
        }
        cudnn
            .stream()
            .synchronize()
            .map_err(|e| Error::driver("synchronizing after the autotune warm-up", e))?;
        done.elapsed = started.elapsed();
        log::info!(
            "autotune warm-up: {} decisions replayed ({} graph plans), {} skipped, {:.1} ms",
            done.replayed,
            done.graph,
            done.skipped,
            done.elapsed.as_secs_f64() * 1e3
        );
        Ok(done)
    }

    /// Rebuilds the plans of the graph decisions among `problems` (of `device`) that are not held
    /// yet, finalized at once on [`crate::graph::build_threads`] threads, and holds those the
    /// current filter accepts (as a call's rebuild would). Returns how many are held.
    fn prebuild(&mut self, cudnn: &Cudnn, device: &Arc<str>, problems: &[Vec<i64>]) -> usize {
        let mut jobs = Vec::new();
        for problem in problems {
            let key = Arc::new(Key::new(device.clone(), problem.clone()));
            let Some(pick) = self.cache.get(&*key).and_then(|e| e.graph.clone()) else {
                continue;
            };
            if self
                .held
                .get(&*key)
                .is_some_and(|h| gunion::built_on(&h.plan, cudnn))
            {
                continue;
            }
            let Some(p) = KeyProblem::decode(problem) else {
                continue;
            };
            let graph = match (p.a_t, p.b_t) {
                (DType::F32, DType::F32) => self.graph_of::<f32>(cudnn, &p, problem),
                (DType::F16, DType::F16) => self.graph_of::<half::f16>(cudnn, &p, problem),
                (DType::BF16, DType::BF16) => self.graph_of::<half::bf16>(cudnn, &p, problem),
                _ => None,
            };
            match graph {
                Some(Ok((cg, conv))) => jobs.push((key, p.dir.name(), cg, conv, pick.config)),
                Some(Err(e)) => log::info!("autotune warm-up: a graph was not rebuilt: {e}"),
                None => {}
            }
        }
        let plans = {
            let refs: Vec<_> = jobs.iter().map(|j| (&j.2.og, &*j.4)).collect();
            plans_from_configs(cudnn, &refs)
        };
        let mut held = 0;
        for ((key, op, cg, conv, config), plan) in jobs.into_iter().zip(plans) {
            let ids = cg.ids;
            held += usize::from(self.hold(&key, op, &conv, &config, plan.map(|p| (ids, p))));
        }
        held
    }

    /// The graph the union search runs for the plain problem `p` (whose key is `key` under this
    /// tuner), as its call builds it; `None` when the key is not this tuner's or the problem is
    /// not a graph problem.
    fn graph_of<T: DataType>(
        &self,
        cudnn: &Cudnn,
        p: &KeyProblem,
        key: &[i64],
    ) -> Option<Result<(ConvGraph, ConvDesc)>> {
        let descs = match p.descriptors::<T>() {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        if p.key(&descs, self.policy, self.limit, self.graph) != key {
            return None;
        }
        let (conv, a_d, w_d, b_d) = descs;
        if !gunion::eligible::<T, T>(a_d.dims(), &w_d, &conv, b_d.dims()) {
            return None;
        }
        let cg = match p.dir {
            ConvDirection::Forward => gunion::fprop_graph(cudnn, &a_d, &w_d, &conv, &b_d, None),
            ConvDirection::BackwardData => gunion::dgrad_graph(cudnn, &w_d, &b_d, &conv, &a_d),
            ConvDirection::BackwardFilter => gunion::wgrad_graph(cudnn, &a_d, &b_d, &conv, &w_d),
        };
        Some(cg.map(|cg| (cg, conv)))
    }

    /// One decision of [`Autotuner::warm_up`]: `Some(ran a graph plan)`, or `None` when the key
    /// is not one this tuner replays.
    fn replay(&mut self, cudnn: &Cudnn, key: &[i64]) -> Result<Option<bool>> {
        let Some(p) = KeyProblem::decode(key) else {
            return Ok(None);
        };
        match (p.a_t, p.b_t) {
            (DType::F32, DType::F32) => self.replay_as::<f32>(cudnn, &p, key),
            (DType::F16, DType::F16) => self.replay_as::<half::f16>(cudnn, &p, key),
            (DType::BF16, DType::BF16) => self.replay_as::<half::bf16>(cudnn, &p, key),
            _ => Ok(None),
        }
    }

    fn replay_as<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        p: &KeyProblem,
        key: &[i64],
    ) -> Result<Option<bool>> {
        let descs = p.descriptors::<T>()?;
        // Only a problem whose key this tuner computes the same way is a cache hit.
        if p.key(&descs, self.policy, self.limit, self.graph) != key {
            return Ok(None);
        }
        let (conv, a_d, w_d, b_d) = descs;
        let (one, zero) = (T::Scalar::from_f64(1.0), T::Scalar::from_f64(0.0));
        let a = alloc::<T>(cudnn, a_d.span())?;
        let mut w = alloc::<T>(cudnn, w_d.span())?;
        let mut b = alloc::<T>(cudnn, b_d.span())?;
        let api = match p.dir {
            ConvDirection::Forward => {
                self.forward(cudnn, one, &a_d, &a, &w_d, &w, &conv, zero, &b_d, &mut b)?
                    .api
            }
            ConvDirection::BackwardData => {
                let mut dx = a;
                self.backward_data(cudnn, one, &w_d, &w, &b_d, &b, &conv, zero, &a_d, &mut dx)?
                    .api
            }
            ConvDirection::BackwardFilter => {
                self.backward_filter(cudnn, one, &a_d, &a, &b_d, &b, &conv, zero, &w_d, &mut w)?
                    .api
            }
        };
        Ok(Some(api.is_graph()))
    }
}
