//! PyTorch state-dict layout (`nn.RNN`, `nn.LSTM`, `nn.GRU`) ↔ cuDNN weight space.
//!
//! PyTorch names each layer's parameters `weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`,
//! `bias_hh_l{k}` and, for a projected LSTM, `weight_hr_l{k}`, with a `_reverse` suffix for
//! the reverse direction. A gate-stacked tensor such as `weight_ih_l0` (`[gates·hidden, in]`)
//! is the concatenation, in gate order, of cuDNN's matrices of the same kind, and PyTorch's gate
//! order is cuDNN's; each gate block is copied at the offset cuDNN reports for it.
use std::collections::HashMap;

use super::{Direction, ParamKind, Rnn, WeightParam};
use crate::dtype::DataType;
use crate::error::{Error, Result};

/// The name and shape of one tensor of a PyTorch state dict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyTorchParam {
    /// E.g. `weight_ih_l0`, `bias_hh_l1_reverse`, `weight_hr_l0`.
    pub name: String,
    /// `[gates·hidden, in]` for weights, `[gates·hidden]` for biases, `[proj, hidden]` for
    /// `weight_hr`.
    pub shape: Vec<usize>,
}

impl PyTorchParam {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// Whether it holds no element (never for a tensor of a built network).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One PyTorch tensor and the cuDNN parameters it is made of, in gate order.
struct Group {
    param: PyTorchParam,
    parts: Vec<WeightParam>,
}

fn base_name(kind: ParamKind) -> &'static str {
    match kind {
        ParamKind::InputWeight => "weight_ih",
        ParamKind::RecurrentWeight => "weight_hh",
        ParamKind::InputBias => "bias_ih",
        ParamKind::RecurrentBias => "bias_hh",
        ParamKind::ProjectionWeight => "weight_hr",
    }
}

/// Groups cuDNN's parameters into PyTorch's tensors, in PyTorch's order (per layer and
/// direction: `weight_ih`, `weight_hh`, `bias_ih`, `bias_hh`, `weight_hr`).
fn groups(params: &[WeightParam]) -> Vec<Group> {
    let mut sorted: Vec<WeightParam> = params.to_vec();
    sorted.sort_by_key(|p| (p.layer, p.direction, p.kind, p.lin_id));
    let mut out: Vec<Group> = Vec::new();
    for p in sorted {
        let same = out.last().is_some_and(|g| {
            let q = &g.parts[0];
            q.layer == p.layer && q.direction == p.direction && q.kind == p.kind
        });
        if !same {
            let suffix = if p.direction == Direction::Reverse {
                "_reverse"
            } else {
                ""
            };
            out.push(Group {
                param: PyTorchParam {
                    name: format!("{}_l{}{}", base_name(p.kind), p.layer, suffix),
                    shape: Vec::new(),
                },
                parts: Vec::new(),
            });
        }
        out.last_mut()
            .expect("a group was just pushed")
            .parts
            .push(p);
    }
    for g in &mut out {
        let first = g.parts[0];
        let rows: usize = g.parts.iter().map(|p| p.rows).sum();
        g.param.shape = if first.kind.is_bias() {
            vec![rows]
        } else {
            vec![rows, first.cols]
        };
    }
    out
}

/// Builds a weight-space image of `space_len` elements from PyTorch tensors (every tensor the
/// layout needs, nothing else); unused elements of the space are zero.
fn from_pytorch<T: DataType>(
    params: &[WeightParam],
    space_len: usize,
    state: &[(&str, &[T])],
) -> Result<Vec<T>> {
    let groups = groups(params);
    let index: HashMap<&str, usize> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (g.param.name.as_str(), i))
        .collect();
    let mut seen = vec![false; groups.len()];
    let mut space = vec![T::default(); space_len];
    for &(name, data) in state {
        let Some(&i) = index.get(name) else {
            let known: Vec<&str> = groups.iter().map(|g| g.param.name.as_str()).collect();
            return Err(Error::InvalidArgument {
                what: "PyTorch parameter name",
                expected: format!("one of {known:?}"),
                got: format!("`{name}`"),
            });
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(Error::invalid(
                "PyTorch parameters",
                "each tensor once",
                format!("`{name}` twice"),
            ));
        }
        let g = &groups[i];
        if data.len() != g.param.len() {
            return Err(Error::InvalidArgument {
                what: "PyTorch parameter size",
                expected: format!(
                    "{} elements (shape {:?}) for `{name}`",
                    g.param.len(),
                    g.param.shape
                ),
                got: format!("{} elements", data.len()),
            });
        }
        let mut at = 0;
        for p in &g.parts {
            space[p.range()].copy_from_slice(&data[at..at + p.len()]);
            at += p.len();
        }
    }
    if let Some(i) = seen.iter().position(|&s| !s) {
        return Err(Error::invalid(
            "PyTorch parameters",
            format!(
                "every tensor of the layout, including `{}` (shape {:?})",
                groups[i].param.name, groups[i].param.shape
            ),
            "a state dict without it",
        ));
    }
    Ok(space)
}

/// Cuts a weight-space image into PyTorch tensors.
fn to_pytorch<T: DataType>(
    params: &[WeightParam],
    space: &[T],
    space_len: usize,
) -> Result<Vec<(String, Vec<T>)>> {
    if space.len() != space_len {
        return Err(Error::InvalidArgument {
            what: "weight-space length",
            expected: format!("exactly {space_len} elements (the RNN's weight space)"),
            got: format!("{} elements", space.len()),
        });
    }
    Ok(groups(params)
        .into_iter()
        .map(|g| {
            let mut data = Vec::with_capacity(g.param.len());
            for p in &g.parts {
                data.extend_from_slice(&space[p.range()]);
            }
            (g.param.name, data)
        })
        .collect())
}

impl<T: DataType> Rnn<T> {
    /// The tensors of the equivalent PyTorch module's state dict, in PyTorch's order: per layer
    /// and direction `weight_ih`, `weight_hh`, `bias_ih`, `bias_hh` (those the bias mode has),
    /// `weight_hr` (projected LSTM). The first layer of a skip-input network has no `weight_ih`.
    pub fn pytorch_params(&self) -> Vec<PyTorchParam> {
        groups(self.weight_params())
            .into_iter()
            .map(|g| g.param)
            .collect()
    }

    /// A host image of the weight space (length [`weight_space_len`](Self::weight_space_len))
    /// holding the given PyTorch tensors (`(name, row-major data)`, e.g. from
    /// `{k: v.flatten().tolist() for k, v in lstm.state_dict().items()}`): each gate block is
    /// copied where cuDNN keeps it. Every tensor of [`pytorch_params`](Self::pytorch_params) must
    /// be given once, with its exact size, and nothing else. Upload the result with
    /// `stream.clone_htod(&image)`.
    pub fn weights_from_pytorch(&self, state: &[(&str, &[T])]) -> Result<Vec<T>> {
        from_pytorch(self.weight_params(), self.weight_space_len(), state)
    }

    /// The inverse of [`weights_from_pytorch`](Self::weights_from_pytorch): a host copy of a
    /// weight space (or of a weight gradient) cut into PyTorch tensors, in PyTorch's order.
    pub fn weights_to_pytorch(&self, space: &[T]) -> Result<Vec<(String, Vec<T>)>> {
        to_pytorch(self.weight_params(), space, self.weight_space_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rnn::{CellMode, Gate};

    /// A synthetic bidirectional one-layer GRU layout (hidden 2, input 3) with gaps and
    /// scrambled order, as cuDNN could report it.
    fn layout() -> (Vec<WeightParam>, usize) {
        let cell = CellMode::Gru;
        let mut params = Vec::new();
        let mut offset = 5; // leading gap
        for (pseudo, direction) in [(1, Direction::Reverse), (0, Direction::Forward)] {
            for lin in (0..6).rev() {
                let (kind, cols) = if lin < 3 {
                    (ParamKind::InputWeight, 3)
                } else {
                    (ParamKind::RecurrentWeight, 2)
                };
                params.push(WeightParam {
                    layer: 0,
                    direction,
                    pseudo_layer: pseudo,
                    lin_id: lin,
                    kind,
                    gate: cell.gate(lin % 3).unwrap(),
                    offset,
                    rows: 2,
                    cols,
                });
                offset += 2 * cols + 1; // a gap after each matrix
            }
            for lin in 0..6 {
                params.push(WeightParam {
                    layer: 0,
                    direction,
                    pseudo_layer: pseudo,
                    lin_id: lin,
                    kind: if lin < 3 {
                        ParamKind::InputBias
                    } else {
                        ParamKind::RecurrentBias
                    },
                    gate: cell.gate(lin % 3).unwrap(),
                    offset,
                    rows: 2,
                    cols: 1,
                });
                offset += 2;
            }
        }
        (params, offset + 3)
    }

    #[test]
    fn names_shapes_and_order_follow_pytorch() {
        let (params, _) = layout();
        let names: Vec<(String, Vec<usize>)> = groups(&params)
            .into_iter()
            .map(|g| (g.param.name, g.param.shape))
            .collect();
        let want = [
            ("weight_ih_l0", vec![6, 3]),
            ("weight_hh_l0", vec![6, 2]),
            ("bias_ih_l0", vec![6]),
            ("bias_hh_l0", vec![6]),
            ("weight_ih_l0_reverse", vec![6, 3]),
            ("weight_hh_l0_reverse", vec![6, 2]),
            ("bias_ih_l0_reverse", vec![6]),
            ("bias_hh_l0_reverse", vec![6]),
        ];
        assert_eq!(names.len(), want.len());
        for ((n, s), (wn, ws)) in names.iter().zip(want.iter()) {
            assert_eq!(n, wn);
            assert_eq!(s, ws);
        }
    }

    #[test]
    fn gate_blocks_land_at_their_offsets_and_round_trip() {
        let (params, len) = layout();
        let tensors: Vec<(String, Vec<f64>)> = groups(&params)
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let n = g.param.len();
                (
                    g.param.name.clone(),
                    (0..n).map(|k| (1000 * (i + 1) + k) as f64).collect(),
                )
            })
            .collect();
        let state: Vec<(&str, &[f64])> = tensors
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let space = from_pytorch(&params, len, &state).unwrap();
        // The update-gate (z) block of weight_hh_l0_reverse is rows 2..4 of [6, 2].
        let p = params
            .iter()
            .find(|p| {
                p.direction == Direction::Reverse
                    && p.kind == ParamKind::RecurrentWeight
                    && p.gate == Gate::Update
            })
            .unwrap();
        let hh_rev = &tensors
            .iter()
            .find(|(n, _)| n == "weight_hh_l0_reverse")
            .unwrap()
            .1;
        assert_eq!(&space[p.range()], &hh_rev[4..8]);
        // Gaps stay zero.
        assert!(space[..5].iter().all(|&v| v == 0.0));
        let back = to_pytorch(&params, &space, len).unwrap();
        assert_eq!(back, tensors);
    }

    #[test]
    fn bad_state_dicts_are_rejected() {
        let (params, len) = layout();
        let gs = groups(&params);
        let full: Vec<(String, Vec<f32>)> = gs
            .iter()
            .map(|g| (g.param.name.clone(), vec![1.0; g.param.len()]))
            .collect();
        let as_state = |v: &[(String, Vec<f32>)]| -> Vec<(String, Vec<f32>)> { v.to_vec() };
        let run = |v: Vec<(String, Vec<f32>)>| {
            let s: Vec<(&str, &[f32])> =
                v.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
            from_pytorch(&params, len, &s)
        };
        assert!(run(as_state(&full)).is_ok());
        let mut missing = as_state(&full);
        missing.remove(3);
        assert!(matches!(run(missing), Err(Error::InvalidArgument { .. })));
        let mut extra = as_state(&full);
        extra.push(("weight_hr_l0".into(), vec![0.0; 4]));
        assert!(matches!(run(extra), Err(Error::InvalidArgument { .. })));
        let mut short = as_state(&full);
        short[0].1.pop();
        assert!(matches!(run(short), Err(Error::InvalidArgument { .. })));
        let mut twice = as_state(&full);
        twice.push(full[0].clone());
        assert!(matches!(run(twice), Err(Error::InvalidArgument { .. })));
        assert!(to_pytorch(&params, &vec![0.0f32; len - 1], len).is_err());
    }
}
