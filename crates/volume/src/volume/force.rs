//! Forced assembly (md's `--assemble --force`): a volume with more members
//! failed or stale than its layout tolerates is brought up by taking back,
//! as active, members whose devices still carry this volume's superblock
//! for their position, the freshest first and only as many as it takes to
//! reach the layout's tolerance.
//!
//! What that risks is data, not structure: a member taken back missed the
//! writes made while it was out, so blocks in those regions may hold old
//! data. The record of which regions were written is the intent bitmap,
//! held (never cleared) from the first failure on (see `readd.rs`); the
//! report lists those regions as volume byte ranges, a superset of what the
//! forced members missed. Without that record (no bitmap, a member that is
//! older than its failure, a stale member the superblocks never marked
//! failed) the report says that any block may be stale.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockOp};

use super::member_io::{abuf, dev_io, zbuf};
use super::{Inner, Volume, VolumeError, newest_superblock};
use crate::layout::Layout;
use crate::superblock::{MemberState, SB_BYTES, Superblock};

/// Why a member was out of the volume before it was forced back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedFrom {
    /// Marked failed in the newest superblock, at generation `failed_at`
    /// (0: not recorded).
    Failed { failed_at: u64 },
    /// Not marked failed, but its superblock is older than the volume's by
    /// more than one generation: it missed updates nobody recorded.
    Stale,
}

/// A member that [`Volume::assemble_force`] took back (or would take back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedMember {
    pub position: usize,
    /// Its index in the list of devices given to the assembly.
    pub index: usize,
    pub from: ForcedFrom,
    /// The generation of its own superblock.
    pub generation: u64,
}

/// A range of the volume that may hold old data after a forced assembly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleRange {
    /// Intent-bitmap regions `first_region..first_region + regions`.
    pub first_region: u64,
    pub regions: u64,
    /// Volume blocks (of the volume's block size) and bytes they cover.
    pub lba: u64,
    pub blocks: u64,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// What a forced assembly did, and what may be stale because of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceReport {
    /// The volume's generation (from its newest superblock) before assembly.
    pub volume_generation: u64,
    pub forced: Vec<ForcedMember>,
    /// Positions still failed or missing after it (the volume runs degraded
    /// on them; replace or re-add them).
    pub still_failed: Vec<usize>,
    /// Stale members that were not needed: left out as failed (a re-add
    /// rebuilds them in full).
    pub left_out: Vec<usize>,
    /// The regions written while the forced members were away, as the held
    /// intent bitmap records them (a superset). None: no usable record.
    pub stale_ranges: Option<Vec<StaleRange>>,
    /// Why there is no usable record, when there is none: then any block of
    /// the volume may be stale.
    pub unknown: Option<String>,
}

impl ForceReport {
    /// Bytes of the volume that may hold old data (None: any of it).
    pub fn stale_bytes(&self) -> Option<u64> {
        self.stale_ranges
            .as_ref()
            .map(|r| r.iter().map(|s| s.len_bytes).sum())
    }
}

/// Which members a forced assembly takes back, from the superblocks alone.
pub(crate) struct ForcePlan {
    pub forced: Vec<ForcedMember>,
    pub left_out: Vec<usize>,
}

impl ForcePlan {
    pub fn forces(&self, position: usize) -> bool {
        self.forced.iter().any(|f| f.position == position)
    }
}

/// Decides what to force from the superblocks read at assembly (`sbs` by
/// device index, `slot` by position). Nothing is written.
pub(crate) fn plan(
    newest: &Superblock,
    sbs: &[Option<Superblock>],
    slot: &[Option<usize>],
) -> Result<ForcePlan, VolumeError> {
    let n = newest.members.len();
    let data_blocks: Vec<u64> = newest.members.iter().map(|e| e.data_blocks).collect();
    let layout = Layout::new(
        newest.kind,
        u64::from(newest.strip_bytes / newest.block_size.max(1)),
        &data_blocks,
    )?;
    let tolerated = layout.parity_columns();
    let mut out = 0usize;
    let mut candidates: Vec<ForcedMember> = Vec::new();
    let mut not_candidates: Vec<String> = Vec::new();
    for (p, &at) in slot.iter().enumerate().take(n) {
        let Some(i) = at else {
            out += 1;
            not_candidates.push(format!("position {p} has no device"));
            continue;
        };
        let Some(sb) = sbs[i].as_ref() else {
            out += 1;
            continue;
        };
        let entry = &newest.members[p];
        let failed = entry.state == MemberState::Failed;
        let stale = !failed && sb.generation + 1 < newest.generation;
        if !failed && !stale {
            continue;
        }
        out += 1;
        // A member that was being rebuilt never held all of its data.
        if matches!(
            sb.members.get(p).map(|e| e.state),
            Some(MemberState::Rebuilding { .. })
        ) {
            not_candidates.push(format!(
                "position {p} was being rebuilt when it left (its data is incomplete)"
            ));
            continue;
        }
        candidates.push(ForcedMember {
            position: p,
            index: i,
            from: if failed {
                ForcedFrom::Failed {
                    failed_at: entry.failed_at,
                }
            } else {
                ForcedFrom::Stale
            },
            generation: sb.generation,
        });
    }
    let need = out.saturating_sub(tolerated);
    // Freshest first: the newest superblock, then the latest failure.
    candidates.sort_by_key(|c| {
        let at = match c.from {
            ForcedFrom::Failed { failed_at } => failed_at,
            ForcedFrom::Stale => 0,
        };
        std::cmp::Reverse((c.generation, at))
    });
    if candidates.len() < need {
        return Err(VolumeError::ForceRefused(format!(
            "{out} of {n} members are failed, stale or missing and {} survives only {tolerated}, \
             but only {} can be taken back ({}){}",
            newest.kind,
            candidates.len(),
            if candidates.is_empty() {
                "none".to_string()
            } else {
                candidates
                    .iter()
                    .map(|c| format!("position {}", c.position))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            if not_candidates.is_empty() {
                String::new()
            } else {
                format!("; {}", not_candidates.join("; "))
            }
        )));
    }
    let rest = candidates.split_off(need);
    let left_out = rest
        .iter()
        .filter(|c| c.from == ForcedFrom::Stale)
        .map(|c| c.position)
        .collect();
    Ok(ForcePlan {
        forced: candidates,
        left_out,
    })
}

impl Volume {
    /// Assembles like [`Volume::assemble`], but when more members are
    /// failed or stale than the layout tolerates, takes back the freshest of
    /// them as active, just enough to run (md's `--assemble --force`). The
    /// report says which, and which ranges may hold old data. Refused (and
    /// nothing written) when even that is not enough.
    pub async fn assemble_force(
        members: Vec<Arc<dyn BlockDevice>>,
    ) -> Result<(Volume, ForceReport), VolumeError> {
        let (vol, rep, _) = Self::assemble_opts(members, true, true, true, false).await?;
        Ok((vol, rep.expect("a forced assembly reports")))
    }

    /// What [`Volume::assemble_force`] would take back, read from the
    /// superblocks only (nothing is written): for a refusal that says what
    /// `--force` would do.
    pub async fn force_preview(
        members: &[Arc<dyn BlockDevice>],
    ) -> Result<Vec<ForcedMember>, VolumeError> {
        let mut sbs: Vec<Option<Superblock>> = Vec::with_capacity(members.len());
        for d in members {
            let (buf, r) = dev_io(d, BlockOp::Read, 0, SB_BYTES, abuf(SB_BYTES)).await;
            sbs.push(r.ok().and_then(|()| Superblock::decode(&buf).ok()));
        }
        let newest = newest_superblock(&sbs)?;
        let mut slot: Vec<Option<usize>> = vec![None; newest.members.len()];
        for (i, sb) in sbs.iter().enumerate() {
            if let Some(sb) = sb
                && sb.uuid == newest.uuid
                && sb.same_shape(&newest)
                && let Some(s) = slot.get_mut(usize::from(sb.position))
                && s.is_none()
            {
                *s = Some(i);
            }
        }
        Ok(plan(&newest, &sbs, &slot)?.forced)
    }
}

impl Inner {
    /// After the states are set, before journal replay: the forced members'
    /// old journal records must never be replayed over newer data, and what
    /// may be stale is read off the held bitmap.
    pub(crate) async fn finish_force(
        &self,
        plan: &ForcePlan,
        newest: &Superblock,
    ) -> Result<ForceReport, VolumeError> {
        if let Some(j) = &self.journal {
            let bytes = j.bytes() as usize;
            let devs = self.members.read().devs.clone();
            for f in &plan.forced {
                let (_, r) = dev_io(
                    &devs[f.position],
                    BlockOp::Write { fua: true },
                    j.start,
                    bytes,
                    zbuf(bytes),
                )
                .await;
                r.map_err(|source| VolumeError::MemberIo {
                    index: f.index,
                    source,
                })?;
            }
        }
        let still_failed: Vec<usize> = {
            let mut m = self.members.write();
            for &p in &plan.left_out {
                // Older than anything the bitmap records: a re-add rebuilds it.
                m.failed_at[p] = 0;
            }
            (0..m.states.len())
                .filter(|&p| m.states[p] == MemberState::Failed)
                .collect()
        };
        let unknown = self.force_unknown(plan);
        let stale_ranges = if unknown.is_some() {
            None
        } else {
            Some(self.stale_ranges(&self.intent.set_bits()))
        };
        let rep = ForceReport {
            volume_generation: newest.generation,
            forced: plan.forced.clone(),
            still_failed,
            left_out: plan.left_out.clone(),
            stale_ranges,
            unknown,
        };
        for f in &rep.forced {
            tracing::warn!(
                "volume {:?}: FORCED member at position {} back in ({}; its superblock is at \
                 generation {} of {}); blocks written while it was away may hold old data",
                newest.name,
                f.position,
                match f.from {
                    ForcedFrom::Failed { failed_at } =>
                        format!("it was marked failed at generation {failed_at}"),
                    ForcedFrom::Stale => "it was stale".to_string(),
                },
                f.generation,
                newest.generation
            );
        }
        match (&rep.stale_ranges, &rep.unknown) {
            (Some(r), _) => tracing::warn!(
                "volume {:?}: forced assembly: {} ranges ({} bytes) were written while the forced \
                 members were away and may be stale: {}; check the file system (fsck)",
                newest.name,
                r.len(),
                rep.stale_bytes().unwrap_or(0),
                r.iter()
                    .take(16)
                    .map(|s| format!("{}+{}", s.offset_bytes, s.len_bytes))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (None, Some(why)) => tracing::warn!(
                "volume {:?}: forced assembly: {why}; any block may be stale; check the file \
                 system (fsck)",
                newest.name
            ),
            (None, None) => {}
        }
        Ok(rep)
    }

    /// Why the held bitmap does not cover what the forced members missed.
    fn force_unknown(&self, plan: &ForcePlan) -> Option<String> {
        if plan.forced.is_empty() {
            return None;
        }
        if !self.use_intent {
            return Some("the volume keeps no intent bitmap of what was written".into());
        }
        let mut why = Vec::new();
        for f in &plan.forced {
            match f.from {
                ForcedFrom::Stale => why.push(format!(
                    "position {} was never marked failed, so nothing recorded what it missed",
                    f.position
                )),
                ForcedFrom::Failed { failed_at: 0 } => why.push(format!(
                    "the superblocks do not say since when the bitmap was kept for position {}",
                    f.position
                )),
                ForcedFrom::Failed { failed_at } if f.generation + 1 < failed_at => {
                    why.push(format!(
                        "position {} is at generation {} but failed at {failed_at}: it missed \
                         more than the bitmap records",
                        f.position, f.generation
                    ))
                }
                ForcedFrom::Failed { .. } => {}
            }
        }
        if why.is_empty() {
            None
        } else {
            Some(why.join("; "))
        }
    }

    /// The set regions of a bitmap as merged volume ranges.
    pub(crate) fn stale_ranges(&self, bits: &[u64]) -> Vec<StaleRange> {
        let rs = self.intent.region_stripes;
        let stripes = self.layout.stripes();
        let bs = self.bs;
        let mut out: Vec<StaleRange> = Vec::new();
        for r in 0..self.intent.regions {
            let set = bits
                .get((r / 64) as usize)
                .is_some_and(|w| w & (1 << (r % 64)) != 0);
            if !set || r * rs >= stripes {
                continue;
            }
            let first = r * rs;
            let last = (first + rs).min(stripes);
            let lba = self.layout.stripe_range(first).start;
            let end = self.layout.stripe_range(last - 1).end;
            match out.last_mut() {
                Some(s) if s.first_region + s.regions == r => {
                    s.regions += 1;
                    s.blocks = end - s.lba;
                    s.len_bytes = s.blocks * bs;
                }
                _ => out.push(StaleRange {
                    first_region: r,
                    regions: 1,
                    lba,
                    blocks: end - lba,
                    offset_bytes: lba * bs,
                    len_bytes: (end - lba) * bs,
                }),
            }
        }
        out
    }
}
