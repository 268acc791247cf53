//! The epilogues cuBLASLt fuses into a matmul, and the buffers each one takes.
use std::fmt;

use cudarc::cublaslt::sys;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, SyncOnDrop};

#[cfg(doc)]
use super::{BlasLt, Matmul};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};

/// What cuBLASLt applies to `alpha·op(A)·op(B) + beta·D` before storing it
/// (`cublasLtEpilogue_t`). GELU is cuBLASLt's tanh approximation,
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (PyTorch's `approximate="tanh"`).
///
/// Each epilogue takes its extra buffers through the matching [`EpilogueData`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[doc(alias = "cublasLtEpilogue_t")]
pub enum Epilogue {
    /// Nothing (`CUBLASLT_EPILOGUE_DEFAULT`). Data: [`EpilogueData::None`].
    #[default]
    None,
    /// `max(x, 0)` (`CUBLASLT_EPILOGUE_RELU`). Data: [`EpilogueData::None`].
    Relu,
    /// tanh-GELU (`CUBLASLT_EPILOGUE_GELU`). Data: [`EpilogueData::None`].
    Gelu,
    /// `x + bias[j]` per output column `j` (`CUBLASLT_EPILOGUE_BIAS`). Data:
    /// [`EpilogueData::Bias`] (length ≥ n).
    Bias,
    /// `max(x + bias[j], 0)` (`CUBLASLT_EPILOGUE_RELU_BIAS`). Data: [`EpilogueData::Bias`].
    BiasRelu,
    /// `gelu(x + bias[j])` (`CUBLASLT_EPILOGUE_GELU_BIAS`). Data: [`EpilogueData::Bias`].
    BiasGelu,
    /// Plain product, and the bias gradient `db[i] = Σ_k op(A)[i, k]` (`i < m`) written to the
    /// bias buffer (`CUBLASLT_EPILOGUE_BGRADB`, see [`BlasLt`]). Data:
    /// [`EpilogueData::BiasGrad`] (length ≥ m). Use `alpha = 1`: cuBLASLt does not document
    /// whether the gradient is scaled by alpha (the tests check alpha = 1).
    BiasGrad,
    /// `gelu(x + bias[j])`, and the GELU input `x + bias[j]` stored in an aux matrix for the
    /// backward pass (`CUBLASLT_EPILOGUE_GELU_AUX_BIAS`). Data: [`EpilogueData::BiasAux`]
    /// (aux: `m` rows of [`Matmul::aux_ld`] elements).
    BiasGeluAux,
    /// `x · gelu'(aux)`: the GELU backward, with `aux` the GELU input a [`BiasGeluAux`]
    /// forward stored (`CUBLASLT_EPILOGUE_DGELU`). Data: [`EpilogueData::Aux`]. Meant for
    /// `beta = 0` (the tests check that case only; with `beta ≠ 0` where cuBLASLt applies the
    /// derivative relative to `beta·D` is not documented).
    ///
    /// [`BiasGeluAux`]: Epilogue::BiasGeluAux
    DGelu,
    /// As [`DGelu`](Epilogue::DGelu), and the bias gradient of that GELU input,
    /// `db[j] = Σ_i D[i, j]` (column sums of the result, `j < n`), written to the bias buffer
    /// (`CUBLASLT_EPILOGUE_DGELU_BGRAD`). Data: [`EpilogueData::AuxBiasGrad`] (db length ≥ n).
    /// Use `alpha = 1`, `beta = 0` (what the tests check).
    DGeluBiasGrad,
}

impl Epilogue {
    /// Every epilogue.
    pub const ALL: [Epilogue; 10] = [
        Epilogue::None,
        Epilogue::Relu,
        Epilogue::Gelu,
        Epilogue::Bias,
        Epilogue::BiasRelu,
        Epilogue::BiasGelu,
        Epilogue::BiasGrad,
        Epilogue::BiasGeluAux,
        Epilogue::DGelu,
        Epilogue::DGeluBiasGrad,
    ];

    pub(super) fn raw(self) -> sys::cublasLtEpilogue_t {
        use sys::cublasLtEpilogue_t as E;
        match self {
            Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Relu => E::CUBLASLT_EPILOGUE_RELU,
            Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasRelu => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::BiasGelu => E::CUBLASLT_EPILOGUE_GELU_BIAS,
            Epilogue::BiasGrad => E::CUBLASLT_EPILOGUE_BGRADB,
            Epilogue::BiasGeluAux => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Epilogue::DGelu => E::CUBLASLT_EPILOGUE_DGELU,
            Epilogue::DGeluBiasGrad => E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
        }
    }

    /// The C name (`CUBLASLT_EPILOGUE_GELU_BIAS`, ...).
    pub fn c_name(self) -> &'static str {
        match self {
            Epilogue::None => "CUBLASLT_EPILOGUE_DEFAULT",
            Epilogue::Relu => "CUBLASLT_EPILOGUE_RELU",
            Epilogue::Gelu => "CUBLASLT_EPILOGUE_GELU",
            Epilogue::Bias => "CUBLASLT_EPILOGUE_BIAS",
            Epilogue::BiasRelu => "CUBLASLT_EPILOGUE_RELU_BIAS",
            Epilogue::BiasGelu => "CUBLASLT_EPILOGUE_GELU_BIAS",
            Epilogue::BiasGrad => "CUBLASLT_EPILOGUE_BGRADB",
            Epilogue::BiasGeluAux => "CUBLASLT_EPILOGUE_GELU_AUX_BIAS",
            Epilogue::DGelu => "CUBLASLT_EPILOGUE_DGELU",
            Epilogue::DGeluBiasGrad => "CUBLASLT_EPILOGUE_DGELU_BGRAD",
        }
    }

    /// The [`EpilogueData`] variant this epilogue takes.
    pub(super) fn data_kind(self) -> DataKind {
        match self {
            Epilogue::None | Epilogue::Relu | Epilogue::Gelu => DataKind::None,
            Epilogue::Bias | Epilogue::BiasRelu | Epilogue::BiasGelu => DataKind::Bias,
            Epilogue::BiasGrad => DataKind::BiasGrad,
            Epilogue::BiasGeluAux => DataKind::BiasAux,
            Epilogue::DGelu => DataKind::Aux,
            Epilogue::DGeluBiasGrad => DataKind::AuxBiasGrad,
        }
    }

    /// Whether the epilogue uses the aux matrix.
    pub fn uses_aux(self) -> bool {
        matches!(
            self.data_kind(),
            DataKind::BiasAux | DataKind::Aux | DataKind::AuxBiasGrad
        )
    }

    /// Whether the epilogue reads or writes the bias buffer.
    pub fn uses_bias(self) -> bool {
        !matches!(self.data_kind(), DataKind::None | DataKind::Aux)
    }

    pub(super) fn code(self) -> i64 {
        i64::from(self.raw() as u32)
    }
}

impl fmt::Display for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Epilogue::None => "none",
            Epilogue::Relu => "relu",
            Epilogue::Gelu => "gelu",
            Epilogue::Bias => "bias",
            Epilogue::BiasRelu => "bias+relu",
            Epilogue::BiasGelu => "bias+gelu",
            Epilogue::BiasGrad => "bias-grad",
            Epilogue::BiasGeluAux => "bias+gelu+aux",
            Epilogue::DGelu => "dgelu",
            Epilogue::DGeluBiasGrad => "dgelu+bias-grad",
        };
        f.write_str(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataKind {
    None,
    Bias,
    BiasGrad,
    BiasAux,
    Aux,
    AuxBiasGrad,
}

impl DataKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            DataKind::None => "EpilogueData::None",
            DataKind::Bias => "EpilogueData::Bias",
            DataKind::BiasGrad => "EpilogueData::BiasGrad",
            DataKind::BiasAux => "EpilogueData::BiasAux",
            DataKind::Aux => "EpilogueData::Aux",
            DataKind::AuxBiasGrad => "EpilogueData::AuxBiasGrad",
        }
    }
}

/// The buffers an [`Epilogue`] reads or writes besides A, B and D, one variant per kind of
/// epilogue. Inputs are shared borrows, outputs exclusive ones, so an output can alias nothing.
///
/// The variants hold views; the constructors take any [`DeviceBuffer`]:
/// `EpilogueData::bias(&bias)`, `EpilogueData::bias_grad(&mut db)`, or a view directly
/// (`EpilogueData::Bias(bias.slice(8..))`).
pub enum EpilogueData<'a, T> {
    /// For [`Epilogue::None`], [`Relu`](Epilogue::Relu), [`Gelu`](Epilogue::Gelu).
    None,
    /// The bias (≥ [`Matmul::bias_len`] elements) for [`Epilogue::Bias`],
    /// [`BiasRelu`](Epilogue::BiasRelu), [`BiasGelu`](Epilogue::BiasGelu).
    Bias(CudaView<'a, T>),
    /// The bias-gradient output (≥ [`Matmul::bias_len`] = m elements) for
    /// [`Epilogue::BiasGrad`].
    BiasGrad(CudaViewMut<'a, T>),
    /// For [`Epilogue::BiasGeluAux`]: the bias (input) and the aux matrix (output, ≥
    /// [`Matmul::aux_len`] elements) that receives the GELU input.
    BiasAux {
        /// The bias, ≥ n elements.
        bias: CudaView<'a, T>,
        /// The GELU input, `m` rows of [`Matmul::aux_ld`] elements.
        aux: CudaViewMut<'a, T>,
    },
    /// The aux matrix (input: the GELU input of the forward pass) for [`Epilogue::DGelu`].
    Aux(CudaView<'a, T>),
    /// For [`Epilogue::DGeluBiasGrad`]: the aux matrix (input) and the bias gradient (output,
    /// ≥ n elements).
    AuxBiasGrad {
        /// The GELU input of the forward pass, `m` rows of [`Matmul::aux_ld`] elements.
        aux: CudaView<'a, T>,
        /// The bias gradient, ≥ n elements.
        bias_grad: CudaViewMut<'a, T>,
    },
}

impl<'a, T> EpilogueData<'a, T> {
    /// [`EpilogueData::Bias`] of a buffer.
    pub fn bias(bias: &'a impl DeviceBuffer<T>) -> Self {
        EpilogueData::Bias(bias.view())
    }
    /// [`EpilogueData::BiasGrad`] of a buffer.
    pub fn bias_grad(bias_grad: &'a mut impl DeviceBufferMut<T>) -> Self {
        EpilogueData::BiasGrad(bias_grad.view_mut())
    }
    /// [`EpilogueData::BiasAux`] of two buffers.
    pub fn bias_aux(bias: &'a impl DeviceBuffer<T>, aux: &'a mut impl DeviceBufferMut<T>) -> Self {
        EpilogueData::BiasAux {
            bias: bias.view(),
            aux: aux.view_mut(),
        }
    }
    /// [`EpilogueData::Aux`] of a buffer.
    pub fn aux(aux: &'a impl DeviceBuffer<T>) -> Self {
        EpilogueData::Aux(aux.view())
    }
    /// [`EpilogueData::AuxBiasGrad`] of two buffers.
    pub fn aux_bias_grad(
        aux: &'a impl DeviceBuffer<T>,
        bias_grad: &'a mut impl DeviceBufferMut<T>,
    ) -> Self {
        EpilogueData::AuxBiasGrad {
            aux: aux.view(),
            bias_grad: bias_grad.view_mut(),
        }
    }

    /// Device addresses of the bias and aux buffers (0 where the variant has none), with the
    /// cudarc guards that order their use on `stream`: they must live until the launch is
    /// enqueued. Inputs are taken as shared, outputs as exclusive device pointers.
    pub(super) fn device_ptrs<'s>(
        &'s mut self,
        stream: &'s CudaStream,
    ) -> (u64, u64, [Option<SyncOnDrop<'s>>; 2]) {
        match self {
            EpilogueData::None => (0, 0, [None, None]),
            EpilogueData::Bias(bias) => {
                let (p, g) = bias.device_ptr(stream);
                (p, 0, [Some(g), None])
            }
            EpilogueData::BiasGrad(db) => {
                let (p, g) = db.device_ptr_mut(stream);
                (p, 0, [Some(g), None])
            }
            EpilogueData::BiasAux { bias, aux } => {
                let (p, g) = bias.device_ptr(stream);
                let (q, h) = aux.device_ptr_mut(stream);
                (p, q, [Some(g), Some(h)])
            }
            EpilogueData::Aux(aux) => {
                let (q, h) = aux.device_ptr(stream);
                (0, q, [None, Some(h)])
            }
            EpilogueData::AuxBiasGrad { aux, bias_grad } => {
                let (p, g) = bias_grad.device_ptr_mut(stream);
                let (q, h) = aux.device_ptr(stream);
                (p, q, [Some(g), Some(h)])
            }
        }
    }

    pub(super) fn kind(&self) -> DataKind {
        match self {
            EpilogueData::None => DataKind::None,
            EpilogueData::Bias(_) => DataKind::Bias,
            EpilogueData::BiasGrad(_) => DataKind::BiasGrad,
            EpilogueData::BiasAux { .. } => DataKind::BiasAux,
            EpilogueData::Aux(_) => DataKind::Aux,
            EpilogueData::AuxBiasGrad { .. } => DataKind::AuxBiasGrad,
        }
    }
}

impl<T> fmt::Debug for EpilogueData<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind().name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epilogues_map_to_distinct_c_values_and_data() {
        let codes: std::collections::HashSet<i64> =
            Epilogue::ALL.iter().map(|e| e.code()).collect();
        assert_eq!(codes.len(), Epilogue::ALL.len());
        assert_eq!(Epilogue::BiasGrad.c_name(), "CUBLASLT_EPILOGUE_BGRADB");
        assert!(Epilogue::BiasGeluAux.uses_aux() && Epilogue::BiasGeluAux.uses_bias());
        assert!(Epilogue::DGelu.uses_aux() && !Epilogue::DGelu.uses_bias());
        assert!(!Epilogue::Gelu.uses_aux() && !Epilogue::Gelu.uses_bias());
    }
}
