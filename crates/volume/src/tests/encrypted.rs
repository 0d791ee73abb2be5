//! Encrypted volumes: members hold only ciphertext, assembly needs the key,
//! rebuild and scrub work without it, a rewrap keeps the data.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockOp, IoRequest};

use super::{BS, Rig, cfg, try_read, vread, vwrite};
use crate::crypt::{DataKey, Kek};
use crate::layout::LayoutKind;
use crate::rebuild::RebuildOptions;
use crate::superblock::MemberState;
use crate::testutil::block_on;
use crate::volume::{Volume, VolumeConfig};

/// A pattern no ciphertext shows by chance.
fn pattern(blocks: u64) -> Vec<u8> {
    b"FLASHPOOL-PLAINTEXT-"
        .iter()
        .copied()
        .cycle()
        .take((blocks * BS) as usize)
        .collect()
}

fn holds(dev: &Arc<dyn BlockDevice>, needle: &[u8]) -> bool {
    let g = dev.geometry();
    let bytes = g.size_bytes() as usize;
    let mut b = blockdev::AlignedBuf::new(bytes);
    b.set_len(bytes);
    let done = block_on(dev.submit(IoRequest {
        op: BlockOp::Read,
        lba: 0,
        blocks: g.num_blocks as u32,
        buf: b,
    }));
    done.result.unwrap();
    done.buf.windows(needle.len()).any(|w| w == needle)
}

fn encrypted_cfg(kind: LayoutKind, kek: &Kek) -> (VolumeConfig, DataKey) {
    let key = DataKey::generate().unwrap();
    let env = kek.wrap(&key).unwrap();
    let mut c = cfg(kind);
    c.key = Some((env, key.clone()));
    (c, key)
}

#[test]
fn every_layout_keeps_only_ciphertext_on_members_and_needs_the_key() {
    for (kind, n) in [
        (LayoutKind::Concat, 2),
        (LayoutKind::Raid0, 3),
        (LayoutKind::Raid1, 2),
        (LayoutKind::Raid5, 4),
        (LayoutKind::Raid6, 5),
        (LayoutKind::Erasure { k: 3, m: 2 }, 5),
    ] {
        block_on(async {
            let rig = Rig::new(n, 8);
            let kek = Kek::generate().unwrap();
            let (c, key) = encrypted_cfg(kind, &kek);
            let vol = Volume::create(rig.members(), c).await.unwrap();
            assert!(vol.is_encrypted() && !vol.is_locked());
            let data = pattern(6);
            vwrite(&vol, 3, &data).await.unwrap();
            assert_eq!(vread(&vol, 3, 6).await, data, "{kind}");
            // Never written: zeroes, as unencrypted.
            assert!(vread(&vol, 12, 2).await.iter().all(|&b| b == 0), "{kind}");
            vol.close().await.unwrap();
            for m in &rig.mems {
                assert!(
                    !holds(m, b"FLASHPOOL-PLAINTEXT-"),
                    "{kind}: plaintext on a member"
                );
            }
            drop(vol);
            // Reassembled: locked until the key is given; I/O refused, not garbage.
            let vol = Volume::assemble(rig.members()).await.unwrap();
            assert!(vol.is_locked(), "{kind}");
            let e = try_read(&vol, 3, 1).await.unwrap_err();
            assert!(e.to_string().contains("encrypted and locked"), "{e}");
            assert!(vwrite(&vol, 3, &pattern(1)).await.is_err());
            // A wrong key is refused by the check value.
            let wrong = DataKey::generate().unwrap();
            let e = vol.unlock(&wrong).unwrap_err();
            assert!(e.to_string().contains("key check value"), "{e}");
            assert!(vol.is_locked());
            let unwrapped = kek.unwrap(&vol.key_envelope().unwrap()).unwrap();
            vol.unlock(&unwrapped).unwrap();
            assert_eq!(vread(&vol, 3, 6).await, data, "{kind}");
            drop(key);
        });
    }
}

#[test]
fn rebuild_and_scrub_work_on_ciphertext_and_a_rewrap_keeps_the_data() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut rig = Rig::with_block_size(5, 8, 512);
        let kek = Kek::generate().unwrap();
        let key = DataKey::generate().unwrap();
        let mut c = cfg(LayoutKind::Raid5);
        c.block_size = 512;
        c.key = Some((kek.wrap(&key).unwrap(), key));
        let vol = Volume::create(rig.members(), c).await.unwrap();
        let data = pattern(40); // 40 x 4 KiB = 320 blocks of 512 B
        vwrite(&vol, 7, &data).await.unwrap();
        vol.fail_member(1).await.unwrap();
        let s = {
            let size = rig.mems[0].geometry().size_bytes();
            crate::fault::FaultDevice::new(Arc::new(blockdev::MemDevice::new(size, 512).unwrap()))
        };
        vol.replace_member(1, s.clone()).await.unwrap();
        rig.faults[1] = s.clone();
        vol.start_rebuild(RebuildOptions::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(vol.member_states()[1], MemberState::Active);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        assert!(!holds(
            &(s.clone() as Arc<dyn BlockDevice>),
            b"FLASHPOOL-PLAINTEXT-"
        ));
        // Another KEK: the same data key rewrapped, nothing rewritten.
        let kek2 = Kek::generate().unwrap();
        let env2 = vol.wrap_key(&kek2).unwrap().unwrap();
        vol.rewrap(env2).await.unwrap();
        // Another data key is refused.
        let other = kek2.wrap(&DataKey::generate().unwrap()).unwrap();
        assert!(vol.rewrap(other).await.is_err());
        vol.close().await.unwrap();
        drop(vol);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        let env = vol.key_envelope().unwrap();
        assert_eq!(env.kek, kek2.id());
        assert!(kek.unwrap(&env).is_err(), "the old KEK no longer opens it");
        vol.unlock(&kek2.unwrap(&env).unwrap()).unwrap();
        assert_eq!(vread(&vol, 7, 320).await, data);
        // With the rebuilt member the only copy of its strips: still the data.
        rig.faults[0].fail_now();
        assert_eq!(vread(&vol, 7, 320).await, data);
    });
}
