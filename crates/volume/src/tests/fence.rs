//! Self-fencing on Reservation Conflict, member failure on Unreachable, and
//! the typed too-many-failed error.

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest, RecordKind};

use super::{BS, Model, Rig, cfg, random_write, spare, vwrite};
use crate::layout::LayoutKind;
use crate::rebuild::RebuildOptions;
use crate::superblock::MemberState;
use crate::testutil::{Rng, block_on};
use crate::volume::{Volume, VolumeError};

fn member_writes(rig: &Rig) -> u64 {
    rig.faults.iter().map(|f| f.stats().writes).sum()
}

async fn vread_result(vol: &Volume, lba: u64, blocks: u64) -> Result<(), BlockError> {
    let bs = vol.geometry().block_size as usize;
    let mut b = AlignedBuf::new(blocks as usize * bs);
    b.set_len(blocks as usize * bs);
    vol.submit(IoRequest {
        op: BlockOp::Read,
        lba,
        blocks: blocks as u32,
        buf: b,
    })
    .await
    .result
}

async fn vflush(vol: &Volume) -> Result<(), BlockError> {
    vol.submit(IoRequest {
        op: BlockOp::Flush,
        lba: 0,
        blocks: 0,
        buf: AlignedBuf::new(0),
    })
    .await
    .result
}

/// After the fence, every kind of I/O answers Fenced and not one more write
/// reaches any member.
async fn assert_fenced_and_silent(rig: &Rig, vol: &Volume) {
    assert!(vol.is_fenced());
    let before = member_writes(rig);
    let data = vec![7u8; 3 * BS as usize];
    for lba in [0u64, 5, 20] {
        let e = vwrite(vol, lba, &data)
            .await
            .expect_err("write while fenced");
        assert!(matches!(e, BlockError::Fenced(_)), "{e}");
        let e = vread_result(vol, lba, 3)
            .await
            .expect_err("read while fenced");
        assert!(matches!(e, BlockError::Fenced(_)), "{e}");
    }
    let e = vflush(vol).await.expect_err("flush while fenced");
    assert!(matches!(e, BlockError::Fenced(_)), "{e}");
    let zero = vol
        .submit(IoRequest {
            op: BlockOp::WriteZeroes,
            lba: 0,
            blocks: 4,
            buf: AlignedBuf::new(0),
        })
        .await
        .result;
    assert!(matches!(zero, Err(BlockError::Fenced(_))), "{zero:?}");
    assert!(matches!(
        vol.store_record(RecordKind::Reservations, b"x"),
        Err(BlockError::Fenced(_))
    ));
    assert!(matches!(vol.close().await, Err(BlockError::Fenced(_))));
    vol.fail_member(0).await.unwrap();
    vol.scrub(true).await;
    // No member is marked failed for it: this node lost them, they did not fail.
    assert!(
        vol.member_states()
            .iter()
            .all(|s| *s == MemberState::Active),
        "{:?}",
        vol.member_states()
    );
    assert_eq!(
        member_writes(rig),
        before,
        "a write reached a member after the fence"
    );
}

#[test]
fn reservation_conflict_fences_the_volume() {
    for (kind, n) in [
        (LayoutKind::Raid5, 5),
        (LayoutKind::Raid1, 2),
        (LayoutKind::Raid0, 3),
    ] {
        block_on(async {
            let rig = Rig::new(n, 16);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let mut model = Model::new(&vol);
            let mut rng = Rng::new(3);
            for _ in 0..10 {
                random_write(&mut rng, &vol, &mut model).await;
            }
            assert!(!vol.is_fenced());
            // Another node preempted our reservation on member 1.
            rig.faults[1].reservation_conflict_now();
            let data = vec![9u8; 16 * BS as usize];
            let e = vwrite(&vol, 0, &data)
                .await
                .expect_err("write after preemption");
            assert!(matches!(e, BlockError::Fenced(_)), "{kind}: {e}");
            assert!(vol.fence_reason().unwrap().contains("member 1"));
            assert_fenced_and_silent(&rig, &vol).await;
            // The members still hold what was acknowledged before: a new
            // owner assembles it (after the preemption is lifted here).
            drop(vol);
            rig.faults[1].heal();
            let vol = Volume::assemble(rig.members()).await.unwrap();
            assert!(!vol.is_fenced());
            assert!(
                vol.member_states()
                    .iter()
                    .all(|s| *s == MemberState::Active)
            );
        });
    }
}

#[test]
fn fence_on_demand_stops_rebuild_and_writes() {
    block_on(async {
        let mut rig = Rig::new(5, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(4);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        vol.fail_member(2).await.unwrap();
        let s = spare(&rig);
        vol.replace_member(2, s.clone()).await.unwrap();
        rig.faults[2] = s;
        assert!(vol.fence("ownership lease lost"));
        assert!(!vol.fence("again"));
        assert_eq!(vol.fence_reason().as_deref(), Some("ownership lease lost"));
        let before = member_writes(&rig);
        let e = vol
            .rebuild(RebuildOptions::default())
            .await
            .expect_err("fenced");
        assert!(matches!(e, VolumeError::Fenced(_)), "{e}");
        let e = vol
            .re_add(2, rig.faults[2].clone())
            .await
            .expect_err("fenced");
        assert!(matches!(e, VolumeError::Fenced(_)), "{e}");
        let e = vwrite(&vol, 3, &vec![1u8; BS as usize])
            .await
            .expect_err("fenced");
        assert!(matches!(e, BlockError::Fenced(_)), "{e}");
        assert_eq!(member_writes(&rig), before);
    });
}

#[test]
fn unreachable_member_fails_and_the_volume_runs_degraded() {
    block_on(async {
        let rig = Rig::new(5, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(6);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[3].unreachable_now();
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        assert!(!vol.is_fenced());
        assert_eq!(vol.member_states()[3], MemberState::Failed);
        model.check(&vol, "degraded after unreachable").await;
    });
}

#[test]
fn too_many_failed_is_typed() {
    block_on(async {
        let rig = Rig::new(5, 16);
        let mut c = cfg(LayoutKind::Raid5);
        c.name = "tmf".into();
        let vol = Volume::create(rig.members(), c).await.unwrap();
        rig.faults[1].fail_now();
        rig.faults[3].fail_now();
        let e = vwrite(&vol, 0, &vec![1u8; 40 * BS as usize])
            .await
            .expect_err("two of five failed");
        match e {
            BlockError::TooManyFailed {
                volume,
                layout,
                failed,
                tolerates,
            } => {
                assert_eq!(volume, "tmf");
                assert_eq!(layout, LayoutKind::Raid5.to_string());
                assert_eq!(failed, vec![1, 3]);
                assert_eq!(tolerates, 1);
            }
            e => panic!("not typed: {e}"),
        }
        // Striping without redundancy: one member is too many.
        let rig = Rig::new(3, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid0))
            .await
            .unwrap();
        rig.faults[2].fail_now();
        let e = vwrite(&vol, 0, &vec![1u8; 24 * BS as usize])
            .await
            .expect_err("raid0 member failed");
        assert!(
            matches!(&e, BlockError::TooManyFailed { failed, tolerates: 0, .. } if failed == &vec![2]),
            "{e}"
        );
    });
}
