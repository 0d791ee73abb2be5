//! Volume tests on RAM members: data against a reference model, parity
//! through scrub, fault injection for degraded mode, crash-restart loops for
//! the write hole, rebuild and assembly.

use std::collections::HashMap;
use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice, RECORD_MAX, RecordKind};
use futures_util::future::join_all;

use crate::fault::{CrashSwitch, FaultDevice};
use crate::layout::LayoutKind;
use crate::rebuild::RebuildOptions;
use crate::records;
use crate::superblock::{MemberState, Superblock};
use crate::testutil::{Rng, block_on};
use crate::volume::{SyncControl, Volume, VolumeConfig, VolumeError};

const BS: u64 = 4096;
/// Small strips and metadata keep debug-build tests quick (the metadata holds
/// the superblock, a bitmap block and a journal slot of 4 KiB + m strips).
const STRIP: u32 = 8 << 10;
const META: u64 = 64 << 10;

struct Rig {
    mems: Vec<Arc<dyn BlockDevice>>,
    faults: Vec<Arc<FaultDevice>>,
}

impl Rig {
    fn new(n: usize, stripes: u64) -> Rig {
        Self::with_block_size(n, stripes, 4096)
    }
    fn with_block_size(n: usize, stripes: u64, bs: u32) -> Rig {
        let size = META + stripes * u64::from(STRIP);
        let mems: Vec<Arc<dyn BlockDevice>> = (0..n)
            .map(|_| Arc::new(MemDevice::new(size, bs).unwrap()) as Arc<dyn BlockDevice>)
            .collect();
        let faults = mems.iter().map(|m| FaultDevice::new(m.clone())).collect();
        Rig { mems, faults }
    }
    fn members(&self) -> Vec<Arc<dyn BlockDevice>> {
        self.faults
            .iter()
            .map(|f| f.clone() as Arc<dyn BlockDevice>)
            .collect()
    }
    fn reads(&self) -> u64 {
        self.faults.iter().map(|f| f.stats().read_blocks).sum()
    }
}

fn cfg(kind: LayoutKind) -> VolumeConfig {
    VolumeConfig {
        strip_bytes: STRIP,
        meta_bytes: META,
        // Two stripes per intent bit, so tests see several regions.
        region_bytes: 2 * u64::from(STRIP),
        assume_clean: true,
        ..VolumeConfig::new(kind)
    }
}

fn buf_with(data: &[u8]) -> AlignedBuf {
    let mut b = AlignedBuf::new(data.len());
    b.set_len(data.len());
    b.copy_from_slice(data);
    b
}

async fn vwrite(vol: &Volume, lba: u64, data: &[u8]) -> Result<(), blockdev::BlockError> {
    vol.submit(IoRequest {
        op: BlockOp::Write { fua: false },
        lba,
        blocks: (data.len() as u64 / vol.geometry().block_size as u64) as u32,
        buf: buf_with(data),
    })
    .await
    .result
}

async fn vread(vol: &Volume, lba: u64, blocks: u64) -> Vec<u8> {
    try_read(vol, lba, blocks).await.expect("volume read")
}

async fn try_read(vol: &Volume, lba: u64, blocks: u64) -> Result<Vec<u8>, blockdev::BlockError> {
    let bs = vol.geometry().block_size as usize;
    let mut b = AlignedBuf::new(blocks as usize * bs);
    b.set_len(blocks as usize * bs);
    let done = vol
        .submit(IoRequest {
            op: BlockOp::Read,
            lba,
            blocks: blocks as u32,
            buf: b,
        })
        .await;
    done.result.map(|()| done.buf.to_vec())
}

/// A byte-for-byte copy of what the volume should hold.
struct Model {
    bs: usize,
    data: Vec<u8>,
}

impl Model {
    fn new(vol: &Volume) -> Model {
        let g = vol.geometry();
        Model {
            bs: g.block_size as usize,
            data: vec![0; g.size_bytes() as usize],
        }
    }
    fn blocks(&self) -> u64 {
        (self.data.len() / self.bs) as u64
    }
    fn apply(&mut self, lba: u64, data: &[u8]) {
        let at = lba as usize * self.bs;
        self.data[at..at + data.len()].copy_from_slice(data);
    }
    async fn check(&self, vol: &Volume, what: &str) {
        let step = 64u64;
        let mut lba = 0;
        while lba < self.blocks() {
            let n = step.min(self.blocks() - lba);
            let got = vread(vol, lba, n).await;
            let at = lba as usize * self.bs;
            if got[..] != self.data[at..at + got.len()] {
                let bad = (0..n as usize)
                    .find(|&b| {
                        got[b * self.bs..(b + 1) * self.bs]
                            != self.data[at + b * self.bs..at + (b + 1) * self.bs]
                    })
                    .unwrap();
                panic!("{what}: block {} differs from the model", lba + bad as u64);
            }
            lba += n;
        }
    }
}

/// A random write: mostly small and unaligned, sometimes whole stripes.
fn random_range(rng: &mut Rng, vol: &Volume) -> (u64, u64) {
    let total = vol.geometry().num_blocks;
    let per = vol.layout().stripe_data_blocks().max(1);
    if rng.below(4) == 0 && vol.layout().is_striped() {
        let stripes = total / per;
        let s = rng.below(stripes);
        let n = (1 + rng.below(2)).min(stripes - s);
        (s * per, n * per)
    } else {
        let lba = rng.below(total);
        let len = 1 + rng.below((3 * per).min(total - lba));
        (lba, len)
    }
}

async fn random_write(rng: &mut Rng, vol: &Volume, model: &mut Model) {
    let (lba, len) = random_range(rng, vol);
    let mut data = vec![0u8; len as usize * model.bs];
    rng.fill(&mut data);
    vwrite(vol, lba, &data).await.expect("volume write");
    model.apply(lba, &data);
}

async fn random_read_check(rng: &mut Rng, vol: &Volume, model: &Model) {
    let (lba, len) = random_range(rng, vol);
    let got = vread(vol, lba, len).await;
    let at = lba as usize * model.bs;
    assert!(
        got[..] == model.data[at..at + got.len()],
        "read {lba}+{len} differs from model"
    );
}

fn all_layouts() -> Vec<(LayoutKind, usize)> {
    vec![
        (LayoutKind::Concat, 3),
        (LayoutKind::Raid0, 4),
        (LayoutKind::Raid1, 3),
        (LayoutKind::Raid5, 4),
        (LayoutKind::Raid5, 8),
        (LayoutKind::Raid6, 6),
        (LayoutKind::Erasure { k: 4, m: 2 }, 6),
        (LayoutKind::Erasure { k: 5, m: 1 }, 6),
        (LayoutKind::Erasure { k: 3, m: 4 }, 7),
    ]
}

#[test]
fn every_layout_matches_the_model() {
    for (kind, n) in all_layouts() {
        block_on(async {
            let rig = Rig::new(n, 24);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let mut model = Model::new(&vol);
            let mut rng = Rng::new(n as u64 + 7);
            for _ in 0..80 {
                random_write(&mut rng, &vol, &mut model).await;
                random_read_check(&mut rng, &vol, &model).await;
            }
            model.check(&vol, &format!("{kind}")).await;
            let rep = vol.scrub(false).await;
            assert_eq!(rep.inconsistent_count, 0, "{kind}: {rep:?}");
            assert_eq!(rep.skipped, 0, "{kind}");
        });
    }
}

#[test]
fn small_blocks_and_initial_sync() {
    // 512 B volume blocks on raid6; members start with garbage so the
    // initial sync must compute parity.
    block_on(async {
        let rig = Rig::with_block_size(5, 16, 512);
        for (i, m) in rig.mems.iter().enumerate() {
            let mut junk = vec![0u8; 64 << 10];
            Rng::new(i as u64).fill(&mut junk);
            let done = m
                .submit(IoRequest {
                    op: BlockOp::Write { fua: false },
                    lba: META / 512,
                    blocks: 128,
                    buf: buf_with(&junk),
                })
                .await;
            done.result.unwrap();
        }
        let c = VolumeConfig {
            block_size: 512,
            assume_clean: false,
            ..cfg(LayoutKind::Raid6)
        };
        let vol = Volume::create(rig.members(), c).await.unwrap();
        assert_eq!(vol.geometry().block_size, 512);
        assert!(vol.unsynced_regions() > 0, "the sync runs after create");
        vol.initial_sync(&SyncControl::default()).await.unwrap();
        assert_eq!(vol.unsynced_regions(), 0);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        let mut model = Model::new(&vol);
        // The model starts from whatever the volume reads (the junk).
        model.data = vread(&vol, 0, model.blocks()).await;
        let mut rng = Rng::new(3);
        for _ in 0..60 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        model.check(&vol, "raid6/512").await;
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
    });
}

#[test]
fn full_stripe_writes_read_nothing_and_partial_writes_read_least() {
    block_on(async {
        // raid5 7+1, 8 KiB strips = 2 blocks per strip, 14 data blocks per stripe.
        let rig = Rig::new(8, 16);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let per = vol.layout().stripe_data_blocks();
        assert_eq!(per, 14);

        let before = rig.reads();
        vwrite(&vol, per, &vec![1u8; (per * BS) as usize])
            .await
            .unwrap();
        assert_eq!(rig.reads(), before, "a full-stripe write reads nothing");
        assert_eq!(vol.stats().full_stripe_writes, 1);

        // One block: read-modify-write reads old data + old parity (2 blocks);
        // reconstruct-write would read 6 blocks.
        let before = rig.reads();
        vwrite(&vol, per + 3, &[2u8; BS as usize]).await.unwrap();
        assert_eq!(rig.reads() - before, 2);
        assert_eq!(vol.stats().rmw_writes, 1);

        // 12 of 14 blocks: reconstruct-write reads the 2 untouched blocks
        // (RMW would read 12 + 2).
        let before = rig.reads();
        vwrite(&vol, 2 * per + 1, &vec![3u8; (12 * BS) as usize])
            .await
            .unwrap();
        assert_eq!(rig.reads() - before, 2);
        assert_eq!(vol.stats().rcw_writes, 1);

        // raid6 4+2, one block: RMW reads 1 data + 2 parity.
        let rig6 = Rig::new(6, 16);
        let v6 = Volume::create(rig6.members(), cfg(LayoutKind::Raid6))
            .await
            .unwrap();
        let before = rig6.reads();
        vwrite(&v6, 1, &[9u8; BS as usize]).await.unwrap();
        assert_eq!(rig6.reads() - before, 3);
        assert_eq!(v6.scrub(false).await.inconsistent_count, 0);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
    });
}

#[test]
fn flush_and_fua_reach_the_members() {
    block_on(async {
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let flushes: Vec<u64> = rig.faults.iter().map(|f| f.stats().flushes).collect();
        let done = vol
            .submit(IoRequest {
                op: BlockOp::Flush,
                lba: 0,
                blocks: 0,
                buf: AlignedBuf::new(0),
            })
            .await;
        done.result.unwrap();
        for (f, b) in rig.faults.iter().zip(flushes) {
            assert_eq!(f.stats().flushes, b + 1);
        }
        let fua_before: u64 = rig.faults.iter().map(|f| f.stats().fua_writes).sum();
        let done = vol
            .submit(IoRequest {
                op: BlockOp::Write { fua: true },
                lba: 0,
                blocks: 1,
                buf: buf_with(&[5u8; 4096]),
            })
            .await;
        done.result.unwrap();
        let fua_after: u64 = rig.faults.iter().map(|f| f.stats().fua_writes).sum();
        // Data and parity both carry FUA (plus any intent-bitmap write).
        assert!(fua_after - fua_before >= 2, "{fua_before} -> {fua_after}");
    });
}

#[test]
fn zeroes_and_bad_requests() {
    block_on(async {
        let rig = Rig::new(6, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid6))
            .await
            .unwrap();
        let total = vol.geometry().num_blocks;
        vwrite(&vol, 0, &vec![7u8; (total * BS) as usize])
            .await
            .unwrap();
        for op in [BlockOp::WriteZeroes, BlockOp::Deallocate] {
            vwrite(&vol, 3, &vec![7u8; (10 * BS) as usize])
                .await
                .unwrap();
            let done = vol
                .submit(IoRequest {
                    op,
                    lba: 3,
                    blocks: 10,
                    buf: AlignedBuf::new(0),
                })
                .await;
            done.result.unwrap();
            let got = vread(&vol, 2, 12).await;
            assert!(got[..BS as usize].iter().all(|&b| b == 7));
            assert!(got[BS as usize..11 * BS as usize].iter().all(|&b| b == 0));
            assert!(got[11 * BS as usize..].iter().all(|&b| b == 7));
        }
        assert!(vol.deallocate_reads_zeroes());
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        // Out of range and short buffers are errors, not panics.
        let done = vol
            .submit(IoRequest {
                op: BlockOp::Read,
                lba: total,
                blocks: 1,
                buf: buf_with(&[0u8; 4096]),
            })
            .await;
        assert!(done.result.is_err());
        let done = vol
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba: 0,
                blocks: 2,
                buf: buf_with(&[0u8; 4096]),
            })
            .await;
        assert!(done.result.is_err());
        assert!(vol.describe().contains("raid6"), "{}", vol.describe());
    });
}

/// Writes and reads go on while members die (by injected errors, found by
/// the I/O itself), and the data always matches the model.
#[test]
fn degraded_reads_and_writes_match_the_model() {
    let cases: Vec<(LayoutKind, usize, usize)> = vec![
        (LayoutKind::Raid1, 3, 2),
        (LayoutKind::Raid5, 4, 1),
        (LayoutKind::Raid5, 8, 1),
        (LayoutKind::Raid6, 6, 1),
        (LayoutKind::Raid6, 6, 2),
        (LayoutKind::Raid6, 4, 2),
        (LayoutKind::Erasure { k: 4, m: 2 }, 6, 2),
        (LayoutKind::Erasure { k: 3, m: 3 }, 6, 3),
        (LayoutKind::Erasure { k: 5, m: 1 }, 6, 1),
    ];
    for (kind, n, fail) in cases {
        for seed in 0..3u64 {
            block_on(async {
                let rig = Rig::new(n, 16);
                let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
                let mut model = Model::new(&vol);
                let mut rng = Rng::new(seed * 31 + n as u64);
                for _ in 0..20 {
                    random_write(&mut rng, &vol, &mut model).await;
                }
                // Members die at random points of the workload.
                let mut victims = Vec::new();
                while victims.len() < fail {
                    let v = rng.below(n as u64) as usize;
                    if !victims.contains(&v) {
                        victims.push(v);
                    }
                }
                for &v in &victims {
                    rig.faults[v].fail_after_writes(rng.below(30));
                }
                for _ in 0..60 {
                    random_write(&mut rng, &vol, &mut model).await;
                    random_read_check(&mut rng, &vol, &model).await;
                }
                for &v in &victims {
                    rig.faults[v].fail_now();
                }
                model
                    .check(&vol, &format!("{kind} with {victims:?} failed"))
                    .await;
                let failed: Vec<usize> = vol
                    .member_states()
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| **s == MemberState::Failed)
                    .map(|(i, _)| i)
                    .collect();
                let mut want = victims.clone();
                want.sort();
                assert_eq!(failed, want, "{kind}");
                // One failure more than the layout tolerates fails I/O cleanly.
                let extra = (0..n).find(|i| !victims.contains(i)).unwrap();
                if fail == vol.layout().parity_columns() {
                    rig.faults[extra].fail_now();
                    let mut hit = false;
                    for lba in 0..vol.geometry().num_blocks {
                        let r = vol
                            .submit(IoRequest {
                                op: BlockOp::Read,
                                lba,
                                blocks: 1,
                                buf: buf_with(&[0u8; 4096]),
                            })
                            .await;
                        hit |= r.result.is_err();
                    }
                    assert!(hit, "{kind}: reads past the failure limit must error");
                }
            });
        }
    }
}

/// Many tasks on several threads write disjoint blocks of the same few
/// stripes; the stripe lock keeps parity consistent.
#[test]
fn concurrent_writes_to_one_stripe_keep_parity() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    rt.block_on(async {
        for (kind, n) in [(LayoutKind::Raid5, 5), (LayoutKind::Raid6, 6)] {
            let rig = Rig::new(n, 8);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let per = vol.layout().stripe_data_blocks();
            // Two stripes, every block written by its own task, many rounds.
            let blocks = 2 * per;
            let mut handles = Vec::new();
            for b in 0..blocks {
                let vol = vol.clone();
                handles.push(tokio::spawn(async move {
                    for round in 0..20u8 {
                        let data = vec![round ^ (b as u8); BS as usize];
                        vwrite(&vol, b, &data).await.unwrap();
                    }
                }));
            }
            for h in handles {
                h.await.unwrap();
            }
            let rep = vol.scrub(false).await;
            assert_eq!(rep.inconsistent_count, 0, "{kind}: {rep:?}");
            for b in 0..blocks {
                let got = vread(&vol, b, 1).await;
                assert!(got.iter().all(|&x| x == 19 ^ (b as u8)), "{kind} block {b}");
            }
        }
    });
}

/// Writes concurrently, as a batch; returns which completed before the crash.
async fn write_batch(
    vol: &Volume,
    crash: &CrashSwitch,
    writes: &[(u64, Vec<u8>)],
    flushes: usize,
) -> Vec<bool> {
    // Flushes race the writes, so bit clears interleave with bit sets.
    let flush = async {
        for _ in 0..flushes {
            let _ = vol
                .submit(IoRequest {
                    op: BlockOp::Flush,
                    lba: 0,
                    blocks: 0,
                    buf: AlignedBuf::new(0),
                })
                .await;
        }
    };
    let w = join_all(writes.iter().map(|(lba, data)| async move {
        let r = vwrite(vol, *lba, data).await;
        r.is_ok() && !crash.crashed()
    }));
    futures_util::future::join(w, flush).await.0
}

/// Power cuts at random points of random workloads, then restart: every
/// acknowledged write reads back and every stripe's parity agrees with its
/// data. Returns the number of stripes found inconsistent after restart.
fn crash_loop(kind: LayoutKind, n: usize, iterations: u64, seed: u64, intent_log: bool) -> u64 {
    crash_loop_with(kind, n, iterations, seed, intent_log, false)
}

/// [`crash_loop`]; with `stream`, each batch is a run of back-to-back
/// partial-stripe writes, on a tokio runtime, so their stripes are gathered
/// (`volume/gather.rs`) and crashes cut gathered full-stripe writes short.
fn crash_loop_with(
    kind: LayoutKind,
    n: usize,
    iterations: u64,
    seed: u64,
    intent_log: bool,
    stream: bool,
) -> u64 {
    let run = async {
        let rig = Rig::new(n, 12);
        let mut c = cfg(kind);
        c.intent_log = intent_log;
        let mut rng = Rng::new(seed);
        let vol = Volume::create(rig.members(), c).await.unwrap();
        let mut model = Model::new(&vol);
        drop(vol);
        // Blocks whose content may be the old or one in-flight write's data.
        let mut maybe: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut inconsistent = 0;
        let mut gathered = 0;
        let bs = BS as usize;
        for it in 0..iterations {
            let crash = CrashSwitch::new();
            let members: Vec<Arc<dyn BlockDevice>> = rig
                .mems
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let f = FaultDevice::with_crash(m.clone(), crash.clone());
                    f.set_yields(2, seed ^ (it << 8) ^ i as u64);
                    f as Arc<dyn BlockDevice>
                })
                .collect();
            let vol = Volume::assemble_with(members, intent_log, true)
                .await
                .unwrap();
            // Every other run, flushes clear idle bits at once, so crashes also
            // land between a clear and the next write to the region.
            if it % 2 == 1 {
                vol.set_intent_clear_age(std::time::Duration::ZERO);
            }
            // Every block holds the acknowledged data, or the in-flight data.
            let all = vread(&vol, 0, model.blocks()).await;
            for b in 0..model.blocks() as usize {
                let got = &all[b * bs..(b + 1) * bs];
                let want = &model.data[b * bs..(b + 1) * bs];
                if got == want {
                    continue;
                }
                match maybe.get(&(b as u64)) {
                    Some(alt) if alt[..] == *got => model.apply(b as u64, got),
                    _ => panic!("{kind} iteration {it}: block {b} lost an acknowledged write"),
                }
            }
            maybe.clear();
            let rep = vol.scrub(!intent_log).await;
            if intent_log {
                assert_eq!(
                    rep.inconsistent_count, 0,
                    "{kind} iteration {it}: parity disagrees after resync: {rep:?}"
                );
            }
            inconsistent += rep.inconsistent_count;

            crash.arm(1 + rng.below(40));
            while !crash.crashed() {
                let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
                if stream {
                    let per = vol.layout().stripe_data_blocks();
                    let len = 1 + rng.below(per - 1);
                    let count = 2 + rng.below(6);
                    let mut lba = rng.below(model.blocks() - len * count);
                    for _ in 0..count {
                        let mut data = vec![0u8; len as usize * bs];
                        rng.fill(&mut data);
                        batch.push((lba, data));
                        lba += len;
                    }
                }
                for _ in 0..if stream { 0 } else { 1 + rng.below(4) } {
                    let (lba, len) = random_range(&mut rng, &vol);
                    if batch
                        .iter()
                        .any(|(l, d)| lba < l + (d.len() / bs) as u64 && *l < lba + len)
                    {
                        continue;
                    }
                    let mut data = vec![0u8; len as usize * bs];
                    rng.fill(&mut data);
                    batch.push((lba, data));
                }
                let flushes = rng.below(3) as usize;
                let acked = write_batch(&vol, &crash, &batch, flushes).await;
                for ((lba, data), ok) in batch.iter().zip(acked) {
                    if ok {
                        model.apply(*lba, data);
                    } else {
                        for (i, blk) in data.chunks(bs).enumerate() {
                            maybe.insert(lba + i as u64, blk.to_vec());
                        }
                    }
                }
            }
            gathered += vol.stats().gathered_stripes;
            drop(vol);
        }
        assert!(!stream || gathered > 0, "{kind}: no stripe was gathered");
        inconsistent
    };
    if stream {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(run)
    } else {
        block_on(run)
    }
}

#[test]
fn crash_restart_loop_raid5() {
    assert_eq!(crash_loop(LayoutKind::Raid5, 4, 300, 1, true), 0);
}

/// The same with streams of partial-stripe writes, gathered into full
/// stripes: crashes during gathered writes lose no acknowledged write and
/// leave no stripe inconsistent after resync.
#[test]
fn crash_restart_loop_gathered_stripes() {
    assert_eq!(crash_loop_with(LayoutKind::Raid5, 5, 200, 6, true, true), 0);
    assert_eq!(crash_loop_with(LayoutKind::Raid6, 6, 100, 7, true, true), 0);
}

#[test]
fn crash_restart_loop_raid6() {
    assert_eq!(crash_loop(LayoutKind::Raid6, 6, 200, 2, true), 0);
}

#[test]
fn crash_restart_loop_erasure_and_mirror() {
    assert_eq!(
        crash_loop(LayoutKind::Erasure { k: 3, m: 3 }, 6, 100, 3, true),
        0
    );
    assert_eq!(crash_loop(LayoutKind::Raid1, 3, 100, 4, true), 0);
}

/// The negative control: without the intent log the same crashes leave
/// stripes whose parity disagrees with their data, so the loop above would
/// catch a broken log.
#[test]
fn crash_without_intent_log_leaves_bad_parity() {
    assert!(crash_loop(LayoutKind::Raid5, 4, 100, 5, false) > 0);
}

/// Compares every block with the model; a block that differs but holds the
/// data of a write cut short by the crash takes that data. Returns the blocks
/// that hold neither (and takes what they hold, so later rounds count anew).
async fn settle(vol: &Volume, model: &mut Model, maybe: &mut HashMap<u64, Vec<u8>>) -> Vec<u64> {
    let bs = model.bs;
    let all = vread(vol, 0, model.blocks()).await;
    let mut bad = Vec::new();
    for b in 0..model.blocks() as usize {
        let got = &all[b * bs..(b + 1) * bs];
        if *got == model.data[b * bs..(b + 1) * bs] {
            continue;
        }
        if maybe.get(&(b as u64)).is_none_or(|alt| alt[..] != *got) {
            bad.push(b as u64);
        }
        model.apply(b as u64, got);
    }
    maybe.clear();
    bad
}

/// Picks `count` distinct member positions.
fn victims(rng: &mut Rng, n: usize, count: usize) -> Vec<usize> {
    let mut v = Vec::new();
    while v.len() < count {
        let i = rng.below(n as u64) as usize;
        if !v.contains(&i) {
            v.push(i);
        }
    }
    v
}

/// Power cuts while members are missing. Concurrent partial-stripe (and some
/// full-stripe) writes run on a degraded volume until the power fails at a
/// random member write; the volume reassembles (replaying the journal), and
/// then every acknowledged write must read back, every block of a write cut
/// short must hold its old or its new data, and the missing members' data,
/// most of it never written while they were missing, must reconstruct
/// intact. Every fourth round the missing members are replaced and rebuilt,
/// a scrub checks every stripe's parity against its data, and other members
/// fail. Returns the corrupted blocks and stripes found (with the journal
/// on, the first one panics) and how many journal records were replayed.
fn degraded_crash_loop(
    kind: LayoutKind,
    n: usize,
    fail: usize,
    iterations: u64,
    seed: u64,
    journal: bool,
) -> (u64, u64) {
    block_on(async {
        let mut rig = Rig::new(n, 12);
        let mut c = cfg(kind);
        c.write_journal = journal;
        let mut rng = Rng::new(seed);
        let vol = Volume::create(rig.members(), c).await.unwrap();
        let mut model = Model::new(&vol);
        // Fill the volume, so the members that go missing hold data to lose.
        let mut fill = vec![0u8; model.data.len()];
        rng.fill(&mut fill);
        vwrite(&vol, 0, &fill).await.unwrap();
        model.apply(0, &fill);
        vol.close().await.unwrap();
        drop(vol);
        let size = rig.mems[0].geometry().size_bytes();
        let mut missing: Vec<usize> = Vec::new();
        let mut maybe: HashMap<u64, Vec<u8>> = HashMap::new();
        let (mut corrupt, mut replayed) = (0u64, 0u64);
        let bs = BS as usize;
        for it in 0..iterations {
            let crash = CrashSwitch::new();
            let members: Vec<Arc<dyn BlockDevice>> = rig
                .mems
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let f = FaultDevice::with_crash(m.clone(), crash.clone());
                    f.set_yields(2, seed ^ (it << 8) ^ i as u64);
                    f as Arc<dyn BlockDevice>
                })
                .collect();
            let vol = Volume::assemble_with(members, true, journal).await.unwrap();
            replayed += vol.stats().journal_replayed;
            let states = vol.member_states();
            for &v in &missing {
                assert_eq!(states[v], MemberState::Failed, "{kind} iteration {it}");
            }
            let bad = settle(&vol, &mut model, &mut maybe).await;
            if journal {
                assert!(
                    bad.is_empty(),
                    "{kind} with {missing:?} missing, iteration {it}: blocks {bad:?} hold \
                     neither the acknowledged data nor an interrupted write's"
                );
            }
            corrupt += bad.len() as u64;
            if it % 4 == 3 {
                for &v in &missing {
                    let spare: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(size, 4096).unwrap());
                    // Behind the same power switch as the others.
                    let f = FaultDevice::with_crash(spare.clone(), crash.clone());
                    vol.replace_member(v, f).await.unwrap();
                    rig.mems[v] = spare;
                }
                vol.rebuild(RebuildOptions::default()).await.unwrap();
                let rep = vol.scrub(!journal).await;
                assert_eq!(rep.skipped, 0, "{kind} iteration {it}");
                if journal {
                    assert_eq!(
                        rep.inconsistent_count, 0,
                        "{kind} iteration {it}: parity disagrees with data after rebuild: {rep:?}"
                    );
                }
                corrupt += rep.inconsistent_count;
                let bad = settle(&vol, &mut model, &mut maybe).await;
                assert!(journal || bad.is_empty() || rep.inconsistent_count > 0);
                assert!(bad.is_empty() || !journal, "{kind}: rebuilt data differs");
                missing.clear();
            }
            if missing.is_empty() {
                missing = victims(&mut rng, n, fail);
                for &v in &missing {
                    vol.fail_member(v).await.unwrap();
                }
            }
            // Mostly early crashes; some long runs, where journal slots are
            // reused many times before the power goes.
            let run = if rng.below(4) == 0 { 400 } else { 40 };
            crash.arm(1 + rng.below(run));
            while !crash.crashed() {
                let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    let (lba, len) = random_range(&mut rng, &vol);
                    if batch
                        .iter()
                        .any(|(l, d)| lba < l + (d.len() / bs) as u64 && *l < lba + len)
                    {
                        continue;
                    }
                    let mut data = vec![0u8; len as usize * bs];
                    rng.fill(&mut data);
                    batch.push((lba, data));
                }
                let acked = write_batch(&vol, &crash, &batch, rng.below(2) as usize).await;
                for ((lba, data), ok) in batch.iter().zip(acked) {
                    if ok {
                        model.apply(*lba, data);
                    } else {
                        for (i, blk) in data.chunks(bs).enumerate() {
                            maybe.insert(lba + i as u64, blk.to_vec());
                        }
                    }
                }
            }
            drop(vol);
        }
        (corrupt, replayed)
    })
}

#[test]
fn degraded_crash_loop_raid5() {
    let (corrupt, replayed) = degraded_crash_loop(LayoutKind::Raid5, 4, 1, 1000, 11, true);
    eprintln!("raid5, one missing: {replayed} journal records replayed");
    assert_eq!(corrupt, 0);
    assert!(
        replayed > 20,
        "the crashes should catch updates mid-way: {replayed}"
    );
}

#[test]
fn degraded_crash_loop_raid6_one_missing() {
    let (corrupt, replayed) = degraded_crash_loop(LayoutKind::Raid6, 6, 1, 500, 12, true);
    eprintln!("raid6, one missing: {replayed} journal records replayed");
    assert_eq!(corrupt, 0);
    assert!(replayed > 20, "{replayed}");
}

#[test]
fn degraded_crash_loop_raid6_two_missing() {
    let (corrupt, replayed) = degraded_crash_loop(LayoutKind::Raid6, 6, 2, 400, 13, true);
    eprintln!("raid6, two missing: {replayed} journal records replayed");
    assert_eq!(corrupt, 0);
    assert!(replayed > 20, "{replayed}");
    let (corrupt, _) = degraded_crash_loop(LayoutKind::Erasure { k: 3, m: 3 }, 6, 2, 200, 14, true);
    assert_eq!(corrupt, 0);
}

/// The negative control: without the journal the same crashes corrupt data
/// nobody was writing (or leave parity that disagrees with it), so the loops
/// above would catch a broken journal.
#[test]
fn degraded_crash_without_journal_corrupts() {
    let (raid5, _) = degraded_crash_loop(LayoutKind::Raid5, 4, 1, 100, 11, false);
    let (raid6, _) = degraded_crash_loop(LayoutKind::Raid6, 6, 2, 100, 13, false);
    eprintln!("without the journal: raid5 {raid5}, raid6 {raid6} corrupted blocks and stripes");
    assert!(raid5 > 0 && raid6 > 0, "raid5 {raid5}, raid6 {raid6}");
}

/// A record of a degraded update must not outlive the rebuild of its stripe:
/// otherwise, after the rebuilt member fails too and the power is cut, the
/// stale record would be replayed over newer, unjournaled writes.
#[test]
fn rebuild_retires_journal_records() {
    block_on(async {
        let mut rig = Rig::new(4, 4);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut fill = vec![0u8; model.data.len()];
        Rng::new(1).fill(&mut fill);
        vwrite(&vol, 0, &fill).await.unwrap();
        model.apply(0, &fill);
        // Stripe 0 has data columns on members 0, 1, 2: lose member 1.
        assert_eq!(vol.layout().data_member(0, 1), 1);
        vol.fail_member(1).await.unwrap();
        // One block of column 0: a read-modify-write with a partial-parity record.
        let one = vec![0xA1u8; BS as usize];
        vwrite(&vol, 0, &one).await.unwrap();
        model.apply(0, &one);
        assert_eq!(vol.stats().journal_writes, 1);
        let spare: Arc<dyn BlockDevice> =
            Arc::new(MemDevice::new(rig.mems[0].geometry().size_bytes(), 4096).unwrap());
        vol.replace_member(1, spare.clone()).await.unwrap();
        rig.faults[1] = FaultDevice::new(spare);
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        // Healthy again: column 2 changes without a record.
        let two = vec![0xB2u8; 2 * BS as usize];
        vwrite(&vol, 4, &two).await.unwrap();
        model.apply(4, &two);
        assert_eq!(vol.stats().journal_writes, 1);
        // The rebuilt member fails, then the power goes.
        vol.fail_member(1).await.unwrap();
        drop(vol);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.stats().journal_replayed, 0);
        model.check(&vol, "after a stale record").await;
    });
}

#[test]
fn mirror_scrub_and_resync_work_without_the_first_copy() {
    block_on(async {
        let rig = Rig::new(3, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid1))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(21);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        vol.fail_member(0).await.unwrap();
        // Corrupt one block of copy 2 behind the volume's back.
        let off = META / 4096 + 1;
        rig.mems[2]
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba: off,
                blocks: 1,
                buf: buf_with(&[0xEEu8; 4096]),
            })
            .await
            .result
            .unwrap();
        let rep = vol.scrub(true).await;
        assert_eq!(
            (rep.skipped, rep.inconsistent_count, rep.repaired),
            (0, 1, 1),
            "{rep:?}"
        );
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        rig.faults[1].fail_now();
        model.check(&vol, "repaired copy").await;
    });
}

#[test]
fn assemble_after_close_and_in_any_order() {
    block_on(async {
        let rig = Rig::new(6, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid6))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(11);
        for _ in 0..30 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        let uuid = vol.uuid();
        vol.close().await.unwrap();
        let gen_closed = vol.generation();
        drop(vol);
        let mut shuffled = rig.members();
        shuffled.reverse();
        shuffled.swap(1, 4);
        let vol = Volume::assemble(shuffled).await.unwrap();
        assert_eq!(vol.uuid(), uuid);
        assert_eq!(vol.generation(), gen_closed + 1);
        assert_eq!(
            vol.stats().resynced_stripes,
            0,
            "a clean close leaves nothing to resync"
        );
        model.check(&vol, "reassembled").await;
    });
}

#[test]
fn assemble_refuses_stale_and_foreign_members() {
    block_on(async {
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.close().await.unwrap();
        drop(vol);
        // Keep an old copy of member 2.
        let size = rig.mems[2].geometry().size_bytes();
        let old: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(size, 4096).unwrap());
        let img = {
            let mut b = AlignedBuf::new(size as usize);
            b.set_len(size as usize);
            rig.mems[2]
                .submit(IoRequest {
                    op: BlockOp::Read,
                    lba: 0,
                    blocks: (size / 4096) as u32,
                    buf: b,
                })
                .await
                .buf
        };
        old.submit(IoRequest {
            op: BlockOp::Write { fua: false },
            lba: 0,
            blocks: (size / 4096) as u32,
            buf: img,
        })
        .await
        .result
        .unwrap();
        // Two more open/close cycles move the volume on.
        for _ in 0..2 {
            let v = Volume::assemble(rig.members()).await.unwrap();
            v.close().await.unwrap();
        }
        let mut members = rig.members();
        members[2] = old;
        let e = Volume::assemble(members)
            .await
            .err()
            .expect("stale refused");
        let msg = e.to_string();
        assert!(matches!(e, VolumeError::Stale { index: 2, .. }), "{msg}");
        assert!(
            msg.contains("member 2")
                && msg.contains("generation is 2")
                && msg.contains("generation 6"),
            "{msg}"
        );

        // A member of another volume.
        let other = Rig::new(4, 8);
        let ov = Volume::create(other.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        drop(ov);
        let mut members = rig.members();
        members[1] = other.members()[1].clone();
        let e = Volume::assemble(members)
            .await
            .err()
            .expect("foreign refused");
        assert!(matches!(e, VolumeError::Mismatch { index: 1, .. }), "{e}");

        // A blank device.
        let mut members = rig.members();
        members[3] = Arc::new(MemDevice::new(size, 4096).unwrap());
        let e = Volume::assemble(members)
            .await
            .err()
            .expect("blank refused");
        assert!(
            matches!(e, VolumeError::NoSuperblock { index: 3, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("member 3"), "{e}");
    });
}

#[test]
fn degraded_volume_reassembles_and_remembers_the_failure() {
    block_on(async {
        let rig = Rig::new(6, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid6))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(5);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        rig.faults[1].fail_now();
        for _ in 0..20 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        drop(vol);
        // The failed member comes back to life (a flaky cable): the volume
        // must not trust its stale data.
        rig.faults[1].heal();
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.member_states()[1], MemberState::Failed);
        model.check(&vol, "after reassembly").await;
        drop(vol);
        // A missing member (device gone) assembles degraded too.
        let mut members = rig.members();
        members.remove(4);
        let vol = Volume::assemble(members).await.unwrap();
        assert_eq!(vol.member_states()[4], MemberState::Failed);
        model.check(&vol, "two missing").await;
        drop(vol);
        let mut members = rig.members();
        members.truncate(3);
        let e = Volume::assemble(members).await.err().expect("too few");
        assert!(matches!(e, VolumeError::TooManyFailed { .. }), "{e}");
    });
}

fn spare(rig: &Rig) -> Arc<FaultDevice> {
    let size = rig.mems[0].geometry().size_bytes();
    FaultDevice::new(Arc::new(MemDevice::new(size, 4096).unwrap()))
}

#[test]
fn rebuild_restores_redundancy() {
    for (kind, n, fail) in [
        (LayoutKind::Raid1, 2, 1),
        (LayoutKind::Raid5, 5, 1),
        (LayoutKind::Raid6, 6, 2),
        (LayoutKind::Erasure { k: 4, m: 3 }, 7, 3),
    ] {
        block_on(async {
            let mut rig = Rig::new(n, 16);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let mut model = Model::new(&vol);
            let mut rng = Rng::new(n as u64);
            for _ in 0..30 {
                random_write(&mut rng, &vol, &mut model).await;
            }
            for i in 0..fail {
                vol.fail_member(i).await.unwrap();
            }
            for _ in 0..10 {
                random_write(&mut rng, &vol, &mut model).await;
            }
            for i in 0..fail {
                let s = spare(&rig);
                vol.replace_member(i, s.clone()).await.unwrap();
                rig.faults[i] = s;
            }
            assert!(matches!(
                vol.member_states()[0],
                MemberState::Rebuilding { checkpoint: 0 }
            ));
            vol.rebuild(RebuildOptions::default()).await.unwrap();
            assert!(
                vol.member_states()
                    .iter()
                    .all(|s| *s == MemberState::Active)
            );
            let p = vol.rebuild_progress();
            assert_eq!(p.done_stripes, p.total_stripes);
            assert!(!p.running);
            // The rebuilt members carry real data: fail all the others.
            for i in fail..n.min(2 * fail) {
                rig.faults[i].fail_now();
            }
            model.check(&vol, &format!("{kind} rebuilt")).await;
            assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        });
    }
}

/// Writers on several threads keep going while a rebuild runs; afterwards the
/// rebuilt member alone (with another failed) still returns every write.
#[test]
fn rebuild_races_concurrent_writers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut rig = Rig::new(6, 48);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid6))
            .await
            .unwrap();
        vol.fail_member(2).await.unwrap();
        let s = spare(&rig);
        vol.replace_member(2, s.clone()).await.unwrap();
        rig.faults[2] = s;
        let rebuild = vol.start_rebuild(RebuildOptions {
            rate_bytes_per_sec: Some(2 << 20),
            checkpoint_every: 8,
        });
        // Each writer owns a slice of the volume, so the final content is known.
        let total = vol.geometry().num_blocks;
        let writers = 4u64;
        let slice = total / writers;
        let mut tasks = Vec::new();
        for w in 0..writers {
            let vol = vol.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng::new(w + 100);
                let mut mine = vec![0u8; (slice * BS) as usize];
                for _ in 0..60 {
                    let off = rng.below(slice);
                    let len = 1 + rng.below(8.min(slice - off));
                    let mut data = vec![0u8; (len * BS) as usize];
                    rng.fill(&mut data);
                    vwrite(&vol, w * slice + off, &data).await.unwrap();
                    let at = (off * BS) as usize;
                    mine[at..at + data.len()].copy_from_slice(&data);
                    tokio::task::yield_now().await;
                }
                mine
            }));
        }
        let mut model = Model::new(&vol);
        for (w, t) in tasks.into_iter().enumerate() {
            let mine = t.await.unwrap();
            model.apply(w as u64 * slice, &mine);
        }
        rebuild.await.unwrap().unwrap();
        assert_eq!(vol.member_states()[2], MemberState::Active);
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
        rig.faults[0].fail_now();
        rig.faults[1].fail_now();
        model.check(&vol, "rebuilt under load").await;
    });
}

#[test]
fn replace_checks_its_arguments() {
    block_on(async {
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let e = vol.replace_member(1, spare(&rig)).await.unwrap_err();
        assert!(e.to_string().contains("not failed"), "{e}");
        vol.fail_member(1).await.unwrap();
        let small: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(META, 4096).unwrap());
        let e = vol.replace_member(1, small).await.unwrap_err();
        assert!(e.to_string().contains("needs at least"), "{e}");
        assert!(vol.fail_member(9).await.is_err());
    });
}

/// A throttled rebuild reports progress and ETA, survives a restart in the
/// middle (resuming from the checkpoint in the superblocks), and verifies.
#[test]
fn rebuild_is_throttled_and_resumes_after_restart() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let stripes = 64u64;
        let mut rig = Rig::new(5, stripes);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(77);
        for _ in 0..60 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        vol.fail_member(3).await.unwrap();
        let s = spare(&rig);
        vol.replace_member(3, s.clone()).await.unwrap();
        rig.faults[3] = s;
        // 64 strips of 8 KiB at 256 KiB/s: about 2 s in all.
        let opts = RebuildOptions {
            rate_bytes_per_sec: Some(256 << 10),
            checkpoint_every: 4,
        };
        let started = std::time::Instant::now();
        let task = vol.start_rebuild(opts.clone());
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        let p = vol.rebuild_progress();
        assert!(p.running);
        assert_eq!(p.members, vec![3]);
        assert!(p.done_stripes > 4 && p.done_stripes < stripes, "{p:?}");
        assert!(p.eta.is_some_and(|e| e.as_secs_f64() > 0.3), "{p:?}");
        assert!(p.bytes_per_sec < 400.0 * 1024.0, "throttled: {p:?}");
        // Writes go on during the rebuild, above and below the checkpoint.
        for _ in 0..20 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        // Power cut: stop the task, drop the volume without closing.
        task.abort();
        let _ = task.await;
        drop(vol);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        let MemberState::Rebuilding { checkpoint } = vol.member_states()[3] else {
            panic!(
                "member 3 should still be rebuilding: {:?}",
                vol.member_states()
            );
        };
        assert!(checkpoint >= 4, "checkpoint {checkpoint} persisted");
        model.check(&vol, "mid-rebuild").await;
        vol.rebuild(RebuildOptions::default()).await.unwrap();
        assert!(started.elapsed().as_secs_f64() > 0.6);
        assert_eq!(vol.member_states()[3], MemberState::Active);
        rig.faults[0].fail_now();
        model.check(&vol, "rebuilt member carries data").await;
        drop(vol);
        rig.faults[0].heal();
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.scrub(false).await.inconsistent_count, 0);
    });
}

#[test]
fn create_rejects_bad_configs() {
    block_on(async {
        let rig = Rig::new(3, 8);
        let mut c = cfg(LayoutKind::Raid6);
        let e = Volume::create(rig.members(), c.clone())
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("at least 4"), "{e}");
        c.layout = LayoutKind::Raid5;
        c.strip_bytes = 12 << 10;
        let e = Volume::create(rig.members(), c.clone())
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("strip_bytes = 12288"), "{e}");
        c.strip_bytes = STRIP;
        c.block_size = 1024;
        let e = Volume::create(rig.members(), c.clone())
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("block_size = 1024"), "{e}");
        c.block_size = 4096;
        let mut twice = rig.members();
        twice[2] = twice[0].clone();
        let e = Volume::create(twice, c).await.err().unwrap();
        assert!(
            e.to_string()
                .contains("member 2 is the same device as member 0"),
            "{e}"
        );
    });
}

// Device-kept records (NVMe reservations with PTPL) in the members' metadata.

const RES: RecordKind = RecordKind::Reservations;

fn member_bytes(dev: &Arc<dyn BlockDevice>, at: u64, len: usize) -> Vec<u8> {
    let bs = u64::from(dev.geometry().block_size);
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    let done = block_on(dev.submit(IoRequest {
        op: BlockOp::Read,
        lba: at / bs,
        blocks: (len as u64 / bs) as u32,
        buf: b,
    }));
    done.result.unwrap();
    done.buf.to_vec()
}

fn put_member_bytes(dev: &Arc<dyn BlockDevice>, at: u64, data: &[u8]) {
    let bs = u64::from(dev.geometry().block_size);
    let done = block_on(dev.submit(IoRequest {
        op: BlockOp::Write { fua: true },
        lba: at / bs,
        blocks: (data.len() as u64 / bs) as u32,
        buf: buf_with(data),
    }));
    done.result.unwrap();
}

/// Where new volumes of `cfg()` keep their records.
const REC_AT: u64 = META - records::AREA_BYTES;

#[test]
fn records_roundtrip_and_survive_reassembly() {
    block_on(async {
        for (kind, n) in [
            (LayoutKind::Raid5, 4),
            (LayoutKind::Raid1, 2),
            (LayoutKind::Raid0, 3),
        ] {
            let rig = Rig::new(n, 8);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            assert!(vol.keeps_records(), "{kind}");
            assert_eq!(vol.load_record(RES).unwrap(), None);
            let mut model = Model::new(&vol);
            let mut rng = Rng::new(3);
            for _ in 0..10 {
                random_write(&mut rng, &vol, &mut model).await;
            }
            vol.store_record(RES, b"first").unwrap();
            assert_eq!(vol.load_record(RES).unwrap(), Some(b"first".to_vec()));
            let mut big = vec![0u8; RECORD_MAX];
            rng.fill(&mut big);
            vol.store_record(RES, &big).unwrap();
            let e = vol
                .store_record(RES, &vec![0u8; RECORD_MAX + 1])
                .unwrap_err()
                .to_string();
            assert!(e.contains("2049 bytes"), "{e}");
            assert_eq!(vol.load_record(RES).unwrap().as_ref(), Some(&big));
            vol.close().await.unwrap();
            drop(vol);

            // Every member holds it, at the superblock's records_at.
            for m in &rig.mems {
                let sb = Superblock::decode(&member_bytes(m, 0, 4096)).unwrap();
                assert_eq!(sb.records_at, REC_AT);
            }
            let mut members = rig.members();
            members.reverse();
            let vol = Volume::assemble(members).await.unwrap();
            assert_eq!(vol.load_record(RES).unwrap().as_ref(), Some(&big), "{kind}");
            model.check(&vol, "data beside the records").await;
            // Generations go on from what was found.
            vol.store_record(RES, b"third").unwrap();
            drop(vol);
            let vol = Volume::assemble(rig.members()).await.unwrap();
            assert_eq!(vol.load_record(RES).unwrap(), Some(b"third".to_vec()));
            model.check(&vol, "after more records").await;
        }
    });
}

#[test]
fn records_torn_slot_keeps_the_older_record() {
    block_on(async {
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.store_record(RES, b"older").unwrap(); // generation 1: slot 1
        vol.store_record(RES, b"newer").unwrap(); // generation 2: slot 0
        drop(vol);
        // The newer write torn on one member: the others still have it.
        let torn = |m: &Arc<dyn BlockDevice>| {
            let mut slot = member_bytes(m, REC_AT, 4096);
            slot[64..69].copy_from_slice(b"XXXXX");
            put_member_bytes(m, REC_AT, &slot);
        };
        torn(&rig.mems[2]);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.load_record(RES).unwrap(), Some(b"newer".to_vec()));
        drop(vol);
        // Torn on every member (a crash mid-store): the older record.
        for m in &rig.mems {
            torn(m);
        }
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.load_record(RES).unwrap(), Some(b"older".to_vec()));
        // The next store goes to the torn slot, never over the good one.
        vol.store_record(RES, b"next").unwrap();
        drop(vol);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.load_record(RES).unwrap(), Some(b"next".to_vec()));
    });
}

#[test]
fn records_load_on_a_degraded_volume() {
    block_on(async {
        for gone in 0..4 {
            let rig = Rig::new(4, 8);
            let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
                .await
                .unwrap();
            vol.store_record(RES, b"kept").unwrap();
            vol.close().await.unwrap();
            drop(vol);
            let mut members = rig.members();
            members.remove(gone);
            let vol = Volume::assemble(members).await.unwrap();
            assert_eq!(vol.member_states()[gone], MemberState::Failed);
            assert_eq!(vol.load_record(RES).unwrap(), Some(b"kept".to_vec()));
        }
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.store_record(RES, b"before failure").unwrap();
        drop(vol);
        // A member failing while running: stores go on to the others.
        let vol = Volume::assemble(rig.members()).await.unwrap();
        rig.faults[1].fail_now();
        vol.store_record(RES, b"after failure").unwrap();
        assert_eq!(vol.member_states()[1], MemberState::Failed);
        drop(vol);
        rig.faults[1].heal();
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(
            vol.load_record(RES).unwrap(),
            Some(b"after failure".to_vec())
        );
    });
}

#[test]
fn records_in_volumes_from_before_records() {
    block_on(async {
        // A volume of the previous format: records_at 0, journal slots up to
        // the end of the metadata area.
        let rig = Rig::new(4, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        let mut model = Model::new(&vol);
        let mut rng = Rng::new(8);
        for _ in 0..10 {
            random_write(&mut rng, &vol, &mut model).await;
        }
        vol.close().await.unwrap();
        drop(vol);
        for m in &rig.mems {
            let mut sb = Superblock::decode(&member_bytes(m, 0, 4096)).unwrap();
            sb.records_at = 0;
            let b = sb.encode();
            assert_eq!(b[72..80], [0u8; 8], "the old format had zeroes here");
            put_member_bytes(m, 0, &b);
        }
        // Raid5 over 8 KiB strips: 20 KiB journal slots after 8 KiB of
        // superblock and bitmap leave 16 KiB unused at the end of 64 KiB:
        // adopted.
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert!(vol.keeps_records());
        model.check(&vol, "old format").await;
        vol.store_record(RES, b"adopted").unwrap();
        drop(vol);
        let sb = Superblock::decode(&member_bytes(&rig.mems[0], 0, 4096)).unwrap();
        assert_eq!(sb.records_at, REC_AT);
        let vol = Volume::assemble(rig.members()).await.unwrap();
        assert_eq!(vol.load_record(RES).unwrap(), Some(b"adopted".to_vec()));
        model.check(&vol, "after adoption").await;
        drop(vol);

        // No room (the journal slot fills the metadata area): no records,
        // and a store says why.
        let strip = 8u64 << 10;
        let meta = 4096 + 4096 + (4096 + strip);
        let size = meta + 8 * strip;
        let mems: Vec<Arc<dyn BlockDevice>> = (0..4)
            .map(|_| Arc::new(MemDevice::new(size, 4096).unwrap()) as Arc<dyn BlockDevice>)
            .collect();
        let vol = Volume::create(
            mems.clone(),
            VolumeConfig {
                meta_bytes: meta,
                ..cfg(LayoutKind::Raid5)
            },
        )
        .await
        .unwrap();
        assert!(!vol.keeps_records());
        assert_eq!(vol.load_record(RES).unwrap(), None);
        let e = vol.store_record(RES, b"x").unwrap_err().to_string();
        assert!(e.contains("meta_bytes") && e.contains("no room"), "{e}");
    });
}

/// A replaced member gets the current record at once, so replacing every
/// member in turn keeps it; the replacement's stale slots are overwritten.
#[test]
fn records_follow_every_member_replacement() {
    block_on(async {
        let rig = Rig::new(3, 8);
        let vol = Volume::create(rig.members(), cfg(LayoutKind::Raid5))
            .await
            .unwrap();
        vol.store_record(RES, b"kept").unwrap();
        let size = rig.mems[0].geometry().size_bytes();
        let mut members = rig.members();
        for (i, member) in members.iter_mut().enumerate() {
            vol.fail_member(i).await.unwrap();
            let spare: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(size, 4096).unwrap());
            // A slot from an earlier life of the device must not survive.
            // (The record, generation 1, lives in slot 1; slot 0 must be empty.)
            put_member_bytes(&spare, REC_AT, &[0xEE; 4096]);
            vol.replace_member(i, spare.clone()).await.unwrap();
            vol.rebuild(RebuildOptions::default()).await.unwrap();
            assert_eq!(member_bytes(&spare, REC_AT, 4096), vec![0u8; 4096]);
            *member = spare;
        }
        vol.close().await.unwrap();
        drop(vol);
        let vol = Volume::assemble(members).await.unwrap();
        assert_eq!(vol.load_record(RES).unwrap(), Some(b"kept".to_vec()));
    });
}

mod encrypted;
mod failed;
mod fence;
mod force;
mod gather;
mod readd;
mod state_hook;
mod sync;
mod zerocopy;

/// A host's discard of the whole device (mkfs does one) on a redundant
/// layout: one Deallocate far larger than a stripe, 512 B blocks.
#[test]
fn whole_device_deallocate() {
    block_on(async {
        for (n, kind) in [
            (5, LayoutKind::Raid6),
            (4, LayoutKind::Raid5),
            (2, LayoutKind::Raid1),
        ] {
            let rig = Rig::with_block_size(n, 64, 512);
            let vol = Volume::create(rig.members(), cfg(kind)).await.unwrap();
            let total = vol.geometry().num_blocks;
            vwrite(&vol, 0, &vec![9u8; (total * 512) as usize])
                .await
                .unwrap();
            for op in [BlockOp::Deallocate, BlockOp::WriteZeroes] {
                let done = vol
                    .submit(IoRequest {
                        op,
                        lba: 0,
                        blocks: total as u32,
                        buf: buf_with(&[0u8; 4096]),
                    })
                    .await;
                done.result
                    .unwrap_or_else(|e| panic!("{kind:?} {op:?}: {e}"));
            }
            let got = vread(&vol, 0, total).await;
            assert!(got.iter().all(|&b| b == 0), "{kind:?}");
        }
    });
}
