//! `digits`' data: the UCI ML hand-written digits bundled as `examples/data/digits.bin` (its
//! source, CC BY 4.0 licence and format are in `examples/data/README.md`), split and
//! standardized.
//!
//! Included with `#[path = "common/digits.rs"] mod digits;` beside `common`.
use crate::common::Rng;

/// The file, compiled in so that the program runs without the repository: a 16-byte header
/// (`DIGITS8X`; the image count as u32, rows and columns as u16, little-endian), then per image
/// its 64 pixels (row-major, 0..16) and its label (0..9), a byte each.
const FILE: &[u8] = include_bytes!("../data/digits.bin");
/// Image height and width.
pub const SIDE: usize = 8;
pub const PIXELS: usize = SIDE * SIDE;
pub const CLASSES: usize = 10;

/// Images as standardized pixels (`n × 64`, row-major) and their labels.
pub struct Images {
    pub x: Vec<f32>,
    pub labels: Vec<usize>,
}

impl Images {
    /// The images in `order` (`order.len() × 64`) and their labels one-hot
    /// (`order.len() × 10`).
    pub fn gather(&self, order: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let mut onehot = vec![0.0; order.len() * CLASSES];
        for (slot, &i) in order.iter().enumerate() {
            onehot[slot * CLASSES + self.labels[i]] = 1.0;
        }
        let x = order.iter().flat_map(|&i| &self.x[i * PIXELS..(i + 1) * PIXELS]).copied();
        (x.collect(), onehot)
    }
}

/// The bundled images shuffled with `rng` and split, `(training, held out)`: the first
/// `held_out` of the shuffle held out. Pixels are standardized with the training images' mean
/// and standard deviation. An error says how the file is damaged.
pub fn load(rng: &mut Rng, held_out: usize) -> Result<(Images, Images), String> {
    let (pixels, labels) = parse(FILE)?;
    if held_out >= labels.len() {
        return Err(format!("{} images, {held_out} to hold out", labels.len()));
    }
    let mut order: Vec<usize> = (0..labels.len()).collect();
    rng.shuffle(&mut order);
    let (held, train) = order.split_at(held_out);
    let image = |i: usize| pixels[i * PIXELS..(i + 1) * PIXELS].iter().map(|&p| f64::from(p));
    let n = (train.len() * PIXELS) as f64;
    let mean = train.iter().flat_map(|&i| image(i)).sum::<f64>() / n;
    let var = train.iter().flat_map(|&i| image(i)).map(|p| (p - mean).powi(2)).sum::<f64>() / n;
    let take = |set: &[usize]| Images {
        x: set.iter().flat_map(|&i| image(i)).map(|p| ((p - mean) / var.sqrt()) as f32).collect(),
        labels: set.iter().map(|&i| labels[i]).collect(),
    };
    Ok((take(train), take(held)))
}

/// The pixels (`count × 64`) and labels of a file in [`FILE`]'s format.
fn parse(data: &[u8]) -> Result<(Vec<u8>, Vec<usize>), String> {
    if data.len() < 16 || &data[..8] != b"DIGITS8X" {
        return Err("no DIGITS8X header".into());
    }
    let count = u32::from_le_bytes([data[8], data[9], data[10], data[11]]) as usize;
    let shape =
        (u16::from_le_bytes([data[12], data[13]]), u16::from_le_bytes([data[14], data[15]]));
    let body = &data[16..];
    if shape != (SIDE as u16, SIDE as u16) || body.len() != count * (PIXELS + 1) {
        return Err(format!("{count} images of {shape:?} pixels in {} bytes", body.len()));
    }
    let records = || body.chunks_exact(PIXELS + 1);
    let pixels: Vec<u8> = records().flat_map(|r| &r[..PIXELS]).copied().collect();
    let labels: Vec<usize> = records().map(|r| usize::from(r[PIXELS])).collect();
    if pixels.iter().any(|&p| p > 16) || labels.iter().any(|&l| l >= CLASSES) {
        return Err("a pixel above 16 or a label above 9".into());
    }
    Ok((pixels, labels))
}
