//! Updates in place: `assign p = p_next` without a copy where the step that computes `p_next`
//! can write it over `p`.
//!
//! A training step ends with an `assign` per param and optimizer state. Lowered as they are, the
//! new values go to fresh buffers and the runtime copies each one over its target after the last
//! dispatch: for a GPT-2-small step with AdamW, 445 copies of 1.04 GB in all (staged through a
//! scratch buffer when sources and targets share an arena, so twice). This pass lets the step
//! that computes the new value write it straight into the target's buffer, and drops the assign,
//! where that cannot change what any step reads:
//!
//! - the writer is a fused kernel that writes the source over a whole contiguous buffer, one
//!   element per point, and reads the target, if at all, only at the element it writes at the
//!   same point: in a map, the thread that writes an element is the only one to read it (a load
//!   and a store of one binding, which keep their order within an invocation); in a reduction,
//!   every lane of a row loads the row's values, so such a kernel passes a storage barrier
//!   between its loads and its first store (`codegen::fused`);
//! - no later step reads the target (its old value) or writes it, and no output or other
//!   assign reads it at the end of the run;
//! - the source buffer is written by that step alone and is the source of one assign only.
//!
//! The source buffer is then an alias of the target: every view of it is redirected to the
//! target's buffer (whose label gains the source's name), and it is removed. This is the
//! one place where a step overwrites a value, so the schedule's fresh-buffer invariant holds for
//! every other step.

use std::collections::HashMap;

use crate::kgraph::KValueId;

use crate::fused::Axis;
use crate::kernel::KernelPlan;
use crate::kernel::{FusedKernel, space_strides};
use crate::layout::{BufferId, View};
use crate::schedule::{BufferKind, Schedule};

/// Writes every assign's source over its target where the module docs allow (recording the
/// target in [`Schedule::updated_in_place`]); returns how many.
pub fn update_in_place(sched: &mut Schedule) -> usize {
    let n = sched.buffers.len();
    let Uses {
        readers,
        writers,
        read_at_end,
    } = Uses::of(sched);
    let mut sources = vec![0usize; n];
    for (_, view) in &sched.assigns {
        sources[view.buffer.0 as usize] += 1;
    }
    let persistent: HashMap<KValueId, BufferId> = (0..n)
        .filter_map(|b| match sched.buffers[b].kind {
            BufferKind::Persistent(v) => Some((v, BufferId(b as u32))),
            _ => None,
        })
        .collect();
    let mut aliases: Vec<(BufferId, BufferId)> = Vec::new();
    let mut kept = Vec::new();
    for (target, source) in std::mem::take(&mut sched.assigns) {
        let fits = persistent.get(&target).copied().filter(|&t| {
            let (tb, sb) = (t.0 as usize, source.buffer.0 as usize);
            let [writer] = writers[sb][..] else {
                return false;
            };
            sched.buffers[sb].kind == BufferKind::Temp
                && sched.buffers[sb].ty == sched.buffers[tb].ty
                && sources[sb] == 1
                && !read_at_end[tb]
                && writers[tb].is_empty()
                && readers[tb].iter().all(|&r| r <= writer)
                && source.offset == 0
                && source.is_contiguous()
                && match &sched.steps[writer].plan {
                    KernelPlan::Fused(k) => writes_over(k, source.buffer, t),
                    _ => false,
                }
        });
        match fits {
            Some(t) => {
                aliases.push((source.buffer, t));
                sched.updated_in_place.push(target);
            }
            None => kept.push((target, source)),
        }
    }
    sched.assigns = kept;
    let aliases: Vec<Alias> = (aliases.into_iter())
        .map(|(from, into)| Alias {
            from,
            into,
            offset: 0,
        })
        .collect();
    merge_buffers(sched, &aliases, &[]);
    aliases.len()
}

/// Writes `concat` operands straight into their parts of the result, dropping the copies that
/// joined them ([`Schedule::concat_parts`]), where the operand is a whole temporary buffer
/// that one other step writes, the part is a contiguous range of the result's buffer, both
/// hold the same dtype in the same storage, and nothing reads the operand at the end of the
/// run: the operand's buffer becomes that range (every view of it moved by the part's
/// offset), so its writer writes the part and its readers read it there. Returns how many.
pub fn write_parts_in_place(sched: &mut Schedule) -> usize {
    let n = sched.buffers.len();
    let Uses {
        writers,
        read_at_end,
        ..
    } = Uses::of(sched);
    // a buffer that an alias moves, or that one receives, takes part in no other (a nested
    // `concat`'s inner result stays where it is)
    let mut aliased = vec![false; n];
    let mut aliases = Vec::new();
    let mut dropped = Vec::new();
    for part in std::mem::take(&mut sched.concat_parts) {
        let (from, into) = (part.source.buffer, part.part.buffer);
        let (fb, ib) = (
            &sched.buffers[from.0 as usize],
            &sched.buffers[into.0 as usize],
        );
        let whole = part.source.offset == 0
            && part.source.is_contiguous()
            && part.source.numel() == fb.ty.numel();
        let fits = from != into
            && !aliased[from.0 as usize]
            && !aliased[into.0 as usize]
            && !aliases.iter().any(|a: &Alias| a.into == from)
            && fb.kind == BufferKind::Temp
            && ib.kind == BufferKind::Temp
            && fb.ty.dtype == ib.ty.dtype
            && fb.storage == ib.storage
            && !read_at_end[from.0 as usize]
            && whole
            && part.part.is_contiguous()
            && matches!(writers[from.0 as usize][..], [w] if w != part.step);
        if fits {
            aliased[from.0 as usize] = true;
            aliases.push(Alias {
                from,
                into,
                offset: part.part.offset,
            });
            dropped.push(part.step);
        }
    }
    merge_buffers(sched, &aliases, &dropped);
    aliases.len()
}

/// Per buffer of a schedule: the steps that read it, the steps that write it, and whether an
/// output or an assign reads it after the last step.
struct Uses {
    readers: Vec<Vec<usize>>,
    writers: Vec<Vec<usize>>,
    read_at_end: Vec<bool>,
}

impl Uses {
    fn of(sched: &Schedule) -> Uses {
        let n = sched.buffers.len();
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut writers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (s, step) in sched.steps.iter().enumerate() {
            let (reads, writes) = step.plan.buffers();
            for b in reads {
                readers[b.0 as usize].push(s);
            }
            for b in writes {
                writers[b.0 as usize].push(s);
            }
        }
        let mut read_at_end = vec![false; n];
        let at_end =
            (sched.outputs.iter().map(|o| &o.view)).chain(sched.assigns.iter().map(|a| &a.1));
        for view in at_end {
            read_at_end[view.buffer.0 as usize] = true;
        }
        Uses {
            readers,
            writers,
            read_at_end,
        }
    }
}

/// Buffer `from` stored as the range of `into` that starts at `offset` elements.
struct Alias {
    from: BufferId,
    into: BufferId,
    offset: usize,
}

/// Makes each alias's `from` buffer its range of `into` (redirecting every view, the target's
/// label gaining the source's name) and removes it and the `dropped` steps; the other buffers
/// and steps keep their order, renumbered. No `into` is itself a `from`.
fn merge_buffers(sched: &mut Schedule, aliases: &[Alias], dropped: &[usize]) {
    if aliases.is_empty() && dropped.is_empty() {
        return;
    }
    let n = sched.buffers.len();
    let mut alias_of: Vec<Option<(BufferId, usize)>> = vec![None; n];
    for a in aliases {
        alias_of[a.from.0 as usize] = Some((a.into, a.offset));
        let label = format!(
            "{}, {}",
            sched.buffers[a.into.0 as usize].label, sched.buffers[a.from.0 as usize].label
        );
        sched.buffers[a.into.0 as usize].label = label;
    }
    debug_assert!(
        aliases
            .iter()
            .all(|a| alias_of[a.into.0 as usize].is_none())
    );
    let mut number = vec![0u32; n];
    let mut next = 0;
    for (b, alias) in alias_of.iter().enumerate() {
        number[b] = next;
        next += u32::from(alias.is_none());
    }
    let to: Vec<(BufferId, usize)> = (0..n)
        .map(|b| match alias_of[b] {
            Some((into, offset)) => (BufferId(number[into.0 as usize]), offset),
            None => (BufferId(number[b]), 0),
        })
        .collect();
    let mut b = 0;
    sched.buffers.retain(|_| {
        b += 1;
        alias_of[b - 1].is_none()
    });
    let mut s = 0;
    sched.steps.retain(|_| {
        s += 1;
        !dropped.contains(&(s - 1))
    });
    let redirect = |v: &mut View| {
        let (buffer, offset) = to[v.buffer.0 as usize];
        v.buffer = buffer;
        v.offset += offset;
    };
    for step in &mut sched.steps {
        step.plan.views_mut(&mut |v| redirect(v));
    }
    for o in &mut sched.outputs {
        redirect(&mut o.view);
    }
    for (_, v) in &mut sched.assigns {
        redirect(v);
    }
}

/// Whether fused kernel `k` writes buffer `source` whole, one element per point of the space
/// axes its view moves along, and reads buffer `target` only where it writes `source` at the
/// same point. (A kernel with reduce axes loads every per-row value before its first store
/// when it writes in place: `codegen::fused`.)
fn writes_over(k: &FusedKernel, source: BufferId, target: BufferId) -> bool {
    let p = &k.program;
    let outs: Vec<usize> = (0..k.outputs.len())
        .filter(|&j| k.outputs[j].buffer == source)
        .collect();
    let [j] = outs[..] else {
        return false;
    };
    let (view, access) = (&k.outputs[j], &p.outputs[j].access);
    // one element per point: the view is the whole buffer, and each space axis it moves
    // along moves along exactly one of its (contiguous) axes
    let moved: Vec<usize> = access
        .axes
        .iter()
        .zip(&view.shape)
        .filter_map(|(x, &d)| match *x {
            Axis::Space(a) if d > 1 => Some(a as usize),
            _ => None,
        })
        .collect();
    let once = moved
        .iter()
        .all(|a| moved.iter().filter(|b| *b == a).count() == 1);
    let points: usize = moved.iter().map(|&a| p.extent(a)).product();
    let numel: usize = view.shape.iter().product();
    let written = space_strides(p, access, view);
    // A load that names a space axis the store does not is made where that axis varies: in a
    // row kernel, a per-row store's target read along a reduce axis (even at stride 0) is an
    // element-level load, made again after lane 0's store. Such loads do not qualify.
    let stored_axes: Vec<usize> = access.space_axes().collect();
    view.offset == 0
        && view.is_contiguous()
        && once
        && numel == points
        && k.operands
            .iter()
            .zip(&p.operands)
            .filter(|(v, _)| v.buffer == target)
            .all(|(v, a)| {
                !a.is_shifted()
                    && v.offset == view.offset
                    && space_strides(p, a, v) == written
                    && a.space_axes().all(|k| stored_axes.contains(&k))
            })
}
