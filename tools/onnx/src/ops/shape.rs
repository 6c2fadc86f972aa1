//! Shape and layout ops: `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, `Transpose`, `Concat`,
//! `Slice`, `Split`, `Expand`, `Tile`, `Gather`, `Shape`, `Size`, `ConstantOfShape`,
//! `DepthToSpace`, `SpaceToDepth`, `Trilu`, `Pad`. The shape rules live here as plain functions, which
//! the translations and the import-time evaluation ([`crate::fold`]) share.

use sinter_ir::{Attrs, DType, Op, ValueId, key};

use super::{Args, Operand, Results, axis, one};
use crate::error::Problem;
use crate::import::{Importer, Val};
use crate::literal::{Elem, Literal};

pub fn translate(cx: &mut Importer, op: &str, args: &Args) -> Result<Option<Results>, Problem> {
    let result = match op {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            let x = args.input(0)?;
            let target = reshaped(op, &shape_of(cx, &x.1), args)?;
            let id = reshape(cx, x, &target)?;
            same_elem(x, id)
        }
        "Transpose" => {
            let x = args.input(0)?;
            let v = cx.value(x)?;
            let perm = transpose_perm(args, cx.shape_of(v).len())?;
            let id = if perm.iter().enumerate().all(|(i, &p)| i == p) {
                v
            } else {
                cx.op(Op::Permute, &[v], Attrs::new().and(key::PERM, perm))?
            };
            same_elem(x, id)
        }
        "Concat" => concat(cx, args)?,
        "Slice" => {
            let x = args.input(0)?;
            let ranges = slice_ranges(&shape_of(cx, &x.1), args)?;
            if let Some((a, ..)) = ranges.iter().find(|(_, s, e, _)| s == e) {
                return Err(Problem::unsupported(format!(
                    "Slice selecting nothing on axis {a} (sinter has no empty tensors)"
                )));
            }
            let mut v = cx.value(x)?;
            for r in ranges {
                v = slice(cx, v, r)?;
            }
            same_elem(x, v)
        }
        "Split" => split(cx, args)?,
        "Expand" => {
            let x = args.input(0)?;
            let spec = args
                .literal(1, "the shape of Expand")?
                .ok_or_else(|| Problem::invalid("Expand needs a shape"))?;
            let dims: Vec<usize> = shape_dims(spec)?
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect();
            let target = broadcast(&shape_of(cx, &x.1), &dims)?;
            let v = cx.value(x)?;
            let id = if cx.shape_of(v) == target {
                v
            } else {
                cx.op(Op::BroadcastTo, &[v], Attrs::new().and(key::SHAPE, target))?
            };
            same_elem(x, id)
        }
        "Tile" => tile(cx, args)?,
        "Gather" => gather(cx, args)?,
        "Shape" => {
            let dims = shape_of(cx, &args.input(0)?.1);
            let (start, end) = shape_range(args, dims.len())?;
            let dims: Vec<i64> = dims[start..end].iter().map(|&d| d as i64).collect();
            one(Val::Static(Literal::ints(&dims)))?
        }
        "Size" => {
            let n: usize = shape_of(cx, &args.input(0)?.1).iter().product();
            one(Val::Static(Literal::scalar(Elem::Int, n as f64)))?
        }
        "DepthToSpace" | "SpaceToDepth" => depth_space(cx, op, args)?,
        "Trilu" => trilu(cx, args)?,
        "Pad" => pad(cx, args)?,
        "Range" | "ConstantOfShape" => {
            return Err(Problem::NotStatic(format!("every operand of {op}")));
        }
        _ => return Ok(None),
    };
    Ok(Some(result))
}

fn same_elem(x: &Operand, id: ValueId) -> Results {
    vec![Some(Val::Dynamic {
        id,
        elem: x.1.elem(),
    })]
}

/// The shape of any value.
pub fn shape_of(cx: &Importer, v: &Val) -> Vec<usize> {
    match v {
        Val::Static(l) => l.shape.clone(),
        Val::Dynamic { id, .. } => cx.shape_of(*id),
    }
}

fn reshape(cx: &mut Importer, x: &Operand, target: &[usize]) -> Result<ValueId, Problem> {
    let v = cx.value(x)?;
    if cx.shape_of(v) == target {
        return Ok(v);
    }
    cx.op(
        Op::Reshape,
        &[v],
        Attrs::new().and(key::SHAPE, target.to_vec()),
    )
}

/// A shape operand's extents (a 1-D integer literal of extents ≥ 0).
pub fn shape_dims(spec: &Literal) -> Result<Vec<i64>, Problem> {
    if spec.rank() != 1 {
        return Err(Problem::invalid(format!(
            "a shape must be 1-D, got a tensor of shape {:?}",
            spec.shape
        )));
    }
    Ok(spec.as_ints())
}

/// The result shape of `Reshape`, `Flatten`, `Squeeze` or `Unsqueeze` of a value of shape
/// `shape` (the four are the same sinter op).
pub fn reshaped(op: &str, shape: &[usize], args: &Args) -> Result<Vec<usize>, Problem> {
    let rank = shape.len();
    match op {
        "Reshape" => {
            let spec = args
                .literal(1, "the shape of Reshape")?
                .ok_or_else(|| Problem::invalid("Reshape needs a shape"))?;
            reshape_target(
                shape,
                &shape_dims(spec)?,
                args.attrs.int("allowzero", 0) != 0,
            )
        }
        "Flatten" => {
            let a = args.attrs.int("axis", 1);
            let a = if a < 0 { a + rank as i64 } else { a };
            if !(0..=rank as i64).contains(&a) {
                return Err(Problem::invalid(format!("axis {a} for rank {rank}")));
            }
            let a = a as usize;
            Ok(vec![
                shape[..a].iter().product(),
                shape[a..].iter().product(),
            ])
        }
        "Squeeze" => {
            let axes = axes_operand(args, 1)?;
            let axes = match axes {
                None => (0..rank).filter(|&i| shape[i] == 1).collect(),
                Some(axes) => normalized(&axes, rank)?,
            };
            if let Some(&a) = axes.iter().find(|&&a| shape[a] != 1) {
                return Err(Problem::invalid(format!(
                    "Squeeze axis {a} has extent {}",
                    shape[a]
                )));
            }
            Ok((0..rank)
                .filter(|i| !axes.contains(i))
                .map(|i| shape[i])
                .collect())
        }
        _ => {
            let axes =
                axes_operand(args, 1)?.ok_or_else(|| Problem::invalid("Unsqueeze needs axes"))?;
            let out_rank = rank + axes.len();
            let axes = normalized(&axes, out_rank)?;
            let mut rest = shape.iter();
            Ok((0..out_rank)
                .map(|i| {
                    if axes.contains(&i) {
                        1
                    } else {
                        rest.next().copied().unwrap_or(1)
                    }
                })
                .collect())
        }
    }
}

/// Axes from operand `i` (opset 13+) or, for older forms, the `axes` attribute.
pub fn axes_operand(args: &Args, i: usize) -> Result<Option<Vec<i64>>, Problem> {
    if let Some(l) = args.literal(i, "axes")? {
        return Ok(Some(l.as_ints()));
    }
    Ok(args.attrs.ints("axes"))
}

/// Normalized, distinct axes.
pub fn normalized(axes: &[i64], rank: usize) -> Result<Vec<usize>, Problem> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = axis(a, rank, "axis")?;
        if out.contains(&a) {
            return Err(Problem::invalid(format!("axis {a} repeats")));
        }
        out.push(a);
    }
    Ok(out)
}

/// `Reshape`'s target: `0` copies the input extent (unless `allowzero`), `-1` is inferred.
pub fn reshape_target(
    shape: &[usize],
    spec: &[i64],
    allowzero: bool,
) -> Result<Vec<usize>, Problem> {
    let numel: usize = shape.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*shape.get(i).ok_or_else(|| {
                Problem::invalid(format!(
                    "shape entry {i} is 0 but the input has rank {}",
                    shape.len()
                ))
            })?),
            d if d >= 0 => out.push(d as usize),
            d => return Err(Problem::invalid(format!("shape entry {d}"))),
        }
    }
    let known = out
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Problem::invalid(format!("shape {spec:?} overflows")))?;
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Problem::invalid(format!(
                "cannot reshape {shape:?} to {spec:?}"
            )));
        }
        out[i] = numel / known;
    } else if known != numel {
        return Err(Problem::invalid(format!(
            "cannot reshape {shape:?} ({numel} elements) to {spec:?}"
        )));
    }
    Ok(out)
}

fn transpose_perm(args: &Args, rank: usize) -> Result<Vec<usize>, Problem> {
    match args.attrs.ints("perm") {
        None => Ok((0..rank).rev().collect()),
        Some(p) => {
            let p = normalized(&p, rank)?;
            if p.len() != rank {
                return Err(Problem::invalid(format!("perm {p:?} for rank {rank}")));
            }
            Ok(p)
        }
    }
}

/// NumPy broadcasting of two shapes (also `Expand`'s two-way rule).
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, Problem> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() < rank {
            1
        } else {
            s[i + s.len() - rank]
        }
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(Problem::invalid(format!(
                "shapes {a:?} and {b:?} do not broadcast ({x} vs {y})"
            ))),
        })
        .collect()
}

/// One sinter slice: `(axis, start, end, step)`, with `start ≤ end` and `step ≥ 1` (an empty
/// range only folds: sinter has no empty tensors).
pub type Range1 = (usize, usize, usize, usize);

/// `Slice`'s ranges on a value of shape `shape`, clamped as ONNX does; full ranges are dropped.
pub fn slice_ranges(shape: &[usize], args: &Args) -> Result<Vec<Range1>, Problem> {
    let mut out = Vec::new();
    for (a, s, e, step) in slice_operands(shape.len(), args)? {
        if step < 1 {
            return Err(Problem::unsupported(format!(
                "Slice with step {step} (sinter's slice steps forward)"
            )));
        }
        let dim = shape[a] as i64;
        let clamp = |v: i64| {
            let v = if v < 0 { v.saturating_add(dim) } else { v };
            v.clamp(0, dim) as usize
        };
        let (s, e) = (clamp(s), clamp(e).max(clamp(s)));
        if (s, e, step) != (0, dim as usize, 1) {
            out.push((a, s, e, step as usize));
        }
    }
    Ok(out)
}

/// `Slice`'s operands as written, per sliced axis: `(axis, start, end, step)`, the axis
/// normalized, the rest as ONNX gives them (negative starts and ends count from the end).
pub fn slice_operands(rank: usize, args: &Args) -> Result<Vec<(usize, i64, i64, i64)>, Problem> {
    let starts = args
        .literal(1, "Slice's starts")?
        .ok_or_else(|| Problem::invalid("Slice needs starts"))?
        .as_ints();
    let ends = args
        .literal(2, "Slice's ends")?
        .ok_or_else(|| Problem::invalid("Slice needs ends"))?
        .as_ints();
    let axes = match args.literal(3, "Slice's axes")? {
        Some(l) => l.as_ints(),
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match args.literal(4, "Slice's steps")? {
        Some(l) => l.as_ints(),
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(Problem::invalid(
            "starts, ends, axes and steps differ in length",
        ));
    }
    let axes = normalized(&axes, rank)?;
    Ok((axes.into_iter().zip(starts).zip(ends).zip(steps))
        .map(|(((a, s), e), step)| (a, s, e, step))
        .collect())
}

fn slice(cx: &mut Importer, v: ValueId, (a, s, e, step): Range1) -> Result<ValueId, Problem> {
    cx.op(
        Op::Slice,
        &[v],
        Attrs::new()
            .and(key::AXIS, a)
            .and(key::START, s)
            .and(key::END, e)
            .and(key::STEP, step),
    )
}

fn concat(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let operands: Vec<&Operand> = args.all().collect();
    let first = operands
        .first()
        .ok_or_else(|| Problem::invalid("no operands"))?;
    let rank = shape_of(cx, &first.1).len();
    let a = axis(args.attrs.int("axis", 0), rank, "axis")?;
    let elem = first.1.elem();
    let mut ids = Vec::new();
    for o in &operands {
        // Parts with no elements along the axis add nothing (sinter has no empty tensors).
        if let Val::Static(l) = &o.1
            && l.shape.get(a) == Some(&0)
        {
            continue;
        }
        ids.push(cx.value(o)?);
    }
    let id = match ids.as_slice() {
        [one] => *one,
        _ => cx.op(Op::Concat, &ids, Attrs::new().and(key::AXIS, a))?,
    };
    Ok(vec![Some(Val::Dynamic { id, elem })])
}

fn split(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    let shape = shape_of(cx, &x.1);
    let a = axis(args.attrs.int("axis", 0), shape.len(), "axis")?;
    let dim = shape[a];
    let sizes: Vec<usize> = match args.literal(1, "Split's sizes")? {
        Some(l) => l.as_ints().iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let parts = match args.attrs.int("num_outputs", 0) {
                0 => args.outputs,
                n => n as usize,
            };
            let chunk = dim.div_ceil(parts.max(1));
            (0..parts)
                .map(|i| chunk.min(dim.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.iter().sum::<usize>() != dim || sizes.contains(&0) {
        return Err(Problem::unsupported(format!(
            "Split of extent {dim} into {sizes:?} (parts must be non-empty and add up)"
        )));
    }
    let v = cx.value(x)?;
    let mut start = 0;
    let mut out = Vec::new();
    for size in sizes {
        let id = if size == dim {
            v
        } else {
            slice(cx, v, (a, start, start + size, 1))?
        };
        out.push(Some(Val::Dynamic {
            id,
            elem: x.1.elem(),
        }));
        start += size;
    }
    Ok(out)
}

fn tile(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    let repeats = args
        .literal(1, "Tile's repeats")?
        .ok_or_else(|| Problem::invalid("Tile needs repeats"))?
        .as_ints();
    let mut v = cx.value(x)?;
    if repeats.len() != cx.shape_of(v).len() || repeats.iter().any(|&r| r < 1) {
        return Err(Problem::unsupported(format!("Tile repeats {repeats:?}")));
    }
    for (a, &r) in repeats.iter().enumerate() {
        if r > 1 {
            let copies = vec![v; r as usize];
            v = cx.op(Op::Concat, &copies, Attrs::new().and(key::AXIS, a))?;
        }
    }
    Ok(same_elem(x, v))
}

/// `Gather`: with indices known at import time, slices (one per index) joined; with run-time
/// indices, sinter's `embedding` over the gathered axis moved to the front.
fn gather(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let data = args.input(0)?;
    let indices = args.input(1)?;
    let shape = shape_of(cx, &data.1);
    let a = axis(args.attrs.int("axis", 0), shape.len(), "axis")?;
    let dim = shape[a];
    let v = cx.value(data)?;
    let pre = &shape[..a];
    let post = &shape[a + 1..];
    let id = match &indices.1 {
        Val::Static(ind) => {
            let mut parts = Vec::new();
            for &i in &ind.as_ints() {
                let i = if i < 0 { i + dim as i64 } else { i };
                if !(0..dim as i64).contains(&i) {
                    return Err(Problem::invalid(format!(
                        "index {i} out of range for {dim}"
                    )));
                }
                parts.push(slice(cx, v, (a, i as usize, i as usize + 1, 1))?);
            }
            let joined = match parts.as_slice() {
                [] => {
                    return Err(Problem::unsupported(
                        "Gather with no indices (an empty tensor)",
                    ));
                }
                [one] => *one,
                _ => cx.op(Op::Concat, &parts, Attrs::new().and(key::AXIS, a))?,
            };
            let target: Vec<usize> = pre.iter().chain(&ind.shape).chain(post).copied().collect();
            if cx.shape_of(joined) == target {
                joined
            } else {
                cx.op(Op::Reshape, &[joined], Attrs::new().and(key::SHAPE, target))?
            }
        }
        Val::Dynamic { id: ids, elem } => {
            if *elem != Elem::Int {
                return Err(Problem::invalid("Gather indices must be integers"));
            }
            if cx.graph.ty(v).dtype != DType::F32 {
                return Err(Problem::unsupported(
                    "Gather of integer data at run-time indices (sinter's embedding gathers f32 rows)",
                ));
            }
            embedding_gather(cx, v, *ids, a, &shape)?
        }
    };
    Ok(vec![Some(Val::Dynamic {
        id,
        elem: data.1.elem(),
    })])
}

/// `data` gathered along axis `a` at `ids`: move `a` to the front, flatten the rest into rows,
/// look the rows up, restore the axes. Indices must lie in `0..extent` (negative indices are a
/// run-time error of `embedding`).
fn embedding_gather(
    cx: &mut Importer,
    data: ValueId,
    ids: ValueId,
    a: usize,
    shape: &[usize],
) -> Result<ValueId, Problem> {
    let rank = shape.len();
    let mut table = data;
    if a != 0 {
        let perm: Vec<usize> = std::iter::once(a)
            .chain((0..rank).filter(|&i| i != a))
            .collect();
        table = cx.op(Op::Permute, &[table], Attrs::new().and(key::PERM, perm))?;
    }
    let rest: Vec<usize> = (0..rank).filter(|&i| i != a).map(|i| shape[i]).collect();
    let row: usize = rest.iter().product();
    if rank != 2 || a != 0 {
        table = cx.op(
            Op::Reshape,
            &[table],
            Attrs::new().and(key::SHAPE, vec![shape[a], row]),
        )?;
    }
    let rows = cx.op(Op::Embedding, &[table, ids], Attrs::new())?;
    let ind_shape = cx.shape_of(ids);
    let unflat: Vec<usize> = ind_shape.iter().chain(&rest).copied().collect();
    let mut y = rows;
    if cx.shape_of(y) != unflat {
        y = cx.op(Op::Reshape, &[y], Attrs::new().and(key::SHAPE, unflat))?;
    }
    if a != 0 {
        // axes now: indices..., pre..., post...; wanted: pre..., indices..., post...
        let k = ind_shape.len();
        let perm: Vec<usize> = (k..k + a).chain(0..k).chain(k + a..k + rank - 1).collect();
        y = cx.op(Op::Permute, &[y], Attrs::new().and(key::PERM, perm))?;
    }
    Ok(y)
}

fn shape_range(args: &Args, rank: usize) -> Result<(usize, usize), Problem> {
    let clamp = |v: i64| {
        let v = if v < 0 { v + rank as i64 } else { v };
        v.clamp(0, rank as i64) as usize
    };
    let start = clamp(args.attrs.int("start", 0));
    let end = clamp(args.attrs.int("end", rank as i64));
    if start >= end {
        return Err(Problem::unsupported(
            "Shape selecting no axes (an empty tensor)",
        ));
    }
    Ok((start, end))
}

fn depth_space(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    let v = cx.value(x)?;
    let s = cx.shape_of(v);
    let b = args.attrs.int("blocksize", 0);
    if s.len() != 4 || b < 1 || b as usize > s[2].max(s[3]).max(s[1]) {
        return Err(Problem::unsupported(format!(
            "{op} of {s:?} with blocksize {b}"
        )));
    }
    let b = b as usize;
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let (split, perm, out) = if op == "DepthToSpace" {
        if !c.is_multiple_of(b * b) {
            return Err(Problem::invalid(format!("{c} channels for blocksize {b}")));
        }
        let mode = args.attrs.string("mode", "DCR");
        let c2 = c / (b * b);
        match mode.as_str() {
            "DCR" => (
                vec![n, b, b, c2, h, w],
                vec![0, 3, 4, 1, 5, 2],
                vec![n, c2, h * b, w * b],
            ),
            "CRD" => (
                vec![n, c2, b, b, h, w],
                vec![0, 1, 4, 2, 5, 3],
                vec![n, c2, h * b, w * b],
            ),
            other => return Err(Problem::unsupported(format!("mode=\"{other}\""))),
        }
    } else {
        if !h.is_multiple_of(b) || !w.is_multiple_of(b) {
            return Err(Problem::invalid(format!("{h}x{w} for blocksize {b}")));
        }
        (
            vec![n, c, h / b, b, w / b, b],
            vec![0, 3, 5, 1, 2, 4],
            vec![n, c * b * b, h / b, w / b],
        )
    };
    let y = cx.op(Op::Reshape, &[v], Attrs::new().and(key::SHAPE, split))?;
    let y = cx.op(Op::Permute, &[y], Attrs::new().and(key::PERM, perm))?;
    let y = cx.op(Op::Reshape, &[y], Attrs::new().and(key::SHAPE, out))?;
    Ok(same_elem(x, y))
}

/// `Trilu`: keep `j − i ≥ k` (upper) or `j − i ≤ k` (lower) of the last two axes, zeros elsewhere.
fn trilu(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    let k = match args.literal(1, "Trilu's k")? {
        Some(l) => l.as_ints().first().copied().unwrap_or(0),
        None => 0,
    };
    let upper = args.attrs.int("upper", 1) != 0;
    let v = cx.value(x)?;
    let s = cx.shape_of(v);
    if s.len() < 2 {
        return Err(Problem::invalid("Trilu needs rank 2 or more"));
    }
    let rc = vec![s[s.len() - 2], s[s.len() - 1]];
    let row = cx.op(
        Op::Iota,
        &[],
        Attrs::new().and(key::SHAPE, rc.clone()).and(key::AXIS, 0),
    )?;
    let col = cx.op(
        Op::Iota,
        &[],
        Attrs::new().and(key::SHAPE, rc).and(key::AXIS, 1),
    )?;
    let diff = cx.op(Op::Sub, &[col, row], Attrs::new())?;
    let k = cx.scalar(k as f64)?;
    let keep = cx.op(
        if upper { Op::Ge } else { Op::Le },
        &[diff, k],
        Attrs::new(),
    )?;
    let zero = if cx.graph.ty(v).dtype == DType::I32 {
        cx.literal(Literal::scalar(Elem::Int, 0.0))?
    } else {
        cx.scalar(0.0)?
    };
    let y = cx.op(Op::Where, &[keep, v, zero], Attrs::new())?;
    Ok(same_elem(x, y))
}

/// `Pad` with pads known at import time, by joining slices: `constant` pads with the (scalar)
/// constant broadcast, `edge` with the edge element, `reflect` with the mirrored elements (edge
/// excluded), `wrap` with the elements from the other end; negative pads crop.
fn pad(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    let mut v = cx.value(x)?;
    let rank = cx.shape_of(v).len();
    let pads = args
        .literal(1, "Pad's pads")?
        .ok_or_else(|| Problem::invalid("Pad needs pads"))?
        .as_ints();
    let axes = match args.literal(3, "Pad's axes")? {
        Some(l) => normalized(&l.as_ints(), rank)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(Problem::invalid(format!("pads {pads:?} for axes {axes:?}")));
    }
    let mode = args.attrs.string("mode", "constant");
    let fill = match (mode.as_str(), args.operand(2)) {
        ("constant", Some(c)) => Some(cx.value(c)?),
        ("constant", None) => Some(if cx.graph.ty(v).dtype == DType::I32 {
            cx.literal(Literal::scalar(Elem::Int, 0.0))?
        } else {
            cx.scalar(0.0)?
        }),
        ("edge" | "reflect" | "wrap", _) => None,
        (other, _) => return Err(Problem::unsupported(format!("mode=\"{other}\""))),
    };
    if let Some(f) = fill {
        let n: usize = cx.shape_of(f).iter().product();
        if n != 1 {
            return Err(Problem::invalid("Pad's constant_value must be one value"));
        }
    }
    for (k, &a) in axes.iter().enumerate() {
        let (before, after) = (pads[k], pads[k + axes.len()]);
        let dim = cx.shape_of(v)[a] as i64;
        // crop first
        let (lo, hi) = (
            before.min(0).unsigned_abs() as i64,
            after.min(0).unsigned_abs() as i64,
        );
        if lo + hi >= dim {
            return Err(Problem::unsupported("Pad cropping an axis to nothing"));
        }
        if lo + hi > 0 {
            v = slice(cx, v, (a, lo as usize, (dim - hi) as usize, 1))?;
        }
        let dim = (dim - lo - hi) as usize;
        let (b, e) = (before.max(0) as usize, after.max(0) as usize);
        if b == 0 && e == 0 {
            continue;
        }
        if mode == "reflect" && (b >= dim || e >= dim) {
            return Err(Problem::unsupported(format!(
                "reflect padding {b}/{e} of an axis of extent {dim}"
            )));
        }
        if mode == "wrap" && (b > dim || e > dim) {
            return Err(Problem::unsupported(format!(
                "wrap padding {b}/{e} of an axis of extent {dim}"
            )));
        }
        let mut parts = Vec::new();
        for (count, at_start) in [(b, true), (e, false)] {
            if count == 0 {
                parts.push(None);
                continue;
            }
            let mut shape = cx.shape_of(v);
            shape[a] = count;
            let part = match (fill, mode.as_str()) {
                (Some(f), _) => {
                    let f = cx.op(
                        Op::Reshape,
                        &[f],
                        Attrs::new().and(key::SHAPE, Vec::<usize>::new()),
                    )?;
                    cx.op(Op::BroadcastTo, &[f], Attrs::new().and(key::SHAPE, shape))?
                }
                (None, "edge") => {
                    let i = if at_start { 0 } else { dim - 1 };
                    let edge = slice(cx, v, (a, i, i + 1, 1))?;
                    cx.op(
                        Op::BroadcastTo,
                        &[edge],
                        Attrs::new().and(key::SHAPE, shape),
                    )?
                }
                (None, "wrap") => {
                    let (s0, e0) = if at_start {
                        (dim - count, dim)
                    } else {
                        (0, count)
                    };
                    slice(cx, v, (a, s0, e0, 1))?
                }
                _ => {
                    // reflect: before = x[count], …, x[1]; after = x[dim-2], …, x[dim-1-count]
                    let mut rows = Vec::new();
                    for j in 1..=count {
                        let i = if at_start { count + 1 - j } else { dim - 1 - j };
                        rows.push(slice(cx, v, (a, i, i + 1, 1))?);
                    }
                    match rows.as_slice() {
                        [one] => *one,
                        _ => cx.op(Op::Concat, &rows, Attrs::new().and(key::AXIS, a))?,
                    }
                }
            };
            parts.push(Some(part));
        }
        let joined: Vec<ValueId> = [parts[0], Some(v), parts[1]]
            .into_iter()
            .flatten()
            .collect();
        v = cx.op(Op::Concat, &joined, Attrs::new().and(key::AXIS, a))?;
    }
    Ok(same_elem(x, v))
}
