//! The background parity passes: the initial sync after create (while the
//! volume serves, and across a crash) and a stoppable scrub.

use std::sync::atomic::Ordering;

use blockdev::{BlockOp, IoRequest};

use super::{BS, META, Model, Rig, STRIP, buf_with, cfg, random_write, vread};
use crate::layout::LayoutKind;
use crate::rebuild::RebuildOptions;
use crate::superblock::MemberState;
use crate::testutil::{Rng, block_on};
use crate::volume::{SyncControl, Volume, VolumeConfig};

/// Members full of junk, so that parity must be computed.
async fn junk_rig(n: usize, stripes: u64) -> Rig {
    let rig = Rig::new(n, stripes);
    for (i, m) in rig.mems.iter().enumerate() {
        let mut junk = vec![0u8; (stripes * u64::from(STRIP)) as usize];
        Rng::new(100 + i as u64).fill(&mut junk);
        let done = m
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba: META / BS,
                blocks: (junk.len() as u64 / BS) as u32,
                buf: buf_with(&junk),
            })
            .await;
        done.result.unwrap();
    }
    rig
}

fn unclean(kind: LayoutKind) -> VolumeConfig {
    VolumeConfig {
        assume_clean: false,
        ..cfg(kind)
    }
}

#[test]
fn initial_sync_runs_after_create_while_writes_go_on() {
    for (kind, n) in [(LayoutKind::Raid5, 4), (LayoutKind::Raid6, 6)] {
        block_on(async {
            let rig = junk_rig(n, 32).await;
            let vol = Volume::create(rig.members(), unclean(kind)).await.unwrap();
            let regions = vol.unsynced_regions();
            assert!(regions > 1, "{kind}: {regions}");
            // Not synced yet: parity disagrees somewhere.
            assert!(vol.scrub(false).await.inconsistent_count > 0, "{kind}");
            let mut model = Model::new(&vol);
            model.data = vread(&vol, 0, model.blocks()).await;
            let mut rng = Rng::new(5);
            for _ in 0..30 {
                random_write(&mut rng, &vol, &mut model).await;
            }
            let ctl = SyncControl::default();
            let rep = vol.initial_sync(&ctl).await.unwrap();
            assert!(!rep.cancelled);
            assert_eq!(rep.skipped, 0);
            assert_eq!(ctl.done.load(Ordering::Relaxed), 32, "{kind}");
            assert_eq!(ctl.total.load(Ordering::Relaxed), 32);
            assert_eq!(vol.unsynced_regions(), 0);
            assert_eq!(vol.scrub(false).await.inconsistent_count, 0, "{kind}");
            model.check(&vol, "after the initial sync").await;
            // Parity is real now: a member lost reads back the same data.
            rig.faults[1].fail_now();
            model.check(&vol, "degraded after the initial sync").await;
        });
    }
}

#[test]
fn a_crash_before_the_initial_sync_ends_resyncs_the_rest_at_assembly() {
    block_on(async {
        let rig = junk_rig(5, 32).await;
        let vol = Volume::create(rig.members(), unclean(LayoutKind::Raid5))
            .await
            .unwrap();
        assert!(vol.unsynced_regions() > 0);
        // A stopped sync syncs nothing and leaves every region dirty.
        let ctl = SyncControl::default();
        ctl.cancel.store(true, Ordering::Relaxed);
        assert!(vol.initial_sync(&ctl).await.unwrap().cancelled);
        let mut rng = Rng::new(2);
        let mut model = Model::new(&vol);
        model.data = vread(&vol, 0, model.blocks()).await;
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        // A power cut: no close.
        drop(vol);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.unsynced_regions(), 0);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        model.check(&vol, "assembled after a cut-short sync").await;
    });
}

#[test]
fn scrub_reports_progress_and_mismatches_and_stops_when_asked() {
    block_on(async {
        let rig = Rig::new(4, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(9);
        for _ in 0..20 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        // Rot one strip of member 2 below the volume.
        let mut junk = vec![0u8; STRIP as usize];
        rng.fill(&mut junk);
        let done = rig.mems[2]
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba: META / BS + 3 * u64::from(STRIP) / BS,
                blocks: STRIP / BS as u32,
                buf: buf_with(&junk),
            })
            .await;
        done.result.unwrap();
        let ctl = SyncControl::default();
        let rep = vol.scrub_with(false, &ctl).await;
        assert_eq!(rep.inconsistent, vec![3]);
        assert_eq!(ctl.mismatches.load(Ordering::Relaxed), 1);
        assert_eq!(ctl.done.load(Ordering::Relaxed), 16);
        assert!(!rep.cancelled);
        // A scrub asked to stop checks nothing more.
        let stopped = SyncControl::default();
        stopped.cancel.store(true, Ordering::Relaxed);
        let rep = vol.scrub_with(true, &stopped).await;
        assert!(rep.cancelled);
        assert_eq!(rep.stripes_checked, 0);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 1, "not repaired");
        let rep = vol.scrub_with(true, &SyncControl::default()).await;
        assert_eq!(rep.repaired, 1);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
    });
}

/// A raid1 of `n` copies whose owner "crashed" after writing 0xAA to
/// stripe 5 (region 2 of 4): the volume dropped with its bit set, and copy
/// 1 torn there (0x55) behind its back. The stripe's first LBA and its
/// byte offset on a member.
async fn torn_mirror(n: usize) -> (Rig, u64, u64) {
    let rig = Rig::new(n, 8);
    let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
        .await
        .unwrap();
    let lba = 5 * u64::from(STRIP) / BS;
    super::vwrite(&vol, lba, &[0xAAu8; 4096]).await.unwrap();
    drop(vol);
    let at = META + lba * BS;
    super::put_member_bytes(&rig.mems[1], at, &[0x55u8; 4096]);
    (rig, lba, at)
}

/// Sets `member`'s state as if the volume had got there (a rebuild or
/// resync under way), in memory and in the superblocks.
async fn set_state(vol: &Volume, member: usize, state: MemberState) {
    {
        let mut m = vol.inner.members.write();
        m.states[member] = state;
        m.changed();
        m.version += 1;
    }
    vol.inner.persist_superblock(true).await;
}

/// Closes `vol` clean and assembles it again as a takeover would: nothing
/// dirty, nothing deferred, every copy Active.
async fn closed_clean_defers_nothing(rig: &Rig, vol: Volume) {
    vol.close().await.unwrap();
    drop(vol);
    let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
        .await
        .unwrap();
    assert!(!deferred);
    assert!(
        vol.member_states()
            .iter()
            .all(|s| *s == MemberState::Active)
    );
    vol.close().await.unwrap();
}

/// A takeover's assembly of a mirror its owner left dirty (a crash with the
/// copies torn) serves before the resync: the first copy is the one of
/// record, the other Resyncing over the dirty regions; every read returns
/// the first copy's data until the background pass makes them agree. A
/// volume closed clean defers nothing.
#[test]
fn a_takeover_defers_a_mirrors_crash_resync_to_the_background() {
    block_on(async {
        let (rig, lba, at) = torn_mirror(2).await;
        let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
            .await
            .unwrap();
        assert!(deferred);
        assert_eq!(vol.member_states()[0], MemberState::Active);
        assert!(matches!(
            vol.member_states()[1],
            MemberState::Resyncing { .. }
        ));
        for _ in 0..4 {
            assert_eq!(vread(&vol, lba, 1).await, vec![0xAAu8; 4096]);
        }
        // Copy 1 still holds the torn block: nothing was resynced yet.
        assert_eq!(
            super::member_bytes(&rig.mems[1], at, 4096),
            vec![0x55u8; 4096]
        );
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
        assert_eq!(
            super::member_bytes(&rig.mems[1], at, 4096),
            vec![0xAAu8; 4096]
        );
        closed_clean_defers_nothing(&rig, vol).await;
    });
}

/// A takeover (or move) before the last owner's mirror resync ended (copy
/// 1 still Resyncing, its checkpoint past a region written since, torn by
/// the crash) defers again instead of resyncing every dirty region before
/// it serves: the checkpoint goes back to 0, reads of both torn blocks come
/// from copy 0, and the background pass makes the copies agree.
#[test]
fn a_takeover_during_a_mirrors_resync_defers_it_again() {
    block_on(async {
        // The first crash: stripe 5 torn on copy 1.
        let (rig, lba5, at5) = torn_mirror(2).await;
        let lba1 = u64::from(STRIP) / BS;
        let at1 = META + lba1 * BS;
        let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
            .await
            .unwrap();
        assert!(deferred);
        // Its resync got past stripe 3 (as far as the superblocks know),
        // then stripe 1 (region 0) was written to both copies.
        set_state(&vol, 1, MemberState::Resyncing { checkpoint: 4 }).await;
        super::vwrite(&vol, lba1, &[0xBBu8; 4096]).await.unwrap();
        // The second crash tears stripe 1 on copy 1, below its checkpoint.
        drop(vol);
        super::put_member_bytes(&rig.mems[1], at1, &[0x66u8; 4096]);
        let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
            .await
            .unwrap();
        assert!(deferred, "resynced before serving");
        assert_eq!(
            vol.member_states(),
            [
                MemberState::Active,
                MemberState::Resyncing { checkpoint: 0 }
            ]
        );
        // Nothing copied yet, and every read comes from copy 0.
        assert_eq!(super::member_bytes(&rig.mems[1], at1, 4096), [0x66u8; 4096]);
        assert_eq!(super::member_bytes(&rig.mems[1], at5, 4096), [0x55u8; 4096]);
        for _ in 0..4 {
            assert_eq!(vread(&vol, lba1, 1).await, [0xBBu8; 4096]);
            assert_eq!(vread(&vol, lba5, 1).await, [0xAAu8; 4096]);
        }
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
        assert_eq!(super::member_bytes(&rig.mems[1], at1, 4096), [0xBBu8; 4096]);
        assert_eq!(super::member_bytes(&rig.mems[1], at5, 4096), [0xAAu8; 4096]);
        closed_clean_defers_nothing(&rig, vol).await;
    });
}

/// A three-way mirror taken over with a copy missing resyncs first, as
/// before: its held bitmap covers everything written since that copy
/// failed, and deferring would demote the second copy over all of it (no
/// redundancy there until the background pass ends). Both copies stay
/// Active, the torn block mended before the volume serves.
#[test]
fn a_takeover_with_a_mirror_copy_missing_resyncs_first() {
    block_on(async {
        let (rig, _, at) = torn_mirror(3).await;
        rig.faults[2].fail_now();
        let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
            .await
            .unwrap();
        assert!(!deferred);
        assert_eq!(
            vol.member_states(),
            [
                MemberState::Active,
                MemberState::Active,
                MemberState::Failed
            ]
        );
        assert_eq!(super::member_bytes(&rig.mems[1], at, 4096), [0xAAu8; 4096]);
    });
}

/// A mirror with a member Rebuilding (a replacement not yet full) resyncs
/// its dirty regions before it serves, as before: the rebuild's checkpoint
/// cannot go back without rebuilding the whole member.
#[test]
fn a_takeover_during_a_mirrors_rebuild_resyncs_first() {
    block_on(async {
        let rig = Rig::new(3, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
            .await
            .unwrap();
        let lba = u64::from(STRIP) / BS;
        set_state(&vol, 2, MemberState::Rebuilding { checkpoint: 4 }).await;
        super::vwrite(&vol, lba, &[0xBBu8; 4096]).await.unwrap();
        drop(vol);
        let at = META + lba * BS;
        super::put_member_bytes(&rig.mems[1], at, &[0x66u8; 4096]);
        let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
            .await
            .unwrap();
        assert!(!deferred);
        assert_eq!(super::member_bytes(&rig.mems[1], at, 4096), [0xBBu8; 4096]);
        for _ in 0..6 {
            assert_eq!(vread(&vol, lba, 1).await, [0xBBu8; 4096]);
        }
    });
}

/// A takeover's assembly of a parity layout its owner left dirty serves
/// before the resync: the dirty regions are unsynced (held on disk across
/// another crash), a write there is fine, and the background sync makes
/// parity agree. Every read returns the data written before the crash.
#[test]
fn a_takeover_defers_a_parity_resync_to_the_background() {
    for (kind, n) in [(LayoutKind::Raid5, 3), (LayoutKind::Raid6, 5)] {
        block_on(async {
            let rig = Rig::new(n, 8);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let (k, stripe) = (vol.layout().data_columns(), 5u64);
            let lba = stripe * k as u64 * u64::from(STRIP) / BS;
            super::vwrite(&vol, lba, &[0xAAu8; 4096]).await.unwrap();
            // The "crash": dropped with the region's bit set, and the
            // stripe's first parity torn behind its back (a cut update).
            let p = vol.layout().column_member(stripe, k);
            let at = META + vol.layout().strip_lba(stripe, 0) * BS;
            drop(vol);
            super::put_member_bytes(&rig.mems[p], at, &[0x55u8; 4096]);
            let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
                .await
                .unwrap();
            assert!(deferred, "{kind}");
            assert!(vol.unsynced_regions() > 0, "{kind}");
            assert!(
                vol.member_states()
                    .iter()
                    .all(|s| *s == MemberState::Active)
            );
            assert_eq!(vread(&vol, lba, 1).await, vec![0xAAu8; 4096], "{kind}");
            assert_eq!(vol.scrub(false).await.inconsistent_count, 1, "{kind}");
            // Another crash before the sync: the region is still dirty.
            drop(vol);
            let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
                .await
                .unwrap();
            assert!(deferred, "{kind}: the bits stayed on disk");
            // A write into the unsynced stripe, then the background sync.
            super::vwrite(&vol, lba + 1, &[0xBBu8; 4096]).await.unwrap();
            vol.set_intent_clear_age(std::time::Duration::ZERO);
            let rep = vol.initial_sync(&SyncControl::default()).await.unwrap();
            assert_eq!(rep.skipped, 0, "{kind}");
            assert_eq!(vol.unsynced_regions(), 0, "{kind}");
            assert_eq!(vol.scrub(false).await.inconsistent_count, 0, "{kind}");
            assert_eq!(vread(&vol, lba, 1).await, vec![0xAAu8; 4096], "{kind}");
            assert_eq!(vread(&vol, lba + 1, 1).await, vec![0xBBu8; 4096], "{kind}");
            // Synced, the bits are cleared on disk: nothing left to defer.
            drop(vol);
            let (vol, deferred) = Volume::assemble_deferring_resync(rig.members())
                .await
                .unwrap();
            assert!(!deferred, "{kind}");
            assert_eq!(vol.scrub(false).await.inconsistent_count, 0, "{kind}");
            vol.close().await.unwrap();
        });
    }
}
