//! The member-state record outside the volume (`state_hook.rs`): a write
//! that skipped a member is acknowledged only after the record landed, a
//! record that cannot land fences, and a member that an earlier owner wrote
//! after this one took over is rebuilt in full, never resynced.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockOp};
use parking_lot::Mutex;

use super::{BS, Model, Rig, cfg, random_write, vwrite};
use crate::layout::LayoutKind;
use crate::superblock::{MemberState, SB_BYTES, Superblock};
use crate::testutil::{Rng, block_on};
use crate::volume::member_io::{abuf, dev_io};
use crate::volume::{StateHook, StateRecord, Volume};

/// A hook that keeps what it was given; fails while `fail` holds a reason.
/// What a test hook keeps, and the failure it answers with while set.
type Kept = (Arc<Mutex<Vec<StateRecord>>>, Arc<Mutex<Option<String>>>);

fn recorder() -> (StateHook, Kept) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let fail = Arc::new(Mutex::new(None::<String>));
    let (g, f) = (got.clone(), fail.clone());
    let hook: StateHook = Arc::new(move |rec| {
        let (g, f) = (g.clone(), f.clone());
        Box::pin(async move {
            // as etcd would: the answer comes later than the call
            tokio::task::yield_now().await;
            if let Some(why) = f.lock().clone() {
                return Err(why);
            }
            g.lock().push(rec);
            Ok(())
        })
    });
    (hook, (got, fail))
}

#[test]
fn a_write_that_skips_a_member_is_acknowledged_after_the_record() {
    block_on(async {
        let rig = Rig::new(3, 64);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let (hook, (got, _)) = recorder();
        vol.set_state_hook(Some(hook));
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(5);
        for _ in 0..20 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        assert!(got.lock().is_empty(), "no state change, no record");
        rig.faults[2].fail_now();
        let data = vec![7u8; 2 * BS as usize];
        vwrite(&vol, 4, &data).await.unwrap();
        model.apply(4, &data);
        let recs = got.lock().clone();
        assert_eq!(recs.len(), 1, "{recs:?}");
        assert_eq!(recs[0].states[2], MemberState::Failed);
        assert_eq!(recs[0].states[0], MemberState::Active);
        assert_eq!(recs[0].generation, vol.generation());
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        assert_eq!(got.lock().len(), 1, "the same states are recorded once");
        model.check(&vol, "degraded").await;
    });
}

#[test]
fn a_record_that_cannot_land_fences_and_the_write_is_refused() {
    block_on(async {
        let rig = Rig::new(2, 64);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
            .await
            .unwrap();
        let (hook, (got, fail)) = recorder();
        vol.set_state_hook(Some(hook));
        *fail.lock() = Some("etcd unreachable".into());
        rig.faults[1].fail_now();
        let e = vwrite(&vol, 0, &vec![1u8; BS as usize]).await.unwrap_err();
        assert!(e.to_string().contains("etcd unreachable"), "{e}");
        assert!(vol.is_fenced());
        assert!(got.lock().is_empty());
        // and nothing later goes through
        assert!(vwrite(&vol, 8, &vec![2u8; BS as usize]).await.is_err());
    });
}

/// Writes `dev`'s superblock again at `generation`.
async fn bump_generation(dev: &Arc<dyn BlockDevice>, generation: u64) {
    let (buf, r) = dev_io(dev, BlockOp::Read, 0, SB_BYTES, abuf(SB_BYTES)).await;
    r.unwrap();
    let mut sb = Superblock::decode(&buf).unwrap();
    sb.generation = generation;
    let bytes = sb.encode();
    let mut out = abuf(SB_BYTES);
    out.copy_from_slice(&bytes);
    let (_, r) = dev_io(dev, BlockOp::Write { fua: true }, 0, SB_BYTES, out).await;
    r.unwrap();
}

#[test]
fn a_member_written_by_another_owner_is_rebuilt_in_full() {
    block_on(async {
        let rig = Rig::new(2, 64);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(9);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[1].fail_now();
        random_write(&mut rng, &vol, &mut model).await;
        assert_eq!(vol.member_states()[1], MemberState::Failed);
        rig.faults[1].heal();
        // Another owner wrote member 1's superblock past this volume's generation.
        let dev: Arc<dyn BlockDevice> = rig.faults[1].clone();
        bump_generation(&dev, vol.generation() + 3).await;
        let e = vol.re_add(1, dev.clone()).await.unwrap_err();
        assert!(e.to_string().contains("another owner"), "{e}");
        let rep = vol.re_add_distrusted(1, dev).await.unwrap();
        assert!(rep.full_rebuild, "{rep:?}");
        assert!(rep.reason.unwrap().contains("another owner"));
        vol.rebuild(Default::default()).await.unwrap();
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
        rig.faults[0].fail_now();
        model
            .check(&vol, "served by the rebuilt member alone")
            .await;
    });
}
