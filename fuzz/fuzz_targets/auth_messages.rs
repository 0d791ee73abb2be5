//! DH-HMAC-CHAP: every authentication message decoder, and the controller's
//! state machine fed a sequence of Sends and Receives from the input. It
//! must never panic, and never authenticate (the fuzzer cannot know the secret).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use nvme_wire::auth::AuthMsg;
use nvme_wire::auth::dhchap::{HashId, Secret};
use nvmf_target::auth::{AuthSession, HostAuth};

fn fixed_rng(b: &mut [u8]) {
    b.fill(0x3C);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = AuthMsg::decode(data) {
        let _ = AuthMsg::decode(&m.encode());
    }
    let key = Secret::from_key(Some(HashId::Sha256), &[0x11; 32]).unwrap();
    let mut s = AuthSession::new(
        Arc::new(HostAuth::new(key, None)),
        "nqn.host",
        "nqn.sub",
        fixed_rng,
    );
    // Chunks: a length byte, then a Send of that many bytes; a 0 byte is a Receive.
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        if n == 0 {
            let _ = s.on_receive(4096);
            rest = tail;
            continue;
        }
        let n = usize::from(n).min(tail.len());
        s.on_send(&tail[..n]);
        rest = &tail[n..];
        assert!(!s.authenticated(), "authenticated without the secret");
    }
});
