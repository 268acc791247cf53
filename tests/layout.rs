//! CPU-only property tests of the layout arithmetic against brute-force address enumeration.
use std::collections::HashSet;

use cudnn_safe::{Error, Layout, TensorBuilder, TensorFormat};
use proptest::prelude::*;

/// Brute force: offsets of every element by nested enumeration (independent of `Layout`).
fn brute_offsets(dims: &[i64], strides: &[i64]) -> Vec<i64> {
    let mut out = vec![0i64];
    for (&d, &s) in dims.iter().zip(strides) {
        out = out
            .iter()
            .flat_map(|&base| (0..d).map(move |i| base + i * s))
            .collect();
    }
    out
}

fn injective(offsets: &[i64]) -> bool {
    offsets.iter().collect::<HashSet<_>>().len() == offsets.len()
}

/// dims, a memory order (permutation) and per-axis padding → a permuted, padded layout.
fn permuted_padded() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
    (1usize..=5)
        .prop_flat_map(|rank| {
            (
                prop::collection::vec(1i64..=5, rank),
                Just((0..rank).collect::<Vec<usize>>()).prop_shuffle(),
                prop::collection::vec(0i64..=3, rank),
            )
        })
        .prop_map(|(dims, order, pad)| {
            let mut strides = vec![0i64; dims.len()];
            let mut acc = 1i64;
            for &axis in order.iter().rev() {
                strides[axis] = acc;
                acc *= dims[axis] + pad[axis];
            }
            (dims, strides)
        })
}

proptest! {
    #[test]
    fn span_and_count_match_enumeration(dims in prop::collection::vec(1i64..=5, 1..=5),
                                         seed in prop::collection::vec(1i64..=30, 5)) {
        let strides: Vec<i64> = seed[..dims.len()].to_vec();
        let l = Layout::strided(&dims, &strides).unwrap();
        let offs = brute_offsets(&dims, &strides);
        prop_assert_eq!(l.element_count(), offs.len());
        prop_assert_eq!(l.span() as i64, offs.iter().max().unwrap() + 1);
        prop_assert_eq!(l.offsets(), offs.clone());
        // Soundness of the output check: accepted ⇒ no element addressed twice.
        if l.is_non_overlapping() {
            prop_assert!(injective(&offs), "accepted an overlapping layout {l}");
        }
    }

    #[test]
    fn permuted_padded_layouts_are_accepted((dims, strides) in permuted_padded()) {
        let l = Layout::strided(&dims, &strides).unwrap();
        let offs = brute_offsets(&dims, &strides);
        prop_assert!(injective(&offs));
        prop_assert!(l.is_non_overlapping(), "rejected a valid layout {l}");
        prop_assert!(l.check_output("y").is_ok());
        prop_assert_eq!(l.span() as i64, offs.iter().max().unwrap() + 1);
    }

    #[test]
    fn packed_formats_match_their_definition(n in 1i64..4, c in 1i64..6, h in 1i64..5, w in 1i64..5) {
        let nchw = Layout::nchw(n, c, h, w).unwrap();
        let nhwc = Layout::nhwc(n, c, h, w).unwrap();
        for ni in 0..n { for ci in 0..c { for hi in 0..h { for wi in 0..w {
            let idx = [ni, ci, hi, wi];
            prop_assert_eq!(nchw.offset_of(&idx), Some(((ni * c + ci) * h + hi) * w + wi));
            prop_assert_eq!(nhwc.offset_of(&idx), Some(((ni * h + hi) * w + wi) * c + ci));
        }}}}
        for l in [&nchw, &nhwc] {
            prop_assert!(l.is_packed());
            prop_assert_eq!(l.span(), (n * c * h * w) as usize);
            let mut offs = l.offsets();
            offs.sort_unstable();
            prop_assert_eq!(offs, (0..n * c * h * w).collect::<Vec<_>>());
        }
    }

    #[test]
    fn five_d_formats(n in 1i64..3, c in 1i64..4, d in 1i64..4, h in 1i64..4, w in 1i64..4) {
        let ndhwc = Layout::ndhwc(n, c, d, h, w).unwrap();
        let ncdhw = Layout::ncdhw(n, c, d, h, w).unwrap();
        prop_assert_eq!(ndhwc.offset_of(&[0, 1 % c, 0, 0, 0]), Some(1 % c));
        prop_assert_eq!(ncdhw.offset_of(&[0, 0, 0, 0, 1 % w]), Some(1 % w));
        for l in [ndhwc, ncdhw] {
            let offs = l.offsets();
            prop_assert!(injective(&offs));
            prop_assert_eq!(l.span(), offs.len());
        }
    }

    #[test]
    fn vect_c_addresses_every_byte_once(n in 1i64..3, cv in 1i64..4, h in 1i64..4, w in 1i64..4,
                                        wide in any::<bool>()) {
        let width: u8 = if wide { 32 } else { 4 };
        let c = cv * i64::from(width);
        let l = Layout::nchw_vect_c(n, c, h, w, width).unwrap();
        let mut offs = l.offsets();
        // Brute force from the definition: memory order N, C/v, H, W, v.
        let v = i64::from(width);
        let def = |ni: i64, ci: i64, hi: i64, wi: i64| (((ni * (c / v) + ci / v) * h + hi) * w + wi) * v + ci % v;
        let last = def(n - 1, c - 1, h - 1, w - 1);
        prop_assert_eq!(l.offset_of(&[n - 1, c - 1, h - 1, w - 1]), Some(last));
        prop_assert_eq!(l.offset_of(&[0, v - 1, 0, 1 % w]), Some(def(0, v - 1, 0, 1 % w)));
        // An index shorter than the rank, or outside a dimension, has no offset.
        prop_assert_eq!(l.offset_of(&[0, 0]), None);
        prop_assert_eq!(l.offset_of(&[n, 0, 0, 0]), None);
        prop_assert_eq!(l.offset_of(&[0, c, 0, 0]), None);
        prop_assert_eq!(l.offset_of(&[0, 0, -1, 0]), None);
        prop_assert_eq!(l.offset_of(&[0, 0, 0, 0, 0]), None);
        offs.sort_unstable();
        prop_assert_eq!(offs, (0..n * c * h * w).collect::<Vec<_>>());
        prop_assert_eq!(l.span(), (n * c * h * w) as usize);
    }
}

#[test]
fn zero_negative_and_too_many_dims_are_rejected() {
    for dims in [vec![2, 0, 3, 3], vec![2, -1, 3, 3], vec![], vec![1; 9]] {
        assert!(
            matches!(Layout::nchw_nd(&dims), Err(Error::InvalidArgument { .. })),
            "{dims:?}"
        );
    }
    for strides in [[12, 4, 0, 1], [12, 4, -2, 1]] {
        assert!(matches!(
            Layout::strided(&[2, 3, 2, 2], &strides),
            Err(Error::InvalidArgument { .. })
        ));
    }
    assert!(matches!(
        Layout::strided(&[2, 3], &[3]),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn int_limits_and_overflow_are_rejected() {
    // A dimension beyond c_int.
    assert!(matches!(
        Layout::nchw_nd(&[1, 1 << 31, 1, 1]),
        Err(Error::Overflow { .. })
    ));
    // Each dimension fits, the element count does not fit c_int.
    assert!(matches!(
        Layout::nchw(1 << 16, 1 << 16, 1, 1),
        Err(Error::Overflow { .. })
    ));
    // Strides that overflow i64 arithmetic.
    assert!(matches!(
        Layout::strided(
            &[i32::MAX as i64, i32::MAX as i64, 3],
            &[i32::MAX as i64, 1, i32::MAX as i64]
        ),
        Err(Error::Overflow { .. })
    ));
    // The largest span that fits is accepted.
    let l = Layout::strided(&[2, 1], &[(i32::MAX as i64) - 1, 1]).unwrap();
    assert_eq!(l.span(), i32::MAX as usize);
    assert!(Layout::strided(&[2, 1], &[i32::MAX as i64, 1]).is_err());
}

#[test]
fn overlapping_outputs_are_detected() {
    let l = Layout::strided(&[2, 3, 4, 5], &[1, 1, 1, 1]).unwrap();
    assert!(!l.is_non_overlapping());
    assert!(matches!(
        l.check_output("y"),
        Err(Error::OverlappingOutput { name: "y", .. })
    ));
    // Broadcast-like overlap in one dimension.
    let l = Layout::strided(&[4, 4], &[2, 1]).unwrap();
    assert!(!l.is_non_overlapping());
    // Size-1 dims may carry any stride.
    let l = Layout::strided(&[1, 3, 1, 4], &[7, 4, 99, 1]).unwrap();
    assert!(l.is_non_overlapping());
}

#[test]
fn builder_combinations() {
    let b = TensorBuilder::default().dims(&[2, 3, 4, 5]);
    assert_eq!(b.clone().layout().unwrap().strides(), &[60, 20, 5, 1]);
    assert_eq!(
        b.clone()
            .format(TensorFormat::Nhwc)
            .layout()
            .unwrap()
            .strides(),
        &[60, 1, 15, 3]
    );
    assert!(b
        .clone()
        .strides(&[60, 20, 5, 1])
        .format(TensorFormat::Nhwc)
        .layout()
        .is_err());
    assert!(b.clone().format(TensorFormat::Strided).layout().is_err());
    assert!(b
        .clone()
        .format(TensorFormat::NchwVectC { width: 4 })
        .layout()
        .is_err()); // c=3
    assert!(TensorBuilder::default()
        .dims(&[2, 8, 4, 5])
        .format(TensorFormat::NchwVectC { width: 8 })
        .layout()
        .is_err());
    assert!(TensorBuilder::default()
        .dims(&[2, 8])
        .format(TensorFormat::Nhwc)
        .layout()
        .is_err());
}

// ---------------------------------------------------------------------------------------------
// Host data in any layout: pack / unpack
// ---------------------------------------------------------------------------------------------

proptest! {
    /// Logical data packed into a permuted, padded layout lands at the brute-force offsets, the
    /// gaps stay zero, and unpacking gives the data back.
    #[test]
    fn pack_unpack_round_trip((dims, strides) in permuted_padded()) {
        let l = Layout::strided(&dims, &strides).unwrap();
        let logical: Vec<i32> = (1..=l.element_count() as i32).collect();
        let stored = l.pack(&logical).unwrap();
        prop_assert_eq!(stored.len(), l.span());
        let offs = brute_offsets(&dims, &strides);
        let mut addressed = vec![false; stored.len()];
        for (v, &o) in logical.iter().zip(&offs) {
            prop_assert_eq!(stored[o as usize], *v);
            addressed[o as usize] = true;
        }
        for (p, &v) in stored.iter().enumerate() {
            if !addressed[p] {
                prop_assert_eq!(v, 0, "gap {} of {}", p, l);
            }
        }
        prop_assert_eq!(l.unpack(&stored).unwrap(), logical);
    }
}

/// Row-major `[N, C, spatial...]` values `0, 1, 2, ...`, as f32.
fn iota(l: &Layout) -> Vec<f32> {
    (0..l.element_count()).map(|i| i as f32).collect()
}

#[test]
fn pack_into_channels_last_3d_4d_5d() {
    // NCW → NWC: [N, C, W] = [1, 2, 3].
    let nwc = Layout::nhwc_nd(&[1, 2, 3]).unwrap();
    let stored = nwc.pack(&[0.0f32, 1.0, 2.0, 10.0, 11.0, 12.0]).unwrap();
    assert_eq!(stored, [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
    // NCHW → NHWC: element (n, c, h, w) lands at ((n·H + h)·W + w)·C + c.
    let (n, c, h, w) = (2i64, 3, 4, 5);
    let nhwc = Layout::nhwc(n, c, h, w).unwrap();
    let nchw = Layout::nchw(n, c, h, w).unwrap();
    let logical = iota(&nhwc);
    let stored = nhwc.pack(&logical).unwrap();
    for ni in 0..n {
        for ci in 0..c {
            for hi in 0..h {
                for wi in 0..w {
                    let i = (((ni * c + ci) * h + hi) * w + wi) as usize;
                    let o = (((ni * h + hi) * w + wi) * c + ci) as usize;
                    assert_eq!(stored[o], logical[i]);
                }
            }
        }
    }
    assert_eq!(nhwc.unpack(&stored).unwrap(), logical);
    // Packed channels-first storage is the logical order itself.
    assert_eq!(nchw.pack(&logical).unwrap(), logical);
    // NCDHW ↔ NDHWC through the host: unpack one, pack the other.
    let ndhwc = Layout::ndhwc(2, 3, 2, 3, 4).unwrap();
    let ncdhw = Layout::ncdhw(2, 3, 2, 3, 4).unwrap();
    let logical = iota(&ndhwc);
    let cl = ndhwc.pack(&logical).unwrap();
    assert_ne!(cl, logical);
    let back = ncdhw.pack(&ndhwc.unpack(&cl).unwrap()).unwrap();
    assert_eq!(back, logical);
}

#[test]
fn pack_leaves_gaps_default_and_handles_vect_c() {
    // [N, C, W] = [2, 2, 3] with one gap element after each row and each image.
    let l = Layout::strided(&[2, 2, 3], &[9, 4, 1]).unwrap();
    assert_eq!(l.span(), 16);
    let stored = l.pack(&iota(&l)).unwrap();
    assert_eq!(
        stored,
        [0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 5.0, 0.0, 0.0, 6.0, 7.0, 8.0, 0.0, 9.0, 10.0, 11.0]
    );
    assert_eq!(l.unpack(&stored).unwrap(), iota(&l));
    // NCHW_VECT_C: channel c of pixel (h, w) at ((n·C/v + c/v)·H·W + h·W + w)·v + c % v.
    let v = Layout::nchw_vect_c(1, 8, 2, 2, 4).unwrap();
    let logical: Vec<i8> = (0..32).collect();
    let stored = v.pack(&logical).unwrap();
    assert_eq!(&stored[..8], &[0, 4, 8, 12, 1, 5, 9, 13]);
    assert_eq!(v.unpack(&stored).unwrap(), logical);
}

#[test]
fn pack_and_unpack_refuse_wrong_lengths() {
    let l = Layout::strided(&[2, 3, 4], &[16, 5, 1]).unwrap();
    let (count, span) = (l.element_count(), l.span());
    assert_eq!((count, span), (24, 30));
    for len in [count - 1, count + 1, 0] {
        let r = l.pack(&vec![1.0f32; len]);
        assert!(
            matches!(&r, Err(Error::InvalidArgument { what, got, .. })
                if what.contains("`logical`") && got == &format!("{len} elements")),
            "{len}: {r:?}"
        );
    }
    let r = l.unpack(&vec![1.0f32; span - 1]);
    assert!(
        matches!(
            r,
            Err(Error::BufferTooSmall { name: "stored", len, required }) if len == span - 1 && required == span
        ),
        "{r:?}"
    );
    // A longer stored buffer (a device buffer with a tail) is read up to the span.
    let mut long = l.pack(&vec![2.0f32; count]).unwrap();
    long.extend([7.0; 5]);
    assert_eq!(l.unpack(&long).unwrap(), vec![2.0f32; count]);
    // Two logical elements in one place: nothing to pack into.
    let overlapping = Layout::strided(&[2, 3], &[1, 1]).unwrap();
    let r = overlapping.pack(&[1, 2, 3, 4, 5, 6]);
    assert!(matches!(r, Err(Error::OverlappingOutput { .. })), "{r:?}");
    assert_eq!(
        overlapping.unpack(&[1, 2, 3, 4]).unwrap(),
        [1, 2, 3, 2, 3, 4]
    );
}

/// The 4-D view cuDNN's legacy calls get for a 3-D layout addresses the same elements.
#[test]
fn legacy_view_inserts_a_unit_height() {
    for l in [
        Layout::nchw_nd(&[2, 3, 5]).unwrap(),
        Layout::nhwc_nd(&[2, 3, 5]).unwrap(),
        Layout::strided(&[2, 3, 5], &[40, 12, 2]).unwrap(),
    ] {
        let v = l.legacy_view();
        let d = l.dims();
        assert_eq!(v.dims(), &[d[0], d[1], 1, d[2]]);
        let s = l.strides();
        assert_eq!(v.strides(), &[s[0], s[1], s[2] * d[2], s[2]]);
        assert_eq!((v.span(), v.element_count()), (l.span(), l.element_count()));
        assert_eq!(v.offsets(), l.offsets());
        assert_eq!(v.format(), l.format());
        assert_eq!(v.is_non_overlapping(), l.is_non_overlapping());
    }
    for l in [
        Layout::nchw(2, 3, 4, 5).unwrap(),
        Layout::nchw_nd(&[7, 3]).unwrap(),
        Layout::ndhwc(1, 2, 3, 4, 5).unwrap(),
    ] {
        assert_eq!(l.legacy_view(), l);
    }
}
