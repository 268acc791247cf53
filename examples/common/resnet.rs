//! ResNet-18 and ResNet-50 (torchvision's architecture) for inference on cudnn-safe, channels-last
//! in f16 or bf16: batch norm folded into each convolution, each convolution with its bias,
//! residual add and ReLU one cuDNN graph ([`FusedConv`]), max and average pooling, and the
//! classifier as one cuBLASLt matmul with a bias epilogue.
//!
//! Weights are PyTorch's `state_dict` names and shapes (float32, convolution filters `[K, C, R,
//! S]`), read from a safetensors file (`benches/pytorch/resnet.py weights DIR` writes them) or
//! drawn at random.
#![allow(dead_code)] // each program uses a part

use std::collections::HashMap;
use std::sync::Arc;

use cudnn_safe::blas::lt::{BlasLt, Element, Epilogue as LtEpilogue, EpilogueData, Matmul};
use cudnn_safe::conv::{Epilogue, FusedConv};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{ConvParams, PlanCache, PlanFilter};
use cudnn_safe::norm::fold_batch_norm;
use cudnn_safe::{Cudnn, DataType, PoolingDesc, PoolingMode, Scalar, TensorDesc, Workspace};

/// What the network code returns: the crate's errors and the example's own.
pub type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Times `calls` back-to-back calls of a function: milliseconds per call.
pub type BatchMs<'a> =
    dyn Fn(usize, &mut dyn FnMut() -> cudnn_safe::Result<()>) -> cudnn_safe::Result<f64> + 'a;

/// Which ResNet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    ResNet18,
    ResNet50,
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "resnet18" => Some(Arch::ResNet18),
            "resnet50" => Some(Arch::ResNet50),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::ResNet18 => "resnet18",
            Arch::ResNet50 => "resnet50",
        }
    }
    fn depths(self) -> [usize; 4] {
        match self {
            Arch::ResNet18 => [2, 2, 2, 2],
            Arch::ResNet50 => [3, 4, 6, 3],
        }
    }
    fn bottleneck(self) -> bool {
        self == Arch::ResNet50
    }
    /// Channels entering the classifier.
    pub fn features(self) -> i64 {
        if self.bottleneck() {
            2048
        } else {
            512
        }
    }
}

/// One convolution of the network: its PyTorch names and geometry.
#[derive(Debug, Clone)]
pub struct ConvSpec {
    /// `layer1.0.conv1`-style name of the weight (without `.weight`).
    pub conv: String,
    /// The batch norm after it (`layer1.0.bn1`).
    pub bn: String,
    pub cin: i64,
    pub cout: i64,
    pub kernel: i64,
    pub stride: i64,
}

/// The convolutions of one residual block: the main path, then the downsample (if any).
pub struct BlockSpec {
    pub main: Vec<ConvSpec>,
    pub down: Option<ConvSpec>,
}

fn spec(conv: String, bn: String, cin: i64, cout: i64, kernel: i64, stride: i64) -> ConvSpec {
    ConvSpec { conv, bn, cin, cout, kernel, stride }
}

/// The stem and the blocks of `arch`, in order, with torchvision's names (stride on the 3×3
/// convolution of a bottleneck, "ResNet v1.5").
pub fn blocks(arch: Arch) -> (ConvSpec, Vec<BlockSpec>) {
    let stem = spec("conv1".into(), "bn1".into(), 3, 64, 7, 2);
    let expansion = if arch.bottleneck() { 4 } else { 1 };
    let mut cin = 64;
    let mut out = Vec::new();
    for (stage, &depth) in arch.depths().iter().enumerate() {
        let width = 64 << stage;
        for i in 0..depth {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            let p = format!("layer{}.{i}", stage + 1);
            let c = |k: usize| (format!("{p}.conv{k}"), format!("{p}.bn{k}"));
            let main = if arch.bottleneck() {
                let ((c1, b1), (c2, b2), (c3, b3)) = (c(1), c(2), c(3));
                vec![
                    spec(c1, b1, cin, width, 1, 1),
                    spec(c2, b2, width, width, 3, stride),
                    spec(c3, b3, width, width * expansion, 1, 1),
                ]
            } else {
                let ((c1, b1), (c2, b2)) = (c(1), c(2));
                vec![spec(c1, b1, cin, width, 3, stride), spec(c2, b2, width, width, 3, 1)]
            };
            let cout = width * expansion;
            let down = (stride != 1 || cin != cout).then(|| {
                spec(format!("{p}.downsample.0"), format!("{p}.downsample.1"), cin, cout, 1, stride)
            });
            out.push(BlockSpec { main, down });
            cin = cout;
        }
    }
    (stem, out)
}

/// Named float32 tensors: `(shape, values)`.
pub struct Tensors(HashMap<String, (Vec<usize>, Vec<f32>)>);

impl Tensors {
    /// Every float32 tensor of a safetensors file.
    pub fn read(path: &std::path::Path) -> Res<Tensors> {
        use safetensors::{Dtype, SafeTensors};
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let st = SafeTensors::deserialize(&bytes)?;
        let mut map = HashMap::new();
        for (name, view) in st.tensors() {
            if view.dtype() != Dtype::F32 {
                return Err(format!("{name}: {:?}, expected F32", view.dtype()).into());
            }
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            map.insert(name, (view.shape().to_vec(), values));
        }
        Ok(Tensors(map))
    }

    /// Random weights of `arch` under PyTorch's names: He-scaled filters, batch norms with
    /// statistics near (0, 1), the last batch norm of each block scaled down (so that the
    /// residual sum stays of unit scale), a small classifier.
    ///
    /// `unit` draws the values: uniform in `[-1, 1)`.
    pub fn random(arch: Arch, unit: &mut dyn FnMut() -> f64) -> Tensors {
        let mut map = HashMap::new();
        let mut uniform = |n: usize, lo: f64, hi: f64| -> Vec<f32> {
            (0..n).map(|_| (lo + (hi - lo) * (unit() + 1.0) / 2.0) as f32).collect()
        };
        let (stem, blocks) = blocks(arch);
        let last_of_block: Vec<String> = blocks
            .iter()
            .map(|b| b.main.last().map(|c| c.bn.clone()).unwrap_or_default())
            .collect();
        let convs = std::iter::once(stem)
            .chain(blocks.into_iter().flat_map(|b| b.main.into_iter().chain(b.down)));
        for c in convs {
            let fan_in = (c.cin * c.kernel * c.kernel) as usize;
            let amp = (6.0 / fan_in as f64).sqrt();
            let shape = vec![c.cout as usize, c.cin as usize, c.kernel as usize, c.kernel as usize];
            map.insert(
                format!("{}.weight", c.conv),
                (shape, uniform(fan_in * c.cout as usize, -amp, amp)),
            );
            let k = c.cout as usize;
            let gain = if last_of_block.contains(&c.bn) { 0.3 } else { 1.0 };
            for (field, lo, hi) in [
                ("weight", 0.8 * gain, 1.2 * gain),
                ("bias", -0.1, 0.1),
                ("running_mean", -0.2, 0.2),
                ("running_var", 0.8, 1.2),
            ] {
                map.insert(format!("{}.{field}", c.bn), (vec![k], uniform(k, lo, hi)));
            }
        }
        let f = arch.features() as usize;
        let amp = (1.0 / f as f64).sqrt();
        map.insert("fc.weight".into(), (vec![1000, f], uniform(1000 * f, -amp, amp)));
        map.insert("fc.bias".into(), (vec![1000], uniform(1000, -amp, amp)));
        Tensors(map)
    }

    pub fn get(&self, name: &str) -> Res<&(Vec<usize>, Vec<f32>)> {
        self.0.get(name).ok_or_else(|| format!("no tensor `{name}` in the weights").into())
    }

    /// The convolution `c`'s filters with its batch norm folded in, as `[K, R, S, Cp]`
    /// (channels-last, input channels zero-padded to `cp`), and the bias.
    fn folded(&self, c: &ConvSpec, cp: i64) -> Res<(Vec<f32>, Vec<f32>)> {
        let (shape, w) = self.get(&format!("{}.weight", c.conv))?;
        let want = [c.cout, c.cin, c.kernel, c.kernel].map(|d| d as usize);
        if shape[..] != want {
            return Err(format!("{}.weight has shape {shape:?}, expected {want:?}", c.conv).into());
        }
        let bn = |f: &str| self.get(&format!("{}.{f}", c.bn)).map(|t| &t.1[..]);
        let (w, b) = fold_batch_norm(
            w,
            None,
            bn("weight")?,
            bn("bias")?,
            bn("running_mean")?,
            bn("running_var")?,
            1e-5,
        )?;
        let (k, cin, rs, cp) =
            (c.cout as usize, c.cin as usize, (c.kernel * c.kernel) as usize, cp as usize);
        let mut krsc = vec![0.0; k * rs * cp];
        for o in 0..k {
            for i in 0..cin {
                for p in 0..rs {
                    krsc[(o * rs + p) * cp + i] = w[(o * cin + i) * rs + p];
                }
            }
        }
        Ok((krsc, b))
    }
}

/// Converts and uploads.
pub fn upload<T: DataType>(stream: &Arc<CudaStream>, v: &[f32]) -> Res<CudaSlice<T>> {
    let v: Vec<T> = v.iter().map(|&x| T::from_f64(f64::from(x))).collect();
    Ok(stream.clone_htod(&v)?)
}

/// One fused convolution with its weights on the device.
struct Layer<T: DataType> {
    name: String,
    conv: FusedConv,
    w: CudaSlice<T>,
    b: CudaSlice<T>,
}

/// A residual block: the main path's layers, then the downsample of the skip connection.
type Block<T> = (Vec<Layer<T>>, Option<Layer<T>>);

/// Activations of one batch: two block buffers used in turn, three scratch buffers, the pooled
/// features. Every buffer is as large as the largest activation that goes in it.
pub struct Scratch<T> {
    io: [CudaSlice<T>; 2],
    t1: CudaSlice<T>,
    t2: CudaSlice<T>,
    res: CudaSlice<T>,
    pooled: CudaSlice<T>,
}

/// Device memory and host-side objects a forward pass uses besides the network.
pub struct Context<'a> {
    pub cudnn: &'a Cudnn,
    pub lt: &'a mut BlasLt,
    pub plans: &'a mut PlanCache,
    pub ws: &'a mut Workspace,
}

/// A ResNet for one batch size and element type.
pub struct ResNet<T: DataType> {
    pub arch: Arch,
    pub batch: i64,
    /// Input channels as stored (3, or zero-padded for engines that need more).
    pub in_channels: i64,
    stem: Layer<T>,
    maxpool: (PoolingDesc, TensorDesc<T>, TensorDesc<T>),
    blocks: Vec<Block<T>>,
    avgpool: (PoolingDesc, TensorDesc<T>, TensorDesc<T>),
    fc: (Matmul, CudaSlice<T>, CudaSlice<T>),
    largest: usize,
}

impl<T: Element> ResNet<T> {
    /// The network for `batch` images of 224×224 with `in_channels` stored input channels, its
    /// plans chosen among `max_plans` candidates per graph at the first forward.
    pub fn new(
        cudnn: &Cudnn,
        arch: Arch,
        batch: i64,
        in_channels: i64,
        max_plans: usize,
        weights: &Tensors,
    ) -> Res<Self> {
        let stream = cudnn.stream();
        let filter = PlanFilter::default().with_max_plans(Some(max_plans));
        let mut largest = 0usize;
        let mut layer = |c: &ConvSpec, x: [i64; 4], cp: i64, epi: Epilogue| -> Res<Layer<T>> {
            let pad = c.kernel / 2;
            let params =
                ConvParams::new(2).with_padding(&[pad, pad]).with_strides(&[c.stride, c.stride]);
            let conv =
                FusedConv::new(cudnn, T::DTYPE, x, [c.cout, cp, c.kernel, c.kernel], &params, epi)?
                    .with_filter(filter.clone());
            largest = largest.max(conv.y_span()).max(conv.x_span());
            let (w, b) = weights.folded(c, cp)?;
            Ok(Layer { name: c.conv.clone(), w: upload(stream, &w)?, b: upload(stream, &b)?, conv })
        };
        let relu = Epilogue { residual: false, relu: true };
        let (stem_spec, specs) = blocks(arch);
        let stem = layer(&stem_spec, [batch, in_channels, 224, 224], in_channels, relu)?;
        let s = stem.conv.y_dims().to_vec();
        let mp = PoolingDesc::builder(PoolingMode::Max, &[3, 3])
            .pads(&[1, 1])
            .strides(&[2, 2])
            .build()?;
        let mp_in = TensorDesc::<T>::nhwc(s[0], s[1], s[2], s[3])?;
        let side = (s[2] + 2 - 3) / 2 + 1;
        let mp_out = TensorDesc::<T>::nhwc(batch, s[1], side, side)?;
        let mut dims = [batch, s[1], side, side];
        let mut net_blocks = Vec::new();
        for b in &specs {
            let mut x = dims;
            let mut main = Vec::new();
            for (i, c) in b.main.iter().enumerate() {
                let last = i + 1 == b.main.len();
                let epi = Epilogue { residual: last, relu: true };
                let l = layer(c, x, c.cin, epi)?;
                x = l.conv.y_dims().try_into()?;
                main.push(l);
            }
            let down = match &b.down {
                Some(c) => Some(layer(c, dims, c.cin, Epilogue::default())?),
                None => None,
            };
            net_blocks.push((main, down));
            dims = x;
        }
        let f = arch.features();
        let ap =
            PoolingDesc::builder(PoolingMode::AvgIncludePadding, &[dims[2], dims[3]]).build()?;
        let ap_in = TensorDesc::<T>::nhwc(batch, f, dims[2], dims[3])?;
        let ap_out = TensorDesc::<T>::nhwc(batch, f, 1, 1)?;
        let op = Matmul::linear(batch, f, 1000)?.with_epilogue(LtEpilogue::Bias);
        let fc = (
            op,
            upload(stream, &weights.get("fc.weight")?.1)?,
            upload(stream, &weights.get("fc.bias")?.1)?,
        );
        Ok(ResNet {
            arch,
            batch,
            in_channels,
            stem,
            maxpool: (mp, mp_in, mp_out),
            blocks: net_blocks,
            avgpool: (ap, ap_in, ap_out),
            fc,
            largest,
        })
    }

    /// Elements of the input (`[N, H, W, C]`) and of the logits (`[N, 1000]`).
    pub fn input_len(&self) -> usize {
        self.stem.conv.x_span()
    }
    pub fn logits_len(&self) -> usize {
        self.batch as usize * 1000
    }

    /// Scratch activations for this network.
    pub fn scratch(&self, stream: &Arc<CudaStream>) -> Res<Scratch<T>> {
        let a = || stream.alloc_zeros::<T>(self.largest);
        let pooled = stream.alloc_zeros::<T>((self.batch * self.arch.features()) as usize)?;
        Ok(Scratch { io: [a()?, a()?], t1: a()?, t2: a()?, res: a()?, pooled })
    }

    /// `logits = fc(avgpool(blocks(maxpool(stem(x)))))`.
    pub fn forward(
        &self,
        cx: &mut Context<'_>,
        x: &CudaSlice<T>,
        s: &mut Scratch<T>,
        logits: &mut CudaSlice<T>,
    ) -> cudnn_safe::Result<()> {
        let one = T::Scalar::from_f64(1.0);
        let zero = T::Scalar::from_f64(0.0);
        let (c, plans, ws) = (cx.cudnn, &mut *cx.plans, &mut *cx.ws);
        let st = &self.stem;
        st.conv.run(c, plans, x, &st.w, &st.b, None, &mut s.t1, ws)?;
        let (mp, mi, mo) = &self.maxpool;
        c.pooling_forward(mp, one, mi, &s.t1, zero, mo, &mut s.io[0])?;
        let mut cur = 0;
        for (main, down) in &self.blocks {
            let (first, second) = s.io.split_at_mut(1);
            let (input, output) =
                if cur == 0 { (&first[0], &mut second[0]) } else { (&second[0], &mut first[0]) };
            let skip = match down {
                Some(d) => {
                    d.conv.run(c, plans, input, &d.w, &d.b, None, &mut s.res, ws)?;
                    &s.res
                }
                None => input,
            };
            let n = main.len();
            main[0].conv.run(c, plans, input, &main[0].w, &main[0].b, None, &mut s.t1, ws)?;
            if n == 3 {
                main[1].conv.run(c, plans, &s.t1, &main[1].w, &main[1].b, None, &mut s.t2, ws)?;
            }
            let (l, last_in) = if n == 3 { (&main[2], &s.t2) } else { (&main[1], &s.t1) };
            l.conv.run(c, plans, last_in, &l.w, &l.b, Some(skip.as_view()), output, ws)?;
            cur = 1 - cur;
        }
        let (ap, ai, ao) = &self.avgpool;
        c.pooling_forward(ap, one, ai, &s.io[cur], zero, ao, &mut s.pooled)?;
        let (op, w, b) = &self.fc;
        cx.lt.matmul(op, 1.0, &s.pooled, w, 0.0, logits, EpilogueData::bias(b))?;
        Ok(())
    }
}

impl<T: Element> ResNet<T> {
    /// Each convolution layer run alone (median of 5 batches of 20 runs on the forward's scratch
    /// buffers, its plan chosen already), slowest first: name, output dims, milliseconds.
    ///
    /// `batch_ms(calls, f)` times `calls` back-to-back calls of `f`: milliseconds per call.
    pub fn profile(
        &self,
        cx: &mut Context<'_>,
        s: &mut Scratch<T>,
        batch_ms: &BatchMs<'_>,
    ) -> Res<Vec<(String, Vec<i64>, f64)>> {
        let mut rows = Vec::new();
        let layers = std::iter::once(&self.stem)
            .chain(self.blocks.iter().flat_map(|(main, down)| main.iter().chain(down)));
        for l in layers {
            let (c, plans, ws) = (cx.cudnn, &mut *cx.plans, &mut *cx.ws);
            let (x, y, r) = (&s.io[0], &mut s.t1, &s.res);
            let residual = l.conv.epilogue().residual;
            let mut run =
                || l.conv.run(c, plans, x, &l.w, &l.b, residual.then(|| r.as_view()), &mut *y, ws);
            batch_ms(3, &mut run)?;
            let mut t =
                (0..5).map(|_| batch_ms(20, &mut run)).collect::<cudnn_safe::Result<Vec<f64>>>()?;
            t.sort_by(f64::total_cmp);
            rows.push((l.name.clone(), l.conv.y_dims().to_vec(), t[2]));
        }
        rows.sort_by(|a, b| b.2.total_cmp(&a.2));
        Ok(rows)
    }
}

/// `[N, 3, 224, 224]` float32 images (NCHW) as the network's input: channels-last, channels
/// zero-padded to `cp`, converted to `T`.
pub fn to_input<T: DataType>(nchw: &[f32], n: usize, cp: usize) -> Vec<T> {
    let hw = 224 * 224;
    let mut out = vec![T::from_f64(0.0); n * hw * cp];
    for i in 0..n {
        for c in 0..3 {
            for p in 0..hw {
                out[(i * hw + p) * cp + c] = T::from_f64(f64::from(nchw[(i * 3 + c) * hw + p]));
            }
        }
    }
    out
}
