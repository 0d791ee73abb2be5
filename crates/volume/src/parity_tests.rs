//! Tests of the parity codes: round trips of encode/reconstruct for every
//! erasure pattern, against random data and proptest cases.

use super::*;
use proptest::prelude::*;

fn random_cols(seed: u64, n: usize, len: usize) -> Vec<Vec<u8>> {
    let mut rng = crate::testutil::Rng::new(seed);
    (0..n)
        .map(|_| {
            let mut v = vec![0u8; len];
            rng.fill(&mut v);
            v
        })
        .collect()
}

fn encode(p: &Parity, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut par = vec![vec![0u8; len]; p.m];
    let refs: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
    let mut prefs: Vec<&mut [u8]> = par.iter_mut().map(|v| &mut v[..]).collect();
    p.encode(&refs, &mut prefs).unwrap();
    par
}

fn shapes() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![
        Just((1, 1)),
        Just((1, 3)),
        (2usize..=16).prop_map(|k| (k, 1)),
        (2usize..=16, 2usize..=4),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any m missing columns come back byte for byte.
    #[test]
    fn any_m_erasures_recover((k, m) in shapes(), seed in any::<u64>(), rows in 1usize..4, lost_seed in any::<u64>()) {
        let p = Parity::new(k, m).unwrap();
        let len = rows * 512;
        let data = random_cols(seed, k, len);
        let par = encode(&p, &data);
        let mut all: Vec<Vec<u8>> = data.iter().chain(par.iter()).cloned().collect();
        let n = k + m;
        let mut present = vec![true; n];
        let mut rng = crate::testutil::Rng::new(lost_seed);
        let lose = 1 + rng.below(m as u64) as usize;
        let mut lost = 0;
        while lost < lose {
            let c = rng.below(n as u64) as usize;
            if present[c] {
                present[c] = false;
                all[c].fill(0xAA);
                lost += 1;
            }
        }
        let mut refs: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
        p.reconstruct(&mut refs, &present).unwrap();
        for c in 0..k { prop_assert_eq!(&all[c], &data[c]); }
        for j in 0..m { prop_assert_eq!(&all[k + j], &par[j]); }
    }

    /// Parity of a row range equals that range of the full parity, and the
    /// delta path equals a fresh encode: the stripe engine's two shortcuts.
    #[test]
    fn ranges_and_deltas_agree((k, m) in shapes(), seed in any::<u64>(), lo in 0usize..8, hi in 1usize..8, col in 0usize..16) {
        let p = Parity::new(k, m).unwrap();
        let len = 8 * 512;
        let data = random_cols(seed, k, len);
        let full = encode(&p, &data);
        let (lo, hi) = (lo.min(hi), hi.max(lo + 1).min(8));
        let part: Vec<Vec<u8>> = data.iter().map(|c| c[lo * 512..hi * 512].to_vec()).collect();
        let ppar = encode(&p, &part);
        for j in 0..m { prop_assert_eq!(&ppar[j][..], &full[j][lo * 512..hi * 512]); }

        let col = col % k;
        let mut new = data.clone();
        crate::testutil::Rng::new(seed ^ 1).fill(&mut new[col][lo * 512..hi * 512]);
        let mut delta = vec![0u8; len];
        for i in 0..len { delta[i] = data[col][i] ^ new[col][i]; }
        let mut deltas: Vec<Option<&[u8]>> = vec![None; k];
        deltas[col] = Some(&delta);
        let mut upd = full.clone();
        let mut refs: Vec<&mut [u8]> = upd.iter_mut().map(|v| &mut v[..]).collect();
        p.apply_delta(&deltas, &mut refs).unwrap();
        prop_assert_eq!(upd, encode(&p, &new));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Data comes back from just the columns `sources` names (the others
    /// hold garbage), and deltas in several columns agree with encoding.
    #[test]
    fn data_decodes_from_its_sources_alone((k, m) in shapes(), seed in any::<u64>(), lost_seed in any::<u64>()) {
        let p = Parity::new(k, m).unwrap();
        let len = 2 * 4096;
        let data = random_cols(seed, k, len);
        let par = encode(&p, &data);
        let n = k + m;
        let mut rng = crate::testutil::Rng::new(lost_seed);
        let mut present = vec![true; n];
        for _ in 0..m {
            present[rng.below(n as u64) as usize] = false;
        }
        let read = p.sources(&present);
        prop_assert!((0..n).all(|c| !read[c] || present[c]));
        let mut all: Vec<Vec<u8>> = data.iter().chain(par.iter()).cloned().collect();
        for c in 0..n {
            if !read[c] {
                all[c].fill(0x5A);
            }
        }
        let mut refs: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
        p.reconstruct_data(&mut refs, &read).unwrap();
        for d in 0..k { prop_assert_eq!(&all[d], &data[d]); }

        // Every column changed: the delta path with many columns.
        let new = random_cols(seed ^ 7, k, len);
        let deltas: Vec<Vec<u8>> = (0..k)
            .map(|d| data[d].iter().zip(&new[d]).map(|(a, b)| a ^ b).collect())
            .collect();
        let drefs: Vec<Option<&[u8]>> = deltas.iter().map(|v| Some(&v[..])).collect();
        let mut upd = par.clone();
        let mut urefs: Vec<&mut [u8]> = upd.iter_mut().map(|v| &mut v[..]).collect();
        p.apply_delta(&drefs, &mut urefs).unwrap();
        prop_assert_eq!(upd, encode(&p, &new));
    }
}

#[test]
fn gf_tables_agree_with_the_engine() {
    let one = gf_one();
    assert_eq!(gf_mul(one, 0x1234), 0x1234);
    for a in [1u16, 2, 0x1234, 0xBEEF, 0xFFFF] {
        assert_eq!(gf_mul(a, gf_inv(a)), one, "{a:#x}");
        let mut x = [[0u8; 64]; 1];
        x[0][5] = 0x34;
        x[0][37] = 0x12;
        ENGINE.with(|e| e.mul(&mut x, gf_log(a)));
        let got = u16::from(x[0][5]) | u16::from(x[0][37]) << 8;
        assert_eq!(got, gf_mul(0x1234, a), "{a:#x}");
    }
}

#[test]
fn copy_xor_copies_and_folds() {
    let a = random_cols(2, 3, 3 * 4096 + 512);
    let srcs: Vec<&[u8]> = a.iter().map(|v| &v[..]).collect();
    let mut out = vec![vec![0u8; a[0].len()]; 3];
    let mut p = vec![0u8; a[0].len()];
    let mut drefs: Vec<&mut [u8]> = out.iter_mut().map(|v| &mut v[..]).collect();
    copy_xor(&mut drefs, &srcs, &mut p);
    assert_eq!(out, a);
    let mut want = vec![0u8; a[0].len()];
    xor_many(&mut want, &srcs);
    assert_eq!(p, want);
}

#[test]
fn xor_handles_odd_lengths() {
    let a = random_cols(1, 3, 200);
    let mut d = vec![0u8; 200];
    xor_many(&mut d, &[&a[0], &a[1], &a[2]]);
    for i in 0..200 {
        assert_eq!(d[i], a[0][i] ^ a[1][i] ^ a[2][i]);
    }
}

#[test]
fn too_many_missing_is_an_error() {
    let p = Parity::new(4, 2).unwrap();
    let mut cols = vec![vec![0u8; 64]; 6];
    let mut refs: Vec<&mut [u8]> = cols.iter_mut().map(|v| &mut v[..]).collect();
    let e = p
        .reconstruct(&mut refs, &[false, false, false, true, true, true])
        .unwrap_err();
    assert!(e.to_string().contains("3 columns"), "{e}");
}
