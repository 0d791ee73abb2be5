//! The TLS PSK decoders on arbitrary bytes (TP 8011): a PSK identity is
//! what a host puts in its ClientHello, so the target parses it untrusted;
//! a configured key comes from a file. Nothing may panic; what parses
//! survives a round trip, and a key only fits identities of its own hash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme_wire::tls_psk::{ConfiguredPsk, PskHash, PskIdentity};

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = PskIdentity::parse(data) {
        assert_eq!(id.encode().as_bytes(), data);
        for (hash, fill) in [(PskHash::Sha256, 1u8), (PskHash::Sha384, 2)] {
            let k = ConfiguredPsk::from_key(Some(hash), &vec![fill; hash.key_len()]).unwrap();
            let psk = id.tls_psk_from(&k);
            if hash != id.hash {
                assert!(psk.is_none());
            } else if id.digest.is_none() {
                assert_eq!(psk.map(|p| p.0.len()), Some(hash.key_len()));
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(k) = ConfiguredPsk::parse(&text) {
        assert_eq!(ConfiguredPsk::parse(&k.to_interchange()), Ok(k.clone()));
        let (id, psk) = k.derive("nqn.2014-08.org.nvmexpress:uuid:f", "nqn.2026-01.x:s", 1);
        assert_eq!(id.tls_psk_from(&k).map(|p| p.0), Some(psk));
    }
});
