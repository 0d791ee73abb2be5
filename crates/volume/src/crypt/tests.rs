//! Known answers from IEEE 1619, the decorator's round trip, keys.

use std::sync::Arc;

use blockdev::testutil::block_on;
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};

use super::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// IEEE 1619-2007 XTS-AES-256 vector 10: Key1 = e's digits, Key2 = pi's,
/// data unit 0xff, 512 bytes of 00 01 .. ff 00 .. ff.
const V10_KEY: &str = "27182818284590452353602874713526624977572470936999595749669676273141592653589793238462643383279502884197169399375105820974944592";
const V10_CT: &str = "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed43851ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151";

fn v10() -> (Xts, Vec<u8>, Vec<u8>) {
    let key: [u8; 64] = unhex(V10_KEY).try_into().unwrap();
    let pt: Vec<u8> = (0..512).map(|i| (i % 256) as u8).collect();
    (
        Xts::new(DataKey::from_bytes(key)).unwrap(),
        pt,
        unhex(V10_CT),
    )
}

#[test]
fn ieee1619_vector_10() {
    let (xts, pt, ct) = v10();
    let mut out = vec![0u8; 512];
    xts.encrypt(0xff, 512, &pt, &mut out).unwrap();
    assert_eq!(out, ct);
    xts.decrypt_in_place(0xff, 512, &mut out).unwrap();
    assert_eq!(out, pt);
    // In place gives the same as into a buffer.
    let mut inplace = pt.clone();
    xts.encrypt_in_place(0xff, 512, &mut inplace).unwrap();
    assert_eq!(inplace, ct);
}

#[test]
fn tweak_is_the_unit_number_of_each_block() {
    // Two units encrypted in one call equal each encrypted alone at its LBA;
    // the one at 0xff is vector 10's.
    let (xts, pt, ct) = v10();
    let mut two = [pt.clone(), pt.clone()].concat();
    xts.encrypt_in_place(0xfe, 512, &mut two).unwrap();
    assert_eq!(&two[512..], &ct[..]);
    assert_ne!(&two[..512], &ct[..], "another LBA, another ciphertext");
    let mut alone = pt.clone();
    xts.encrypt_in_place(0xfe, 512, &mut alone).unwrap();
    assert_eq!(&two[..512], &alone[..]);
    assert!(xts.encrypt_in_place(0, 512, &mut [0u8; 100]).is_err());
}

#[test]
fn zero_ciphertext_reads_as_zeroes() {
    let (xts, _, _) = v10();
    let mut z = vec![0u8; 1024];
    xts.decrypt_in_place(7, 512, &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
    // Plaintext zeroes encrypt to something else, and come back.
    xts.encrypt_in_place(7, 512, &mut z).unwrap();
    assert!(z[..512].iter().any(|&b| b != 0) && z[512..].iter().any(|&b| b != 0));
    xts.decrypt_in_place(7, 512, &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
}

#[test]
fn wrap_unwrap_and_wrong_keks() {
    let kek = Kek::generate().unwrap();
    let key = DataKey::generate().unwrap();
    let env = kek.wrap(&key).unwrap();
    assert_eq!(KeyEnvelope::decode(&env.encode()).unwrap(), Some(env));
    assert_eq!(KeyEnvelope::decode(&[0u8; ENVELOPE_BYTES]).unwrap(), None);
    let back = kek.unwrap(&env).unwrap();
    assert_eq!(back.bytes(), key.bytes());
    // The envelope holds no plaintext key.
    assert!(env.encode().windows(16).all(|w| w != &key.bytes()[..16]));
    // Another KEK: refused by id, naming both.
    let other = Kek::generate().unwrap();
    let e = other.unwrap(&env).unwrap_err();
    assert!(matches!(e, CryptError::WrongKek { .. }), "{e}");
    assert!(e.to_string().contains(&env.kek.to_string()), "{e}");
    // A corrupt wrapped key fails the unwrap's integrity check.
    let mut bad = env;
    bad.wrapped[5] ^= 1;
    assert_eq!(kek.unwrap(&bad).unwrap_err(), CryptError::Unwrap(env.kek));
    // A wrong check value refuses the (good) key: never serve garbage.
    let mut bad = env;
    bad.kcv[0] ^= 1;
    assert_eq!(kek.unwrap(&bad).unwrap_err(), CryptError::KeyCheck);
    // Keys never print.
    assert_eq!(format!("{key:?}"), "DataKey(..)");
    assert_eq!(format!("{kek:?}"), format!("Kek({})", kek.id()));
}

fn io(
    dev: &dyn BlockDevice,
    op: BlockOp,
    lba: u64,
    data: &[u8],
) -> (AlignedBuf, Result<(), blockdev::BlockError>) {
    let mut buf = AlignedBuf::new(data.len());
    buf.set_len(data.len());
    buf.copy_from_slice(data);
    let blocks = (data.len() / dev.geometry().block_size as usize) as u32;
    let done = block_on(dev.submit(IoRequest {
        op,
        lba,
        blocks,
        buf,
    }));
    (done.buf, done.result)
}

#[test]
fn decorator_round_trip_keeps_the_callers_buffer_and_stores_ciphertext() {
    for bs in [512u32, 4096] {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20, bs).unwrap());
        let dev =
            EncryptedDevice::new(mem.clone(), Xts::new(DataKey::generate().unwrap()).unwrap());
        let data: Vec<u8> = (0..3 * bs as usize).map(|i| (i * 7 % 251) as u8).collect();
        let (back, r) = io(&dev, BlockOp::Write { fua: false }, 5, &data);
        r.unwrap();
        assert_eq!(&back[..], &data[..], "the caller's buffer is unchanged");
        // Below: ciphertext, not the data.
        let (raw, r) = io(&*mem, BlockOp::Read, 5, &vec![0u8; data.len()]);
        r.unwrap();
        assert_ne!(&raw[..], &data[..]);
        // Through the decorator: the data; never-written blocks read zero.
        let (plain, r) = io(&dev, BlockOp::Read, 5, &vec![0u8; data.len()]);
        r.unwrap();
        assert_eq!(&plain[..], &data[..]);
        let (z, r) = io(&dev, BlockOp::Read, 100, &vec![1u8; bs as usize]);
        r.unwrap();
        assert!(z.iter().all(|&b| b == 0));
        // Write Zeroes passes down and reads back as zeroes.
        let done = block_on(dev.submit(IoRequest {
            op: BlockOp::WriteZeroes,
            lba: 5,
            blocks: 1,
            buf: AlignedBuf::empty(),
        }));
        done.result.unwrap();
        let (z, r) = io(&dev, BlockOp::Read, 5, &vec![1u8; bs as usize]);
        r.unwrap();
        assert!(z.iter().all(|&b| b == 0));
        // Out of range is refused before anything is encrypted.
        let (_, r) = io(
            &dev,
            BlockOp::Write { fua: false },
            dev.geometry().num_blocks,
            &data,
        );
        assert!(r.is_err());
        assert!(dev.describe().starts_with("aes-xts-256 over "));
    }
}

#[test]
fn another_key_reads_garbage_below_which_is_why_the_check_value_exists() {
    let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20, 4096).unwrap());
    let a = EncryptedDevice::new(mem.clone(), Xts::new(DataKey::generate().unwrap()).unwrap());
    let b = EncryptedDevice::new(mem, Xts::new(DataKey::generate().unwrap()).unwrap());
    let data = vec![0x5au8; 4096];
    io(&a, BlockOp::Write { fua: false }, 0, &data).1.unwrap();
    let (x, _) = io(&b, BlockOp::Read, 0, &[0u8; 4096]);
    assert_ne!(&x[..], &data[..]);
}
