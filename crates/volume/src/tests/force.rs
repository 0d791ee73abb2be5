//! Forced assembly (md's `--assemble --force`): more members failed than
//! the layout tolerates, the freshest taken back, and an account of what
//! may be stale.

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};

use super::{BS, Model, Rig, cfg, random_write, vread, vwrite};
use crate::layout::LayoutKind;
use crate::rebuild::RebuildOptions;
use crate::superblock::MemberState;
use crate::testutil::{Rng, block_on};
use crate::volume::{ForcedFrom, Volume, VolumeError};

async fn heads(rig: &Rig) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for m in &rig.mems {
        let mut b = AlignedBuf::new(64 << 10);
        b.set_len(64 << 10);
        let done = m
            .submit(IoRequest {
                op: BlockOp::Read,
                lba: 0,
                blocks: ((64 << 10) / BS) as u32,
                buf: b,
            })
            .await;
        done.result.unwrap();
        out.push(done.buf.to_vec());
    }
    out
}

#[test]
fn force_brings_back_the_fresher_of_two_failed_members() {
    block_on(async {
        let stripes = 128u64;
        let rig = Rig::new(4, stripes);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(21);
        vol.set_intent_clear_age(std::time::Duration::ZERO);
        for _ in 0..40 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        let flush = || async {
            vol.submit(IoRequest {
                op: BlockOp::Flush,
                lba: 0,
                blocks: 0,
                buf: AlignedBuf::new(0),
            })
            .await
            .result
            .unwrap()
        };
        flush().await;
        // Member 1 drops off; writes go on degraded into stripes 8..12 only.
        rig.faults[1].fail_now();
        let per = vol.layout().stripe_data_blocks();
        for i in 0..8 {
            let lba = 8 * per + i * per / 2;
            let mut data = vec![0u8; 2 * BS as usize];
            rng.fill(&mut data);
            vwrite(&vol, lba, &data).await.unwrap();
            model.apply(lba, &data);
        }
        assert_eq!(vol.member_states()[1], MemberState::Failed);
        // Then member 2 is failed too: the volume has failed.
        vol.fail_member(2).await.unwrap();
        assert!(vol.is_failed());
        vol.close().await.unwrap();
        drop(vol);
        rig.faults.iter().for_each(|f| f.heal());

        // Without force: refused, and nothing written.
        let before = heads(&rig).await;
        let Err(e) = Volume::assemble(rig.members()).await else {
            panic!("assembled with two members failed")
        };
        assert!(matches!(e, VolumeError::TooManyFailed { .. }), "{e}");
        assert!(before == heads(&rig).await, "a refused assembly wrote");
        let preview = Volume::force_preview(&rig.members()).await.unwrap();
        assert_eq!(preview.len(), 1, "{preview:?}");
        assert_eq!(preview[0].position, 2, "{preview:?}");
        assert!(before == heads(&rig).await, "a preview wrote");

        let (vol, rep) = Volume::assemble_force(rig.members()).await.unwrap();
        assert_eq!(rep.forced.len(), 1, "{rep:?}");
        let f = &rep.forced[0];
        assert_eq!(f.position, 2, "the fresher member comes back: {rep:?}");
        assert!(matches!(f.from, ForcedFrom::Failed { failed_at } if failed_at > 0));
        assert!(f.generation < rep.volume_generation, "{rep:?}");
        assert_eq!(rep.still_failed, vec![1]);
        assert!(rep.unknown.is_none(), "{rep:?}");
        let ranges = rep.stale_ranges.clone().unwrap();
        assert!(!ranges.is_empty(), "{rep:?}");
        // The stale ranges cover the writes made while member 1 was away,
        // and nothing far from them.
        let stale = |lba: u64| {
            ranges
                .iter()
                .any(|r| lba >= r.lba && lba < r.lba + r.blocks)
        };
        assert!(stale(8 * per) && stale(11 * per + per / 2), "{ranges:?}");
        assert!(!stale(0) && !stale(100 * per), "{ranges:?}");
        for r in &ranges {
            assert_eq!(r.offset_bytes, r.lba * BS);
            assert_eq!(r.len_bytes, r.blocks * BS);
        }
        assert_eq!(vol.member_states()[2], MemberState::Active);
        assert_eq!(vol.member_states()[1], MemberState::Failed);
        assert!(!vol.is_failed());
        // Outside the stale ranges every block is right (member 1's columns
        // reconstructed from the others, the forced one included).
        let blocks = model.blocks();
        let mut lba = 0;
        while lba < blocks {
            let n = 16.min(blocks - lba);
            if !(lba..lba + n).any(stale) {
                let got = vread(&vol, lba, n).await;
                let at = lba as usize * model.bs;
                assert!(
                    got[..] == model.data[at..at + got.len()],
                    "blocks {lba}+{n} outside the stale ranges differ"
                );
            }
            lba += n;
        }
        // Member 2 got every write before it failed: here nothing is lost.
        model.check(&vol, "after force").await;
        // It runs degraded; member 1 can be re-added from here.
        let r = vol.re_add(1, rig.faults[1].clone()).await.unwrap();
        assert!(!r.full_rebuild, "{r:?}");
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
        model.check(&vol, "after re-add").await;
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
    });
}

#[test]
fn force_is_refused_when_too_few_members_can_come_back() {
    block_on(async {
        let rig = Rig::new(4, 32);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.close().await.unwrap();
        drop(vol);
        // Two members gone entirely: nothing to take back.
        let members: Vec<_> = rig.members().into_iter().take(2).collect();
        let before = heads(&rig).await;
        let Err(e) = Volume::assemble_force(members).await else {
            panic!("force-assembled with two members missing")
        };
        assert!(matches!(e, VolumeError::ForceRefused(_)), "{e}");
        assert!(e.to_string().contains("only 0 can be taken back"), "{e}");
        assert!(
            before == heads(&rig).await,
            "a refused forced assembly wrote"
        );
    });
}

#[test]
fn force_on_a_healthy_volume_forces_nothing() {
    block_on(async {
        let rig = Rig::new(3, 32);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.close().await.unwrap();
        drop(vol);
        let (vol, rep) = Volume::assemble_force(rig.members()).await.unwrap();
        assert!(
            rep.forced.is_empty() && rep.still_failed.is_empty(),
            "{rep:?}"
        );
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
    });
}
