//! Import-time evaluation of nodes whose operands are all known: the shape arithmetic PyTorch
//! exports around `Reshape` and `Expand` (`Shape → Gather → Unsqueeze → Concat`), `Constant`,
//! `ConstantOfShape`, `Range`, integer and boolean math on such values, and the index ops
//! exports apply to constant tables (`GatherElements`, `ScatterElements`, `ScatterND`,
//! `CumSum`, `ArgMax`/`ArgMin`, `Slice` with negative steps). The result is a [`Literal`], so
//! the shapes that depend on it are static.

use crate::error::Problem;
use crate::literal::{Elem, Literal};
use crate::ops::Args;
use crate::ops::shape::{broadcast, reshaped, slice_operands, slice_ranges};

/// The folded results, or `None` when `op` is not folded (it is then translated).
pub fn fold(op: &str, args: &Args) -> Result<Option<Vec<Literal>>, Problem> {
    let lit = |i: usize| -> Result<&Literal, Problem> {
        args.literal(i, "operand")?
            .ok_or_else(|| Problem::invalid(format!("required operand {i} is missing")))
    };
    let folded = match op {
        "Constant" => constant(args)?,
        "ConstantOfShape" => {
            let shape: Vec<usize> = lit(0)?
                .as_ints()
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect();
            let value = args
                .attrs
                .tensor("value")?
                .unwrap_or_else(|| Literal::new(Elem::Float, vec![1], vec![0.0]));
            let v = value.data.first().copied().unwrap_or(0.0);
            let n = element_count(&shape)?;
            Literal::new(value.elem, shape, vec![v; n])
        }
        "Range" => {
            let (start, limit, delta) = (lit(0)?, lit(1)?, lit(2)?);
            let first = |l: &Literal| {
                l.data
                    .first()
                    .copied()
                    .ok_or_else(|| Problem::invalid("Range's operands must be scalars"))
            };
            let (s, l, d) = (first(start)?, first(limit)?, first(delta)?);
            if d == 0.0 || !(s.is_finite() && l.is_finite() && d.is_finite()) {
                return Err(Problem::invalid(
                    "Range needs finite bounds and a non-zero delta",
                ));
            }
            let n = ((l - s) / d).ceil().max(0.0) as usize;
            element_count(&[n])?;
            Literal::new(
                start.elem,
                vec![n],
                (0..n).map(|i| s + i as f64 * d).collect(),
            )
        }
        "Identity" => lit(0)?.clone(),
        "Cast" => {
            let x = lit(0)?;
            args.attrs.ignore("saturate");
            args.attrs.ignore("round_mode");
            let to = args.attrs.int("to", 0) as i32;
            cast(x, to)?
        }
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            let x = lit(0)?;
            let shape = reshaped(op, &x.shape, args)?;
            Literal::new(x.elem, shape, x.data.clone())
        }
        "Concat" => concat(args)?,
        "Gather" => gather(args, lit(0)?, lit(1)?)?,
        "Slice" if has_negative_step(args)? => slice_any_step(args, lit(0)?)?,
        "GatherElements" => gather_elements(args, lit(0)?, lit(1)?)?,
        "ScatterElements" => scatter_elements(args, lit(0)?, lit(1)?, lit(2)?)?,
        "ScatterND" => scatter_nd(args, lit(0)?, lit(1)?, lit(2)?)?,
        "CumSum" => cumsum(args, lit(0)?)?,
        "ArgMax" | "ArgMin" => arg_extreme(args, lit(0)?, op == "ArgMax")?,
        "Slice" => {
            let x = lit(0)?;
            let mut v = x.clone();
            for (a, s, e, step) in slice_ranges(&x.shape, args)? {
                let mut shape = v.shape.clone();
                shape[a] = (e - s).div_ceil(step);
                v = relayout(&v, shape, |idx| {
                    let mut idx = idx.to_vec();
                    idx[a] = s + idx[a] * step;
                    idx
                })?;
            }
            v
        }
        "Expand" => {
            let x = lit(0)?;
            let target: Vec<usize> = lit(1)?
                .as_ints()
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect();
            let shape = broadcast(&x.shape, &target)?;
            broadcast_to(x, &shape)?
        }
        "Add" | "Sub" | "Mul" | "Div" | "Equal" | "Less" | "Greater" | "LessOrEqual"
        | "GreaterOrEqual" | "And" | "Or" | "Max" | "Min" | "Mod"
            if args.operands.len() == 2 =>
        {
            let (a, b) = (lit(0)?, lit(1)?);
            let ints = a.elem == Elem::Int && b.elem == Elem::Int;
            let elem = match op {
                "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" => {
                    Elem::Bool
                }
                _ => a.elem,
            };
            if op == "Mod" && args.attrs.int("fmod", 0) != 0 {
                return Ok(None);
            }
            let f = |x: f64, y: f64| -> f64 {
                let b = |c: bool| if c { 1.0 } else { 0.0 };
                match op {
                    "Add" => x + y,
                    "Sub" => x - y,
                    "Mul" => x * y,
                    "Div" if ints => {
                        if y == 0.0 {
                            0.0
                        } else {
                            (x / y).trunc()
                        }
                    }
                    "Div" => x / y,
                    "Mod" => {
                        if y == 0.0 {
                            0.0
                        } else {
                            x - y * (x / y).floor()
                        }
                    }
                    "Equal" => b(x == y),
                    "Less" => b(x < y),
                    "Greater" => b(x > y),
                    "LessOrEqual" => b(x <= y),
                    "GreaterOrEqual" => b(x >= y),
                    "And" => b(x != 0.0 && y != 0.0),
                    "Or" => b(x != 0.0 || y != 0.0),
                    "Max" => x.max(y),
                    _ => x.min(y),
                }
            };
            if op == "Div" && ints && b.data.contains(&0.0) {
                return Err(Problem::invalid("integer division by zero"));
            }
            let shape = broadcast(&a.shape, &b.shape)?;
            let (a, b) = (broadcast_to(a, &shape)?, broadcast_to(b, &shape)?);
            let data = a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect();
            Literal::new(elem, shape, data)
        }
        "Neg" | "Abs" | "Not" | "Sqrt" | "Floor" | "Ceil" | "Round" | "Sign" => {
            let x = lit(0)?;
            let f = |v: f64| match op {
                "Neg" => -v,
                "Abs" => v.abs(),
                "Not" => f64::from(u8::from(v == 0.0)),
                "Sqrt" => v.sqrt(),
                "Floor" => v.floor(),
                "Ceil" => v.ceil(),
                "Round" => v.round_ties_even(),
                _ => v.signum() * f64::from(u8::from(v != 0.0)),
            };
            let elem = if op == "Not" { Elem::Bool } else { x.elem };
            Literal::new(
                elem,
                x.shape.clone(),
                x.data.iter().map(|&v| f(v)).collect(),
            )
        }
        "Where" => {
            let (c, a, b) = (lit(0)?, lit(1)?, lit(2)?);
            let shape = broadcast(&broadcast(&c.shape, &a.shape)?, &b.shape)?;
            let (c, a2, b2) = (
                broadcast_to(c, &shape)?,
                broadcast_to(a, &shape)?,
                broadcast_to(b, &shape)?,
            );
            let data = (0..c.data.len())
                .map(|i| {
                    if c.data[i] != 0.0 {
                        a2.data[i]
                    } else {
                        b2.data[i]
                    }
                })
                .collect();
            Literal::new(a.elem, shape, data)
        }
        _ => return Ok(None),
    };
    Ok(Some(vec![folded]))
}

fn constant(args: &Args) -> Result<Literal, Problem> {
    let a = args.attrs;
    if let Some(t) = a.tensor("value")? {
        return Ok(t);
    }
    if a.has("value_float") {
        return Ok(Literal::scalar(Elem::Float, a.float("value_float", 0.0)));
    }
    if a.has("value_int") {
        return Ok(Literal::scalar(Elem::Int, a.int("value_int", 0) as f64));
    }
    if let Some(v) = a.floats("value_floats") {
        return Ok(Literal::new(
            Elem::Float,
            vec![v.len()],
            v.iter().map(|&x| f64::from(x)).collect(),
        ));
    }
    if let Some(v) = a.ints("value_ints") {
        return Ok(Literal::ints(&v));
    }
    Err(Problem::unsupported(
        "a Constant without value, value_float(s) or value_int(s) (strings and sparse tensors \
         have no sinter equivalent)",
    ))
}

fn cast(x: &Literal, to: i32) -> Result<Literal, Problem> {
    let elem =
        crate::literal::literal_elem(to).map_err(|e| Problem::unsupported(format!("cast: {e}")))?;
    let f: fn(f64) -> f64 = match elem {
        Elem::Float => |v| v,
        Elem::Int => f64::trunc,
        Elem::Bool => |v| f64::from(u8::from(v != 0.0)),
    };
    Ok(Literal::new(
        elem,
        x.shape.clone(),
        x.data.iter().map(|&v| f(v)).collect(),
    ))
}

/// Row-major multi-index of flat position `i` in `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = i % shape[a].max(1);
        i /= shape[a].max(1);
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// A literal of `shape` whose element at `idx` is `x`'s element at `source(idx)`.
fn relayout(
    x: &Literal,
    shape: Vec<usize>,
    source: impl Fn(&[usize]) -> Vec<usize>,
) -> Result<Literal, Problem> {
    let n = element_count(&shape)?;
    let data = (0..n)
        .map(|i| x.data[ravel(&source(&unravel(i, &shape)), &x.shape)])
        .collect();
    Ok(Literal::new(x.elem, shape, data))
}

/// The most elements a folded value may have (2²⁶): folding is for shapes and small constants,
/// and a malformed model must not make the importer allocate without bound.
const MAX_FOLDED: usize = 1 << 26;

/// The element count of a folded value's shape, refused past [`MAX_FOLDED`].
fn element_count(shape: &[usize]) -> Result<usize, Problem> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_FOLDED)
        .ok_or_else(|| {
            Problem::unsupported(format!(
                "a value of shape {shape:?} computed at import time (more than {MAX_FOLDED} elements)"
            ))
        })
}

fn broadcast_to(x: &Literal, shape: &[usize]) -> Result<Literal, Problem> {
    let offset = shape.len() - x.rank();
    relayout(x, shape.to_vec(), |idx| {
        idx[offset..]
            .iter()
            .zip(&x.shape)
            .map(|(&i, &d)| if d == 1 { 0 } else { i })
            .collect()
    })
}

fn concat(args: &Args) -> Result<Literal, Problem> {
    let parts: Vec<&Literal> = args
        .all()
        .map(|(_, v)| match v {
            crate::import::Val::Static(l) => Ok(l),
            crate::import::Val::Dynamic { .. } => Err(Problem::invalid("not static")),
        })
        .collect::<Result<_, _>>()?;
    let first = parts
        .first()
        .ok_or_else(|| Problem::invalid("no operands"))?;
    let a = crate::ops::axis(args.attrs.int("axis", 0), first.rank(), "axis")?;
    let mut shape = first.shape.clone();
    shape[a] = 0;
    let mut sources = Vec::new();
    for p in &parts {
        if p.rank() != first.rank()
            || p.shape
                .iter()
                .enumerate()
                .any(|(i, &d)| i != a && d != first.shape[i])
        {
            return Err(Problem::invalid(format!(
                "Concat of shapes {:?} and {:?}",
                first.shape, p.shape
            )));
        }
        for k in 0..p.shape[a] {
            sources.push((p, k));
        }
        shape[a] += p.shape[a];
    }
    let n = shape.iter().product();
    let data = (0..n)
        .map(|i| {
            let mut idx = unravel(i, &shape);
            let (p, k) = sources[idx[a]];
            idx[a] = k;
            p.data[ravel(&idx, &p.shape)]
        })
        .collect();
    Ok(Literal::new(first.elem, shape, data))
}

fn gather(args: &Args, data: &Literal, indices: &Literal) -> Result<Literal, Problem> {
    let a = crate::ops::axis(args.attrs.int("axis", 0), data.rank(), "axis")?;
    let ind: Vec<usize> = (indices.as_ints().iter())
        .map(|&i| index_in(i, data.shape[a], "Gather"))
        .collect::<Result<_, _>>()?;
    let k = indices.rank();
    let shape: Vec<usize> = data.shape[..a]
        .iter()
        .chain(&indices.shape)
        .chain(&data.shape[a + 1..])
        .copied()
        .collect();
    relayout(data, shape, |idx| {
        let which = ravel(&idx[a..a + k], &indices.shape);
        idx[..a]
            .iter()
            .copied()
            .chain(std::iter::once(ind[which]))
            .chain(idx[a + k..].iter().copied())
            .collect()
    })
}

/// An index along an axis of extent `dim`, negative ones counting from the end; `what` names
/// the op in the error.
fn index_in(i: i64, dim: usize, what: &str) -> Result<usize, Problem> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if (0..d).contains(&j) {
        Ok(j as usize)
    } else {
        Err(Problem::invalid(format!(
            "{what} index {i} out of range for {dim}"
        )))
    }
}

fn has_negative_step(args: &Args) -> Result<bool, Problem> {
    Ok(args
        .literal(4, "Slice's steps")?
        .is_some_and(|steps| steps.as_ints().iter().any(|&s| s < 0)))
}

/// `Slice` of a literal with any nonzero steps, as numpy slices (negative steps walk back from
/// a start clamped to `dim − 1`, to an end clamped to −1).
fn slice_any_step(args: &Args, x: &Literal) -> Result<Literal, Problem> {
    let mut v = x.clone();
    for (a, s, e, step) in slice_operands(x.rank(), args)? {
        if step == 0 {
            return Err(Problem::invalid("Slice with step 0"));
        }
        let dim = x.shape[a] as i64;
        let at = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let picked: Vec<usize> = if step > 0 {
            let (s, e) = (at(s).clamp(0, dim), at(e).clamp(0, dim));
            (s..e.max(s))
                .step_by(step as usize)
                .map(|i| i as usize)
                .collect()
        } else {
            let (s, e) = (at(s).clamp(-1, dim - 1), at(e).clamp(-1, dim - 1));
            let mut out = Vec::new();
            let mut i = s;
            while i > e {
                out.push(i as usize);
                i += step;
            }
            out
        };
        let mut shape = v.shape.clone();
        shape[a] = picked.len();
        v = relayout(&v, shape, |idx| {
            let mut idx = idx.to_vec();
            idx[a] = picked[idx[a]];
            idx
        })?;
    }
    Ok(v)
}

/// `GatherElements`: `out[i] = data[i with i[axis] = indices[i]]`, of the indices' shape.
fn gather_elements(args: &Args, data: &Literal, indices: &Literal) -> Result<Literal, Problem> {
    let a = crate::ops::axis(args.attrs.int("axis", 0), data.rank(), "axis")?;
    if indices.rank() != data.rank() {
        return Err(Problem::invalid(
            "GatherElements: indices and data differ in rank",
        ));
    }
    let ind = indices.as_ints();
    let n = element_count(&indices.shape)?;
    let mut out = Vec::with_capacity(n);
    for (i, &raw) in ind.iter().enumerate().take(n) {
        let mut idx = unravel(i, &indices.shape);
        idx[a] = index_in(raw, data.shape[a], "GatherElements")?;
        if idx.iter().zip(&data.shape).any(|(&j, &d)| j >= d) {
            return Err(Problem::invalid(
                "GatherElements: indices pass the data's shape",
            ));
        }
        out.push(data.data[ravel(&idx, &data.shape)]);
    }
    Ok(Literal::new(data.elem, indices.shape.clone(), out))
}

/// How a scatter combines an update with the value there.
fn scatter_reduction(args: &Args) -> Result<fn(f64, f64) -> f64, Problem> {
    Ok(match args.attrs.string("reduction", "none").as_str() {
        "none" => |_, u| u,
        "add" => |x, u| x + u,
        "mul" => |x, u| x * u,
        "max" => f64::max,
        "min" => f64::min,
        other => return Err(Problem::unsupported(format!("reduction=\"{other}\""))),
    })
}

/// `ScatterElements`: a copy of `data` with `data[i with i[axis] = indices[i]]` combined with
/// `updates[i]`, in index order.
fn scatter_elements(
    args: &Args,
    data: &Literal,
    indices: &Literal,
    updates: &Literal,
) -> Result<Literal, Problem> {
    let a = crate::ops::axis(args.attrs.int("axis", 0), data.rank(), "axis")?;
    if indices.shape != updates.shape || indices.rank() != data.rank() {
        return Err(Problem::invalid(
            "ScatterElements: indices, updates and data do not match",
        ));
    }
    let combine = scatter_reduction(args)?;
    let mut out = data.clone();
    for (i, &raw) in indices.as_ints().iter().enumerate() {
        let mut idx = unravel(i, &indices.shape);
        idx[a] = index_in(raw, data.shape[a], "ScatterElements")?;
        if idx.iter().zip(&data.shape).any(|(&j, &d)| j >= d) {
            return Err(Problem::invalid(
                "ScatterElements: indices pass the data's shape",
            ));
        }
        let at = ravel(&idx, &data.shape);
        out.data[at] = combine(out.data[at], updates.data[i]);
    }
    Ok(out)
}

/// `ScatterND`: a copy of `data` whose slices at the index tuples of `indices` (its last axis)
/// are combined with the slices of `updates`.
fn scatter_nd(
    args: &Args,
    data: &Literal,
    indices: &Literal,
    updates: &Literal,
) -> Result<Literal, Problem> {
    let Some((&k, batch)) = indices.shape.split_last() else {
        return Err(Problem::invalid("ScatterND: indices of rank 0"));
    };
    if k > data.rank() {
        return Err(Problem::invalid(
            "ScatterND: index tuples longer than the data's rank",
        ));
    }
    let slice_shape = &data.shape[k..];
    let expected: Vec<usize> = batch.iter().chain(slice_shape).copied().collect();
    if updates.shape != expected {
        return Err(Problem::invalid(format!(
            "ScatterND: updates of shape {:?}, expected {expected:?}",
            updates.shape
        )));
    }
    let combine = scatter_reduction(args)?;
    let slice_len: usize = slice_shape.iter().product();
    let ind = indices.as_ints();
    let mut out = data.clone();
    for (t, tuple) in ind
        .chunks(k.max(1))
        .enumerate()
        .take(batch.iter().product())
    {
        let mut idx = vec![0; data.rank()];
        for (a, &raw) in tuple.iter().enumerate().take(k) {
            idx[a] = index_in(raw, data.shape[a], "ScatterND")?;
        }
        let base = ravel(&idx, &data.shape);
        for j in 0..slice_len {
            out.data[base + j] = combine(out.data[base + j], updates.data[t * slice_len + j]);
        }
    }
    Ok(out)
}

/// `CumSum` along the axis its second operand names, `exclusive` and `reverse` as ONNX defines
/// them. The additions run in scan order and the first inclusive sum is the element itself (so
/// `-0` stays `-0`), as in sinter's `cumsum`.
fn cumsum(args: &Args, x: &Literal) -> Result<Literal, Problem> {
    let form = crate::ops::cumsum_form(args, x.elem, x.rank())?;
    let a = form.axis;
    let dim = x.shape[a];
    let inner: usize = x.shape[a + 1..].iter().product();
    let outer: usize = x.shape[..a].iter().product();
    let mut out = x.clone();
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| (o * dim + i) * inner + j;
            let mut total = 0.0;
            for step in 0..dim {
                let i = if form.reverse { dim - 1 - step } else { step };
                let v = x.data[at(i)];
                if form.exclusive {
                    out.data[at(i)] = total;
                }
                total = if step == 0 { v } else { total + v };
                if !form.exclusive {
                    out.data[at(i)] = total;
                }
            }
        }
    }
    Ok(out)
}

/// `ArgMax` / `ArgMin` along `axis` (`keepdims`, `select_last_index`), as int64 indices.
fn arg_extreme(args: &Args, x: &Literal, max: bool) -> Result<Literal, Problem> {
    let a = crate::ops::axis(args.attrs.int("axis", 0), x.rank(), "axis")?;
    let keep = args.attrs.int("keepdims", 1) != 0;
    let last = args.attrs.int("select_last_index", 0) != 0;
    let mut shape = x.shape.clone();
    shape[a] = 1;
    let out = relayout(x, shape.clone(), |idx| idx.to_vec())?;
    let data: Vec<f64> = (0..out.data.len())
        .map(|i| {
            let mut idx = unravel(i, &shape);
            let mut best: Option<(usize, f64)> = None;
            for j in 0..x.shape[a] {
                idx[a] = j;
                let v = x.data[ravel(&idx, &x.shape)];
                let better = match best {
                    None => true,
                    Some((_, b)) if max => v > b || (last && v == b),
                    Some((_, b)) => v < b || (last && v == b),
                };
                if better {
                    best = Some((j, v));
                }
            }
            best.map_or(0.0, |(j, _)| j as f64)
        })
        .collect();
    if !keep {
        shape.remove(a);
    }
    Ok(Literal::new(Elem::Int, shape, data))
}
