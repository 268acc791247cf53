//! A graph as one line of JSON ([`Graph::to_json`], [`Graph::from_json`]): what a
//! [`super::PlanCache`] file keeps beside each chosen engine configuration, so that a new
//! process can rebuild and warm up the plan before any caller describes the graph again
//! ([`super::PlanCache::warm_up`]).
//!
//! A record is data from a file: [`Graph::from_json`] checks every index, rank and dimension
//! that the builder methods would have established before the graph reaches cuDNN, and derives
//! which operation writes each tensor from the operations instead of reading it.
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use super::pointwise::Arity;
use super::{Graph, Op, PointwiseMode};
use crate::error::{Error, Result};

/// Ranks a tensor descriptor takes (`CUDNN_DIM_MAX`).
const MAX_RANK: usize = 8;
/// Distinct tensor names [`intern`] keeps for the life of the process; later ones share one.
const MAX_NAMES: usize = 4096;
/// Longest tensor name kept from a record (longer ones are cut).
const MAX_NAME_LEN: usize = 128;

/// A `&'static str` for a tensor name read from a record. Names live as long as the process
/// (tensor names are `&'static str` throughout the crate): each distinct name is kept once, at
/// most [`MAX_NAMES`] of them, so reading the same file again allocates nothing.
fn intern(name: String) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut name = name;
    if name.len() > MAX_NAME_LEN {
        let mut end = MAX_NAME_LEN;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    let mut set = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&s) = set.get(name.as_str()) {
        return s;
    }
    if set.len() >= MAX_NAMES {
        return "recorded tensor";
    }
    let s: &'static str = Box::leak(name.into_boxed_str());
    set.insert(s);
    s
}

/// A tensor name (`&'static str`). Spelled as an alias so that serde does not take the field
/// for one borrowed from the input (it is read through [`name::deserialize`] instead).
pub(crate) type Name = &'static str;

/// Serde for tensor names (`&'static str`, read back through [`intern`]).
pub(crate) mod name {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(n: &&'static str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(n)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
        Ok(super::intern(String::deserialize(d)?))
    }
}

/// Serde for a by-value scalar's value, as its bit pattern (JSON has no ±∞ or NaN, and
/// attention masks use −∞).
pub(crate) mod scalar {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        v.map(f64::to_bits).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(f64::from_bits))
    }
}

fn bad(detail: String) -> Error {
    Error::invalid("graph record", "a graph written by Graph::to_json", detail)
}

impl Graph {
    /// The graph as one line of JSON: data types, every tensor (name, dimensions, strides, data
    /// type, virtual, scalar value) and every operation with its parameters. Unique ids are
    /// positions, so [`Graph::from_json`] gives back a graph with the same tensor uids and the
    /// same [`Graph::signature`]. The format follows the crate's version; read it back with the
    /// same version.
    ///
    /// ```no_run
    /// # use cudnn_safe::graph::{ConvParams, Graph};
    /// # use cudnn_safe::DType;
    /// # fn f() -> cudnn_safe::Result<()> {
    /// let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    /// let x = g.tensor_nhwc("x", &[8, 64, 56, 56], DType::F16)?;
    /// let w = g.tensor_nhwc("w", &[64, 64, 3, 3], DType::F16)?;
    /// let y = g.conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))?;
    /// g.mark_output(y)?;
    /// let line = g.to_json()?;
    /// let back = Graph::from_json(&line)?;
    /// assert_eq!(back.signature(), g.signature());
    /// # Ok(()) }
    /// ```
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| {
            Error::invalid(
                "graph record",
                "a graph JSON can hold (finite operation parameters)",
                e.to_string(),
            )
        })
    }

    /// Reads a graph written by [`Graph::to_json`]. The record is checked before anything
    /// reaches cuDNN: every operation's tensor indices in range, each tensor written by at most
    /// one operation (none for a by-value scalar) and a virtual tensor by exactly one, ranks 1–8 with as many strides as
    /// dimensions, dimensions ≥ 1 and strides ≥ 0 without overflow, convolution and matmul
    /// operand ranks as their builder methods require. [`Graph::check`] or [`Graph::build`]
    /// then run cuDNN's own validation. A malformed record is [`Error::InvalidArgument`].
    pub fn from_json(json: &str) -> Result<Graph> {
        let mut g: Graph = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        g.derive_links()?;
        g.check_record()?;
        Ok(g)
    }

    /// Sets every tensor's producer, and the `consumed` flag of every tensor read, from the
    /// operations, refusing out-of-range indices and tensors written twice.
    fn derive_links(&mut self) -> Result<()> {
        let n = self.tensors.len();
        for t in &mut self.tensors {
            t.producer = None;
        }
        for (o, op) in self.ops.iter().enumerate() {
            let (reads, writes) = (op.reads(), op.writes());
            if let Some(&i) = reads.iter().chain(&writes).find(|&&i| i >= n) {
                return Err(bad(format!(
                    "operation #{o} ({}) names tensor index {i} of {n}",
                    op.name()
                )));
            }
            for i in reads {
                self.tensors[i].consumed = true;
            }
            for i in writes {
                let t = &mut self.tensors[i];
                if t.producer.is_some() || t.scalar.is_some() {
                    return Err(bad(format!(
                        "tensor `{}` is written by operation #{o} ({}) and is {}",
                        t.name,
                        op.name(),
                        if t.scalar.is_some() {
                            "a by-value scalar"
                        } else {
                            "written by another operation too"
                        }
                    )));
                }
                t.producer = Some(o);
            }
        }
        Ok(())
    }

    /// The checks of [`Graph::from_json`] on tensors and operation operands.
    fn check_record(&self) -> Result<()> {
        for t in &self.tensors {
            let r = t.dims.len();
            let scalar_rank_ok = t.scalar.is_some() && r == 0;
            if r != t.strides.len() || r > MAX_RANK || (r == 0 && !scalar_rank_ok) {
                return Err(bad(format!(
                    "tensor `{}`: {} dimensions and {} strides (1 to {MAX_RANK}, as many strides \
                     as dimensions)",
                    t.name,
                    r,
                    t.strides.len()
                )));
            }
            if t.dims.iter().any(|&d| d < 1) || t.strides.iter().any(|&s| s < 0) {
                return Err(bad(format!(
                    "tensor `{}`: dims {:?} strides {:?} (dimensions ≥ 1, strides ≥ 0)",
                    t.name, t.dims, t.strides
                )));
            }
            if t.scalar.is_some() && t.dims.iter().any(|&d| d != 1) {
                return Err(bad(format!(
                    "by-value scalar `{}` with dims {:?} (all 1)",
                    t.name, t.dims
                )));
            }
            let span = t
                .dims
                .iter()
                .zip(&t.strides)
                .try_fold(1i64, |acc, (&d, &s)| {
                    (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
                });
            let count = t.dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
            if span.is_none() || count.is_none() {
                return Err(bad(format!(
                    "tensor `{}`: dims {:?} strides {:?} overflow",
                    t.name, t.dims, t.strides
                )));
            }
            if t.is_virtual && t.producer.is_none() {
                return Err(bad(format!(
                    "virtual tensor `{}` is written by no operation",
                    t.name
                )));
            }
        }
        for (o, op) in self.ops.iter().enumerate() {
            self.check_operands(o, op)?;
            let rank = |i: usize| self.tensors[i].dims.len();
            let (operands, want) = match (op, op.conv_operands()) {
                (_, Some((operands, conv))) => {
                    conv.validate(op.name())?;
                    (operands, conv.spatial_dims() + 2)
                }
                (Op::Matmul { a, b, c, over, .. }, _) => {
                    self.check_overrides(o, [*a, *b], over)?;
                    ([*a, *b, *c], rank(*c).max(3))
                }
                _ => continue,
            };
            if let Some(&i) = operands.iter().find(|&&i| rank(i) != want) {
                return Err(bad(format!(
                    "operation #{o} ({}): operand `{}` of rank {} (want {want})",
                    op.name(),
                    self.tensors[i].name,
                    rank(i)
                )));
            }
        }
        Ok(())
    }
}

impl Graph {
    /// The builder methods' rules on operation `o`'s operands that cuDNN's own validation does
    /// not cover: no operation reads a tensor it writes; by-value scalars only where the
    /// builders put them (pointwise and select `b`, a norm's epsilon and momentum: elsewhere
    /// the variant pack would hand a kernel the host address of the value); pointwise modes
    /// as the builder takes them (parameters finite, a leaky ReLU's slope 0, the operand count,
    /// a generated index's axis); and the output dimensions of pointwise, select, pointwise
    /// backward and transpose operations as the builders derive them (an output smaller than
    /// what the operation iterates over would be written past its buffer).
    fn check_operands(&self, o: usize, op: &Op) -> Result<()> {
        let t = |i: usize| &self.tensors[i];
        let refuse = |what: String| Err(bad(format!("operation #{o} ({}): {what}", op.name())));
        let reads = op.reads();
        if let Some(&i) = op.writes().iter().find(|i| reads.contains(i)) {
            return refuse(format!("reads and writes `{}`", t(i).name));
        }
        let by_value: Vec<usize> = match op {
            Op::Pointwise { b, .. } => b.iter().copied().collect(),
            Op::Select { b, .. } => vec![*b],
            Op::NormFwd(n) => n.scalar_operands(),
            _ => Vec::new(),
        };
        let misplaced = reads
            .iter()
            .find(|&&i| t(i).scalar.is_some() && !by_value.contains(&i));
        if let Some(&i) = misplaced {
            return refuse(format!(
                "by-value scalar `{}` as a tensor operand",
                t(i).name
            ));
        }
        // b of x's rank with each dimension equal to x's or 1 (either way for pointwise).
        let broadcast = |x: &[i64], b: &[i64], both_ways: bool| -> Option<Vec<i64>> {
            let fits = b.len() == x.len()
                && x.iter()
                    .zip(b)
                    .all(|(&p, &q)| p == q || q == 1 || (both_ways && p == 1));
            fits.then(|| x.iter().zip(b).map(|(&p, &q)| p.max(q)).collect())
        };
        match *op {
            Op::Pointwise { mode, x, b, y } => {
                Graph::check_param(mode)?;
                if matches!(mode, PointwiseMode::LeakyRelu { slope } if slope != 0.0) {
                    return refuse(format!("{mode:?} (the slope must be 0)"));
                }
                match (mode.arity(), b) {
                    (Arity::Unary, None) | (Arity::Binary, Some(_)) => {}
                    _ => return refuse(format!("{mode:?} with b = {b:?}")),
                }
                let xd = &t(x).dims;
                if let PointwiseMode::GenIndex { axis } = mode {
                    if axis < 0 || axis >= xd.len() as i64 {
                        return refuse(format!("GenIndex axis {axis} of a rank-{} x", xd.len()));
                    }
                }
                let want = match b.map(t) {
                    Some(bt) if bt.scalar.is_none() => broadcast(xd, &bt.dims, true),
                    _ => Some(xd.clone()),
                };
                if want.as_ref() != Some(&t(y).dims) {
                    return refuse(format!(
                        "output `{}` of dims {:?} for operands of dims {:?} and {:?}",
                        t(y).name,
                        t(y).dims,
                        xd,
                        b.map(|b| &t(b).dims)
                    ));
                }
            }
            Op::Select { x, b, cond, y } => {
                let xd = &t(x).dims;
                let b_ok = t(b).scalar.is_some() || broadcast(xd, &t(b).dims, false).is_some();
                if &t(y).dims != xd || &t(cond).dims != xd || !b_ok {
                    return refuse(format!(
                        "y {:?}, cond {:?} and b {:?} for x {xd:?} (y and cond have x's dims)",
                        t(y).dims,
                        t(cond).dims,
                        t(b).dims
                    ));
                }
            }
            Op::PointwiseBwd { mode, dy, x, dx } => {
                Graph::check_param(mode)?;
                if mode.arity() != Arity::Backward {
                    return refuse(format!("{mode:?} is not a backward mode"));
                }
                if t(dy).dims != t(x).dims || t(dx).dims != t(x).dims {
                    return refuse(format!(
                        "dy {:?}, x {:?}, dx {:?} (the same dims)",
                        t(dy).dims,
                        t(x).dims,
                        t(dx).dims
                    ));
                }
            }
            Op::Transpose { x, y } => {
                let mut want = t(x).dims.clone();
                let r = want.len();
                if r < 3 {
                    return refuse(format!("x of rank {r} (at least 3)"));
                }
                want.swap(r - 2, r - 1);
                if t(y).dims != want {
                    return refuse(format!("y {:?} for x {:?}", t(y).dims, t(x).dims));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A matmul's M, N and K overrides (operation `o`, operands `a`, `b`) read lengths that
    /// bound what it computes: each must be an INT32 graph input whose bound (the largest value
    /// execution accepts, [`super::Args::lengths`]) is at most the extent it overrides (M: a's
    /// rows, N: b's columns, K: a's columns).
    fn check_overrides(
        &self,
        o: usize,
        [a, b]: [usize; 2],
        over: &super::MatmulOverrides,
    ) -> Result<()> {
        let (ad, bd) = (&self.tensors[a].dims, &self.tensors[b].dims);
        let (ra, rb) = (ad.len(), bd.len());
        if ra < 2 || rb < 2 {
            return Ok(()); // refused by the rank check that follows
        }
        for (which, t, extent) in [
            ("M", over.m, ad[ra - 2]),
            ("N", over.n, bd[rb - 1]),
            ("K", over.k, ad[ra - 1]),
        ] {
            let Some(t) = t else { continue };
            let info = &self.tensors[t];
            let ok = info.dtype == crate::dtype::DType::I32
                && !info.is_virtual
                && info.producer.is_none()
                && info.scalar.is_none()
                && info.bound.is_some_and(|b| (0..=extent).contains(&b));
            if !ok {
                return Err(bad(format!(
                    "operation #{o} (matmul): {which} override `{}` (an INT32 graph input of \
                     lengths bounded by {extent}; got {}, bound {:?})",
                    info.name, info.dtype, info.bound
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::{ConvParams, PointwiseMode};

    fn conv_graph() -> Graph {
        let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        let x = g.tensor_nhwc("x", &[2, 8, 6, 6], DType::F16).unwrap();
        let w = g.tensor_nhwc("w", &[4, 8, 3, 3], DType::F16).unwrap();
        let b = g.tensor_nhwc("b", &[1, 4, 1, 1], DType::F16).unwrap();
        let y = g
            .conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))
            .unwrap();
        let y = g.bias(y, b).unwrap();
        let m = g
            .scalar("minus_inf", f64::NEG_INFINITY, DType::F32)
            .unwrap();
        let y = g.pointwise(PointwiseMode::Max, y, Some(m)).unwrap();
        let y = g.pointwise(PointwiseMode::Relu, y, None).unwrap();
        g.set_name(y, "y").unwrap();
        g.mark_output(y).unwrap();
        g
    }

    #[test]
    fn a_graph_reads_back_with_its_signature_names_and_links() {
        let g = conv_graph();
        let line = g.to_json().unwrap();
        assert!(!line.contains('\n') && !line.contains('\t'));
        let back = Graph::from_json(&line).unwrap();
        assert_eq!(back.signature(), g.signature());
        assert_ne!(back.id, g.id, "a graph read back is a new graph");
        for (a, b) in back.tensors.iter().zip(&g.tensors) {
            assert_eq!(
                (a.name, a.producer, a.consumed),
                (b.name, b.producer, b.consumed)
            );
        }
        // −∞ survives as its bit pattern.
        assert!(back
            .tensors
            .iter()
            .any(|t| t.scalar == Some(f64::NEG_INFINITY)));
        assert_eq!(back.to_json().unwrap(), line);
    }

    #[test]
    fn a_refused_pointwise_marks_nothing_read() {
        let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        let x = g.tensor_nhwc("x", &[2, 8, 6, 6], DType::F16).unwrap();
        assert!(g
            .pointwise(PointwiseMode::GenIndex { axis: 9 }, x, None)
            .is_err());
        assert!(
            !g.tensors[x.index].consumed,
            "x read by a refused operation"
        );
        // A scalar first read at rank 4, then offered to a rank-3 operand: refused, z unread.
        let s = g.scalar("s", 2.0, DType::F32).unwrap();
        g.pointwise(PointwiseMode::Mul, x, Some(s)).unwrap();
        let z = g.tensor("z", &[2, 3, 4], &[12, 4, 1], DType::F16).unwrap();
        assert!(g.pointwise(PointwiseMode::Mul, z, Some(s)).is_err());
        assert!(
            !g.tensors[z.index].consumed,
            "z read by a refused operation"
        );
        // A broadcast whose output's element count overflows i64: refused, c unread.
        let big = (1i64 << 31) - 1;
        let a = g.tensor_nhwc("a", &[big, 1, 1, 1], DType::F16).unwrap();
        let b = g.tensor_nhwc("b", &[1, big, 1, 1], DType::F16).unwrap();
        let ab = g.pointwise(PointwiseMode::Add, a, Some(b)).unwrap();
        let c = g.tensor_nhwc("c", &[1, 1, big, 1], DType::F16).unwrap();
        assert!(g.pointwise(PointwiseMode::Add, ab, Some(c)).is_err());
        assert!(
            !g.tensors[c.index].consumed,
            "c read by a refused operation"
        );
    }

    #[test]
    fn malformed_records_are_typed_errors() {
        let line = conv_graph().to_json().unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&line).unwrap();
        type Edit = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Edit)> = vec![
            (
                "index",
                Box::new(|v| v["ops"][0]["ConvFprop"]["w"] = 99.into()),
            ),
            (
                "written by",
                Box::new(|v| v["ops"][1]["Pointwise"]["y"] = v["ops"][0]["ConvFprop"]["y"].clone()),
            ),
            (
                "strides",
                Box::new(|v| v["tensors"][0]["strides"] = serde_json::json!([1, 1])),
            ),
            (
                "dimensions ≥ 1",
                Box::new(|v| v["tensors"][1]["dims"][0] = (-4).into()),
            ),
            (
                "overflow",
                Box::new(|v| {
                    v["tensors"][0]["strides"][0] = i64::MAX.into();
                }),
            ),
            (
                "rank",
                Box::new(|v| {
                    v["tensors"][1]["dims"] = serde_json::json!([4, 8, 3]);
                    v["tensors"][1]["strides"] = serde_json::json!([24, 1, 8]);
                }),
            ),
            (
                "padding",
                Box::new(|v| {
                    v["ops"][0]["ConvFprop"]["conv"]["pre_padding"] = serde_json::json!([1])
                }),
            ),
            (
                "written by no operation",
                Box::new(|v| v["tensors"][0]["is_virtual"] = true.into()),
            ),
            ("expected", Box::new(|v| v["ops"] = "none".into())),
            // The builders' operand rules, which cuDNN's validation does not re-establish.
            (
                "the slope must be 0",
                Box::new(|v| {
                    v["ops"][3]["Pointwise"]["mode"] =
                        serde_json::json!({"LeakyRelu": {"slope": 0.1}})
                }),
            ),
            (
                "by-value scalar",
                Box::new(|v| v["ops"][0]["ConvFprop"]["w"] = v["ops"][2]["Pointwise"]["b"].clone()),
            ),
            (
                "reads and writes",
                Box::new(|v| v["ops"][3]["Pointwise"]["x"] = v["ops"][3]["Pointwise"]["y"].clone()),
            ),
            (
                "Relu with b",
                Box::new(|v| v["ops"][3]["Pointwise"]["b"] = v["ops"][1]["Pointwise"]["b"].clone()),
            ),
            (
                "for operands of dims",
                Box::new(|v| {
                    let y = v["ops"][3]["Pointwise"]["y"].as_u64().unwrap() as usize;
                    v["tensors"][y]["dims"] = serde_json::json!([1, 1, 1, 1]);
                    v["tensors"][y]["strides"] = serde_json::json!([1, 1, 1, 1]);
                }),
            ),
        ];
        for (want, edit) in cases {
            let mut bad = v.clone();
            edit(&mut bad);
            match Graph::from_json(&bad.to_string()) {
                Err(e @ Error::InvalidArgument { .. }) => {
                    assert!(e.to_string().contains(want), "{want}: {e}")
                }
                other => panic!("{want}: {other:?}"),
            }
        }
        // Unchanged, it still reads.
        v["tensors"][0]["name"] = "renamed".into();
        assert_eq!(
            Graph::from_json(&v.to_string()).unwrap().tensors[0].name,
            "renamed"
        );
    }

    /// JSON pointers of every number in `v`.
    fn number_paths(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Number(_) => out.push(at),
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    number_paths(x, format!("{at}/{i}"), out);
                }
            }
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    number_paths(x, format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }

    proptest::proptest! {
        /// Any number of a record replaced by any integer: `from_json` and cuDNN's validation
        /// return (Ok or a typed error) without panicking.
        #[test]
        fn edited_records_never_panic(picks in proptest::collection::vec(
            (proptest::prelude::any::<proptest::sample::Index>(), -3i64..70),
            1..4,
        )) {
            let line = conv_graph().to_json().unwrap();
            let mut v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let mut paths = Vec::new();
            number_paths(&v, String::new(), &mut paths);
            for (at, value) in picks {
                let p = at.get(&paths);
                *v.pointer_mut(p).unwrap() = value.into();
            }
            if let Ok(g) = Graph::from_json(&v.to_string()) {
                let _ = g.check();
                let _ = g.signature();
            }
        }
    }

    #[test]
    fn names_are_kept_once() {
        let a = intern("record_test_name".to_string());
        let b = intern("record_test_name".to_string());
        assert!(std::ptr::eq(a, b));
        let long = "n".repeat(300);
        assert_eq!(intern(long).len(), MAX_NAME_LEN);
    }
}
