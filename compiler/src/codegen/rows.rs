//! Row kernels: reductions, softmax, norms, cross-entropy.
//!
//! A segment of `T` threads (a power of two, `T = min(256, next_pow2(row length))`) works on
//! one row; a workgroup of 256 threads holds `256 / T` segments. Each thread strides over the
//! row accumulating a partial result; a shared-memory tree combines the partials. Rows past
//! the end keep a trip count of zero but still reach every barrier, which stays in uniform
//! control flow.

use std::fmt::Write;

use sinter_ir::DType;

use super::{
    ENTRY_ARGS, Emitter, NAN, NEG_INF, POS_INF, WORKGROUP, decompose, f32_literal, grid, load,
    store, strided_loop, unroll_factor,
};
use crate::kernel::{RowKind, RowOperand, Rows};

/// WGSL names for one operand: its arena binding, the base address of the current row, and
/// the reduced strides.
struct Access {
    arena: String,
    base: String,
    reduced: Vec<String>,
    dtype: DType,
}

impl Access {
    /// Address of element `r*` (reduced coordinates) of the current row.
    fn at(&self, coord_prefix: &str) -> String {
        let mut s = self.base.clone();
        for (axis, stride) in self.reduced.iter().enumerate() {
            write!(s, " + {coord_prefix}{axis} * {stride}").unwrap();
        }
        s
    }

    fn load(&self, coord_prefix: &str) -> String {
        load(&self.arena, &self.at(coord_prefix), self.dtype)
    }
}

pub fn emit(e: &mut Emitter, k: &Rows) -> (String, [u32; 3], u32) {
    let rows: usize = k.kept.iter().product();
    let len: usize = k.reduced.iter().product();
    let seg = (len.next_power_of_two() as u32).clamp(1, WORKGROUP);
    let per_group = WORKGROUP / seg;
    let argmax = k.kind == RowKind::Argmax;

    let mut s = String::new();
    writeln!(s, "const SEG: u32 = {seg}u;").unwrap();
    writeln!(s, "var<workgroup> red: array<f32, {WORKGROUP}>;").unwrap();
    if argmax {
        writeln!(s, "var<workgroup> redi: array<u32, {WORKGROUP}>;").unwrap();
    }
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    writeln!(s, "    let lane = lid % SEG;").unwrap();
    writeln!(
        s,
        "    let row = (wid.x + wid.y * nwg.x) * {per_group}u + lid / SEG;"
    )
    .unwrap();
    let rows_p = e.param(rows);
    let len_p = e.param(len);
    writeln!(s, "    let live = row < {rows_p};").unwrap();
    writeln!(s, "    let len = select(0u, {len_p}, live);").unwrap();
    let kept_dims = e.params(&k.kept);
    let reduced_dims = e.params(&k.reduced);
    decompose(&mut s, "    ", "select(0u, row, live)", "k", &kept_dims);

    let mut access = |s: &mut String, name: &str, op: &RowOperand| {
        let arena = e.arena(op.buffer);
        let mut base = e.base(op.buffer, op.offset);
        for (axis, &stride) in op.kept_strides.iter().enumerate() {
            let st = e.param(stride);
            write!(base, " + k{axis} * {st}").unwrap();
        }
        writeln!(s, "    let {name} = {base};").unwrap();
        let reduced = op.reduced_strides.iter().map(|&st| e.param(st)).collect();
        Access {
            arena,
            base: name.to_string(),
            reduced,
            dtype: op.dtype,
        }
    };
    let inputs: Vec<Access> = k
        .inputs
        .iter()
        .enumerate()
        .map(|(i, op)| access(&mut s, &format!("in{i}"), op))
        .collect();
    let out = access(&mut s, "out0", &k.outputs[0]);
    let x = &inputs[0];

    // A loop over the row's elements assigned to this thread, with coordinates `r*`; unrolled
    // when the row is long enough to pass the loop budget.
    let (passes, combines) = passes(k.kind);
    let per_pass = (len as u64).div_ceil(u64::from(seg));
    let combine_trips = combines * u64::from(seg.trailing_zeros());
    let unroll = unroll_factor(per_pass, passes, combine_trips);
    e.loop_trips(per_pass.div_ceil(u64::from(unroll)) * passes + combine_trips);
    let each = |s: &mut String, body: &str| {
        strided_loop(
            s,
            "    ",
            "j",
            "lane",
            "len",
            "SEG",
            unroll,
            &|s, indent| {
                decompose(s, indent, "j", "r", &reduced_dims);
                for line in body.lines() {
                    writeln!(s, "{indent}{line}").unwrap();
                }
            },
        );
    };
    let write_once = |s: &mut String, value: &str, dtype: DType| {
        writeln!(
            s,
            "    if (live && lane == 0u) {{ {} }}",
            store(&out.arena, &out.base, value, dtype)
        )
        .unwrap();
    };

    match k.kind {
        RowKind::Sum | RowKind::Mean => {
            reduce(
                &mut s,
                "sum",
                "0.0",
                "acc + x",
                &x.load("r"),
                &each,
                "a + b",
            );
            let v = if k.kind == RowKind::Mean {
                "sum / f32(len)"
            } else {
                "sum"
            };
            write_once(&mut s, v, DType::F32);
        }
        RowKind::Max | RowKind::Min => {
            // NaN-propagating, as IR.md says for `max` and `min`.
            let (init, f) = if k.kind == RowKind::Max {
                (NEG_INF, "max_nan")
            } else {
                (POS_INF, "min_nan")
            };
            reduce(
                &mut s,
                "m",
                init,
                &format!("{f}(acc, x)"),
                &x.load("r"),
                &each,
                &format!("{f}(a, b)"),
            );
            write_once(&mut s, "m", DType::F32);
        }
        RowKind::Logsumexp => {
            max_and_sum_exp(&mut s, x, &each);
            write_once(&mut s, "lse", DType::F32);
        }
        RowKind::Argmax => {
            // The first maximum, a NaN counting as the maximum (`argmax_better`); a thread that
            // saw no element holds index u32::MAX.
            writeln!(s, "    var best = {NEG_INF};").unwrap();
            writeln!(s, "    var besti = 0xffffffffu;").unwrap();
            each(
                &mut s,
                &format!(
                    "let x = {};\nif (argmax_better(x, j, best, besti)) {{ best = x; besti = j; }}",
                    x.load("r")
                ),
            );
            writeln!(s, "    red[lid] = best;").unwrap();
            writeln!(s, "    redi[lid] = besti;").unwrap();
            writeln!(s, "    workgroupBarrier();").unwrap();
            writeln!(s, "    for (var w = SEG / 2u; w > 0u; w = w >> 1u) {{").unwrap();
            writeln!(s, "        if (lane < w) {{").unwrap();
            writeln!(s, "            let b = red[lid + w];").unwrap();
            writeln!(s, "            let bi = redi[lid + w];").unwrap();
            writeln!(s, "            if (argmax_better(b, bi, red[lid], redi[lid])) {{ red[lid] = b; redi[lid] = bi; }}").unwrap();
            writeln!(s, "        }}").unwrap();
            writeln!(s, "        workgroupBarrier();").unwrap();
            writeln!(s, "    }}").unwrap();
            writeln!(s, "    let index = redi[lid - lane];").unwrap();
            write_once(&mut s, "i32(index)", DType::I32);
        }
        RowKind::Softmax | RowKind::LogSoftmax => {
            max_and_sum_exp(&mut s, x, &each);
            let value = if k.kind == RowKind::Softmax {
                format!("exp({} - shift) / total", x.load("r"))
            } else {
                format!("{} - shift - log_f32(total)", x.load("r"))
            };
            each(&mut s, &store(&out.arena, &out.at("r"), &value, DType::F32));
        }
        RowKind::LayerNorm { eps } => {
            reduce(
                &mut s,
                "sum",
                "0.0",
                "acc + x",
                &x.load("r"),
                &each,
                "a + b",
            );
            writeln!(s, "    let mean = sum / f32(len);").unwrap();
            reduce(
                &mut s,
                "sq",
                "0.0",
                "acc + (x - mean) * (x - mean)",
                &x.load("r"),
                &each,
                "a + b",
            );
            writeln!(
                s,
                "    let rstd = inverseSqrt(sq / f32(len) + {});",
                f32_literal(eps)
            )
            .unwrap();
            let value = format!(
                "({} - mean) * rstd * {} + {}",
                x.load("r"),
                inputs[1].load("r"),
                inputs[2].load("r")
            );
            each(&mut s, &store(&out.arena, &out.at("r"), &value, DType::F32));
        }
        RowKind::RmsNorm { eps } => {
            reduce(
                &mut s,
                "sq",
                "0.0",
                "acc + x * x",
                &x.load("r"),
                &each,
                "a + b",
            );
            writeln!(
                s,
                "    let rstd = inverseSqrt(sq / f32(len) + {});",
                f32_literal(eps)
            )
            .unwrap();
            let value = format!("{} * rstd * {}", x.load("r"), inputs[1].load("r"));
            each(&mut s, &store(&out.arena, &out.at("r"), &value, DType::F32));
        }
        RowKind::CrossEntropy => {
            max_and_sum_exp(&mut s, x, &each);
            let labels = &inputs[1];
            writeln!(s, "    if (live && lane == 0u) {{").unwrap();
            writeln!(
                s,
                "        let label = {};",
                load(&labels.arena, &labels.base, DType::I32)
            )
            .unwrap();
            writeln!(s, "        var loss = {NAN};").unwrap();
            writeln!(s, "        if (label >= 0i && u32(label) < len) {{").unwrap();
            let stride = &x.reduced[0];
            writeln!(
                s,
                "            loss = lse - {}[{} + u32(label) * {stride}];",
                x.arena, x.base
            )
            .unwrap();
            writeln!(s, "        }}").unwrap();
            writeln!(
                s,
                "        {}",
                store(&out.arena, &out.base, "loss", DType::F32)
            )
            .unwrap();
            writeln!(s, "    }}").unwrap();
        }
        RowKind::SquaredError { mean } => {
            let diff = format!("{} - {}", x.load("r"), inputs[1].load("r"));
            reduce(&mut s, "sum", "0.0", "acc + x * x", &diff, &each, "a + b");
            write_once(
                &mut s,
                if mean { "sum / f32(len)" } else { "sum" },
                DType::F32,
            );
        }
    }
    s.push_str("}\n");
    let shared = WORKGROUP * if argmax { 8 } else { 4 };
    (s, grid(rows.div_ceil(per_group as usize)), shared)
}

/// How many loops over the row (`each`) and how many segment combines (`log2(SEG)` iterations
/// each) a kind of row kernel runs, for its loop count.
fn passes(kind: RowKind) -> (u64, u64) {
    match kind {
        RowKind::Sum | RowKind::Mean | RowKind::Max | RowKind::Min => (1, 1),
        RowKind::Argmax | RowKind::SquaredError { .. } => (1, 1),
        RowKind::Logsumexp | RowKind::CrossEntropy => (2, 2),
        RowKind::Softmax | RowKind::LogSoftmax | RowKind::LayerNorm { .. } => (3, 2),
        RowKind::RmsNorm { .. } => (2, 1),
    }
}

/// Accumulates `step` (in terms of `acc` and `x = element`) over the row, combines the
/// segment's partials with `combine` (in terms of `a` and `b`), and binds the result to `name`.
fn reduce(
    s: &mut String,
    name: &str,
    init: &str,
    step: &str,
    element: &str,
    each: &dyn Fn(&mut String, &str),
    combine: &str,
) {
    writeln!(s, "    var acc_{name} = {init};").unwrap();
    let step = step.replace("acc", &format!("acc_{name}"));
    each(s, &format!("let x = {element};\nacc_{name} = {step};"));
    combine_segment(s, &format!("acc_{name}"), name, combine);
}

/// Combines every thread's `partial` over its segment through `red` with `combine` (in terms
/// of `a` and `b`) and binds the segment's result to `name` in every thread of the segment.
pub fn combine_segment(s: &mut String, partial: &str, name: &str, combine: &str) {
    writeln!(s, "    red[lid] = {partial};").unwrap();
    writeln!(s, "    workgroupBarrier();").unwrap();
    writeln!(s, "    for (var w = SEG / 2u; w > 0u; w = w >> 1u) {{").unwrap();
    writeln!(s, "        if (lane < w) {{").unwrap();
    writeln!(s, "            let a = red[lid];").unwrap();
    writeln!(s, "            let b = red[lid + w];").unwrap();
    writeln!(s, "            red[lid] = {combine};").unwrap();
    writeln!(s, "        }}").unwrap();
    writeln!(s, "        workgroupBarrier();").unwrap();
    writeln!(s, "    }}").unwrap();
    writeln!(s, "    let {name} = red[lid - lane];").unwrap();
    // Every thread has read the result before the next reduction reuses `red`.
    writeln!(s, "    workgroupBarrier();").unwrap();
}

/// Binds `m` (the row max, NaN if the row holds one), `shift` (`m`, or 0 when it is -inf),
/// `total = sum(exp(x - shift))` and `lse`, the row's log-sum-exp: `m` itself when `m` is NaN
/// or infinite (so +inf stays +inf instead of becoming inf - inf), else `shift + log(total)`.
fn max_and_sum_exp(s: &mut String, x: &Access, each: &dyn Fn(&mut String, &str)) {
    reduce(
        s,
        "m",
        NEG_INF,
        "max_nan(acc, x)",
        &x.load("r"),
        each,
        "max_nan(a, b)",
    );
    writeln!(s, "    let shift = select(m, 0.0, m == {NEG_INF});").unwrap();
    reduce(
        s,
        "total",
        "0.0",
        "acc + exp(x - shift)",
        &x.load("r"),
        each,
        "a + b",
    );
    writeln!(
        s,
        "    let lse = select(shift + log_f32(total), m, is_nan_f32(m) || is_inf_f32(m));"
    )
    .unwrap();
}
