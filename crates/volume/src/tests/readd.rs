//! Re-add through the write-intent bitmap: a failed member comes back and
//! only what it missed is resynced.

use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};

use super::{BS, Model, RES, Rig, STRIP, cfg, random_write, spare, vwrite};
use crate::fault::FaultDevice;
use crate::layout::LayoutKind;
use crate::rebuild::RebuildOptions;
use crate::superblock::{MemberState, SB_BYTES, Superblock};
use crate::testutil::{Rng, block_on};
use crate::volume::{Volume, VolumeError};

async fn vflush(vol: &Volume) {
    vol.submit(IoRequest {
        op: BlockOp::Flush,
        lba: 0,
        blocks: 0,
        buf: AlignedBuf::new(0),
    })
    .await
    .result
    .expect("flush");
}

/// A 2-way raid1 on a fresh rig.
async fn two_way_mirror() -> (Rig, Volume) {
    let rig = Rig::new(2, 64);
    let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
        .await
        .unwrap();
    (rig, vol)
}

fn member_write_blocks(f: &FaultDevice) -> u64 {
    f.stats().write_blocks
}

/// Writes `count` small random writes into the first `span` blocks.
async fn writes_in(rng: &mut Rng, vol: &Volume, model: &mut Model, span: u64, count: usize) {
    for _ in 0..count {
        let lba = rng.below(span - 2);
        let data: Vec<u8> = (0..2 * BS as usize).map(|_| rng.below(256) as u8).collect();
        vwrite(vol, lba, &data).await.unwrap();
        model.apply(lba, &data);
    }
}

#[test]
fn re_add_resyncs_only_the_stale_regions() {
    for (kind, n) in [
        (LayoutKind::Raid5, 5),
        (LayoutKind::Raid6, 6),
        (LayoutKind::Raid1, 2),
    ] {
        block_on(async {
            let stripes = 256u64;
            let rig = Rig::new(n, stripes);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let mut model = Model::new(&vol);
            let mut rng = Rng::new(11);
            vol.set_intent_clear_age(std::time::Duration::ZERO);
            for _ in 0..40 {
                random_write(&mut rng, &vol, &mut model).await;
            }
            vflush(&vol).await;
            // Member 1 drops off (a remote drive unreachable for a while);
            // writes go on degraded, into the first few stripes only.
            rig.faults[1].fail_now();
            let span = 4 * vol.layout().data_columns() as u64 * u64::from(STRIP) / BS;
            writes_in(&mut rng, &vol, &mut model, span, 12).await;
            assert_eq!(vol.member_states()[1], MemberState::Failed);
            // Flushes must not clear what member 1 missed.
            vflush(&vol).await;
            rig.faults[1].heal();
            let before = member_write_blocks(&rig.faults[1]);
            let rep = vol.re_add(1, rig.faults[1].clone()).await.unwrap();
            assert!(!rep.full_rebuild, "{kind}: {rep:?}");
            assert!(
                rep.stale_stripes > 0 && rep.stale_stripes <= 6,
                "{kind}: {rep:?}"
            );
            assert!(matches!(
                vol.member_states()[1],
                MemberState::Resyncing { checkpoint: 0 }
            ));
            // It serves clean regions at once, reconstructs stale ones.
            model.check(&vol, "re-added, before resync").await;
            vol.rebuild(RebuildOptions::default()).await.unwrap();
            let p = vol.rebuild_progress();
            assert!(p.resync && p.done_stripes == p.total_stripes, "{p:?}");
            assert_eq!(p.total_stripes, rep.stale_stripes);
            assert!(
                vol.member_states()
                    .iter()
                    .all(|s| *s == MemberState::Active)
            );
            let member_blocks = vol.layout().member_blocks(1);
            let wrote = member_write_blocks(&rig.faults[1]) - before;
            assert!(
                wrote * 4 < member_blocks,
                "{kind}: re-add wrote {wrote} blocks to the member; a full rebuild writes {member_blocks}"
            );
            // The re-added member carries the data: lose others instead.
            for i in (0..n)
                .filter(|&i| i != 1)
                .take(vol.layout().parity_columns())
            {
                rig.faults[i].fail_now();
            }
            model
                .check(&vol, &format!("{kind}: re-added member carries data"))
                .await;
            drop(vol);
            rig.faults.iter().for_each(|f| f.heal());
            let vol = Volume::assemble(rig.members()).await.unwrap();
            assert_eq!(vol.scrub(false).await.inconsistent_count, 0, "{kind}");
        });
    }
}

#[test]
fn re_add_survives_a_restart_midway() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let stripes = 64u64;
        let rig = Rig::new(5, stripes);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(12);
        for _ in 0..40 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[2].fail_now();
        for _ in 0..30 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        // A power cut while degraded: the kept bits survive it.
        drop(vol);
        let mut members = rig.members();
        members.remove(2);
        let vol = Volume::assemble(members).await.unwrap();
        assert_eq!(vol.member_states()[2], MemberState::Failed);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[2].heal();
        let rep = vol.re_add(2, rig.faults[2].clone()).await.unwrap();
        assert!(!rep.full_rebuild, "{rep:?}");
        assert!(rep.stale_stripes < stripes, "{rep:?}");
        // Resync slowly, cut the power in the middle.
        let opts = RebuildOptions {
            rate_bytes_per_sec: Some(64 << 10),
            checkpoint_every: 1,
        };
        let task = vol.start_rebuild(opts);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        task.abort();
        let _ = task.await;
        drop(vol);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        let MemberState::Resyncing { checkpoint } = vol.member_states()[2] else {
            panic!(
                "member 2 should still be resyncing: {:?}",
                vol.member_states()
            );
        };
        assert!(checkpoint > 0, "the checkpoint was persisted");
        model.check(&vol, "mid-resync after restart").await;
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
        rig.faults[0].fail_now();
        model.check(&vol, "re-added member carries data").await;
        drop(vol);
        rig.faults[0].heal();
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
    });
}

#[test]
fn re_add_refuses_the_wrong_device_and_changes_nothing() {
    block_on(async {
        let rig = Rig::new(5, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(13);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        // Not failed: nothing to re-add.
        let e = vol
            .re_add(1, rig.faults[1].clone())
            .await
            .expect_err("active");
        assert!(
            matches!(e, VolumeError::ReAddRefused { index: 1, .. }),
            "{e}"
        );
        rig.faults[1].fail_now();
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[1].heal();
        let states = vol.member_states();
        let generation = vol.generation();
        let other = Rig::new(5, 16);
        let foreign = Volume::create(other.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        drop(foreign);
        let blank = spare(&rig);
        for (what, dev) in [
            ("another position", rig.faults[3].clone()),
            ("another volume", other.faults[1].clone()),
            ("a blank device", blank.clone()),
        ] {
            let writes = dev.stats().writes;
            let e = vol.re_add(1, dev.clone()).await.expect_err(what);
            assert!(
                matches!(e, VolumeError::ReAddRefused { index: 1, .. }),
                "{what}: {e}"
            );
            assert_eq!(dev.stats().writes, writes, "{what}: the device was written");
            assert_eq!(vol.member_states(), states, "{what}");
            assert_eq!(vol.generation(), generation, "{what}");
        }
        // A copy from the future (written by another owner) is refused too.
        let mut sb = {
            let b = super::member_bytes(rig.faults[1].inner(), 0, 4096);
            Superblock::decode(&b).unwrap()
        };
        sb.generation = generation + 10;
        super::put_member_bytes(rig.faults[1].inner(), 0, &sb.encode());
        let e = vol
            .re_add(1, rig.faults[1].clone())
            .await
            .expect_err("newer");
        assert!(e.to_string().contains("generation"), "{e}");
        assert_eq!(vol.member_states(), states);
        model.check(&vol, "after refusals").await;
    });
}

#[test]
fn re_add_without_a_usable_record_rebuilds_in_full() {
    block_on(async {
        let rig = Rig::new(5, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(14);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[4].fail_now();
        drop(vol);
        // Reassembled without the bitmap: nothing records what it missed.
        let vol = Volume::assemble_with(rig.members(), false, true)
            .await
            .unwrap();
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[4].heal();
        let rep = vol.re_add(4, rig.faults[4].clone()).await.unwrap();
        assert!(rep.full_rebuild && rep.reason.is_some(), "{rep:?}");
        assert!(matches!(
            vol.member_states()[4],
            MemberState::Rebuilding { checkpoint: 0 }
        ));
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        rig.faults[0].fail_now();
        model.check(&vol, "fully rebuilt").await;
    });
}

/// Without a host flush, `settle_intents` (the node's bitmap daemon) makes
/// idle regions' writes durable, then clears their bits once they stayed
/// idle for the clear age; with nothing idle it does no I/O at all.
#[test]
fn settle_intents_clears_idle_bits_without_a_host_flush() {
    block_on(async {
        let rig = Rig::new(2, 256);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
            .await
            .unwrap();
        let flushes = || rig.faults.iter().map(|f| f.stats().flushes).sum::<u64>();
        let ios = || {
            rig.faults
                .iter()
                .map(|f| {
                    let s = f.stats();
                    s.reads + s.writes + s.flushes
                })
                .sum::<u64>()
        };
        vol.set_intent_clear_age(std::time::Duration::from_millis(50));
        vwrite(&vol, 7, &vec![1u8; BS as usize]).await.unwrap();
        let dirty = |v: &Volume| v.inner.intent.set_bits().iter().any(|w| *w != 0);
        assert!(dirty(&vol), "a write sets its region's bit");

        let f0 = flushes();
        vol.settle_intents().await.unwrap();
        assert!(flushes() > f0, "the idle region's writes were not flushed");
        assert!(dirty(&vol), "cleared before the region stayed idle");
        std::thread::sleep(std::time::Duration::from_millis(60));
        vol.settle_intents().await.unwrap();
        assert!(!dirty(&vol), "an idle region kept its bit");

        let before = ios();
        vol.settle_intents().await.unwrap();
        assert_eq!(ios(), before, "nothing idle, yet it did I/O");
        // On disk too: a crash now leaves nothing to resync.
        for m in &rig.mems {
            let mut buf = AlignedBuf::new(4096);
            buf.set_len(4096);
            let done = m
                .submit(IoRequest {
                    op: BlockOp::Read,
                    lba: crate::superblock::SB_BYTES as u64 / BS,
                    blocks: 1,
                    buf,
                })
                .await;
            done.result.unwrap();
            assert!(
                vol.inner.intent.dirty_regions(&done.buf[..]).is_empty(),
                "the cleared bits are not on disk"
            );
        }
    });
}

/// A copy that joins while the bitmap is held (a replacement, a re-add)
/// gets the bits held so far on its own disk: assembled later without the
/// copy that was there all along, a member still Resyncing is still stale
/// where it missed writes. Before, the replacement's bitmap was zeroed and
/// the re-added one kept its own: C was read back without the write below
/// (checked with the bitmap asserts left out).
#[test]
fn a_joining_copy_gets_the_held_bitmap_on_its_disk() {
    block_on(async {
        let rig = Rig::new(3, 64);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        // C goes away; a write it misses sets a held bit.
        rig.faults[2].fail_now();
        let x = 20 * u64::from(STRIP) / BS;
        let data = vec![0xABu8; 2 * BS as usize];
        vwrite(&vol, x, &data).await.unwrap();
        model.apply(x, &data);
        assert_eq!(vol.member_states()[2], MemberState::Failed);
        // B is replaced and rebuilt; then C comes back through re-add.
        vol.fail_member(1).await.unwrap();
        let b2 = spare(&rig);
        vol.replace_member(1, b2.clone()).await.unwrap();
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        rig.faults[2].heal();
        vol.re_add(2, rig.faults[2].clone()).await.unwrap();
        let on = |d: &Arc<dyn BlockDevice>| super::member_bytes(d, SB_BYTES as u64, 4096);
        let (b2, c): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (b2, rig.faults[2].clone());
        let a = on(&rig.mems[0]);
        assert!(a.iter().any(|&x| x != 0), "the held bit is on A");
        assert!(on(&b2) == a, "the replacement's bitmap differs from A's");
        assert!(on(&c) == a, "the re-added copy's bitmap differs from A's");
        // A crash, and A is gone at the next assembly.
        drop(vol);
        let vol = Volume::assemble(vec![b2.clone(), c]).await.unwrap();
        assert!(matches!(
            vol.member_states()[2],
            MemberState::Resyncing { .. }
        ));
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        // B' gone too: C alone has every write.
        vol.fail_member(1).await.unwrap();
        model.check(&vol, "C alone, after A and B' went").await;
    });
}

/// Two replacements of one position at once: both found it Failed before
/// either put its device in, and both went in (the second's journal wipe
/// and bitmap write landing on a device the first had made a member).
/// One goes in; the other is refused and changes nothing.
#[test]
fn one_of_two_concurrent_replacements_of_a_member_goes_in() {
    block_on(async {
        let rig = Rig::new(4, 64);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(11);
        for _ in 0..20 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        vol.fail_member(2).await.unwrap();
        let (x, y) = (spare(&rig), spare(&rig));
        x.set_yields(3, 5);
        y.set_yields(3, 7);
        let (rx, ry) = futures_util::future::join(
            vol.replace_member(2, x.clone()),
            vol.replace_member(2, y.clone()),
        )
        .await;
        assert!(rx.is_ok(), "{rx:?}");
        assert!(ry.is_err(), "the second change went in too");
        assert_eq!(member_write_blocks(&y), 0, "the refused device was written");
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        assert!(
            vol.member_states()
                .iter()
                .all(|s| *s == MemberState::Active)
        );
        model.check(&vol, "after the replacement").await;
    });
}

/// A reservation stored while a replacement joins: the store writes the
/// members it sees, which did not yet include the new device, and the
/// device's record area was written before. The new copy must end up with
/// the newest record: after the others are gone, it is the one read.
#[test]
fn a_record_stored_while_a_member_joins_reaches_it() {
    block_on(async {
        let (rig, vol) = two_way_mirror().await;
        vol.store_record(RES, b"before").unwrap();
        vol.fail_member(1).await.unwrap();
        let b2 = spare(&rig);
        b2.set_yields(4, 3);
        let mut last = b"before".to_vec();
        {
            let mut join = std::pin::pin!(vol.replace_member(1, b2.clone()));
            // A store at each point where the join waits for its device
            // before it is in.
            let mut stores = 0;
            loop {
                let once = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(std::future::Future::poll(join.as_mut(), cx))
                });
                if let std::task::Poll::Ready(r) = once.await {
                    r.unwrap();
                    break;
                }
                // Only while it is not yet a member: a store after that
                // reaches it as it reaches the others.
                if stores == 8 || vol.member_states()[1] != MemberState::Failed {
                    join.await.unwrap();
                    break;
                }
                stores += 1;
                last = format!("store {stores}").into_bytes();
                vol.store_record(RES, &last).unwrap();
            }
            assert!(stores >= 2, "the join never waited ({stores} stores)");
        }
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        drop(vol);
        let b2: Arc<dyn BlockDevice> = b2;
        let vol = Volume::assemble(vec![b2]).await.unwrap();
        assert_eq!(
            vol.load_record(RES).unwrap(),
            Some(last),
            "the new copy lacks the newest record"
        );
    });
}

/// The same with the stores on a thread of their own, as a node's
/// reservation stores run: a join that finds the record's lock held tries
/// again, and the new copy still ends up with the newest record.
#[test]
fn records_stored_from_another_thread_while_a_member_joins_reach_it() {
    block_on(async {
        let (rig, vol) = two_way_mirror().await;
        let vol = Arc::new(vol);
        vol.store_record(RES, b"before").unwrap();
        vol.fail_member(1).await.unwrap();
        let b2 = spare(&rig);
        b2.set_yields(2, 9);
        let storer = {
            let vol = vol.clone();
            std::thread::spawn(move || {
                let mut last = b"before".to_vec();
                let mut n = 0u32;
                // Stores with gaps, as a host's reservation commands come:
                // a join needs one gap between two stores to go in.
                while n < 20 || (n < 2000 && vol.member_states()[1] == MemberState::Failed) {
                    n += 1;
                    last = format!("store {n}").into_bytes();
                    vol.store_record(RES, &last).unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                last
            })
        };
        vol.replace_member(1, b2.clone()).await.unwrap();
        let last = storer.join().unwrap();
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        drop(vol);
        let b2: Arc<dyn BlockDevice> = b2;
        let vol = Volume::assemble(vec![b2]).await.unwrap();
        assert_eq!(vol.load_record(RES).unwrap(), Some(last));
    });
}

/// A joining device that stops answering stalls its own join only: the
/// volume's writes that need a new intent bit go on meanwhile (before, its
/// bitmap was written under the bitmap's `io` lock, which those writes wait
/// on), and once it answers it gets the bits they set.
#[test]
fn a_hung_joining_device_does_not_stall_the_volumes_writes() {
    use std::task::Poll;
    block_on(async {
        let (rig, vol) = two_way_mirror().await;
        let mut model = Model::new(&vol);
        vol.fail_member(1).await.unwrap();
        let b2 = spare(&rig);
        // Its first write (the bitmap image) lands; it hangs from its
        // second on (the record area), before the join takes the io lock.
        b2.hang_after_writes(1);
        let mut stalled = false;
        let writer = async {
            // The join runs until the device hangs under it.
            for _ in 0..10_000 {
                if b2.is_hung() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert!(
                b2.is_hung(),
                "the join never reached the device's second write"
            );
            // Each write in a region of its own: each sets a new bit.
            for i in 1..=4u64 {
                let lba = i * 4 * u64::from(STRIP) / BS;
                let data = vec![i as u8; BS as usize];
                let mut w = std::pin::pin!(vwrite(&vol, lba, &data));
                let mut polls = 0;
                loop {
                    let once = std::future::poll_fn(|cx| Poll::Ready(w.as_mut().poll(cx))).await;
                    if let Poll::Ready(r) = once {
                        r.unwrap();
                        model.apply(lba, &data);
                        break;
                    }
                    polls += 1;
                    if polls == 10_000 {
                        stalled = true;
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                if stalled {
                    break;
                }
            }
            assert!(b2.is_hung(), "the writes did not overlap the hang");
            b2.unhang();
        };
        let (r, ()) = futures_util::future::join(vol.replace_member(1, b2.clone()), writer).await;
        r.unwrap();
        assert!(!stalled, "a write waited on the hung device's join");
        let on = |d: &Arc<dyn BlockDevice>| super::member_bytes(d, SB_BYTES as u64, 4096);
        let b2: Arc<dyn BlockDevice> = b2;
        let a = on(&rig.mems[0]);
        assert!(on(&b2) == a, "the new device lacks bits set while it hung");
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        vol.fail_member(0).await.unwrap();
        model.check(&vol, "the new copy alone").await;
    });
}
