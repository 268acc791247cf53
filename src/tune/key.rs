//! The key codec: every property of a convolution problem that can change the tuner's answer,
//! as integers (the cache's key), and back (the warm-up rebuilds problems from their keys).
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::{GraphSearch, Policy};
use crate::conv::{ConvDesc, ConvDirection, ConvMode, MathType};
use crate::dtype::{DType, DataType};
use crate::error::Result;
use crate::tensor::{FilterDesc, Layout, TensorDesc, TensorFormat};

/// The convolution and the descriptors of `a`, the filter and `b` of a [`KeyProblem`].
pub(super) type KeyDescs<T> = (ConvDesc, TensorDesc<T>, FilterDesc<T>, TensorDesc<T>);

/// A plain convolution problem read back from its key ([`problem_key`], [`with_search`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct KeyProblem {
    pub(super) dir: ConvDirection,
    pub(super) a_t: DType,
    pub(super) b_t: DType,
    pub(super) compute: DType,
    pub(super) math: MathType,
    pub(super) mode: ConvMode,
    pub(super) groups: i64,
    pub(super) spatial: usize,
    pub(super) pads: Vec<i64>,
    pub(super) strides: Vec<i64>,
    pub(super) dilations: Vec<i64>,
    pub(super) a_dims: Vec<i64>,
    pub(super) a_strides: Vec<i64>,
    pub(super) w_format: TensorFormat,
    pub(super) w_dims: Vec<i64>,
    pub(super) b_dims: Vec<i64>,
    pub(super) b_strides: Vec<i64>,
}

impl KeyProblem {
    /// The convolution and the descriptors of `a`, the filter and `b`, in `T`.
    pub(super) fn descriptors<T: DataType>(&self) -> Result<KeyDescs<T>> {
        let conv = ConvDesc::builder(self.spatial)
            .pads(&self.pads)
            .strides(&self.strides)
            .dilations(&self.dilations)
            .groups(self.groups)
            .mode(self.mode)
            .math(self.math)
            .compute(self.compute)
            .build::<T>()?;
        Ok((
            conv,
            TensorDesc::<T>::strided(&self.a_dims, &self.a_strides)?,
            FilterDesc::<T>::new(&self.w_dims, self.w_format)?,
            TensorDesc::<T>::strided(&self.b_dims, &self.b_strides)?,
        ))
    }

    /// The key these descriptors have under `policy`, `limit` and `search`.
    pub(super) fn key<T: DataType>(
        &self,
        (conv, a, w, b): &KeyDescs<T>,
        policy: Policy,
        limit: usize,
        search: GraphSearch,
    ) -> Vec<i64> {
        call_key(self.dir, (a, w, b), conv, (policy, limit, search))
    }

    /// The problem of a plain forward, backward-data or backward-filter key; `None` for other
    /// keys (fused calls, unknown codes, a length that does not match the ranks).
    pub(super) fn decode(k: &[i64]) -> Option<KeyProblem> {
        let dir = match *k.first()? {
            0 => ConvDirection::Forward,
            1 => ConvDirection::BackwardData,
            2 => ConvDirection::BackwardFilter,
            _ => return None,
        };
        let spatial = usize::try_from(*k.get(7)?)
            .ok()
            .filter(|s| (1..=6).contains(s))?;
        // A 1-D problem's tensors are 3-D or 4-D (unit height); the others' have spatial + 2.
        let rank = usize::try_from(*k.get(8)?)
            .ok()
            .filter(|&t| t == spatial + 2 || (spatial == 1 && t == 4))?;
        // Header, three spatial lists (as declared: one value each for a 1-D problem), a's dims
        // and strides, filter format and dims, b's dims and strides, policy and limit; the search
        // suffix is optional.
        let len = 9 + 3 * spatial + 5 * rank + 3;
        if k.len() != len && k.len() != len + 1 {
            return None;
        }
        let mut at = 9;
        let mut take = |n: usize| {
            let v = k[at..at + n].to_vec();
            at += n;
            v
        };
        let pads = take(spatial);
        let strides = take(spatial);
        let dilations = take(spatial);
        let a_dims = take(rank);
        let a_strides = take(rank);
        let w_format = format_from_code(take(1)[0])?;
        let w_dims = take(rank);
        let b_dims = take(rank);
        let b_strides = take(rank);
        Some(KeyProblem {
            dir,
            a_t: dtype_from_code(k[1])?,
            b_t: dtype_from_code(k[2])?,
            compute: dtype_from_code(k[3])?,
            math: MathType::from_raw(crate::sys::cudnnMathType_t(u32::try_from(k[4]).ok()?))?,
            mode: match k[5] {
                0 => ConvMode::CrossCorrelation,
                1 => ConvMode::Convolution,
                _ => return None,
            },
            groups: k[6],
            spatial,
            pads,
            strides,
            dilations,
            a_dims,
            a_strides,
            w_format,
            w_dims,
            b_dims,
            b_strides,
        })
    }
}

/// A cache key: the GPU and cuDNN version, and the problem as integers. Its hash is computed
/// once, so that the steady-state lookup of a held plan hashes 8 bytes, not the whole problem.
#[derive(Debug, Clone)]
pub(super) struct Key {
    pub(super) device: Arc<str>,
    pub(super) problem: Vec<i64>,
    pub(super) hash: u64,
}

impl Key {
    pub(super) fn new(device: Arc<str>, problem: Vec<i64>) -> Key {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        device.hash(&mut h);
        problem.hash(&mut h);
        Key {
            hash: h.finish(),
            device,
            problem,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash && self.problem == other.problem && self.device == other.device
    }
}
impl Eq for Key {}
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A problem key with the graph search mode under the benchmark policies, unless it is the
/// default (so that union decisions share the keys of the legacy-only decisions earlier
/// versions wrote; a union key never ends in a negative value).
pub(super) fn with_search(mut k: Vec<i64>, policy: Policy, graph: GraphSearch) -> Vec<i64> {
    if matches!(policy, Policy::Benchmark | Policy::Deterministic) {
        match graph {
            GraphSearch::Union => {}
            GraphSearch::Off => k.push(-1),
            GraphSearch::Prefer => k.push(-2),
        }
    }
    k
}

/// The key of a problem of direction `dir` (`a`, the filter and `b` as [`problem_key`] takes
/// them) under a policy, workspace limit and search mode ([`with_search`]).
pub(super) fn call_key<A: DataType, B: DataType, W: DataType>(
    dir: ConvDirection,
    (a, w, b): (&TensorDesc<A>, &FilterDesc<W>, &TensorDesc<B>),
    conv: &ConvDesc,
    (policy, limit, graph): (Policy, usize, GraphSearch),
) -> Vec<i64> {
    let k = problem_key(
        dir,
        (a.layout(), A::DTYPE),
        w,
        (b.layout(), B::DTYPE),
        conv,
        policy,
        limit,
    );
    with_search(k, policy, graph)
}

/// The kind of a problem whose winning engine configurations [`SearchEffort::Quick`] carries
/// into the searches of others: direction, the two data types, compute type and math type (the
/// first five fields of [`problem_key`]).
///
/// [`SearchEffort::Quick`]: super::SearchEffort::Quick
pub(super) fn kind_of(key: &Key) -> [i64; 5] {
    let mut kind = [-1; 5];
    for (k, v) in kind.iter_mut().zip(&key.problem) {
        *k = *v;
    }
    kind
}

pub(super) fn dtype_code(d: DType) -> i64 {
    i64::from(d.raw().0)
}

/// The data types a warm-up replays, by [`dtype_code`].
pub(super) fn dtype_from_code(c: i64) -> Option<DType> {
    [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| dtype_code(d) == c)
}

/// Inverse of [`format_code`] for filter formats.
pub(super) fn format_from_code(c: i64) -> Option<TensorFormat> {
    match c {
        0 => Some(TensorFormat::Nchw),
        1 => Some(TensorFormat::Nhwc),
        101..=255 => Some(TensorFormat::NchwVectC {
            width: u8::try_from(c - 100).ok()?,
        }),
        _ => None,
    }
}

pub(super) fn format_code(f: TensorFormat) -> i64 {
    match f {
        TensorFormat::Nchw => 0,
        TensorFormat::Nhwc => 1,
        TensorFormat::NchwVectC { width } => 100 + i64::from(width),
        TensorFormat::Strided => 2,
    }
}

/// Everything about a problem that can change the answer, as integers.
///
/// The header holds the spatial rank and the tensor rank, then come the padding, strides and
/// dilations as declared ([`ConvDesc::builder`]) and the tensors' dims and strides as given. A
/// 1-D problem thus writes one padding, stride and dilation (not the unit height's 0, 1 and 1
/// cuDNN is handed) and the rank of its tensors, 3 (`[N, C, W]`) or 4 (`[N, C, 1, W]`): the two
/// forms have distinct keys, so that [`KeyProblem::decode`] rebuilds the form the caller used,
/// even where cuDNN is handed the same descriptors (a 4-D layout equal to the 3-D one's
/// [`Layout::legacy_view`]). For 2-D and 3-D problems the declared lists are those cuDNN is
/// handed and the tensor rank is [`ConvDesc::tensor_rank`].
pub(super) fn problem_key<T: DataType>(
    dir: ConvDirection,
    (a, a_t): (&Layout, DType),
    w: &FilterDesc<T>,
    (b, b_t): (&Layout, DType),
    conv: &ConvDesc,
    policy: Policy,
    limit: usize,
) -> Vec<i64> {
    let mut k = Vec::with_capacity(64);
    k.push(dir as i64);
    k.push(dtype_code(a_t));
    k.push(dtype_code(b_t));
    k.push(dtype_code(conv.compute()));
    k.push(i64::from(conv.math().raw().0));
    k.push(conv.mode() as i64);
    k.push(conv.groups());
    let spatial = conv.spatial_rank();
    k.push(spatial as i64);
    let rank = if spatial == 1 {
        a.dims().len()
    } else {
        conv.tensor_rank()
    };
    k.push(rank as i64);
    for list in [conv.pads(), conv.strides(), conv.dilations()] {
        // As declared: a 1-D convolution's lists hold the unit height's value first.
        k.extend_from_slice(&list[list.len().saturating_sub(spatial)..]);
    }
    k.extend_from_slice(a.dims());
    k.extend_from_slice(a.strides());
    k.push(format_code(w.format()));
    k.extend_from_slice(w.dims());
    k.extend_from_slice(b.dims());
    k.extend_from_slice(b.strides());
    k.push(policy.code());
    k.push(i64::try_from(limit).unwrap_or(i64::MAX));
    k
}
