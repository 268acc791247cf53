//! Sequence data: the RNN data descriptor, its lengths, and their device copy.
use std::cell::{RefCell, RefMut};
use std::ffi::c_void;
use std::fmt;

use cudarc::driver::CudaSlice;
use cudnn_safe_sys as sys;

use super::{ffi, int_arg};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;

/// How a batch of sequences is laid out in memory (`cudnnRNNDataLayout_t`).
///
/// With `T` steps at most, `B` sequences and `V` values per step:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeqLayout {
    /// Padded, `[T, B, V]`: step `t` of sequence `b` at `(t·B + b)·V`
    /// (`CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED`; PyTorch's default `batch_first=False`).
    SeqMajor,
    /// Padded, `[B, T, V]`: step `t` of sequence `b` at `(b·T + t)·V`
    /// (`CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED`; PyTorch's `batch_first=True`).
    BatchMajor,
    /// Packed, sequence-major without padding: the sequences sorted by decreasing length, step
    /// `t` of every sequence longer than `t` stored one after the other
    /// (`CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED`; PyTorch's `PackedSequence`).
    Packed,
}

impl SeqLayout {
    fn raw(self) -> sys::cudnnRNNDataLayout_t {
        match self {
            SeqLayout::SeqMajor => {
                sys::cudnnRNNDataLayout_t::CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
            }
            SeqLayout::BatchMajor => {
                sys::cudnnRNNDataLayout_t::CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
            }
            SeqLayout::Packed => sys::cudnnRNNDataLayout_t::CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED,
        }
    }
    /// Whether the layout has padding (every sequence takes `max_len` steps of storage).
    pub fn is_padded(self) -> bool {
        self != SeqLayout::Packed
    }
}

/// A batch of sequences of `V`-element vectors (`cudnnRNNDataDescriptor_t`) of type `T`, with
/// the length of each sequence.
///
/// Lengths are in `1..=max_len`; for [`SeqLayout::Packed`] they must not increase and the first
/// must equal `max_len` (cuDNN's rules, checked here). When the descriptor describes an output
/// in a padded layout, cuDNN writes `fill` into every padding position (steps `t ≥ length`).
///
/// The launches need the lengths in device memory too: the descriptor uploads them on the
/// launching handle's stream the first time (and again if a handle of another CUDA context
/// uses it) and keeps the copy. `Send`, not `Sync`.
///
/// ```no_run
/// # fn main() -> cudnn_safe::Result<()> {
/// use cudnn_safe::rnn::{SeqDataDesc, SeqLayout};
/// // Sequences of 4, 2 and 1 steps of 8 values, packed: 7 vectors in all.
/// let x = SeqDataDesc::<f32>::new(SeqLayout::Packed, 4, 8, &[4, 2, 1], 0.0)?;
/// assert_eq!(x.span(), 7 * 8);
/// assert_eq!(x.offset(1, 1, 0), Some((3 + 1) * 8)); // step 1 of sequence 1
/// # Ok(()) }
/// ```
pub struct SeqDataDesc<T: DataType> {
    raw: ffi::OwnedRnnData,
    layout: SeqLayout,
    max_len: usize,
    vector: usize,
    lengths: Vec<i32>,
    fill: T,
    span: usize,
    /// In the packed layout, the sum of the lengths from each sequence on (`batch + 1`
    /// entries); empty otherwise.
    packed_tails: Vec<usize>,
    /// The lengths in device memory, one copy per stream served, none freed while the
    /// descriptor lives (a CUDA graph captured on one stream keeps reading its copy).
    dev_lengths: RefCell<Vec<CudaSlice<i32>>>,
}

impl<T: DataType> fmt::Debug for SeqDataDesc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeqDataDesc")
            .field("dtype", &T::DTYPE)
            .field("layout", &self.layout)
            .field("max_len", &self.max_len)
            .field("vector_size", &self.vector)
            .field("lengths", &self.lengths)
            .field("fill", &self.fill)
            .finish()
    }
}

impl<T: DataType> SeqDataDesc<T> {
    /// A batch of `lengths.len()` sequences of `vector_size` values per step, at most `max_len`
    /// steps, in `layout`; `fill` is written into the padding of outputs.
    ///
    /// Sizes are dimensions, `i64` as in [`TensorDesc`](crate::TensorDesc); cuDNN takes them as
    /// 32-bit `int`s, so a size below 1 is an [`Error::InvalidArgument`] and one above
    /// `i32::MAX` an [`Error::Overflow`], each naming the argument.
    #[doc(alias = "cudnnCreateRNNDataDescriptor")]
    #[doc(alias = "cudnnSetRNNDataDescriptor")]
    pub fn new(
        layout: SeqLayout,
        max_len: i64,
        vector_size: i64,
        lengths: &[i64],
        fill: T,
    ) -> Result<Self> {
        let c_max = int_arg("RNN maximum sequence length", max_len)?;
        let c_batch = int_arg(
            "RNN batch size",
            lengths.len().try_into().unwrap_or(i64::MAX),
        )?;
        let c_vector = int_arg("RNN vector size", vector_size)?;
        for (b, &len) in lengths.iter().enumerate() {
            if len < 1 || len > max_len {
                return Err(Error::invalid(
                    "sequence length",
                    format!("1..={max_len} (the maximum length)"),
                    format!("length {len} for sequence {b}"),
                ));
            }
        }
        // Each in `1..=i32::MAX` from here on (checked above).
        let c_lengths: Vec<i32> = lengths.iter().map(|&l| l as i32).collect();
        let lengths: Vec<usize> = lengths.iter().map(|&l| l as usize).collect();
        let (max_len, vector_size) = (c_max as usize, c_vector as usize);
        // Everything below is sized by `lengths` (the caller's own slice), never by `max_len`:
        // the sizes are checked against cuDNN's `int` before anything is allocated.
        let steps_stored: usize = if layout == SeqLayout::Packed {
            if let Some(b) = lengths.windows(2).position(|w| w[1] > w[0]) {
                return Err(Error::invalid(
                    "packed sequence lengths",
                    "lengths sorted from longest to shortest",
                    format!(
                        "{} then {} at sequence {}",
                        lengths[b],
                        lengths[b + 1],
                        b + 1
                    ),
                ));
            }
            if lengths[0] != max_len {
                return Err(Error::invalid(
                    "packed sequence lengths",
                    format!("the longest sequence as long as the maximum length {max_len}"),
                    format!("longest {}", lengths[0]),
                ));
            }
            lengths
                .iter()
                .try_fold(0usize, |acc, &l| acc.checked_add(l))
                .ok_or_else(|| Error::Overflow {
                    what: "RNN data size",
                    detail: format!("the sum of {} sequence lengths", lengths.len()),
                })?
        } else {
            max_len
                .checked_mul(lengths.len())
                .ok_or_else(|| Error::Overflow {
                    what: "RNN data size",
                    detail: format!("{max_len} steps × {} sequences", lengths.len()),
                })?
        };
        let span = steps_stored
            .checked_mul(vector_size)
            .filter(|&s| s <= i32::MAX as usize)
            .ok_or_else(|| Error::Overflow {
                what: "RNN data size",
                detail: format!(
                    "{steps_stored} vectors of {vector_size} values exceed cuDNN's 32-bit \
                     addressing"
                ),
            })?;
        // Packed: the vectors stored before step `t` are `Σ_b min(length_b, t)`, which with the
        // lengths sorted is `k·t + Σ_{b ≥ k} length_b` for the `k` sequences longer than `t`.
        let packed_tails = if layout == SeqLayout::Packed {
            let mut tails = vec![0usize; lengths.len() + 1];
            for b in (0..lengths.len()).rev() {
                tails[b] = tails[b + 1] + lengths[b];
            }
            tails
        } else {
            Vec::new()
        };
        let lib = raw::lib()?;
        let desc = ffi::OwnedRnnData::new(lib)?;
        let mut fill_value = fill;
        // SAFETY: live descriptor; `c_lengths` holds `batch` lengths, each in 1..=max (checked,
        // and sorted for the packed layout); the padding value is a `T` on our stack, of the
        // descriptor's data type, which cuDNN copies during the call (it reads `sizeof(T)`
        // bytes: 2 for f16/bf16, 4 for f32, 8 for f64, as `cudnnGetRNNDataDescriptor` shows).
        unsafe {
            ffi::cudnnSetRNNDataDescriptor(
                lib,
                desc.as_ptr(),
                T::DTYPE.raw(),
                layout.raw(),
                c_max,
                c_batch,
                c_vector,
                c_lengths.as_ptr(),
                (&mut fill_value as *mut T).cast::<c_void>(),
            )
        }?;
        Ok(SeqDataDesc {
            raw: desc,
            layout,
            max_len,
            vector: vector_size,
            lengths: c_lengths,
            fill,
            span,
            packed_tails,
            dev_lengths: RefCell::new(Vec::new()),
        })
    }

    /// `batch` sequences of `seq_len` steps each (no padding), padding value zero.
    pub fn uniform(layout: SeqLayout, seq_len: i64, batch: i64, vector_size: i64) -> Result<Self> {
        // Checked before the lengths are allocated from `batch`: at most one length per vector
        // of a layout cuDNN can address.
        let n = int_arg("RNN batch size", batch)? as usize;
        let c_len = int_arg("RNN maximum sequence length", seq_len)?;
        let c_vector = int_arg("RNN vector size", vector_size)?;
        (c_len as usize)
            .checked_mul(n)
            .and_then(|s| s.checked_mul(c_vector as usize))
            .filter(|&s| s <= i32::MAX as usize)
            .ok_or_else(|| Error::Overflow {
                what: "RNN data size",
                detail: format!(
                    "{batch} sequences of {seq_len} vectors of {vector_size} values exceed \
                     cuDNN's 32-bit addressing"
                ),
            })?;
        Self::new(
            layout,
            seq_len,
            vector_size,
            &vec![seq_len; n],
            T::default(),
        )
    }

    /// The memory layout.
    pub fn layout(&self) -> SeqLayout {
        self.layout
    }
    /// Maximum sequence length (steps of storage per sequence in padded layouts).
    pub fn max_len(&self) -> i64 {
        self.max_len as i64
    }
    /// Number of sequences.
    pub fn batch(&self) -> i64 {
        self.lengths.len() as i64
    }
    /// Values per step.
    pub fn vector_size(&self) -> i64 {
        self.vector as i64
    }
    /// Length of each sequence.
    pub fn lengths(&self) -> impl ExactSizeIterator<Item = i64> + '_ {
        self.lengths.iter().map(|&l| i64::from(l))
    }
    /// Length of sequence `b`; `None` outside `0..batch`.
    pub fn length(&self, b: i64) -> Option<i64> {
        self.len_of(usize::try_from(b).ok()?).map(|l| l as i64)
    }
    fn len_of(&self, b: usize) -> Option<usize> {
        self.lengths.get(b).map(|&l| l as usize)
    }
    /// The value cuDNN writes into the padding of outputs.
    pub fn fill(&self) -> T {
        self.fill
    }
    /// Elements a buffer must hold: `max_len · batch · vector_size` padded, `Σ lengths ·
    /// vector_size` packed.
    pub fn span(&self) -> usize {
        self.span
    }
    /// Where value `v` of step `t` of sequence `b` is stored, in elements; `None` outside the
    /// shape or, in the packed layout, for a step past the sequence's length (not stored).
    /// Padded layouts return the padding position for such steps.
    pub fn offset(&self, t: i64, b: i64, v: i64) -> Option<usize> {
        let (t, b, v) = (index(t)?, index(b)?, index(v)?);
        let batch = self.lengths.len();
        if t >= self.max_len || b >= batch || v >= self.vector {
            return None;
        }
        let slot = match self.layout {
            SeqLayout::SeqMajor => t * batch + b,
            SeqLayout::BatchMajor => b * self.max_len + t,
            SeqLayout::Packed => {
                if t >= self.len_of(b)? {
                    return None;
                }
                // Sorted lengths: the sequences still running at step t are 0..k, b among them.
                let k = self.lengths.partition_point(|&l| l as usize > t);
                k * t + self.packed_tails[k] + b
            }
        };
        Some(slot * self.vector + v)
    }
    /// Whether step `t` of sequence `b` lies past its length (padding, or not stored); `None`
    /// for `b` outside `0..batch`.
    pub fn is_padding(&self, t: i64, b: i64) -> Option<bool> {
        Some(t >= self.length(b)?)
    }

    /// The raw descriptor (still owned by `self`).
    pub fn as_raw(&self) -> sys::cudnnRNNDataDescriptor_t {
        self.raw.as_ptr()
    }
    /// Process-unique id of this descriptor.
    pub(crate) fn id(&self) -> u64 {
        self.raw.id()
    }
    pub(crate) fn raw_lengths(&self) -> &[i32] {
        &self.lengths
    }

    /// The lengths in device memory on `cudnn`'s stream, uploaded there at its first use. Per
    /// stream (not just per context): a copy is only ever used on the stream that uploaded it,
    /// and freed there (when the descriptor drops) after those uses. Streams compare with their
    /// context: the raw handle alone is no identity (every context's default stream is null).
    pub(crate) fn device_lengths(&self, cudnn: &Cudnn) -> Result<RefMut<'_, CudaSlice<i32>>> {
        let mut slot = self.dev_lengths.borrow_mut();
        let stream = cudnn.stream().as_ref();
        let at = match slot.iter().position(|d| d.stream().as_ref() == stream) {
            Some(at) => at,
            None => {
                let d = cudnn
                    .stream()
                    .clone_htod(&self.lengths)
                    .map_err(|e| Error::driver("uploading the sequence lengths", e))?;
                slot.push(d);
                slot.len() - 1
            }
        };
        Ok(RefMut::map(slot, |s| &mut s[at]))
    }
}

/// A position along a dimension as an index; `None` for a negative one.
fn index(i: i64) -> Option<usize> {
    usize::try_from(i).ok()
}
