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
//!
//! Encoding uses the crate's FFT encoder. Decoding does not use its decoder,
//! whose erasure-locator step costs ~200 us per call whatever the size (two
//! Walsh transforms over all 2^16 field elements): the code is linear, with
//! `parity_j = sum_d c[j][d] * data_d` element by element, so the generator
//! coefficients are read once per shape from the encoder (encoding unit
//! vectors), and each erasure pattern gets its decode coefficients solved once
//! and cached; a decode is then a few SIMD multiply-and-XOR passes (the
//! crate's engine multiplies), in cache-sized pieces. Read-modify-write with
//! a delta in few columns uses the same coefficients instead of a full encode.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use reed_solomon_simd::ReedSolomonEncoder;
use reed_solomon_simd::engine::{DefaultEngine, Engine, GF_MODULUS, tables};

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
    static ZEROES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static ENGINE: DefaultEngine = DefaultEngine::new();
    /// Generator coefficients `c[j * k + d]` by (k, m).
    static GENERATORS: RefCell<HashMap<(usize, usize), Generator>> = RefCell::new(HashMap::new());
    /// Decode plans by (k, m, bitmask of present columns).
    static PLANS: RefCell<HashMap<(usize, usize, u64), Rc<Plan>>> = RefCell::new(HashMap::new());
    static SCRATCH: RefCell<Vec<[u8; 64]>> = const { RefCell::new(Vec::new()) };
}

/// `c[j * k + d]`: parity j's coefficient of data column d.
type Generator = Rc<Vec<u16>>;

/// Bytes processed per pass of a multiply-and-XOR combination, so the
/// accumulator stays in L1 while the sources stream through.
const PIECE: usize = 4096;

/// How to compute one column as a GF(2^16) combination of others.
#[derive(Debug, Clone, Default)]
struct Combination {
    /// Horner form of `sum_i a_i * src_i`: `t = src_last; t = t * r + src; ...;
    /// out = t * first`. Each entry is (source column, log of the factor that
    /// multiplies the running sum before this source is added), first entry's
    /// factor unused; `scale` is the log of the final factor (None for 1).
    steps: Vec<(usize, u16)>,
    scale: Option<u16>,
}

/// A cached decode: the present columns it reads and how each missing data
/// column follows from them.
#[derive(Debug)]
struct Plan {
    missing: Vec<(usize, Combination)>,
}

fn gf_log(x: u16) -> u16 {
    tables::get_exp_log().log[usize::from(x)]
}

fn gf_mul(a: u16, b: u16) -> u16 {
    if a == 0 || b == 0 {
        return 0;
    }
    let el = tables::get_exp_log();
    let sum = (u32::from(el.log[usize::from(a)]) + u32::from(el.log[usize::from(b)]))
        % u32::from(GF_MODULUS);
    el.exp[sum as usize]
}

fn gf_inv(a: u16) -> u16 {
    debug_assert_ne!(a, 0);
    let el = tables::get_exp_log();
    let l = u32::from(el.log[usize::from(a)]);
    el.exp[((u32::from(GF_MODULUS) - l) % u32::from(GF_MODULUS)) as usize]
}

/// The multiplicative identity in the crate's (Cantor basis) representation.
fn gf_one() -> u16 {
    tables::get_exp_log().exp[0]
}

/// Log of `a / b` (both non-zero), as a factor for the engine's multiply.
fn log_ratio(a: u16, b: u16) -> u16 {
    let m = u32::from(GF_MODULUS);
    ((u32::from(gf_log(a)) + m - u32::from(gf_log(b))) % m) as u16
}

impl Combination {
    /// `sum_i coef_i * col_i` over the non-zero terms.
    fn new(terms: &[(usize, u16)]) -> Combination {
        let terms: Vec<(usize, u16)> = terms.iter().copied().filter(|t| t.1 != 0).collect();
        let Some(&(_, first)) = terms.first() else {
            return Combination::default();
        };
        // Horner from the last term: t = s_n; t = t * (a_{i+1} / a_i) + s_i.
        let mut steps = Vec::with_capacity(terms.len());
        for i in (0..terms.len()).rev() {
            let factor = if i + 1 < terms.len() {
                log_ratio(terms[i + 1].1, terms[i].1)
            } else {
                0
            };
            steps.push((terms[i].0, factor));
        }
        let scale = (first != gf_one()).then(|| gf_log(first));
        Combination { steps, scale }
    }

    /// `out = combination of cols` (`out` is not one of them).
    fn apply(&self, eng: &DefaultEngine, cols: &[&[u8]], out: &mut [u8]) {
        let len = out.len();
        if self.steps.is_empty() {
            out.fill(0);
            return;
        }
        let mut at = 0;
        while at < len {
            let end = (at + PIECE).min(len);
            let piece = &mut out[at..end];
            let (chunks, rest) = piece.as_chunks_mut::<64>();
            debug_assert!(rest.is_empty(), "columns are multiples of 64 bytes");
            for (i, &(src, factor)) in self.steps.iter().enumerate() {
                let s = &cols[src][at..end];
                if i == 0 {
                    chunks.as_flattened_mut().copy_from_slice(s);
                } else {
                    if factor != 0 {
                        eng.mul(chunks, factor);
                    }
                    xor_into(chunks.as_flattened_mut(), s);
                }
            }
            if let Some(scale) = self.scale {
                eng.mul(chunks, scale);
            }
            at = end;
        }
    }
}

/// The generator coefficients of a k+m code, read off the encoder once.
fn generator(k: usize, m: usize) -> Result<Generator, ParityError> {
    if let Some(g) = GENERATORS.with(|g| g.borrow().get(&(k, m)).cloned()) {
        return Ok(g);
    }
    // Column d carries the identity at element d and zeroes elsewhere, so
    // element d of parity j is c[j][d]. Elements sit 32 to a 64-byte chunk:
    // low bytes first, then high bytes.
    let bytes = k.div_ceil(32) * 64;
    let one = gf_one();
    let data: Vec<Vec<u8>> = (0..k)
        .map(|d| {
            let mut v = vec![0u8; bytes];
            let (chunk, e) = (d / 32, d % 32);
            v[chunk * 64 + e] = one as u8;
            v[chunk * 64 + 32 + e] = (one >> 8) as u8;
            v
        })
        .collect();
    let mut par = vec![vec![0u8; bytes]; m];
    let drefs: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
    let mut prefs: Vec<&mut [u8]> = par.iter_mut().map(|v| &mut v[..]).collect();
    rs_encode(k, m, &drefs, &mut prefs)?;
    let mut c = vec![0u16; k * m];
    for j in 0..m {
        for d in 0..k {
            let (chunk, e) = (d / 32, d % 32);
            c[j * k + d] =
                u16::from(par[j][chunk * 64 + e]) | u16::from(par[j][chunk * 64 + 32 + e]) << 8;
        }
    }
    let c = Rc::new(c);
    GENERATORS.with(|g| g.borrow_mut().insert((k, m), c.clone()));
    Ok(c)
}

/// Inverts a square matrix over GF(2^16) (Gauss-Jordan); None if singular.
fn invert(mut a: Vec<Vec<u16>>) -> Option<Vec<Vec<u16>>> {
    let n = a.len();
    let one = gf_one();
    let mut inv: Vec<Vec<u16>> = (0..n)
        .map(|i| (0..n).map(|j| if i == j { one } else { 0 }).collect())
        .collect();
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r][col] != 0)?;
        a.swap(col, pivot);
        inv.swap(col, pivot);
        let f = gf_inv(a[col][col]);
        for j in 0..n {
            a[col][j] = gf_mul(a[col][j], f);
            inv[col][j] = gf_mul(inv[col][j], f);
        }
        for r in 0..n {
            if r != col && a[r][col] != 0 {
                let f = a[r][col];
                for j in 0..n {
                    a[r][j] ^= gf_mul(f, a[col][j]);
                    inv[r][j] ^= gf_mul(f, inv[col][j]);
                }
            }
        }
    }
    Some(inv)
}

/// The decode plan for the columns `present` marks (bit c: column c).
fn plan(k: usize, m: usize, present: u64) -> Result<Rc<Plan>, ParityError> {
    if let Some(p) = PLANS.with(|p| p.borrow().get(&(k, m, present)).cloned()) {
        return Ok(p);
    }
    let c = generator(k, m)?;
    let has = |col: usize| present & (1u64 << col) != 0;
    let lost: Vec<usize> = (0..k).filter(|&d| !has(d)).collect();
    // As many present parity columns as data columns are lost.
    let rows: Vec<usize> = (0..m).filter(|&j| has(k + j)).take(lost.len()).collect();
    if rows.len() < lost.len() {
        return Err(ParityError::TooManyMissing {
            missing: (0..k + m).filter(|&x| !has(x)).count(),
            m,
        });
    }
    // sum_{x lost} c[j][x] D_x = P_j + sum_{d kept} c[j][d] D_d, for j in rows.
    let sys: Vec<Vec<u16>> = rows
        .iter()
        .map(|&j| lost.iter().map(|&x| c[j * k + x]).collect())
        .collect();
    let b = invert(sys).ok_or_else(|| ParityError::Rs(format!("singular {k}+{m} decode")))?;
    let missing = lost
        .iter()
        .enumerate()
        .map(|(l, &x)| {
            let mut terms: Vec<(usize, u16)> = rows
                .iter()
                .enumerate()
                .map(|(i, &j)| (k + j, b[l][i]))
                .collect();
            for d in (0..k).filter(|&d| has(d)) {
                let coef = rows
                    .iter()
                    .enumerate()
                    .fold(0u16, |acc, (i, &j)| acc ^ gf_mul(b[l][i], c[j * k + d]));
                terms.push((d, coef));
            }
            (x, Combination::new(&terms))
        })
        .collect();
    let p = Rc::new(Plan { missing });
    PLANS.with(|p2| p2.borrow_mut().insert((k, m, present), p.clone()));
    Ok(p)
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
                let changed: Vec<(usize, &[u8])> = delta
                    .iter()
                    .enumerate()
                    .filter_map(|(d, x)| x.map(|x| (d, x)))
                    .collect();
                // Multiply-and-XOR costs about twice an encode pass per
                // column and parity, the FFT encoder one pass per data column.
                if 2 * changed.len() * self.m <= self.k + self.m {
                    let c = generator(self.k, self.m)?;
                    return ENGINE.with(|eng| {
                        SCRATCH.with(|sc| {
                            let mut sc = sc.borrow_mut();
                            if sc.len() < PIECE / 64 {
                                sc.resize(PIECE / 64, [0u8; 64]);
                            }
                            for (j, p) in parity.iter_mut().enumerate() {
                                let terms: Vec<(usize, u16)> = changed
                                    .iter()
                                    .enumerate()
                                    .map(|(i, &(d, _))| (i, c[j * self.k + d]))
                                    .collect();
                                let comb = Combination::new(&terms);
                                let srcs: Vec<&[u8]> = changed.iter().map(|x| x.1).collect();
                                let mut at = 0;
                                while at < len {
                                    let end = (at + PIECE).min(len);
                                    let t = sc[..(end - at) / 64].as_flattened_mut();
                                    let piece: Vec<&[u8]> =
                                        srcs.iter().map(|s| &s[at..end]).collect();
                                    comb.apply(eng, &piece, t);
                                    xor_into(&mut p[at..end], t);
                                    at = end;
                                }
                            }
                            Ok(())
                        })
                    });
                }
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
                let others: Vec<&[u8]> = (0..n).filter(|&i| i != c).map(|i| &*cols[i]).collect();
                xor_many(acc, &others);
                cols[c] = acc;
                Ok(())
            }
            Code::ReedSolomon => {
                let k = self.k;
                self.decode_data(cols, present)?;
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

    /// Which present columns [`Parity::reconstruct_data`] reads: for
    /// Reed-Solomon the present data and one present parity column per
    /// missing data column; for the others, every present column.
    pub fn sources(&self, present: &[bool]) -> Vec<bool> {
        let k = self.k;
        if self.code != Code::ReedSolomon {
            return present.to_vec();
        }
        let lost = (0..k).filter(|&d| !present[d]).count();
        let mut want: Vec<bool> = present[..k].to_vec();
        let mut more = lost;
        for &p in &present[k..] {
            want.push(p && more > 0);
            if p && more > 0 {
                more -= 1;
            }
        }
        want
    }

    /// Fills the missing data columns (`present[d] == false`, `d < k`) from
    /// the columns [`Parity::sources`] names; parity columns are left as
    /// they are, present or not.
    pub fn reconstruct_data(
        &self,
        cols: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), ParityError> {
        let k = self.k;
        if (0..k).all(|d| present[d]) {
            return Ok(());
        }
        match self.code {
            Code::ReedSolomon => self.decode_data(cols, present),
            _ => {
                // Parity columns that are missing need not be computed, but
                // XOR and mirror recovery cost the same either way.
                self.reconstruct(cols, present)
            }
        }
    }

    /// Reed-Solomon: fills missing data columns through a cached plan.
    fn decode_data(&self, cols: &mut [&mut [u8]], present: &[bool]) -> Result<(), ParityError> {
        let (k, m) = (self.k, self.m);
        if (0..k).all(|d| present[d]) {
            return Ok(());
        }
        let mask = present
            .iter()
            .enumerate()
            .fold(0u64, |acc, (c, &p)| if p { acc | 1u64 << c } else { acc });
        let plan = plan(k, m, mask)?;
        ENGINE.with(|eng| {
            for (x, comb) in &plan.missing {
                // Sources are never missing columns, so the output can be
                // lent out while the others are read.
                let out = std::mem::take(&mut cols[*x]);
                {
                    let srcs: Vec<&[u8]> = cols.iter().map(|c| &**c).collect();
                    comb.apply(eng, &srcs, out);
                }
                cols[*x] = out;
            }
        });
        Ok(())
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

/// `dsts[i] = srcs[i]` and `parity = srcs[0] ^ srcs[1] ^ ...`, a cache-sized
/// piece at a time so the XOR reads the sources from L1 (a full-stripe XOR
/// write).
pub fn copy_xor(dsts: &mut [&mut [u8]], srcs: &[&[u8]], parity: &mut [u8]) {
    const PIECE: usize = 4096;
    let len = parity.len();
    let mut at = 0;
    while at < len {
        let end = (at + PIECE).min(len);
        let mut piece: [&[u8]; crate::layout::MAX_MEMBERS] = [&[]; crate::layout::MAX_MEMBERS];
        for ((d, s), p) in dsts.iter_mut().zip(srcs).zip(piece.iter_mut()) {
            d[at..end].copy_from_slice(&s[at..end]);
            *p = &s[at..end];
        }
        xor_many(&mut parity[at..end], &piece[..srcs.len()]);
        at = end;
    }
}

/// `dst = srcs[0] ^ srcs[1] ^ ...`, 64 bytes at a time: each chunk of `dst` is
/// accumulated in registers over every source and stored once (a third
/// faster than XORing whole sources into `dst` one after another).
pub fn xor_many(dst: &mut [u8], srcs: &[&[u8]]) {
    let mut chunks: [&[[u8; 64]]; crate::layout::MAX_MEMBERS] = [&[]; crate::layout::MAX_MEMBERS];
    for (c, s) in chunks.iter_mut().zip(srcs) {
        *c = s.as_chunks::<64>().0;
    }
    let chunks = &chunks[..srcs.len()];
    let (dch, rest) = dst.as_chunks_mut::<64>();
    for (i, d) in dch.iter_mut().enumerate() {
        let mut acc = chunks[0][i];
        for s in &chunks[1..] {
            let x = &s[i];
            for b in 0..64 {
                acc[b] ^= x[b];
            }
        }
        *d = acc;
    }
    let done = dch.len() * 64;
    for (j, r) in rest.iter_mut().enumerate() {
        *r = srcs.iter().fold(0, |a, s| a ^ s[done + j]);
    }
}

#[cfg(test)]
#[path = "parity_tests.rs"]
mod tests;
