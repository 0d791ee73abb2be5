//! Vectors computed with OpenSSL's HKDF (`openssl kdf ... HKDF`) and
//! Python's hmac over the HKDF-Expand-Label info libnvme builds, so a
//! mistake in our own HKDF-Label encoding shows up here.

use super::*;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b8c2d2e-1f3a-4c5d-9e6f-708192a3b4c5";
const SUB: &str = "nqn.2026-01.io.flashpool:vol0";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn key(len: usize) -> Vec<u8> {
    (0..len as u8).collect()
}

#[test]
fn sha256_vectors() {
    let k = ConfiguredPsk::from_key(Some(PskHash::Sha256), &key(32)).unwrap();
    assert_eq!(
        hex(&k.retained(HOST, Derivation::Rfc8446)),
        "e3e14f96ac2b820a9c60ac748fcabbe95f9c6802cb87c95b3ee77190e32f2fb6"
    );
    let (id, psk) = k.derive(HOST, SUB, 0);
    assert_eq!(id.encode(), format!("NVMe0R01 {HOST} {SUB}"));
    assert_eq!(
        hex(&psk),
        "1a6d92d71dc626d8301172ba49aa33510ba1f1f7980b0ac55c8c5093178badf6"
    );
    let (id, psk) = k.derive(HOST, SUB, 1);
    assert_eq!(
        id.encode(),
        format!("NVMe1R01 {HOST} {SUB} v0zeymjOB3P9WLwKpxg39mW1aeC2jjE0mEU4a/AwADc=")
    );
    assert_eq!(
        hex(&psk),
        "17134d8476dbc566ed8283c94d1b0f1dcf93d102b059bb7f49fb6658c5a40a95"
    );
}

#[test]
fn sha384_vectors() {
    let k = ConfiguredPsk::from_key(Some(PskHash::Sha384), &key(48)).unwrap();
    assert_eq!(
        hex(&k.retained(HOST, Derivation::Rfc8446)),
        "d0974c011f3c06d4b13e51602f2b13c986374a6d82bb36ccc8ca5deb4f32dce9c3661cf143ea2a53302641baf48a237c"
    );
    let (id, psk) = k.derive(HOST, SUB, 0);
    assert_eq!(id.encode(), format!("NVMe0R02 {HOST} {SUB}"));
    assert_eq!(
        hex(&psk),
        "2837c436891e84d3f960b4a187c38a086e8ed9d38fe3019b4383dbd954f86ada2475402d875c0c73174b2477bd40efae"
    );
    let (id, psk) = k.derive(HOST, SUB, 1);
    assert_eq!(
        id.digest.as_deref(),
        Some("a9RodRsYuqirCF4u+FxN4Hmcsrq33I1nVY0d0Xbtk4feNmLZr3XG3Pss5QpW2+Ls")
    );
    assert_eq!(
        hex(&psk),
        "768bfb7a2251641b9cfee3885cce5f0706c27b2ced4474fd8386925bd0e9aca3539299429dd45bbbc8293fd3475ebcd5"
    );
}

#[test]
fn untransformed_key_is_the_retained_psk() {
    let k = ConfiguredPsk::from_key(None, &key(48)).unwrap();
    assert_eq!(k.hash(), PskHash::Sha384);
    assert_eq!(k.retained(HOST, Derivation::Rfc8446), key(48));
    assert_eq!(
        ConfiguredPsk::from_key(None, &key(32)).unwrap().hash(),
        PskHash::Sha256
    );
}

#[test]
fn interchange_round_trip_and_refusals() {
    let k = ConfiguredPsk::from_key(Some(PskHash::Sha256), &key(32)).unwrap();
    let s = k.to_interchange();
    assert!(s.starts_with("NVMeTLSkey-1:01:") && s.ends_with(':'));
    assert_eq!(ConfiguredPsk::parse(&format!("  {s}\n")).unwrap(), k);
    assert_eq!(
        ConfiguredPsk::parse(s.trim_end_matches(':')).unwrap(),
        k,
        "the trailing colon is optional"
    );
    assert!(
        !format!("{k:?}").contains(&s[16..30]),
        "Debug hides the key"
    );
    assert_eq!(ConfiguredPsk::parse("DHHC-1:01:x:"), Err(PskError::Prefix));
    assert_eq!(
        ConfiguredPsk::parse(&s.replace(":01:", ":03:")),
        Err(PskError::Hash)
    );
    assert_eq!(
        ConfiguredPsk::parse(&s.replace(":01:", ":02:")),
        Err(PskError::Length(32)),
        "hash 02 takes a 48-byte key"
    );
    assert_eq!(
        ConfiguredPsk::parse("NVMeTLSkey-1:01:@@@:"),
        Err(PskError::Base64)
    );
    assert_eq!(
        ConfiguredPsk::parse("NVMeTLSkey-1:01::"),
        Err(PskError::Length(0))
    );
    let mut raw = key(32);
    raw.extend_from_slice(&[0, 0, 0, 0]);
    let bad = format!(
        "NVMeTLSkey-1:01:{}:",
        base64::engine::general_purpose::STANDARD.encode(raw)
    );
    assert_eq!(ConfiguredPsk::parse(&bad), Err(PskError::Crc));
}

#[test]
fn identity_parse_round_trip_and_refusals() {
    let k = ConfiguredPsk::from_key(Some(PskHash::Sha384), &key(48)).unwrap();
    for v in [0, 1] {
        let (id, psk) = k.derive(HOST, SUB, v);
        let back = PskIdentity::parse(id.encode().as_bytes()).unwrap();
        assert_eq!(back, id);
        assert_eq!(
            back.tls_psk_from(&k),
            Some((psk, Derivation::Rfc8446)),
            "v{v}"
        );
    }
    // a key of the other hash, or another key, does not fit the identity
    let other = ConfiguredPsk::from_key(Some(PskHash::Sha256), &key(32)).unwrap();
    let (id1, _) = k.derive(HOST, SUB, 1);
    assert_eq!(id1.tls_psk_from(&other), None);
    let mut k2 = key(48);
    k2[0] ^= 1;
    let k2 = ConfiguredPsk::from_key(Some(PskHash::Sha384), &k2).unwrap();
    assert_eq!(id1.tls_psk_from(&k2), None, "v1 digest binds the key");
    for bad in [
        &b""[..],
        b"NVMe0R01",
        b"NVMe0R01 host",
        b"NVMe0R01  sub",
        b"NVMe0X01 h s",
        b"NVMe0R0x h s",
        b"NVMe1R01 h s",
        b"NVMe0R01 h s extra",
        b"NVMe0R01 h s\xff",
        b"nvme0R01 h s",
    ] {
        assert_eq!(
            PskIdentity::parse(bad),
            Err(IdentityError::Format),
            "{bad:?}"
        );
    }
    assert_eq!(
        PskIdentity::parse(b"NVMe0R03 h s"),
        Err(IdentityError::Hash(3))
    );
    assert_eq!(
        PskIdentity::parse(b"NVMe0G01 h s"),
        Err(IdentityError::Generated)
    );
    assert_eq!(
        PskIdentity::parse(b"NVMe2R01 h s d"),
        Err(IdentityError::Version(2))
    );
    let long = format!("NVMe0R01 {} s", "h".repeat(224));
    assert_eq!(
        PskIdentity::parse(long.as_bytes()),
        Err(IdentityError::Format)
    );
}

/// libnvme before 1.16 (Debian 13's nvme-cli): the same steps with its own
/// HKDF info layout; vectors from OpenSSL's HKDF over that layout.
#[test]
fn libnvme_compat_vectors_and_detection() {
    let c = Derivation::LibnvmeCompat;
    let k = ConfiguredPsk::from_key(Some(PskHash::Sha256), &key(32))
        .unwrap()
        .with_derivation(c);
    assert_eq!(
        hex(&k.retained(HOST, c)),
        "c8b6cf1b838331a52e40d5d8ffe22e3b5394cd2ab397fd3a65d5385925125171"
    );
    let (id0, psk0) = k.derive(HOST, SUB, 0);
    assert_eq!(
        hex(&psk0),
        "f3488b6be20b22268b91e6918c1ec754122d4a8c2f3b077fba24f97abc9e4ec0"
    );
    let (id1, psk1) = k.derive(HOST, SUB, 1);
    assert_eq!(
        id1.digest.as_deref(),
        Some("PzOQTRhmZExZJtEzAi4xHGcUV/fBOYcG8Mam5DtLzq8=")
    );
    assert_eq!(
        hex(&psk1),
        "a739ab65f67fff872d0143fcb02895884af6b342e95a55b143162d5351e1cf69"
    );
    let k48 = ConfiguredPsk::from_key(Some(PskHash::Sha384), &key(48))
        .unwrap()
        .with_derivation(c);
    let (_, p) = k48.derive(HOST, SUB, 0);
    assert_eq!(
        hex(&p),
        "5143a1e3c9d782fdf99e8455ed682316a750fbec8a1e355156ecf6e535d49c42166f7d57a1afc41778129730569fe929"
    );
    let (_, p) = k48.derive(HOST, SUB, 1);
    assert_eq!(
        hex(&p),
        "f3bee0000206258bfe59b8805ecd22dca9254a935b4aefa84923270974512fbf79323771df63eaeb888472f395b9f4ef"
    );
    // A target that holds the key as RFC 8446: the v1 digest tells it the
    // host derived the compat way; a v0 identity takes the key's setting.
    let plain = ConfiguredPsk::from_key(Some(PskHash::Sha256), &key(32)).unwrap();
    assert_eq!(id1.tls_psk_from(&plain), Some((psk1, c)));
    assert_eq!(
        id0.tls_psk_from(&plain).map(|x| x.1),
        Some(Derivation::Rfc8446)
    );
    assert_eq!(id0.tls_psk_from(&k), Some((psk0, c)));
    // hh 00: no retained derivation, the TLS PSK still differs
    let raw = ConfiguredPsk::from_key(None, &key(32)).unwrap();
    let (_, a) = raw.derive(HOST, SUB, 0);
    let (_, b) = raw.clone().with_derivation(c).derive(HOST, SUB, 0);
    assert_ne!(a, b);
}
