//! Where each volume block lives: a pure map from volume LBAs to
//! (stripe, data column, member, member LBA), and which members hold parity.
//!
//! Units are volume blocks throughout; "member LBA" counts volume blocks from
//! the start of a member's data area (after its metadata region).
//!
//! Striped layouts (raid0/1/5/6, k+m) cut each member's data area into strips
//! of `strip_blocks`; stripe `s` is strip `s` of every member. Of the `n = k + m`
//! strips of a stripe, `k` hold data and `m` hold parity. Rotating layouts place
//! parity left-symmetric (as Linux md does): stripe `s` puts parity `j` on member
//! `(P + j) % n` with `P = n - 1 - s % n`, and data column `d` on `(P + m + d) % n`,
//! so consecutive data strips walk the members in order and every member holds
//! each parity role once per `n` stripes.

use std::ops::Range;

/// The protection scheme of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// Members end to end; no striping, no redundancy.
    Concat,
    /// Striped across all members; no redundancy.
    Raid0,
    /// Every member holds a full copy (n-way mirror).
    Raid1,
    /// k data strips + 1 XOR parity strip, rotating.
    Raid5,
    /// k data strips + 2 Reed-Solomon parity strips, rotating.
    Raid6,
    /// k data strips + m Reed-Solomon parity strips (k <= 16, m <= 4), rotating.
    /// m = 1 uses XOR parity.
    Erasure { k: usize, m: usize },
}

impl LayoutKind {
    pub(crate) fn code(self) -> u8 {
        match self {
            LayoutKind::Concat => 0,
            LayoutKind::Raid0 => 1,
            LayoutKind::Raid1 => 2,
            LayoutKind::Raid5 => 3,
            LayoutKind::Raid6 => 4,
            LayoutKind::Erasure { .. } => 5,
        }
    }

    pub(crate) fn from_code(code: u8, k: usize, m: usize) -> Option<LayoutKind> {
        Some(match code {
            0 => LayoutKind::Concat,
            1 => LayoutKind::Raid0,
            2 => LayoutKind::Raid1,
            3 => LayoutKind::Raid5,
            4 => LayoutKind::Raid6,
            5 => LayoutKind::Erasure { k, m },
            _ => return None,
        })
    }

    /// (k, m) for `members` members, or why that count does not fit the layout.
    pub fn shape(self, members: usize) -> Result<(usize, usize), LayoutError> {
        let need = |min: usize, what: &str| {
            if members < min {
                Err(LayoutError(format!(
                    "{self} needs at least {min} members ({what}); got {members}"
                )))
            } else {
                Ok(())
            }
        };
        if members > MAX_MEMBERS {
            return Err(LayoutError(format!(
                "{members} members is over the limit of {MAX_MEMBERS}; use fewer members"
            )));
        }
        match self {
            LayoutKind::Concat => need(1, "one or more drives").map(|_| (members, 0)),
            LayoutKind::Raid0 => need(1, "one or more drives").map(|_| (members, 0)),
            LayoutKind::Raid1 => need(2, "two or more copies").map(|_| (1, members - 1)),
            LayoutKind::Raid5 => need(3, "two data + one parity").map(|_| (members - 1, 1)),
            LayoutKind::Raid6 => need(4, "two data + two parity").map(|_| (members - 2, 2)),
            LayoutKind::Erasure { k, m } => {
                if !(1..=16).contains(&k) || !(1..=4).contains(&m) {
                    return Err(LayoutError(format!(
                        "erasure code {k}+{m} is not supported; use k in 1..=16 and m in 1..=4"
                    )));
                }
                if members != k + m {
                    return Err(LayoutError(format!(
                        "erasure code {k}+{m} needs exactly {} members; got {members}",
                        k + m
                    )));
                }
                Ok((k, m))
            }
        }
    }

    fn rotates(self) -> bool {
        matches!(
            self,
            LayoutKind::Raid5 | LayoutKind::Raid6 | LayoutKind::Erasure { .. }
        )
    }
}

impl std::fmt::Display for LayoutKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutKind::Concat => write!(f, "concat"),
            LayoutKind::Raid0 => write!(f, "raid0"),
            LayoutKind::Raid1 => write!(f, "raid1"),
            LayoutKind::Raid5 => write!(f, "raid5"),
            LayoutKind::Raid6 => write!(f, "raid6"),
            LayoutKind::Erasure { k, m } => write!(f, "ec{k}+{m}"),
        }
    }
}

/// Most members a volume may have (a superblock lists them all).
pub const MAX_MEMBERS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LayoutError(pub String);

/// What a member's strip holds in one stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Data(usize),
    Parity(usize),
}

/// A run of volume blocks that sits in one strip of one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Stripe number (striped layouts); the member index for concat.
    pub stripe: u64,
    /// Data column inside the stripe (0 for concat).
    pub col: usize,
    pub member: usize,
    /// First block inside the strip (concat: same as `member_lba`).
    pub row: u64,
    /// First block in the member's data area.
    pub member_lba: u64,
    pub blocks: u64,
    /// Blocks from the start of the request.
    pub offset: u64,
}

/// A volume's geometry in volume blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    kind: LayoutKind,
    n: usize,
    k: usize,
    m: usize,
    strip_blocks: u64,
    /// Usable data-area blocks of each member (striped: all equal, multiple of strip_blocks).
    member_blocks: Vec<u64>,
    /// Concat only: volume LBA where each member starts (len n + 1).
    concat_starts: Vec<u64>,
    stripes: u64,
}

impl Layout {
    /// `member_blocks[i]` is how many volume blocks member `i` can hold in its
    /// data area. Striped layouts use the smallest, cut to whole strips.
    pub fn new(
        kind: LayoutKind,
        strip_blocks: u64,
        member_blocks: &[u64],
    ) -> Result<Layout, LayoutError> {
        let n = member_blocks.len();
        let (k, m) = kind.shape(n)?;
        if strip_blocks == 0 || !strip_blocks.is_power_of_two() {
            return Err(LayoutError(format!(
                "strip of {strip_blocks} blocks is not a power of two; use e.g. 16 (64 KiB at 4 KiB blocks)"
            )));
        }
        if kind == LayoutKind::Concat {
            let mut starts = Vec::with_capacity(n + 1);
            let mut at = 0u64;
            for &b in member_blocks {
                starts.push(at);
                at += b;
            }
            starts.push(at);
            if at == 0 {
                return Err(LayoutError("members have no room for data".into()));
            }
            return Ok(Layout {
                kind,
                n,
                k,
                m,
                strip_blocks,
                member_blocks: member_blocks.to_vec(),
                concat_starts: starts,
                stripes: 0,
            });
        }
        let smallest = member_blocks.iter().copied().min().unwrap_or(0);
        let stripes = smallest / strip_blocks;
        if stripes == 0 {
            return Err(LayoutError(format!(
                "the smallest member holds {smallest} blocks, less than one strip of {strip_blocks}; \
                 use larger members or a smaller strip"
            )));
        }
        Ok(Layout {
            kind,
            n,
            k,
            m,
            strip_blocks,
            member_blocks: vec![stripes * strip_blocks; n],
            concat_starts: Vec::new(),
            stripes,
        })
    }

    pub fn kind(&self) -> LayoutKind {
        self.kind
    }
    pub fn members(&self) -> usize {
        self.n
    }
    /// Data strips per stripe.
    pub fn data_columns(&self) -> usize {
        self.k
    }
    /// Parity strips per stripe (mirror copies for raid1).
    pub fn parity_columns(&self) -> usize {
        self.m
    }
    pub fn strip_blocks(&self) -> u64 {
        self.strip_blocks
    }
    /// Stripes (0 for concat).
    pub fn stripes(&self) -> u64 {
        self.stripes
    }
    pub fn is_striped(&self) -> bool {
        self.kind != LayoutKind::Concat
    }
    /// Blocks of member `i`'s data area in use.
    pub fn member_blocks(&self, i: usize) -> u64 {
        self.member_blocks[i]
    }

    pub fn volume_blocks(&self) -> u64 {
        match self.kind {
            LayoutKind::Concat => *self.concat_starts.last().unwrap_or(&0),
            _ => self.stripes * self.strip_blocks * self.k as u64,
        }
    }

    /// Blocks of data per stripe.
    pub fn stripe_data_blocks(&self) -> u64 {
        self.strip_blocks * self.k as u64
    }

    /// First member of the stripe's parity run.
    fn parity_start(&self, stripe: u64) -> usize {
        if self.kind.rotates() {
            self.n - 1 - (stripe % self.n as u64) as usize
        } else {
            self.k
        }
    }

    /// Member holding data column `col` of `stripe`.
    pub fn data_member(&self, stripe: u64, col: usize) -> usize {
        debug_assert!(col < self.k);
        if self.kind.rotates() {
            (self.parity_start(stripe) + self.m + col) % self.n
        } else {
            col
        }
    }

    /// Member holding parity `j` of `stripe`.
    pub fn parity_member(&self, stripe: u64, j: usize) -> usize {
        debug_assert!(j < self.m);
        if self.kind.rotates() {
            (self.parity_start(stripe) + j) % self.n
        } else {
            self.k + j
        }
    }

    /// Member of column `c` where columns `0..k` are data and `k..k+m` parity.
    pub fn column_member(&self, stripe: u64, c: usize) -> usize {
        if c < self.k {
            self.data_member(stripe, c)
        } else {
            self.parity_member(stripe, c - self.k)
        }
    }

    /// What `member` holds in `stripe` (striped layouts).
    pub fn role(&self, stripe: u64, member: usize) -> Role {
        if self.kind.rotates() {
            let r = (member + self.n - self.parity_start(stripe)) % self.n;
            if r < self.m {
                Role::Parity(r)
            } else {
                Role::Data(r - self.m)
            }
        } else if member < self.k {
            Role::Data(member)
        } else {
            Role::Parity(member - self.k)
        }
    }

    /// Column index (data `0..k`, parity `k..k+m`) of `member` in `stripe`.
    pub fn member_column(&self, stripe: u64, member: usize) -> usize {
        match self.role(stripe, member) {
            Role::Data(d) => d,
            Role::Parity(j) => self.k + j,
        }
    }

    /// Member LBA of block `row` of `stripe`'s strips.
    pub fn strip_lba(&self, stripe: u64, row: u64) -> u64 {
        stripe * self.strip_blocks + row
    }

    /// Where one volume block lives.
    pub fn locate(&self, lba: u64) -> Extent {
        self.extents(lba, 1)[0]
    }

    /// Splits `blocks` blocks from `lba` into per-strip runs, in volume order.
    /// The caller checks the range against `volume_blocks()`.
    pub fn extents(&self, lba: u64, blocks: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        let mut at = lba;
        let end = lba + blocks;
        while at < end {
            let e = if self.kind == LayoutKind::Concat {
                // Last start <= at.
                let i = self.concat_starts.partition_point(|&s| s <= at) - 1;
                let off = at - self.concat_starts[i];
                let len = (self.concat_starts[i + 1] - at).min(end - at);
                Extent {
                    stripe: i as u64,
                    col: 0,
                    member: i,
                    row: off,
                    member_lba: off,
                    blocks: len,
                    offset: at - lba,
                }
            } else {
                let per_stripe = self.stripe_data_blocks();
                let stripe = at / per_stripe;
                let in_stripe = at % per_stripe;
                let col = (in_stripe / self.strip_blocks) as usize;
                let row = in_stripe % self.strip_blocks;
                let len = (self.strip_blocks - row).min(end - at);
                Extent {
                    stripe,
                    col,
                    member: self.data_member(stripe, col),
                    row,
                    member_lba: self.strip_lba(stripe, row),
                    blocks: len,
                    offset: at - lba,
                }
            };
            at += e.blocks;
            out.push(e);
        }
        out
    }

    /// Volume LBA range that `stripe` covers.
    pub fn stripe_range(&self, stripe: u64) -> Range<u64> {
        let per = self.stripe_data_blocks();
        stripe * per..(stripe + 1) * per
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn kinds() -> impl Strategy<Value = (LayoutKind, usize)> {
        prop_oneof![
            (1usize..6).prop_map(|n| (LayoutKind::Concat, n)),
            (1usize..9).prop_map(|n| (LayoutKind::Raid0, n)),
            (2usize..5).prop_map(|n| (LayoutKind::Raid1, n)),
            (3usize..10).prop_map(|n| (LayoutKind::Raid5, n)),
            (4usize..10).prop_map(|n| (LayoutKind::Raid6, n)),
            (1usize..=16, 1usize..=4).prop_map(|(k, m)| (LayoutKind::Erasure { k, m }, k + m)),
        ]
    }

    fn layout_strategy() -> impl Strategy<Value = Layout> {
        (
            kinds(),
            0u32..4,
            1u64..6,
            prop::collection::vec(0u64..40, 64),
        )
            .prop_map(|((kind, n), strip_pow, strips, extra)| {
                let strip = 1u64 << strip_pow;
                let sizes: Vec<u64> = (0..n).map(|i| strips * strip + extra[i]).collect();
                Layout::new(kind, strip, &sizes).expect("valid layout")
            })
    }

    proptest! {
        /// Every volume block maps to a distinct (member, member LBA) inside the
        /// member's data area, and on a data (never parity) strip.
        #[test]
        fn map_is_injective_onto_data_strips(layout in layout_strategy()) {
            let total = layout.volume_blocks();
            let mut seen = HashSet::new();
            let mut count = 0u64;
            for e in layout.extents(0, total) {
                for b in 0..e.blocks {
                    let lba = e.member_lba + b;
                    prop_assert!(lba < layout.member_blocks(e.member));
                    prop_assert!(seen.insert((e.member, lba)), "block mapped twice");
                    if layout.is_striped() {
                        prop_assert_eq!(layout.role(e.stripe, e.member), Role::Data(e.col));
                        prop_assert_eq!(lba / layout.strip_blocks(), e.stripe);
                    }
                    count += 1;
                }
            }
            prop_assert_eq!(count, total);
            // Bijection: data strips + parity strips fill every member's data area.
            if layout.is_striped() {
                let parity_blocks = layout.stripes() * layout.strip_blocks() * layout.parity_columns() as u64;
                let member_total: u64 = (0..layout.members()).map(|i| layout.member_blocks(i)).sum();
                prop_assert_eq!(total + parity_blocks, member_total);
            } else {
                let member_total: u64 = (0..layout.members()).map(|i| layout.member_blocks(i)).sum();
                prop_assert_eq!(total, member_total);
            }
        }

        /// Any request splits into in-order runs that cover it exactly and agree
        /// with the block-by-block map.
        #[test]
        fn extents_cover_requests(layout in layout_strategy(), a in 0u64..10_000, len in 1u64..300) {
            let total = layout.volume_blocks();
            let lba = a % total;
            let len = len.min(total - lba);
            let ext = layout.extents(lba, len);
            let mut next = 0;
            for e in &ext {
                prop_assert_eq!(e.offset, next);
                prop_assert!(e.blocks > 0);
                if layout.is_striped() {
                    prop_assert!(e.row + e.blocks <= layout.strip_blocks());
                }
                let single = layout.locate(lba + e.offset);
                prop_assert_eq!(single.member, e.member);
                prop_assert_eq!(single.member_lba, e.member_lba);
                next += e.blocks;
            }
            prop_assert_eq!(next, len);
        }

        /// Each stripe uses every member once; columns and members invert.
        #[test]
        fn stripe_roles_partition_members(layout in layout_strategy(), s in 0u64..1000) {
            prop_assume!(layout.is_striped());
            let s = s % layout.stripes();
            let n = layout.members();
            let cols = layout.data_columns() + layout.parity_columns();
            prop_assert_eq!(cols, n);
            let mut members = HashSet::new();
            for c in 0..cols {
                let mbr = layout.column_member(s, c);
                prop_assert!(members.insert(mbr));
                prop_assert_eq!(layout.member_column(s, mbr), c);
            }
        }

        /// Rotating layouts give every member each parity role exactly once per
        /// n consecutive stripes.
        #[test]
        fn parity_rotates_evenly(layout in layout_strategy(), start in 0u64..50) {
            let rot = matches!(layout.kind(), LayoutKind::Raid5 | LayoutKind::Raid6 | LayoutKind::Erasure { .. });
            prop_assume!(rot);
            let n = layout.members();
            for j in 0..layout.parity_columns() {
                let mut hits = vec![0; n];
                for s in start..start + n as u64 {
                    hits[layout.parity_member(s, j)] += 1;
                }
                prop_assert!(hits.iter().all(|&h| h == 1), "parity {} hits {:?}", j, hits);
            }
        }
    }

    #[test]
    fn raid5_is_left_symmetric() {
        // md's left-symmetric 4-drive table: parity 3,2,1,0; data follows parity.
        let l = Layout::new(LayoutKind::Raid5, 1, &[8; 4]).unwrap();
        let rows: Vec<Vec<usize>> = (0..4)
            .map(|s| (0..3).map(|d| l.data_member(s, d)).collect())
            .collect();
        assert_eq!(
            rows,
            vec![vec![0, 1, 2], vec![3, 0, 1], vec![2, 3, 0], vec![1, 2, 3]]
        );
        assert_eq!(
            (0..4).map(|s| l.parity_member(s, 0)).collect::<Vec<_>>(),
            vec![3, 2, 1, 0]
        );
        // raid6: Q follows P.
        let l6 = Layout::new(LayoutKind::Raid6, 1, &[8; 5]).unwrap();
        assert_eq!(l6.parity_member(0, 0), 4);
        assert_eq!(l6.parity_member(0, 1), 0);
        assert_eq!(l6.data_member(0, 0), 1);
    }

    #[test]
    fn shape_errors_say_what_is_needed() {
        let e = Layout::new(LayoutKind::Raid6, 16, &[64; 3]).unwrap_err();
        assert!(e.0.contains("at least 4") && e.0.contains("got 3"), "{e}");
        let e = Layout::new(LayoutKind::Erasure { k: 17, m: 1 }, 16, &[64; 18]).unwrap_err();
        assert!(e.0.contains("17+1"), "{e}");
        let e = Layout::new(LayoutKind::Raid0, 3, &[64; 2]).unwrap_err();
        assert!(e.0.contains("power of two"), "{e}");
        let e = Layout::new(LayoutKind::Raid5, 16, &[64, 64, 8]).unwrap_err();
        assert!(e.0.contains("smallest member"), "{e}");
    }

    #[test]
    fn concat_spans_unequal_members() {
        let l = Layout::new(LayoutKind::Concat, 16, &[10, 5, 7]).unwrap();
        assert_eq!(l.volume_blocks(), 22);
        let ext = l.extents(8, 10);
        assert_eq!(
            ext.iter()
                .map(|e| (e.member, e.member_lba, e.blocks))
                .collect::<Vec<_>>(),
            vec![(0, 8, 2), (1, 0, 5), (2, 0, 3)]
        );
    }
}
