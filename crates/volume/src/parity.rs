//! Parity kernels: mirror copies, XOR (raid5, any m = 1) and Reed-Solomon
//! (raid6, k+m with m >= 2) through `reed-solomon-simd`, which picks AVX2,
//! SSSE3 or NEON at run time.
//!
//! Every code here is linear and works position by position (RS on 64-byte
//! chunks), so parity of a row range of the strips is that range of the
//! full-strip parity, and `parity(a ^ b) = parity(a) ^ parity(b)`. The stripe
//! engine relies on both: it encodes only the rows a write touches, and
//! read-modify-write XORs the parity of the data delta into the old parity.
//!
//! `reed-solomon-simd` implements the Leopard (FFT over GF(2^16)) code, so its
//! parity bytes differ from ISA-L's Vandermonde/Cauchy parity; recovery is
//! equivalent (MDS: any k of k+m columns restore the rest).

use std::cell::RefCell;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// Which kernel a layout uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// No redundancy (concat, raid0).
    None,
    /// k = 1; every parity column is a copy.
    Mirror,
    /// m = 1; parity is the XOR of the data.
    Xor,
    /// m >= 2 Reed-Solomon.
    ReedSolomon,
}

#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("{missing} columns are missing but the code only corrects {m}")]
    TooManyMissing { missing: usize, m: usize },
    #[error("reed-solomon: {0}")]
    Rs(String),
}

/// A k+m code over equal-length columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parity {
    pub k: usize,
    pub m: usize,
    pub code: Code,
}

thread_local! {
    static ENCODER: RefCell<Option<ReedSolomonEncoder>> = const { RefCell::new(None) };
    static DECODER: RefCell<Option<ReedSolomonDecoder>> = const { RefCell::new(None) };
    static ZEROES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Parity {
    pub fn new(k: usize, m: usize) -> Result<Parity, ParityError> {
        let code = match (k, m) {
            (_, 0) => Code::None,
            (1, _) => Code::Mirror,
            (_, 1) => Code::Xor,
            _ => {
                if !ReedSolomonEncoder::supports(k, m) {
                    return Err(ParityError::Rs(format!("{k}+{m} is not supported")));
                }
                Code::ReedSolomon
            }
        };
        Ok(Parity { k, m, code })
    }

    /// `parity[j]` from `data` (k columns of one length).
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), ParityError> {
        debug_assert_eq!(data.len(), self.k);
        debug_assert_eq!(parity.len(), self.m);
        match self.code {
            Code::None => Ok(()),
            Code::Mirror => {
                for p in parity.iter_mut() {
                    p.copy_from_slice(data[0]);
                }
                Ok(())
            }
            Code::Xor => {
                xor_many(parity[0], data);
                Ok(())
            }
            Code::ReedSolomon => rs_encode(self.k, self.m, data, parity),
        }
    }

    /// XORs into `parity` the parity of a data change, given `delta[d] = old ^ new`
    /// for columns that changed (`None` = unchanged). All slices have one length.
    pub fn apply_delta(
        &self,
        delta: &[Option<&[u8]>],
        parity: &mut [&mut [u8]],
    ) -> Result<(), ParityError> {
        match self.code {
            Code::None => Ok(()),
            Code::Mirror | Code::Xor => {
                for p in parity.iter_mut() {
                    for d in delta.iter().flatten() {
                        xor_into(p, d);
                    }
                }
                Ok(())
            }
            Code::ReedSolomon => {
                let len = parity[0].len();
                ZEROES.with(|z| {
                    let mut z = z.borrow_mut();
                    if z.len() < len {
                        z.resize(len, 0);
                    }
                    let zero = &z[..len];
                    let cols: Vec<&[u8]> = delta.iter().map(|d| d.unwrap_or(zero)).collect();
                    let mut pd: Vec<Vec<u8>> = vec![vec![0u8; len]; self.m];
                    let mut pd_refs: Vec<&mut [u8]> =
                        pd.iter_mut().map(|v| v.as_mut_slice()).collect();
                    rs_encode(self.k, self.m, &cols, &mut pd_refs)?;
                    for (p, d) in parity.iter_mut().zip(&pd) {
                        xor_into(p, d);
                    }
                    Ok(())
                })
            }
        }
    }

    /// Fills the columns with `present[c] == false` (data `0..k`, parity `k..k+m`)
    /// from the others. At most `m` may be missing.
    pub fn reconstruct(&self, cols: &mut [&mut [u8]], present: &[bool]) -> Result<(), ParityError> {
        let n = self.k + self.m;
        debug_assert_eq!(cols.len(), n);
        let missing: Vec<usize> = (0..n).filter(|&c| !present[c]).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if missing.len() > self.m {
            return Err(ParityError::TooManyMissing {
                missing: missing.len(),
                m: self.m,
            });
        }
        match self.code {
            Code::None => unreachable!("m = 0 has nothing to reconstruct"),
            Code::Mirror => {
                let src = (0..n).find(|&c| present[c]).expect("a copy is present");
                let src_data = cols[src].to_vec();
                for &c in &missing {
                    cols[c].copy_from_slice(&src_data);
                }
                Ok(())
            }
            Code::Xor => {
                // XOR of all the others, whichever column is missing.
                let c = missing[0];
                let acc = std::mem::take(&mut cols[c]);
                acc.fill(0);
                for (i, col) in cols.iter().enumerate() {
                    if i != c {
                        xor_into(acc, col);
                    }
                }
                cols[c] = acc;
                Ok(())
            }
            Code::ReedSolomon => {
                let k = self.k;
                let data_missing: Vec<usize> = missing.iter().copied().filter(|&c| c < k).collect();
                if !data_missing.is_empty() {
                    let len = cols[0].len();
                    DECODER.with(|cell| {
                        let mut cell = cell.borrow_mut();
                        let dec = match cell.as_mut() {
                            Some(d) => {
                                d.reset(k, self.m, len).map_err(rs_err)?;
                                d
                            }
                            None => cell
                                .insert(ReedSolomonDecoder::new(k, self.m, len).map_err(rs_err)?),
                        };
                        for (c, col) in cols.iter().enumerate() {
                            if !present[c] {
                                continue;
                            }
                            if c < k {
                                dec.add_original_shard(c, &**col).map_err(rs_err)?;
                            } else {
                                dec.add_recovery_shard(c - k, &**col).map_err(rs_err)?;
                            }
                        }
                        let res = dec.decode().map_err(rs_err)?;
                        for &c in &data_missing {
                            let got = res.restored_original(c).ok_or_else(|| {
                                ParityError::Rs(format!("decoder did not restore column {c}"))
                            })?;
                            cols[c].copy_from_slice(got);
                        }
                        Ok::<(), ParityError>(())
                    })?;
                }
                if missing.iter().any(|&c| c >= k) {
                    let (data, parity) = cols.split_at_mut(k);
                    let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
                    let mut fresh: Vec<Vec<u8>> = vec![vec![0u8; data[0].len()]; self.m];
                    let mut refs: Vec<&mut [u8]> = fresh.iter_mut().map(|v| &mut v[..]).collect();
                    rs_encode(k, self.m, &data, &mut refs)?;
                    for &c in missing.iter().filter(|&&c| c >= k) {
                        parity[c - k].copy_from_slice(&fresh[c - k]);
                    }
                }
                Ok(())
            }
        }
    }
}

fn rs_err(e: reed_solomon_simd::Error) -> ParityError {
    ParityError::Rs(e.to_string())
}

fn rs_encode(
    k: usize,
    m: usize,
    data: &[&[u8]],
    parity: &mut [&mut [u8]],
) -> Result<(), ParityError> {
    let len = data[0].len();
    ENCODER.with(|cell| {
        let mut cell = cell.borrow_mut();
        let enc = match cell.as_mut() {
            Some(e) => {
                e.reset(k, m, len).map_err(rs_err)?;
                e
            }
            None => cell.insert(ReedSolomonEncoder::new(k, m, len).map_err(rs_err)?),
        };
        for d in data {
            enc.add_original_shard(d).map_err(rs_err)?;
        }
        let res = enc.encode().map_err(rs_err)?;
        for (p, r) in parity.iter_mut().zip(res.recovery_iter()) {
            p.copy_from_slice(r);
        }
        Ok(())
    })
}

/// `dst ^= src`. Fixed 64-byte steps so the compiler emits wide vector XORs.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (dc, sc) in (&mut d).zip(&mut s) {
        let dc: &mut [u8; 64] = dc.try_into().expect("64-byte chunk");
        let sc: &[u8; 64] = sc.try_into().expect("64-byte chunk");
        for i in 0..64 {
            dc[i] ^= sc[i];
        }
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= *b;
    }
}

/// `dst = srcs[0] ^ srcs[1] ^ ...`, a cache-sized piece at a time so `dst`
/// stays in L1 while every source streams through once.
pub fn xor_many(dst: &mut [u8], srcs: &[&[u8]]) {
    const PIECE: usize = 4096;
    let len = dst.len();
    let mut at = 0;
    while at < len {
        let end = (at + PIECE).min(len);
        let d = &mut dst[at..end];
        d.copy_from_slice(&srcs[0][at..end]);
        for s in &srcs[1..] {
            xor_into(d, &s[at..end]);
        }
        at = end;
    }
}

#[cfg(test)]
mod tests {
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
}
