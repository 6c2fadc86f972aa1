//! Reductions: `ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceMin`, `ReduceLogSumExp`,
//! `ReduceL1`, `ReduceL2`, `ReduceSumSquare`, `ReduceLogSum`, and `ArgMax`/`ArgMin`.

use sinter_ir::{Attrs, Op, ValueId, key};

use super::shape::{axes_operand, normalized};
use super::{Args, Results, f32_value, float, one, unary};
use crate::error::Problem;
use crate::import::{Importer, Val};
use crate::literal::Elem;

pub fn translate(cx: &mut Importer, op: &str, args: &Args) -> Result<Option<Results>, Problem> {
    let (pre, reduce, post): (Option<Op>, Op, Option<Op>) = match op {
        "ReduceSum" => (None, Op::Sum, None),
        "ReduceMean" => (None, Op::Mean, None),
        "ReduceMax" => (None, Op::Max, None),
        "ReduceMin" => (None, Op::Min, None),
        "ReduceLogSumExp" => (None, Op::Logsumexp, None),
        "ReduceL1" => (Some(Op::Abs), Op::Sum, None),
        "ReduceL2" => (Some(Op::Square), Op::Sum, Some(Op::Sqrt)),
        "ReduceSumSquare" => (Some(Op::Square), Op::Sum, None),
        "ReduceLogSum" => (None, Op::Sum, Some(Op::Log)),
        "ArgMax" | "ArgMin" => return arg_reduce(cx, op, args).map(Some),
        _ => return Ok(None),
    };
    let x = f32_value(cx, args.input(0)?)?;
    let rank = cx.shape_of(x).len();
    let keepdim = args.attrs.int("keepdims", 1) != 0;
    let noop = args.attrs.int("noop_with_empty_axes", 0) != 0;
    let axes = match axes_operand(args, 1)? {
        Some(a) if !a.is_empty() => normalized(&a, rank)?,
        _ if noop => return float(x).map(Some),
        _ => (0..rank).collect(),
    };
    let mut v = x;
    if let Some(p) = pre {
        v = unary(cx, p, v)?;
    }
    if rank > 0 {
        let mut sorted = axes;
        sorted.sort_unstable();
        v = cx.op(
            reduce,
            &[v],
            Attrs::new()
                .and(key::AXES, sorted)
                .and(key::KEEPDIM, keepdim),
        )?;
    }
    if let Some(p) = post {
        v = unary(cx, p, v)?;
    }
    float(v).map(Some)
}

fn arg_reduce(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let last = args.attrs.int("select_last_index", 0) != 0;
    let mut x: ValueId = f32_value(cx, args.input(0)?)?;
    let rank = cx.shape_of(x).len();
    let a = super::axis(args.attrs.int("axis", 0), rank, "axis")?;
    let keepdim = args.attrs.int("keepdims", 1) != 0;
    if op == "ArgMin" {
        x = unary(cx, Op::Neg, x)?;
    }
    let id = cx.op(
        Op::Argmax,
        &[x],
        Attrs::new()
            .and(key::AXIS, a)
            .and(key::KEEPDIM, keepdim)
            .and(key::LAST, last),
    )?;
    one(Val::Dynamic {
        id,
        elem: Elem::Int,
    })
}
