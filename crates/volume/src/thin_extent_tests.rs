//! Pool growth by extents: a full pool grows and keeps writing, reopens
//! with its extents (and refuses to open without one), refusals change
//! nothing, and power cuts during and after the growth lose no
//! acknowledged write.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError};

use crate::fault::{CrashSwitch, FaultDevice};
use crate::testutil::{Rng, block_on};
use crate::thin::{ThinError, ThinPool};
use crate::thin_tests::{BS, CB, dev, mem, rand_data, tread, twrite};

const PER: u64 = CB / BS;

/// Writes one block into each cluster of `v` from cluster `from` until the
/// pool is full; returns the clusters written and their data.
async fn fill(v: &dyn BlockDevice, from: u64, rng: &mut Rng) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let vclusters = v.geometry().num_blocks / PER;
    for c in from..vclusters {
        let d = rand_data(rng, BS as usize);
        match twrite(v, c * PER, &d).await {
            Ok(()) => out.push((c, d)),
            Err(BlockError::NoSpace) => break,
            Err(e) => panic!("cluster {c}: {e}"),
        }
    }
    out
}

async fn assert_holds(v: &dyn BlockDevice, written: &[(u64, Vec<u8>)], what: &str) {
    for (c, d) in written {
        assert_eq!(&tread(v, c * PER, 1).await, d, "{what}: cluster {c}");
    }
}

#[test]
fn a_full_pool_grows_by_an_extent_and_reopens_with_it() {
    block_on(async {
        let (base, x1, x2) = (mem(2 << 20), mem(1 << 20), mem(1 << 20));
        let mut rng = Rng::new(7);
        let pool = ThinPool::format(dev(&base), CB).await.unwrap();
        let v = pool.create_volume("v", 64 << 20, 4096).await.unwrap();
        let before = pool.usage();
        let mut written = fill(&v, 0, &mut rng).await;
        assert_eq!(written.len() as u64, before.total_clusters);

        let e = pool.add_extent(dev(&x1)).await.unwrap();
        assert_eq!(e.first_cluster, before.total_clusters);
        let after = pool.usage();
        assert_eq!(after.total_clusters, before.total_clusters + e.clusters);
        assert_eq!(after.free_clusters, e.clusters);
        let more = fill(&v, written.len() as u64, &mut rng).await;
        assert_eq!(
            more.len() as u64,
            e.clusters,
            "the extent's clusters are used"
        );
        written.extend(more);
        let e2 = pool.add_extent(dev(&x2)).await.unwrap();
        assert_eq!(e2.first_cluster, e.first_cluster + e.clusters);
        written.extend(fill(&v, written.len() as u64, &mut rng).await);
        assert_eq!(pool.extents().len(), 2);
        assert_holds(&v, &written, "live").await;
        pool.check_with_device().await.unwrap();
        drop((v, pool));

        // Without an extent the pool refuses to open, and says which.
        let r = ThinPool::open_with_extents(dev(&base), &[dev(&x2)]).await;
        assert!(
            matches!(r, Err(ThinError::MissingExtent(ref u)) if *u == e.uuid),
            "{r:?}"
        );
        // Extents in any order, with strangers among them.
        let other = mem(1 << 20);
        let pool = ThinPool::open_with_extents(dev(&base), &[dev(&x2), dev(&other), dev(&x1)])
            .await
            .unwrap();
        let v = pool.volume("v").unwrap();
        assert_holds(&v, &written, "reopened").await;
        let c = pool.check_with_device().await.unwrap();
        assert_eq!(c.total_clusters, after.total_clusters + e2.clusters);
        assert_eq!(c.allocated_clusters, written.len() as u64);
        let label = ThinPool::extent_of(&dev(&x1)).await.unwrap();
        assert_eq!((label.pool, label.extent), (pool.uuid(), e.uuid));
        assert_eq!(ThinPool::extent_of(&dev(&other)).await, None);
    });
}

#[test]
fn refused_extents_change_nothing() {
    block_on(async {
        let (base, x1) = (mem(2 << 20), mem(1 << 20));
        let pool = ThinPool::format(dev(&base), CB).await.unwrap();
        let d1 = dev(&x1);
        pool.add_extent(d1.clone()).await.unwrap();
        let u = pool.usage();
        let r = pool.add_extent(d1).await;
        assert!(matches!(r, Err(ThinError::Config(_))), "{r:?}");
        let r = pool.add_extent(dev(&base)).await;
        assert!(matches!(r, Err(ThinError::Config(_))), "{r:?}");
        let tiny = mem(16 << 10);
        let r = pool.add_extent(dev(&tiny)).await;
        assert!(matches!(r, Err(ThinError::Config(_))), "{r:?}");
        assert_eq!(
            ThinPool::extent_of(&dev(&tiny)).await,
            None,
            "nothing written"
        );
        assert_eq!(pool.usage(), u);
        pool.check_with_device().await.unwrap();
    });
}

/// A power cut at every write of the growth and of the writes after it:
/// the pool reopens either as it was or grown, every acknowledged write
/// reads back, and the metadata checks clean (no cluster lost or doubled).
#[test]
fn power_cuts_during_growth_lose_no_acknowledged_write() {
    for k in 1..40u64 {
        block_on(async {
            let (base, x1) = (mem(2 << 20), mem(1 << 20));
            let mut rng = Rng::new(k);
            let written = {
                let pool = ThinPool::format(dev(&base), CB).await.unwrap();
                let v = pool.create_volume("v", 64 << 20, 4096).await.unwrap();
                fill(&v, 0, &mut rng).await
            };
            let crash = CrashSwitch::new();
            let fb = FaultDevice::with_crash(dev(&base), crash.clone());
            let fx: Arc<dyn BlockDevice> = FaultDevice::with_crash(dev(&x1), crash.clone());
            let pool = ThinPool::open(fb).await.unwrap();
            crash.arm(k);
            let grown = pool.add_extent(fx).await.is_ok() && !crash.crashed();
            let mut acked = Vec::new();
            if grown {
                let v = pool.volume("v").unwrap();
                for c in written.len() as u64..written.len() as u64 + 8 {
                    let d = rand_data(&mut rng, BS as usize);
                    if twrite(&v, c * PER, &d).await.is_ok() && !crash.crashed() {
                        acked.push((c, d));
                    }
                }
                // A later checkpoint (create) cut too: its parts may tear.
                let _ = pool.create_volume("w", 1 << 20, 4096).await;
            }
            drop(pool);
            let pool = ThinPool::open_with_extents(dev(&base), &[dev(&x1)])
                .await
                .unwrap_or_else(|e| panic!("k {k}: {e}"));
            if grown {
                assert_eq!(pool.extents().len(), 1, "k {k}: acknowledged growth lost");
            }
            let v = pool.volume("v").unwrap();
            assert_holds(&v, &written, &format!("k {k}")).await;
            assert_holds(&v, &acked, &format!("k {k} after growth")).await;
            pool.check_with_device()
                .await
                .unwrap_or_else(|e| panic!("k {k}: {e}"));
        });
    }
}
