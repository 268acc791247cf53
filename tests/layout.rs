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
