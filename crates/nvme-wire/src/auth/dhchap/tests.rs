//! Known answers computed independently (Python's hmac/hashlib/zlib and
//! plain modular exponentiation) from the definitions in Linux
//! `drivers/nvme/common/auth.c` and `drivers/nvme/target/auth.c`.

use super::*;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const SUBNQN: &str = "nqn.2026-01.io.flashpool:vol0";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn secret_representation_round_trips_with_its_crc() {
    let s = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    let k = Secret::parse(s).unwrap();
    assert_eq!(
        k,
        Secret::from_key(Some(HashId::Sha256), &(0..32).collect::<Vec<u8>>()).unwrap()
    );
    assert_eq!(k.to_dhhc(), s);
    assert_eq!(Secret::parse(&format!("  {s}\n")).unwrap(), k);
    assert_eq!(Secret::parse(s.trim_end_matches(':')).unwrap(), k);
    let s48 = "DHHC-1:00:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
    assert_eq!(Secret::parse(s48).unwrap().to_dhhc(), s48);
    // Debug shows no key material.
    assert_eq!(format!("{k:?}"), "Secret(DHHC-1:01, 32 bytes)");
}

#[test]
fn bad_secrets_are_refused() {
    let good = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    assert_eq!(Secret::parse("DHHC-2:01:x:"), Err(SecretError::Prefix));
    assert_eq!(
        Secret::parse(&good.replace(":01:", ":04:")),
        Err(SecretError::Hash)
    );
    assert_eq!(
        Secret::parse(&good.replace("AAEC", "AAED")),
        Err(SecretError::Crc)
    );
    assert_eq!(Secret::parse("DHHC-1:00:!!!!:"), Err(SecretError::Base64));
    assert_eq!(
        Secret::parse("DHHC-1:00:AAECAwQFBgcICQoL:"),
        Err(SecretError::Length(8))
    );
}

#[test]
fn key_transformation_matches_the_definition() {
    let k = Secret::parse("DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
    assert_eq!(
        hex(&k.transformed(HOSTNQN)),
        "2fb0ace5d783b03625e59bae940a3ef8fa86f1edf63925949ca2d89d8d6559a9"
    );
    let raw = Secret::from_key(None, &[7; 48]).unwrap();
    assert_eq!(raw.transformed(HOSTNQN), vec![7; 48]);
}

#[test]
fn host_and_controller_responses() {
    let k = Secret::parse("DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
    let c1 = [0xA5u8; 48];
    let r1 = host_response(
        HashId::Sha384,
        &k.transformed(HOSTNQN),
        &c1,
        ResponseCtx {
            seqnum: 0x0102_0304,
            t_id: 0x0506,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
        },
    );
    assert_eq!(
        hex(&r1),
        "c72d6bb81cdc46abc42f99aeb250976b228f540880133b89a09aff25b18f51039b1384fa1a57c471219413568a31d329"
    );
    let kc: Vec<u8> = (100..148).collect();
    let r2 = ctrl_response(
        HashId::Sha384,
        &Secret::from_key(None, &kc).unwrap().transformed(SUBNQN),
        &c1,
        ResponseCtx {
            seqnum: 0x0a0b_0c0d,
            t_id: 0x0506,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
        },
    );
    assert_eq!(
        hex(&r2),
        "d8ceb8bd5c4184f94955cfd67ed4f75988e748cabbb0244077063e698e084a07cdcd51c564e5241972e5848aaca42ca6"
    );
}

#[test]
fn ffdhe2048_exchange_and_augmented_challenge() {
    let mut xa: Vec<u8> = (1..29).collect();
    *xa.last_mut().unwrap() |= 1;
    let xb: Vec<u8> = (200..228).collect();
    let a = DhKey::new(DhGroup::Ffdhe2048, &xa).unwrap();
    let b = DhKey::new(DhGroup::Ffdhe2048, &xb).unwrap();
    assert_eq!(a.public.len(), 256);
    assert_eq!(
        hex(&HashId::Sha256.digest(&a.public)),
        "89f093e0accfe2947194b26ff3df18c09f2808bcf611d4e4e5e1bc754538d4e0"
    );
    let s = a.shared_secret(&b.public).unwrap();
    assert_eq!(s, b.shared_secret(&a.public).unwrap());
    assert_eq!(
        hex(&HashId::Sha256.digest(&s)),
        "0cd354d6c2eb0d2e7f1a3f0283aac68e029f441992b6017cbe5a7aa97c5bf684"
    );
    assert_eq!(
        hex(&augmented_challenge(HashId::Sha256, &s, &[0xA5; 32])),
        "59e8f1061242311146d37172859e8486003a895edc1e7fabcdb3357d682b7fe3"
    );
}

#[test]
fn every_group_agrees_with_itself() {
    for g in DhGroup::ALL.into_iter().skip(1) {
        let a = DhKey::new(g, &vec![0x5A; g.private_len()]).unwrap();
        let b = DhKey::new(g, &vec![0xC3; g.private_len()]).unwrap();
        assert_eq!(a.public.len(), g.value_len());
        assert_eq!(
            a.shared_secret(&b.public).unwrap(),
            b.shared_secret(&a.public).unwrap(),
            "{g:?}"
        );
    }
    assert!(DhKey::new(DhGroup::Null, &[1]).is_none());
}

#[test]
fn bad_public_values_are_refused() {
    let g = DhGroup::Ffdhe2048;
    let k = DhKey::new(g, &[9; 28]).unwrap();
    let p = g.prime().unwrap();
    let mut v = vec![0u8; 256];
    assert_eq!(k.shared_secret(&v), Err(DhError::Range)); // zero
    v[255] = 1;
    assert_eq!(k.shared_secret(&v), Err(DhError::Range)); // identity
    let mut pm1 = p.to_vec();
    pm1[255] -= 1;
    assert_eq!(k.shared_secret(&pm1), Err(DhError::Range)); // order 2
    assert_eq!(k.shared_secret(p), Err(DhError::Range));
    assert_eq!(k.shared_secret(&[0xFF; 256]), Err(DhError::Range));
    assert_eq!(
        k.shared_secret(&k.public[1..]),
        Err(DhError::Length {
            have: 255,
            want: 256
        })
    );
    v[255] = 2;
    assert!(k.shared_secret(&v).is_ok());
}

#[test]
fn macs_compare() {
    assert!(macs_equal(&[1, 2], &[1, 2]));
    assert!(!macs_equal(&[1, 2], &[1, 3]));
    assert!(!macs_equal(&[1, 2], &[1]));
}
