//! Gathering partial-stripe writes of a stream into full stripes
//! (`volume/gather.rs`): the data is the model's, parity agrees, the
//! members are not read, random writes never wait, and a leader that goes
//! away leaves its parts to write themselves.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Waker};

use blockdev::BlockDevice;

use futures_util::future::join_all;

use super::{BS, Model, Rig, cfg, vread, vwrite};
use crate::layout::LayoutKind;
use crate::testutil::Rng;
use crate::volume::Volume;

/// Runs `f` on a current-thread tokio runtime: windows need its timer.
fn rt<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

/// Writes `lens` back to back from LBA 0, all in flight together; returns
/// the data written.
async fn stream(vol: &Volume, model: &mut Model, lens: &[u64], seed: u8) {
    let mut at = 0;
    let mut ws = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        let data: Vec<u8> = (0..n * BS)
            .map(|b| (b as u8) ^ seed ^ (i as u8).wrapping_mul(37))
            .collect();
        model.apply(at, &data);
        ws.push((at, data));
        at += n;
    }
    let r = join_all(ws.iter().map(|(lba, d)| vwrite(vol, *lba, d))).await;
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
}

#[test]
fn a_stream_of_partial_writes_makes_full_stripes() {
    rt(async {
        for (kind, n) in [
            (LayoutKind::Raid5, 5),
            (LayoutKind::Raid6, 6),
            (LayoutKind::Erasure { k: 3, m: 2 }, 5),
        ] {
            let rig = Rig::new(n, 16);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            for f in &rig.faults {
                // Member I/O completes a few polls later, as a remote one would.
                f.set_yields(2, 3);
            }
            let per = vol.layout().stripe_data_blocks();
            let mut model = Model::new(&vol);
            // Writes of 3/4 of a stripe: every stripe is two or three parts.
            let len = (per * 3 / 4).max(1);
            let count = (vol.geometry().num_blocks / len) as usize;
            let reads = rig.reads();
            stream(&vol, &mut model, &vec![len; count], 1).await;
            let st = vol.stats();
            assert!(st.gathered_stripes > 0, "{kind}: {st:?}");
            // Only the stream's first and last stripes may be partial: the
            // first write starts no window (nothing before it), the last
            // stripe is not filled. Without gathering every stripe is.
            assert!(st.rmw_writes + st.rcw_writes <= 6, "{kind}: {st:?}");
            assert!(st.gathered_stripes >= count as u64 / 2, "{kind}: {st:?}");
            // The first stripe's window waits in vain (its first part went alone).
            assert!(st.gather_timeouts >= 1, "{kind}: {st:?}");
            let read = rig.reads() - reads;
            assert!(read <= 6 * per, "{kind}: read {read} blocks");
            model.check(&vol, &format!("{kind}")).await;
            let rep = vol.scrub(false).await;
            assert_eq!(rep.inconsistent_count, 0, "{kind}: {rep:?}");
        }
    });
}

/// A raid5 on 5 members whose I/O completes a few polls later.
async fn slow_raid5() -> (Rig, Volume) {
    let rig = Rig::new(5, 16);
    let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
        .await
        .unwrap();
    for f in &rig.faults {
        f.set_yields(2, 3);
    }
    (rig, vol)
}

#[test]
fn random_small_and_lone_writes_do_not_wait() {
    rt(async {
        let (_rig, vol) = slow_raid5().await;
        let per = vol.layout().stripe_data_blocks();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(7);
        // Random partial writes, many in flight: none continues another.
        let mut ws = Vec::new();
        for _ in 0..64 {
            let lba = rng.below(vol.geometry().num_blocks - per) | 1;
            let mut data = vec![0u8; BS as usize];
            rng.fill(&mut data);
            ws.push((lba, data));
        }
        ws.sort_by_key(|w| std::cmp::Reverse(w.0));
        ws.dedup_by_key(|w| w.0);
        for (lba, d) in &ws {
            model.apply(*lba, d);
        }
        join_all(ws.iter().map(|(lba, d)| vwrite(&vol, *lba, d))).await;
        // A stream at queue depth 1: each write waits for the one before.
        for i in 0..8 {
            let data = vec![i as u8 + 1; (per / 2 * BS) as usize];
            vwrite(&vol, i * per / 2, &data).await.unwrap();
            model.apply(i * per / 2, &data);
        }
        // A stream of writes too small to fill a stripe in one window.
        assert!(per > 5);
        stream(&vol, &mut model, &[1; 24], 9).await;
        let st = vol.stats();
        assert_eq!((st.gathered_stripes, st.gather_timeouts), (0, 0), "{st:?}");
        model.check(&vol, "random").await;
    });
}

#[test]
fn a_stream_inside_block_on_opens_no_window() {
    // `blockdev::block_on` on a runtime's thread: the runtime's timer does
    // not run while it blocks, so a window there would wait for a stripe
    // that the blocked writes behind it cannot fill. (On a thread of its
    // own, so that such a hang fails the test instead of stalling it.)
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(std::panic::catch_unwind(stream_in_block_on)));
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(r) => r.unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(_) => panic!("a stream of partial writes inside block_on hung"),
    }
}

fn stream_in_block_on() {
    rt(async {
        let (_rig, vol) = slow_raid5().await;
        let per = vol.layout().stripe_data_blocks();
        let mut model = Model::new(&vol);
        let len = (per * 3 / 4).max(1);
        blockdev::block_on(stream(&vol, &mut model, &[len; 8], 5));
        let st = vol.stats();
        assert_eq!((st.gathered_stripes, st.gather_timeouts), (0, 0), "{st:?}");
        model.check(&vol, "block_on").await;
        // The same stream on the runtime gathers (the test above is not vacuous).
        stream(&vol, &mut model, &[len; 8], 6).await;
        assert!(vol.stats().gathered_stripes > 0, "{:?}", vol.stats());
    });
}

/// Polls `f` once; whether it is still pending.
fn pending<F: Future>(f: Pin<&mut F>) -> bool {
    f.poll(&mut Context::from_waker(Waker::noop())).is_pending()
}

#[test]
fn parts_of_a_leader_that_went_away_write_themselves() {
    rt(async {
        let rig = Rig::new(5, 16);
        for f in &rig.faults {
            // Member I/O takes a few polls, so the first write stays in flight.
            f.set_yields(3, 11);
        }
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let per = vol.layout().stripe_data_blocks();
        assert!(per >= 8);
        let (a, b, c) = (
            vec![1u8; 2 * BS as usize],
            vec![2u8; 2 * BS as usize],
            vec![3u8; BS as usize],
        );
        let mut first = pin!(vwrite(&vol, 0, &a));
        let mut lead = Box::pin(vwrite(&vol, 2, &b));
        let mut part = pin!(vwrite(&vol, 4, &c));
        assert!(pending(first.as_mut()));
        assert!(pending(lead.as_mut()));
        assert!(
            vol.inner.gather_open(0),
            "the second write continues the first: it leads stripe 0"
        );
        assert!(pending(part.as_mut()));
        drop(lead);
        assert!(!vol.inner.gather_open(0));
        first.await.unwrap();
        part.await.unwrap();
        assert_eq!(vread(&vol, 0, 2).await, a);
        assert_eq!(vread(&vol, 4, 1).await, c);
        let rep = vol.scrub(false).await;
        assert_eq!(rep.inconsistent_count, 0, "{rep:?}");
    });
}
