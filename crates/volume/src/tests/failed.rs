//! A failed member is real on every layout: raid0 and concat stop using it
//! (I/O touching it fails, the rest serves), and beyond any layout's
//! tolerance the volume says it has failed. Replacements that cannot be
//! rebuilt are refused before anything changes.

use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};

use super::{BS, Rig, STRIP, cfg, spare, try_read, vwrite};
use crate::layout::LayoutKind;
use crate::testutil::block_on;
use crate::volume::{Volume, VolumeError};

async fn try_zero(vol: &Volume, lba: u64, blocks: u64) -> Result<(), blockdev::BlockError> {
    vol.submit(IoRequest {
        op: BlockOp::WriteZeroes,
        lba,
        blocks: blocks as u32,
        buf: AlignedBuf::new(0),
    })
    .await
    .result
}

fn pattern(lba: u64, blocks: u64, seed: u8) -> Vec<u8> {
    (0..blocks * BS)
        .map(|i| (lba * BS + i) as u8 ^ seed.wrapping_mul(31))
        .collect()
}

#[test]
fn a_failed_member_of_raid0_or_concat_gets_no_io_and_fails_what_touches_it() {
    block_on(async {
        for (kind, n) in [(LayoutKind::Raid0, 4), (LayoutKind::Concat, 3)] {
            let rig = Rig::new(n, 8);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let blocks = vol.geometry().num_blocks;
            // Pieces of one strip (raid0) or one member (concat) at most.
            let piece = u64::from(STRIP) / BS;
            for lba in (0..blocks).step_by(piece as usize) {
                let len = piece.min(blocks - lba);
                vwrite(&vol, lba, &pattern(lba, len, 1)).await.unwrap();
            }
            assert!(!vol.is_failed());
            vol.fail_member(1).await.unwrap();
            assert!(vol.is_failed(), "{kind}: beyond its tolerance of 0");
            assert!(vol.describe().contains("FAILED"), "{}", vol.describe());
            let before = rig.faults[1].stats();
            let mut touched = 0;
            for lba in (0..blocks).step_by(piece as usize) {
                let len = piece.min(blocks - lba);
                let on_failed = vol.layout().extents(lba, len).iter().any(|e| e.member == 1);
                let r = try_read(&vol, lba, len).await;
                let w = vwrite(&vol, lba, &pattern(lba, len, 2)).await;
                let z = try_zero(&vol, lba, len).await;
                if on_failed {
                    touched += 1;
                    for e in [r.map(drop).unwrap_err(), w.unwrap_err(), z.unwrap_err()] {
                        assert!(
                            matches!(e, blockdev::BlockError::TooManyFailed { ref failed, tolerates: 0, .. } if failed == &[1]),
                            "{kind} lba {lba}: {e}"
                        );
                    }
                } else {
                    assert_eq!(r.unwrap(), pattern(lba, len, 1), "{kind} lba {lba}");
                    w.unwrap();
                    z.unwrap();
                }
            }
            assert!(touched > 0);
            // A request spanning healthy and failed members fails whole and
            // writes none of them.
            let healthy_writes: u64 = [0, 2].iter().map(|&i| rig.faults[i].stats().writes).sum();
            assert!(vwrite(&vol, 0, &pattern(0, blocks, 3)).await.is_err());
            let after: u64 = [0, 2].iter().map(|&i| rig.faults[i].stats().writes).sum();
            assert_eq!(
                healthy_writes, after,
                "{kind}: a refused write wrote nothing"
            );
            let s = rig.faults[1].stats();
            assert_eq!(
                (s.reads, s.writes),
                (before.reads, before.writes),
                "{kind}: the failed member got I/O"
            );
            // It cannot be rebuilt, and the refusal changes nothing.
            let states = vol.member_states();
            let e = vol.replace_member(1, spare(&rig)).await.unwrap_err();
            assert!(
                matches!(e, VolumeError::CannotRebuild(_))
                    && e.to_string().contains("no redundancy"),
                "{e}"
            );
            assert_eq!(vol.member_states(), states);
        }
    });
}

#[test]
fn beyond_tolerance_a_parity_volume_fails_and_refuses_replacements() {
    block_on(async {
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vwrite(&vol, 0, &pattern(0, 8, 1)).await.unwrap();
        vol.fail_member(1).await.unwrap();
        assert!(!vol.is_failed(), "raid5 tolerates one");
        vol.check_replacement(1, &(spare(&rig) as Arc<dyn BlockDevice>))
            .unwrap();
        vol.fail_member(2).await.unwrap();
        assert!(vol.is_failed());
        assert_eq!(vol.incomplete_members(), [1, 2]);
        let e = vol.replace_member(1, spare(&rig)).await.unwrap_err();
        assert!(
            matches!(e, VolumeError::CannotRebuild(_)) && e.to_string().contains("[2]"),
            "{e}"
        );
        assert_eq!(vol.incomplete_members(), [1, 2], "nothing changed");
        // Every stripe of raid5 has a column on member 1 or 2 that a full
        // read needs: it fails with the volume's error.
        let blocks = vol.geometry().num_blocks;
        let e = try_read(&vol, 0, blocks.min(64)).await.unwrap_err();
        assert!(
            matches!(e, blockdev::BlockError::TooManyFailed { tolerates: 1, .. }),
            "{e}"
        );
        // A replacement while another member still rebuilds is refused on raid5.
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.fail_member(0).await.unwrap();
        vol.replace_member(0, spare(&rig)).await.unwrap();
        let e = vol
            .check_replacement(3, &(spare(&rig) as Arc<dyn BlockDevice>))
            .unwrap_err();
        assert!(e.to_string().contains("[0]"), "{e}");
    });
}
