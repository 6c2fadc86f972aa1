//! The memory plan: liveness over the schedule and best-fit offset assignment in arenas.
//!
//! Params and states sit at fixed offsets at the start of arena 0 (they live across runs).
//! Every other buffer lives from the step that writes it (inputs: from the start) to the last
//! step that reads it (outputs and assign sources: to the end of the run). Buffers are placed
//! largest first, each in the smallest gap between buffers whose lifetimes overlap its own
//! (greedy-by-size best fit). When a buffer does not fit under the storage-binding limit in
//! any arena, a new arena is opened.
//!
//! The lower bound reported beside the peak is the largest total size of buffers live at one
//! moment: no placement can use less.

use crate::error::CompileError;
use crate::schedule::{BufferKind, Schedule};

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
    /// Live interval `[first, last]` of each buffer, in step indices (`steps.len()` = after
    /// the last step).
    pub live: Vec<(u32, u32)>,
    pub peak_bytes: u64,
    pub lower_bound_bytes: u64,
}

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN).max(1) * ALIGN
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

pub fn plan(sched: &Schedule, max_binding: u64) -> Result<MemoryPlan, CompileError> {
    let live = liveness(sched);
    let sizes: Vec<u64> = sched
        .buffers
        .iter()
        .map(|b| b.ty.size_bytes() as u64)
        .collect();
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
    let mut arenas: Vec<u64> = Vec::new();

    // Persistent buffers first, in declaration order, packed from the start of the arenas.
    let persistent: Vec<usize> = (0..sizes.len())
        .filter(|&b| matches!(sched.buffers[b].kind, BufferKind::Persistent(_)))
        .collect();
    let mut order: Vec<usize> = (0..sizes.len())
        .filter(|b| !persistent.contains(b))
        .collect();
    order.sort_by_key(|&b| (std::cmp::Reverse(sizes[b]), live[b].0, b));

    for b in persistent.into_iter().chain(order) {
        let size = aligned(sizes[b]);
        let mut chosen = None;
        for arena in 0..=arenas.len() {
            let offset = best_fit(arena as u32, live[b], size, &placements, &sizes, &live);
            if offset + size <= max_binding {
                chosen = Some(Placement {
                    arena: arena as u32,
                    offset,
                });
                break;
            }
        }
        let p = chosen.expect("an empty arena fits any buffer under the limit");
        if p.arena as usize == arenas.len() {
            arenas.push(0);
        }
        arenas[p.arena as usize] = arenas[p.arena as usize].max(p.offset + size);
        placements[b] = Some(p);
    }
    if arenas.is_empty() {
        arenas.push(ALIGN);
    }
    for (i, &bytes) in arenas.iter().enumerate() {
        if bytes / 4 > u32::MAX as u64 {
            return Err(CompileError::IndexSpace {
                arena: i,
                elements: bytes / 4,
            });
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
        live,
        peak_bytes,
        lower_bound_bytes,
    })
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// The offset of the smallest gap that fits `size` among buffers in `arena` whose lifetimes
/// overlap `interval`; the top of those buffers when no gap fits.
fn best_fit(
    arena: u32,
    interval: (u32, u32),
    size: u64,
    placements: &[Option<Placement>],
    sizes: &[u64],
    live: &[(u32, u32)],
) -> u64 {
    let mut busy: Vec<(u64, u64)> = placements
        .iter()
        .enumerate()
        .filter_map(|(b, p)| {
            let p = (*p)?;
            (p.arena == arena && overlaps(live[b], interval))
                .then(|| (p.offset, p.offset + aligned(sizes[b])))
        })
        .collect();
    busy.sort_unstable();
    let mut best: Option<(u64, u64)> = None; // (gap size, offset)
    let mut cursor = 0;
    for (start, end) in busy {
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

fn lower_bound(live: &[(u32, u32)], sizes: &[u64]) -> u64 {
    let end = live.iter().map(|l| l.1).max().unwrap_or(0);
    (0..=end)
        .map(|t| {
            live.iter()
                .zip(sizes)
                .filter(|(l, _)| l.0 <= t && t <= l.1)
                .map(|(_, &s)| s)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_reuses_dead_space() {
        // Two buffers live at different times share one offset.
        let sizes = [64, 64];
        let live = [(0, 1), (2, 3)];
        let placements = [
            Some(Placement {
                arena: 0,
                offset: 0,
            }),
            None,
        ];
        assert_eq!(best_fit(0, live[1], 64, &placements, &sizes, &live), 0);
        // Overlapping lifetimes stack.
        let live = [(0, 2), (2, 3)];
        assert_eq!(best_fit(0, live[1], 64, &placements, &sizes, &live), 64);
    }

    #[test]
    fn lower_bound_is_peak_of_live_sizes() {
        assert_eq!(lower_bound(&[(0, 1), (1, 2), (2, 3)], &[10, 20, 30]), 50);
    }
}
