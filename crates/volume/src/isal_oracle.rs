//! ISA-L as a test oracle for the Reed-Solomon path.
//!
//! `reed-solomon-simd` (Leopard, GF(2^16)) and ISA-L (Cauchy, GF(2^8)) are
//! different codes, so parity bytes cannot match; what must match is
//! recovery: for random shapes, data and erasures, both restore exactly the
//! original data. ISA-L is loaded at run time (Debian `libisal-dev` or
//! `libisal2`), so the build does not depend on it; without it the test
//! fails, naming the package, unless `FLASHPOOL_SKIP_ISAL=1` says to skip
//! the oracle (a missing oracle must not pass as a checked one).

use std::ffi::{CStr, c_void};

use crate::parity::Parity;
use crate::testutil::Rng;

type GenMatrix = unsafe extern "C" fn(*mut u8, i32, i32);
type InitTables = unsafe extern "C" fn(i32, i32, *mut u8, *mut u8);
type EncodeData = unsafe extern "C" fn(i32, i32, i32, *mut u8, *mut *mut u8, *mut *mut u8);
type InvertMatrix = unsafe extern "C" fn(*mut u8, *mut u8, i32) -> i32;

struct Isal {
    gen_cauchy: GenMatrix,
    init_tables: InitTables,
    encode: EncodeData,
    invert: InvertMatrix,
}

fn load() -> Option<Isal> {
    let names: [&CStr; 2] = [c"libisal.so.2", c"libisal.so"];
    // SAFETY: dlopen with a valid NUL-terminated name; the handle is never closed.
    let lib = names
        .iter()
        .map(|n| unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW) })
        .find(|h| !h.is_null())?;
    let sym = |name: &CStr| -> Option<*mut c_void> {
        // SAFETY: lib is a live handle, name is NUL-terminated.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    // SAFETY: these ISA-L symbols have exactly these C signatures
    // (isa-l/erasure_code.h, ABI version 2).
    unsafe {
        Some(Isal {
            gen_cauchy: std::mem::transmute::<*mut c_void, GenMatrix>(sym(
                c"gf_gen_cauchy1_matrix",
            )?),
            init_tables: std::mem::transmute::<*mut c_void, InitTables>(sym(c"ec_init_tables")?),
            encode: std::mem::transmute::<*mut c_void, EncodeData>(sym(c"ec_encode_data")?),
            invert: std::mem::transmute::<*mut c_void, InvertMatrix>(sym(c"gf_invert_matrix")?),
        })
    }
}

impl Isal {
    /// rows x k matrix; the top k rows are the identity.
    fn matrix(&self, k: usize, m: usize) -> Vec<u8> {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: `a` holds (k+m)*k bytes as the function writes.
        unsafe { (self.gen_cauchy)(a.as_mut_ptr(), (k + m) as i32, k as i32) };
        a
    }

    /// out[r] = sum over c of coef[r][c] * src[c], for rows of `coef` (rows x k).
    fn apply(&self, k: usize, coef: &[u8], src: &[&[u8]], out: &mut [Vec<u8>]) {
        let rows = out.len();
        let len = src[0].len();
        let mut coef = coef.to_vec();
        let mut tables = vec![0u8; 32 * k * rows];
        let mut srcs: Vec<*mut u8> = src.iter().map(|s| s.as_ptr() as *mut u8).collect();
        let mut outs: Vec<*mut u8> = out.iter_mut().map(|o| o.as_mut_ptr()).collect();
        // SAFETY: tables holds 32*k*rows bytes; coef holds rows*k; every source
        // and output buffer holds `len` bytes; ISA-L only reads the sources.
        unsafe {
            (self.init_tables)(
                k as i32,
                rows as i32,
                coef.as_mut_ptr(),
                tables.as_mut_ptr(),
            );
            (self.encode)(
                len as i32,
                k as i32,
                rows as i32,
                tables.as_mut_ptr(),
                srcs.as_mut_ptr(),
                outs.as_mut_ptr(),
            );
        }
    }

    /// Restores the `lost` data columns from the first k surviving columns.
    fn recover(&self, k: usize, m: usize, all: &[Vec<u8>], lost: &[usize]) -> Vec<Vec<u8>> {
        let a = self.matrix(k, m);
        let survivors: Vec<usize> = (0..k + m).filter(|c| !lost.contains(c)).take(k).collect();
        let mut b: Vec<u8> = survivors
            .iter()
            .flat_map(|&r| a[r * k..(r + 1) * k].to_vec())
            .collect();
        let mut inv = vec![0u8; k * k];
        // SAFETY: both buffers hold k*k bytes.
        let rc = unsafe { (self.invert)(b.as_mut_ptr(), inv.as_mut_ptr(), k as i32) };
        assert_eq!(rc, 0, "Cauchy submatrix must be invertible");
        let coef: Vec<u8> = lost
            .iter()
            .flat_map(|&i| inv[i * k..(i + 1) * k].to_vec())
            .collect();
        let src: Vec<&[u8]> = survivors.iter().map(|&c| &all[c][..]).collect();
        let mut out = vec![vec![0u8; all[0].len()]; lost.len()];
        self.apply(k, &coef, &src, &mut out);
        out
    }
}

/// Set to 1 to run the tests without ISA-L (the oracle check is skipped).
const SKIP_VAR: &str = "FLASHPOOL_SKIP_ISAL";

/// The oracle if it loaded; else a skip if `skip` (the value of
/// [`SKIP_VAR`]) is "1", or the error that fails the test.
fn oracle_or_skip<T>(loaded: Option<T>, skip: Option<&str>) -> Result<Option<T>, String> {
    match (loaded, skip) {
        (Some(o), _) => Ok(Some(o)),
        (None, Some("1")) => Ok(None),
        (None, _) => Err(format!(
            "ISA-L (libisal.so.2) not found, so the Reed-Solomon oracle check cannot run: \
             install it (Debian: apt-get install libisal-dev, or libisal2), or set {SKIP_VAR}=1 \
             to skip this check knowingly"
        )),
    }
}

#[test]
fn a_missing_isal_fails_unless_skipped_knowingly() {
    let e = oracle_or_skip::<()>(None, None).unwrap_err();
    assert!(
        e.contains("libisal-dev") && e.contains("FLASHPOOL_SKIP_ISAL=1"),
        "{e}"
    );
    assert!(oracle_or_skip::<()>(None, Some("0")).is_err());
    assert!(oracle_or_skip::<()>(None, Some("")).is_err());
    assert_eq!(oracle_or_skip::<()>(None, Some("1")), Ok(None));
    assert_eq!(oracle_or_skip(Some(7), None), Ok(Some(7)));
    assert_eq!(oracle_or_skip(Some(7), Some("1")), Ok(Some(7)));
}

#[test]
fn recovery_matches_isal() {
    let skip = std::env::var(SKIP_VAR).ok();
    let Some(isal) = oracle_or_skip(load(), skip.as_deref()).unwrap_or_else(|e| panic!("{e}"))
    else {
        eprintln!("ISA-L not found and {SKIP_VAR}=1: the oracle check is skipped");
        return;
    };
    let mut rng = Rng::new(0x15A1);
    let mut shapes = 0;
    for _ in 0..200 {
        let k = 2 + rng.below(15) as usize;
        let m = 2 + rng.below(3) as usize;
        let len = 512 * (1 + rng.below(16) as usize);
        let data: Vec<Vec<u8>> = (0..k)
            .map(|_| {
                let mut v = vec![0u8; len];
                rng.fill(&mut v);
                v
            })
            .collect();
        // ISA-L's codeword: data + Cauchy parity.
        let a = isal.matrix(k, m);
        let refs: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
        let mut isal_par = vec![vec![0u8; len]; m];
        isal.apply(k, &a[k * k..], &refs, &mut isal_par);
        // Ours.
        let p = Parity::new(k, m).unwrap();
        let mut our_par = vec![vec![0u8; len]; m];
        {
            let mut pr: Vec<&mut [u8]> = our_par.iter_mut().map(|v| &mut v[..]).collect();
            p.encode(&refs, &mut pr).unwrap();
        }
        // Lose up to m data columns (no more than there are) in both codewords.
        let nlost = 1 + rng.below(m.min(k) as u64) as usize;
        let mut lost = Vec::new();
        while lost.len() < nlost {
            let c = rng.below(k as u64) as usize;
            if !lost.contains(&c) {
                lost.push(c);
            }
        }
        let isal_all: Vec<Vec<u8>> = data.iter().chain(&isal_par).cloned().collect();
        let isal_got = isal.recover(k, m, &isal_all, &lost);
        let mut ours: Vec<Vec<u8>> = data.iter().chain(&our_par).cloned().collect();
        let present: Vec<bool> = (0..k + m).map(|c| !lost.contains(&c)).collect();
        for &c in &lost {
            ours[c].fill(0);
        }
        {
            let mut refs: Vec<&mut [u8]> = ours.iter_mut().map(|v| &mut v[..]).collect();
            p.reconstruct(&mut refs, &present).unwrap();
        }
        for (i, &c) in lost.iter().enumerate() {
            assert_eq!(isal_got[i], data[c], "ISA-L {k}+{m} column {c}");
            assert_eq!(ours[c], data[c], "ours {k}+{m} column {c}");
        }
        shapes += 1;
    }
    eprintln!("ISA-L and reed-solomon-simd recovered the same data for {shapes} shapes");
}
