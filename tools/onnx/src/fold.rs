//! Import-time evaluation of nodes whose operands are all known: the shape arithmetic PyTorch
//! exports around `Reshape` and `Expand` (`Shape → Gather → Unsqueeze → Concat`), `Constant`,
//! `ConstantOfShape`, `Range`, and integer and boolean math on such values. The result is a
//! [`Literal`], so the shapes that depend on it are static.

use crate::error::Problem;
use crate::literal::{Elem, Literal};
use crate::ops::Args;
use crate::ops::shape::{broadcast, reshaped, slice_ranges};

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
    let dim = data.shape[a] as i64;
    let ind: Vec<usize> = indices
        .as_ints()
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + dim } else { i };
            if (0..dim).contains(&j) {
                Ok(j as usize)
            } else {
                Err(Problem::invalid(format!(
                    "Gather index {i} out of range for {dim}"
                )))
            }
        })
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
