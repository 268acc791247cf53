//! The weight layout: where each weight matrix and bias lives in the weight space, as cuDNN
//! reports it (`cudnnGetRNNWeightParams`).
use std::ffi::{c_int, c_void};

use cudarc::driver::DevicePtr;
use cudnn_safe_sys as sys;

use super::builder::Config;
use super::{ffi, BiasMode, Direction, InputMode};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;

/// A gate of a recurrent cell (or the plain RNN's single transform, or the LSTM projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gate {
    /// The only transform of a ReLU / tanh RNN.
    Hidden,
    /// LSTM input gate `i`.
    Input,
    /// LSTM forget gate `f`.
    Forget,
    /// LSTM cell candidate `g` (cuDNN's "new memory gate" `c'`).
    Cell,
    /// LSTM output gate `o`.
    Output,
    /// GRU reset gate `r`.
    Reset,
    /// GRU update gate `z`.
    Update,
    /// GRU new gate `n` (cuDNN's `h'`).
    New,
    /// The LSTM projection `h_proj = W_hr·h` (not a gate; linear-layer id 8).
    Projection,
}

/// Which kind of parameter a [`WeightParam`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamKind {
    /// A matrix applied to the layer's input (`W`, PyTorch `weight_ih`).
    InputWeight,
    /// A matrix applied to the previous hidden state (`R`, PyTorch `weight_hh`).
    RecurrentWeight,
    /// A bias of the input GEMM (`b_W`, PyTorch `bias_ih`).
    InputBias,
    /// A bias of the recurrent GEMM (`b_R`, PyTorch `bias_hh`).
    RecurrentBias,
    /// The LSTM projection matrix (PyTorch `weight_hr`).
    ProjectionWeight,
}

impl ParamKind {
    /// Whether this is a bias vector.
    pub fn is_bias(self) -> bool {
        matches!(self, ParamKind::InputBias | ParamKind::RecurrentBias)
    }
}

/// Where one weight matrix or bias vector lives in the weight space
/// (from `cudnnGetRNNWeightParams`).
///
/// A matrix is `rows × cols`, row-major (`rows` = gate width, `cols` = input width); a bias is
/// a vector of `rows` elements (`cols == 1`). `offset` counts elements of `T` from the start of
/// the weight space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WeightParam {
    /// Physical layer (0 is the one reading the input).
    pub layer: usize,
    /// Direction of the pseudo-layer.
    pub direction: Direction,
    /// cuDNN's pseudo-layer index: `layer · directions + (0 forward | 1 reverse)`.
    pub pseudo_layer: usize,
    /// cuDNN's linear-layer id (see the [module docs](crate::rnn)).
    pub lin_id: usize,
    /// Matrix or bias, input or recurrent.
    pub kind: ParamKind,
    /// The gate it belongs to.
    pub gate: Gate,
    /// Offset in elements from the start of the weight space.
    pub offset: usize,
    /// Rows of the matrix, or the bias length.
    pub rows: usize,
    /// Columns of the matrix (1 for a bias).
    pub cols: usize,
}

impl WeightParam {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }
    /// Whether it holds no element (never the case for a parameter cuDNN reports).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements of the weight space it occupies.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// Number of elements a tensor descriptor cuDNN filled in describes (0 for an empty one).
fn described_elements(lib: &'static sys::Library, desc: &raw::OwnedTensor) -> Result<usize> {
    let mut dt = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let mut nb: c_int = 0;
    let mut dims = [0 as c_int; crate::tensor::MAX_DIMS];
    let mut strides = [0 as c_int; crate::tensor::MAX_DIMS];
    // SAFETY: live descriptor; `dims` and `strides` hold the `MAX_DIMS` entries requested.
    unsafe {
        ffi::cudnnGetTensorNdDescriptor(
            lib,
            desc.as_ptr(),
            dims.len() as c_int,
            &mut dt,
            &mut nb,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
        )
    }?;
    let nb = (nb.max(0) as usize).min(dims.len());
    if nb == 0 {
        return Ok(0);
    }
    Ok(dims[..nb]
        .iter()
        .map(|&d| d.max(0) as usize)
        .product::<usize>())
}

/// The scratch weight space `cudnnGetRNNWeightParams` computes addresses in, and the tensor
/// descriptor it describes each parameter with.
struct Probe<'a> {
    cudnn: &'a Cudnn,
    desc: &'a ffi::OwnedRnn,
    m_desc: raw::OwnedTensor,
    base: u64,
    bytes: usize,
    elem: usize,
}

impl Probe<'_> {
    /// The offset (in elements) and length of one parameter: `Ok(None)` when cuDNN reports no
    /// such parameter.
    fn param(&self, pseudo: usize, lin: usize, bias: bool) -> Result<Option<(usize, usize)>> {
        let (lib, bytes, base) = (self.cudnn.lib(), self.bytes, self.base);
        let mut addr: *mut c_void = std::ptr::null_mut();
        let (desc, out) = (self.m_desc.as_ptr(), &mut addr as *mut *mut c_void);
        let (none_d, none_a) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (md, ma, bd, ba) = if bias {
            (none_d, none_a, desc, out)
        } else {
            (desc, out, none_d, none_a)
        };
        // SAFETY: live handle, RNN and tensor descriptors; `base` addresses `bytes` bytes of
        // device memory that stays allocated (and is only used for address arithmetic by this
        // host function); the out-pointers are valid, the unused pair is null as documented
        // (PyTorch queries matrices and biases the same way).
        unsafe {
            ffi::cudnnGetRNNWeightParams(
                lib,
                self.cudnn.as_raw(),
                self.desc.as_ptr(),
                pseudo as i32,
                bytes,
                base as *const c_void,
                lin as i32,
                md,
                ma,
                bd,
                ba,
            )
        }?;
        if addr.is_null() {
            return Ok(None);
        }
        // An absent parameter may also come back as an empty descriptor.
        let n = described_elements(lib, &self.m_desc)?;
        if n == 0 {
            return Ok(None);
        }
        let elem = self.elem;
        let off = (addr as u64).checked_sub(base).map(|o| o as usize);
        match off {
            Some(o) if o % elem == 0 && o + n * elem <= bytes => Ok(Some((o / elem, n))),
            _ => Err(Error::invalid(
                "RNN weight parameter reported by cuDNN",
                format!("{} elements inside the {bytes}-byte weight space", n),
                format!(
                    "pseudo-layer {pseudo}, linear id {lin}, address offset {:?}",
                    (addr as u64).checked_sub(base)
                ),
            )),
        }
    }
}

/// One pseudo-layer (layer × direction) of a network being described.
struct PseudoLayer {
    pseudo: usize,
    layer: usize,
    direction: Direction,
}

impl PseudoLayer {
    fn param(
        &self,
        lin: usize,
        kind: ParamKind,
        gate: Gate,
        place: (usize, usize, usize),
    ) -> WeightParam {
        let (offset, rows, cols) = place;
        WeightParam {
            layer: self.layer,
            direction: self.direction,
            pseudo_layer: self.pseudo,
            lin_id: lin,
            kind,
            gate,
            offset,
            rows,
            cols,
        }
    }
}

/// The gates of `cfg`'s cell in linear-id order.
fn gates(cfg: &Config) -> impl Iterator<Item = (usize, Gate)> + '_ {
    (0..cfg.cell.gate_count()).filter_map(|g| Some((g, cfg.cell.gate(g)?)))
}

/// The matrices of one pseudo-layer, which cuDNN must all report with the expected shape.
fn matrices(
    probe: &Probe<'_>,
    cfg: &Config,
    pl: &PseudoLayer,
    params: &mut Vec<WeightParam>,
) -> Result<()> {
    let dirs = cfg.direction.count();
    let gate_count = cfg.cell.gate_count();
    let (hidden, out) = (cfg.hidden_size as usize, cfg.proj_size as usize);
    let in_cols = if pl.layer == 0 {
        cfg.input_size as usize
    } else {
        dirs * out
    };
    let mut wanted: Vec<(usize, ParamKind, Gate, usize, usize)> = Vec::new();
    if !(pl.layer == 0 && cfg.input_mode == InputMode::Skip) {
        for (g, gate) in gates(cfg) {
            wanted.push((g, ParamKind::InputWeight, gate, hidden, in_cols));
        }
    }
    for (g, gate) in gates(cfg) {
        wanted.push((
            gate_count + g,
            ParamKind::RecurrentWeight,
            gate,
            hidden,
            out,
        ));
    }
    if out < hidden {
        let proj = (
            2 * gate_count,
            ParamKind::ProjectionWeight,
            Gate::Projection,
            out,
            hidden,
        );
        wanted.push(proj);
    }
    let pseudo = pl.pseudo;
    for (lin, kind, gate, rows, cols) in wanted {
        let Some((offset, n)) = probe.param(pseudo, lin, false)? else {
            return Err(Error::invalid(
                "RNN weight layout reported by cuDNN",
                format!("a {rows}×{cols} matrix for linear id {lin}"),
                format!("none for pseudo-layer {pseudo}"),
            ));
        };
        if n != rows * cols {
            return Err(Error::invalid(
                "RNN weight layout reported by cuDNN",
                format!("a {rows}×{cols} matrix for linear id {lin}"),
                format!("{n} elements for pseudo-layer {pseudo}"),
            ));
        }
        params.push(pl.param(lin, kind, gate, (offset, rows, cols)));
    }
    Ok(())
}

/// The biases of one pseudo-layer. They are looked up for every id and kept where cuDNN has
/// one, so the single-bias modes are described by cuDNN itself; the count is checked.
fn biases(
    probe: &Probe<'_>,
    cfg: &Config,
    pl: &PseudoLayer,
    params: &mut Vec<WeightParam>,
) -> Result<()> {
    let (gates, hidden, pseudo) = (cfg.cell.gate_count(), cfg.hidden_size as usize, pl.pseudo);
    let mut found = 0;
    for lin in 0..2 * gates {
        let present = match probe.param(pseudo, lin, true) {
            Ok(p) => p,
            Err(Error::Cudnn { .. }) => None,
            Err(e) => return Err(e),
        };
        let Some((offset, n)) = present else { continue };
        if n != hidden {
            return Err(Error::invalid(
                "RNN bias layout reported by cuDNN",
                format!("{hidden} elements for linear id {lin}"),
                format!("{n} for pseudo-layer {pseudo}"),
            ));
        }
        let kind = if lin < gates {
            ParamKind::InputBias
        } else {
            ParamKind::RecurrentBias
        };
        let Some(gate) = cfg.cell.gate(lin % gates) else {
            continue;
        };
        params.push(pl.param(lin, kind, gate, (offset, hidden, 1)));
        found += 1;
    }
    let expected = gates
        * (usize::from(cfg.bias.has_input_bias()) + usize::from(cfg.bias.has_recurrent_bias()));
    // Without an input matrix (skip input), the first layer may or may not keep its input
    // biases; either is described faithfully by what cuDNN reports.
    let without_input = expected - gates * usize::from(cfg.bias.has_input_bias());
    let skipped = pl.layer == 0 && cfg.input_mode == InputMode::Skip;
    if found != expected && !(skipped && found == without_input) {
        return Err(Error::invalid(
            "RNN bias layout reported by cuDNN",
            format!(
                "{expected} bias vectors per pseudo-layer for {:?}",
                cfg.bias
            ),
            format!("{found} for pseudo-layer {pseudo}"),
        ));
    }
    Ok(())
}

/// Asks cuDNN where each weight matrix and bias lives, against a scratch weight space of the
/// right size (cuDNN computes addresses inside the buffer it is given; it reads nothing).
pub(super) fn query_params<T: DataType>(
    cudnn: &Cudnn,
    desc: &ffi::OwnedRnn,
    cfg: &Config,
    bytes: usize,
) -> Result<Vec<WeightParam>> {
    let stream = cudnn.stream();
    let space = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| Error::driver("allocating a scratch RNN weight space", e))?;
    let (base, _guard) = space.device_ptr(stream);
    let probe = Probe {
        cudnn,
        desc,
        m_desc: raw::OwnedTensor::new(cudnn.lib())?,
        base,
        bytes,
        elem: T::DTYPE.size(),
    };
    let dirs = cfg.direction.count();
    let mut params = Vec::new();
    for pseudo in 0..cfg.layers as usize * dirs {
        let direction = if pseudo % dirs == 0 {
            Direction::Forward
        } else {
            Direction::Reverse
        };
        let pl = PseudoLayer {
            pseudo,
            layer: pseudo / dirs,
            direction,
        };
        matrices(&probe, cfg, &pl, &mut params)?;
        if cfg.bias != BiasMode::NoBias {
            biases(&probe, cfg, &pl, &mut params)?;
        }
    }
    Ok(params)
}
