//! The memory plan: liveness over the schedule and best-fit offset assignment in arenas.
//!
//! Params and states sit at fixed offsets at the start of arena 0 (they live across runs).
//! Every other buffer lives from the step that writes it (inputs: from the start) to the last
//! step that reads it (outputs and assign sources: to the end of the run). Buffers are placed
//! largest first, each in the smallest gap between buffers whose lifetimes overlap its own
//! (greedy-by-size best fit). When a buffer does not fit under the storage-binding limit in
//! any arena, a new arena is opened.
//!
//! Greedy-by-size looks at every pair of buffers live together, which is quadratic when
//! thousands are (the activations a training step keeps for its backward pass). Past a budget
//! of such pairs per buffer the plan places buffers in order of their first step instead, each
//! in the smallest free block of a free list (linear scan, O(n log n)). Every step of the plan is
//! O(n log n) plus the pairs greedy-by-size is allowed to visit.
//!
//! The lower bound reported beside the peak is the largest total size of buffers live at one
//! moment: no placement can use less.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Write;

use sinter_ir::artifact::Storage;

use crate::error::CompileError;
use crate::schedule::{Buffer, BufferKind, Schedule};

/// Buffers start at multiples of this many bytes.
pub const ALIGN: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub arena: u32,
    /// Byte offset in the arena.
    pub offset: u64,
}

#[derive(Clone, Debug)]
pub struct MemoryPlan {
    pub placements: Vec<Placement>,
    /// Size in bytes of each arena.
    pub arenas: Vec<u64>,
    /// What each arena stores (word arenas first).
    pub storage: Vec<Storage>,
    /// Live interval `[first, last]` of each buffer, in step indices (`steps.len()` = after
    /// the last step).
    pub live: Vec<(u32, u32)>,
    pub peak_bytes: u64,
    pub lower_bound_bytes: u64,
}

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN).max(1).saturating_mul(ALIGN)
}

/// Live interval of every buffer.
pub fn liveness(sched: &Schedule) -> Vec<(u32, u32)> {
    let end = sched.steps.len() as u32;
    let mut live: Vec<Option<(u32, u32)>> = sched
        .buffers
        .iter()
        .map(|b| match b.kind {
            BufferKind::Persistent(_) => Some((0, end)),
            BufferKind::Input(_) => Some((0, 0)),
            BufferKind::Temp => None,
        })
        .collect();
    let mut touch = |buffer: usize, step: u32| {
        let entry = &mut live[buffer];
        *entry = Some(match *entry {
            Some((first, last)) => (first.min(step), last.max(step)),
            None => (step, step),
        });
    };
    for (s, step) in sched.steps.iter().enumerate() {
        let (reads, writes) = step.plan.buffers();
        for b in reads.into_iter().chain(writes) {
            touch(b.0 as usize, s as u32);
        }
    }
    for o in &sched.outputs {
        touch(o.view.buffer.0 as usize, end);
    }
    for (_, view) in &sched.assigns {
        touch(view.buffer.0 as usize, end);
    }
    live.into_iter().map(|l| l.unwrap_or((end, end))).collect()
}

/// Plans every buffer of `sched`: each storage class ([`Storage`]: words, f16 halves) in arenas
/// of its own, word arenas first; within a class, persistent buffers first, then the rest by
/// liveness.
pub fn plan(sched: &Schedule, max_binding: u64) -> Result<MemoryPlan, CompileError> {
    let live = liveness(sched);
    let sizes: Vec<u64> = sched.buffers.iter().map(Buffer::size_bytes).collect();
    for (b, &size) in sched.buffers.iter().zip(&sizes) {
        if aligned(size) > max_binding {
            return Err(CompileError::TensorTooLarge {
                name: b.label.clone(),
                bytes: size,
                limit: max_binding,
            });
        }
    }
    let mut placements: Vec<Option<Placement>> = vec![None; sizes.len()];
    let (mut arenas, mut storage) = (Vec::new(), Vec::new());
    for class in [Storage::Word, Storage::Half] {
        let members: Vec<usize> = (0..sizes.len())
            .filter(|&b| sched.buffers[b].storage == class)
            .collect();
        if members.is_empty() && class != Storage::Word {
            continue;
        }
        let first = arenas.len() as u32;
        let class_arenas =
            place_class(sched, &members, &sizes, &live, max_binding, &mut placements);
        for &b in &members {
            if let Some(p) = placements[b].as_mut() {
                p.arena += first;
            }
        }
        storage.extend(std::iter::repeat_n(class, class_arenas.len()));
        arenas.extend(class_arenas);
    }
    for (i, (&bytes, class)) in arenas.iter().zip(&storage).enumerate() {
        let elements = bytes / class.bytes();
        if elements > u32::MAX as u64 {
            return Err(CompileError::IndexSpace { arena: i, elements });
        }
    }
    let peak_bytes = arenas.iter().sum();
    let lower_bound_bytes = lower_bound(&live, &sizes);
    Ok(MemoryPlan {
        placements: placements
            .into_iter()
            .map(|p| p.expect("every buffer placed"))
            .collect(),
        arenas,
        storage,
        live,
        peak_bytes,
        lower_bound_bytes,
    })
}

/// Places the buffers `members` (one storage class) in arenas of their own, numbered from 0 in
/// `placements`; returns the arenas' sizes (at least one arena).
fn place_class(
    sched: &Schedule,
    members: &[usize],
    sizes: &[u64],
    live: &[(u32, u32)],
    max_binding: u64,
    placements: &mut [Option<Placement>],
) -> Vec<u64> {
    let mut arenas: Vec<u64> = Vec::new();
    // Persistent buffers first, in declaration order, stacked from the start of the arenas
    // (they are all live together, so no gap between them could be reused).
    let is_persistent = |b: usize| matches!(sched.buffers[b].kind, BufferKind::Persistent(_));
    for &b in members.iter().filter(|&&b| is_persistent(b)) {
        let size = aligned(sizes[b]);
        let arena = match arenas.last() {
            Some(&top) if top + size <= max_binding => arenas.len() - 1,
            _ => {
                arenas.push(0);
                arenas.len() - 1
            }
        };
        placements[b] = Some(Placement {
            arena: arena as u32,
            offset: arenas[arena],
        });
        arenas[arena] += size;
    }
    let rest: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&b| !is_persistent(b))
        .collect();
    let aligned_sizes: Vec<u64> = sizes.iter().map(|&s| aligned(s)).collect();
    let mut layout = Layout {
        sizes: &aligned_sizes,
        live,
        max_binding,
        placements: placements.to_vec(),
        arenas,
        members: members.to_vec(),
    };
    if overlapping_pairs(&rest, live) <= GREEDY_PAIR_BUDGET_PER_BUFFER * rest.len() as u64 {
        layout.greedy_by_size(rest);
    } else {
        layout.linear_scan(rest);
    }
    for &b in members {
        placements[b] = layout.placements[b];
    }
    let mut arenas = layout.arenas;
    if arenas.is_empty() {
        arenas.push(ALIGN);
    }
    arenas
}

/// Greedy-by-size enumerates, for every buffer, the placed buffers whose lifetimes overlap its
/// own; past this many overlapping pairs per buffer (a training graph keeps thousands of
/// activations live at once) the plan switches to [`Layout::linear_scan`], which is
/// O(n log n) whatever the overlap.
const GREEDY_PAIR_BUDGET_PER_BUFFER: u64 = 64;

/// Offsets being assigned: a placement per buffer (persistent ones already placed) and the
/// size of every arena so far.
struct Layout<'a> {
    /// Aligned sizes.
    sizes: &'a [u64],
    live: &'a [(u32, u32)],
    max_binding: u64,
    placements: Vec<Option<Placement>>,
    arenas: Vec<u64>,
    /// The buffers of the storage class being placed (others' placements are another class's
    /// arenas).
    members: Vec<usize>,
}

impl Layout<'_> {
    fn place(&mut self, b: usize, p: Placement) {
        if p.arena as usize == self.arenas.len() {
            self.arenas.push(0);
        }
        let top = &mut self.arenas[p.arena as usize];
        *top = (*top).max(p.offset + self.sizes[b]);
        self.placements[b] = Some(p);
    }

    /// Largest first, each in the smallest gap between the placed buffers whose lifetimes
    /// overlap its own (greedy-by-size best fit); a new arena when none has room.
    fn greedy_by_size(&mut self, mut order: Vec<usize>) {
        order.sort_by_key(|&b| (std::cmp::Reverse(self.sizes[b]), self.live[b].0, b));
        let mut placed = PlacedIndex::new(self.live);
        for &b in &self.members {
            if self.placements[b].is_some() {
                placed.insert(b);
            }
        }
        let mut overlapping = Vec::new();
        let mut busy = Vec::new();
        for b in order {
            let size = self.sizes[b];
            overlapping.clear();
            placed.overlapping(self.live[b], &mut overlapping);
            let mut arena = 0;
            let offset = loop {
                busy.clear();
                busy.extend(overlapping.iter().filter_map(|&o| {
                    let p = self.placements[o].expect("indexed buffers are placed");
                    (p.arena == arena).then(|| (p.offset, p.offset + self.sizes[o]))
                }));
                let offset = best_fit(&mut busy, size);
                if offset + size <= self.max_binding {
                    break offset;
                }
                arena += 1;
            };
            self.place(b, Placement { arena, offset });
            placed.insert(b);
        }
    }

    /// In order of first step, each buffer in the smallest free block of an arena at that
    /// step (best fit over a free list that buffers return to after their last step), else on
    /// top; a new arena when none has room. O(n log n).
    fn linear_scan(&mut self, mut order: Vec<usize>) {
        order.sort_by_key(|&b| (self.live[b].0, std::cmp::Reverse(self.sizes[b]), b));
        let mut ending: BinaryHeap<Reverse<(u32, usize)>> = BinaryHeap::new();
        let mut free: Vec<FreeList> = Vec::new();
        for b in order {
            let start = self.live[b].0;
            while let Some(&Reverse((last, done))) = ending.peek() {
                if last >= start {
                    break;
                }
                ending.pop();
                let p = self.placements[done].expect("ending buffers are placed");
                free[p.arena as usize].release(p.offset, self.sizes[done]);
            }
            let size = self.sizes[b];
            let mut arena = 0;
            let offset = loop {
                if arena == free.len() {
                    let top = self.arenas.get(arena).copied().unwrap_or(0);
                    free.push(FreeList::new(top));
                }
                if let Some(offset) = free[arena].take(size, self.max_binding) {
                    break offset;
                }
                arena += 1;
            };
            self.place(
                b,
                Placement {
                    arena: arena as u32,
                    offset,
                },
            );
            ending.push(Reverse((self.live[b].1, b)));
        }
    }
}

/// The free byte ranges of one arena below its current top, by offset and by size.
struct FreeList {
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    /// Everything from here up is free.
    top: u64,
}

impl FreeList {
    fn new(top: u64) -> FreeList {
        FreeList {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            top,
        }
    }

    fn remove(&mut self, offset: u64, size: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(size, offset));
    }

    /// The offset of `size` bytes: the smallest free block that fits, else the top (merged
    /// with a free block just below it), if that stays within `limit`.
    fn take(&mut self, size: u64, limit: u64) -> Option<u64> {
        if let Some(&(block, offset)) = self.by_size.range((size, 0)..).next() {
            self.remove(offset, block);
            if block > size {
                self.insert(offset + size, block - size);
            }
            return Some(offset);
        }
        let mut start = self.top;
        if let Some((&offset, &block)) = self.by_offset.last_key_value()
            && offset + block == self.top
        {
            start = offset;
        }
        if start + size > limit {
            return None;
        }
        if start < self.top {
            let block = self.top - start;
            self.remove(start, block);
        }
        self.top = start + size;
        Some(start)
    }

    fn insert(&mut self, offset: u64, size: u64) {
        self.by_offset.insert(offset, size);
        self.by_size.insert((size, offset));
    }

    /// Returns a block, merging it with free neighbours (and into the top).
    fn release(&mut self, mut offset: u64, mut size: u64) {
        if let Some((&before, &len)) = self.by_offset.range(..offset).next_back()
            && before + len == offset
        {
            self.remove(before, len);
            offset = before;
            size += len;
        }
        if let Some(&len) = self.by_offset.get(&(offset + size)) {
            self.remove(offset + size, len);
            size += len;
        }
        if offset + size == self.top {
            self.top = offset;
        } else {
            self.insert(offset, size);
        }
    }
}

/// How many pairs of `buffers` are live at one step together (counted by sorting, without
/// enumerating them).
fn overlapping_pairs(buffers: &[usize], live: &[(u32, u32)]) -> u64 {
    let mut ends: Vec<u32> = buffers.iter().map(|&b| live[b].1).collect();
    ends.sort_unstable();
    let n = buffers.len() as u64;
    // A pair is disjoint when one ends before the other starts.
    let disjoint: u64 = buffers
        .iter()
        .map(|&b| ends.partition_point(|&e| e < live[b].0) as u64)
        .sum();
    n * n.saturating_sub(1) / 2 - disjoint
}

/// The buffers placed so far, found by lifetime: a max-tree over the buffers sorted by first
/// step, whose leaves hold the last step of each placed buffer. The placed buffers overlapping an
/// interval are found in O((k + 1) log n) for k results, so planning a long chain of short-lived
/// buffers stays O(n log n) instead of scanning every placement per buffer.
struct PlacedIndex {
    /// Buffers sorted by first step, and that step.
    order: Vec<usize>,
    starts: Vec<u32>,
    /// Position of each buffer in `order`.
    position: Vec<usize>,
    /// Leaves `leaves..2 * leaves`; each node holds the largest last step of a placed buffer
    /// below it, or -1.
    tree: Vec<i64>,
    leaves: usize,
    last: Vec<u32>,
}

impl PlacedIndex {
    fn new(live: &[(u32, u32)]) -> PlacedIndex {
        let mut order: Vec<usize> = (0..live.len()).collect();
        order.sort_by_key(|&b| (live[b].0, b));
        let starts = order.iter().map(|&b| live[b].0).collect();
        let mut position = vec![0; live.len()];
        for (i, &b) in order.iter().enumerate() {
            position[b] = i;
        }
        let leaves = live.len().next_power_of_two().max(1);
        PlacedIndex {
            order,
            starts,
            position,
            tree: vec![-1; 2 * leaves],
            leaves,
            last: live.iter().map(|l| l.1).collect(),
        }
    }

    fn insert(&mut self, buffer: usize) {
        let mut node = self.leaves + self.position[buffer];
        self.tree[node] = i64::from(self.last[buffer]);
        while node > 1 {
            node /= 2;
            self.tree[node] = self.tree[2 * node].max(self.tree[2 * node + 1]);
        }
    }

    /// Appends to `out` every placed buffer whose lifetime overlaps `interval`.
    fn overlapping(&self, interval: (u32, u32), out: &mut Vec<usize>) {
        // Candidates start no later than the interval ends: a prefix of `order`.
        let prefix = self.starts.partition_point(|&s| s <= interval.1);
        let first = i64::from(interval.0);
        let mut stack = vec![(1usize, 0usize, self.leaves)];
        while let Some((node, lo, hi)) = stack.pop() {
            if lo >= prefix || self.tree[node] < first {
                continue;
            }
            if hi - lo == 1 {
                out.push(self.order[lo]);
                continue;
            }
            let mid = (lo + hi) / 2;
            stack.push((2 * node + 1, mid, hi));
            stack.push((2 * node, lo, mid));
        }
    }
}

/// The offset of the smallest gap that fits `size` among the `busy` byte ranges (sorted here);
/// the top of them when no gap fits.
fn best_fit(busy: &mut [(u64, u64)], size: u64) -> u64 {
    busy.sort_unstable();
    let mut best: Option<(u64, u64)> = None; // (gap size, offset)
    let mut cursor = 0;
    for &(start, end) in busy.iter() {
        if start > cursor {
            let gap = start - cursor;
            if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, cursor));
            }
        }
        cursor = cursor.max(end);
    }
    best.map_or(cursor, |(_, offset)| offset)
}

/// The largest total size of buffers live at one step, by a sweep over start and end events.
fn lower_bound(live: &[(u32, u32)], sizes: &[u64]) -> u64 {
    // (step, change): a buffer counts from its first step through its last.
    let mut events: Vec<(u64, i128)> = Vec::with_capacity(2 * live.len());
    for (l, &s) in live.iter().zip(sizes) {
        events.push((u64::from(l.0), i128::from(s)));
        events.push((u64::from(l.1) + 1, -i128::from(s)));
    }
    // At one step, ends (negative) apply before starts.
    events.sort_unstable();
    let (mut current, mut peak) = (0i128, 0i128);
    for (_, change) in events {
        current += change;
        peak = peak.max(current);
    }
    peak as u64
}

/// The plan as text (`--dump-after memory`): the peak against the lower bound, then every
/// buffer's arena, offset, size, live range and label.
pub fn describe(sched: &Schedule, mem: &MemoryPlan) -> String {
    let mut s = String::new();
    writeln!(
        s,
        "peak {} bytes, lower bound {} bytes ({:.3}x), {} arena(s)",
        mem.peak_bytes,
        mem.lower_bound_bytes,
        mem.peak_bytes as f64 / mem.lower_bound_bytes.max(1) as f64,
        mem.arenas.len()
    )
    .unwrap();
    for (i, b) in sched.buffers.iter().enumerate() {
        let p = mem.placements[i];
        let (first, last) = mem.live[i];
        writeln!(
            s,
            "  arena {} @ {:>10}  {:>10} B  live {first}..={last}  {}",
            p.arena,
            p.offset,
            b.size_bytes(),
            b.label
        )
        .unwrap();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_smallest_gap() {
        assert_eq!(best_fit(&mut [], 64), 0);
        // Gaps of 64 at 0 and of 32 at 96: a 32-byte buffer takes the smaller one.
        assert_eq!(best_fit(&mut [(128, 192), (64, 96)], 32), 96);
        assert_eq!(best_fit(&mut [(64, 96), (128, 192)], 64), 0);
        assert_eq!(best_fit(&mut [(0, 64)], 64), 64);
    }

    #[test]
    fn placed_index_finds_exactly_the_overlapping_placed_buffers() {
        let live = [(0, 1), (2, 3), (1, 2), (5, 9), (0, 9), (4, 4)];
        let mut index = PlacedIndex::new(&live);
        for b in [0, 1, 3, 5] {
            index.insert(b);
        }
        for interval in [(0, 0), (1, 2), (3, 4), (4, 8), (0, 9), (10, 12)] {
            let mut got = Vec::new();
            index.overlapping(interval, &mut got);
            got.sort();
            let want: Vec<usize> = [0, 1, 3, 5]
                .into_iter()
                .filter(|&b| live[b].0 <= interval.1 && interval.0 <= live[b].1)
                .collect();
            assert_eq!(got, want, "{interval:?}");
        }
    }

    /// Both strategies on pseudo-random lifetimes and sizes: buffers live together never share
    /// bytes, every arena stays under the limit, and linear scan's free list stays consistent.
    #[test]
    fn both_strategies_keep_live_buffers_apart() {
        let mut rng = crate::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        let mut next = |n: u64| rng.below(n);
        for round in 0..40 {
            let n = 1 + next(60) as usize;
            let live: Vec<(u32, u32)> = (0..n)
                .map(|_| {
                    let a = next(30) as u32;
                    (a, a + next(12) as u32)
                })
                .collect();
            let sizes: Vec<u64> = (0..n).map(|_| aligned(1 + next(300))).collect();
            let max_binding = 1024;
            let mut layout = Layout {
                sizes: &sizes,
                live: &live,
                max_binding,
                placements: vec![None; n],
                arenas: Vec::new(),
                members: (0..n).collect(),
            };
            if round % 2 == 0 {
                layout.greedy_by_size((0..n).collect());
            } else {
                layout.linear_scan((0..n).collect());
            }
            let p: Vec<Placement> = layout.placements.iter().map(|p| p.unwrap()).collect();
            for a in 0..n {
                assert!(p[a].offset + sizes[a] <= max_binding);
                for b in a + 1..n {
                    let together = live[a].0 <= live[b].1 && live[b].0 <= live[a].1;
                    let shared = p[a].arena == p[b].arena
                        && p[a].offset < p[b].offset + sizes[b]
                        && p[b].offset < p[a].offset + sizes[a];
                    assert!(!(together && shared), "round {round}: {a} and {b}");
                }
            }
        }
    }

    #[test]
    fn overlapping_pairs_counts_without_enumerating() {
        let live = [(0, 1), (1, 2), (3, 4), (0, 9)];
        // (0,1)-(1,2), (0,1)-(0,9), (1,2)-(0,9), (3,4)-(0,9)
        assert_eq!(overlapping_pairs(&[0, 1, 2, 3], &live), 4);
        assert_eq!(overlapping_pairs(&[], &live), 0);
    }

    #[test]
    fn lower_bound_is_peak_of_live_sizes() {
        assert_eq!(lower_bound(&[(0, 1), (1, 2), (2, 3)], &[10, 20, 30]), 50);
    }
}
