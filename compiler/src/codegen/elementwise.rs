//! Elementwise kernels: one thread per output element; every operand is addressed through
//! its own strides over the output coordinates (broadcast axes have stride 0).

use std::fmt::Write;

use sinter_ir::DType;

use super::{
    ENTRY_ARGS, Emitter, WORKGROUP, address, decompose, f32_literal, grid, load, store,
    thread_index,
};
use crate::kernel::{BinaryFn, Elementwise, Inst, UnaryFn};

pub fn emit(e: &mut Emitter, k: &Elementwise) -> (String, [u32; 3], u32) {
    let numel: usize = k.shape.iter().product();
    let mut s = String::new();
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    thread_index(&mut s);
    let n = e.param(numel);
    writeln!(s, "    if (gi >= {n}) {{ return; }}").unwrap();
    let dims = e.params(&k.shape);
    decompose(&mut s, "    ", "gi", "c", &dims);

    let mut types = Vec::with_capacity(k.insts.len());
    for (i, inst) in k.insts.iter().enumerate() {
        let (expr, ty) = match *inst {
            Inst::Load(input) => {
                let op = &k.inputs[input];
                let arena = e.arena(op.view.buffer);
                let base = e.base(op.view.buffer, op.view.offset);
                let strides = e.params(&op.view.strides);
                (
                    load(&arena, &address(&base, "c", &strides), op.dtype),
                    op.dtype,
                )
            }
            Inst::Const(c) => (f32_literal(c), DType::F32),
            Inst::Coord(axis) => (format!("f32(c{axis})"), DType::F32),
            Inst::Unary(f, x) => (unary(f, &format!("v{x}")), DType::F32),
            Inst::Binary(f, a, b) => (binary(f, &format!("v{a}"), &format!("v{b}")), DType::F32),
            Inst::Select(c, a, b) => {
                // A NaN condition is not 0, so it selects `a`.
                let cond = if types[c] == DType::I32 {
                    format!("v{c} != 0i")
                } else {
                    format!("(v{c} != 0.0 || is_nan_f32(v{c}))")
                };
                (format!("select(v{b}, v{a}, {cond})"), types[a])
            }
            Inst::Cast(to, x) => match (types[x], to) {
                (from, to) if from == to => (format!("v{x}"), to),
                (_, DType::I32) => (format!("f32_to_i32(v{x})"), DType::I32),
                (_, DType::F32) => (format!("f32(v{x})"), DType::F32),
            },
        };
        writeln!(s, "    let v{i} = {expr};").unwrap();
        types.push(ty);
    }
    for (out, inst) in &k.outputs {
        let arena = e.arena(out.view.buffer);
        let base = e.base(out.view.buffer, out.view.offset);
        let strides = e.params(&out.view.strides);
        writeln!(
            s,
            "    {}",
            store(
                &arena,
                &address(&base, "c", &strides),
                &format!("v{inst}"),
                out.dtype
            )
        )
        .unwrap();
    }
    s.push_str("}\n");
    (s, grid(numel.div_ceil(WORKGROUP as usize)), 0)
}

fn unary(f: UnaryFn, x: &str) -> String {
    match f {
        UnaryFn::Neg => format!("-{x}"),
        UnaryFn::Abs => format!("abs({x})"),
        UnaryFn::Exp => format!("exp({x})"),
        UnaryFn::Log => format!("log_f32({x})"),
        UnaryFn::Sqrt => format!("sqrt_f32({x})"),
        UnaryFn::Rsqrt => format!("rsqrt_f32({x})"),
        UnaryFn::Reciprocal => format!("1.0 / {x}"),
        UnaryFn::Square => format!("{x} * {x}"),
        // NaN and -0.0 pass through, as `x < 0 ? 0 : x`.
        UnaryFn::Relu => format!("select({x}, 0.0, {x} < 0.0)"),
        UnaryFn::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
        UnaryFn::Tanh => format!("tanh_f32({x})"),
        UnaryFn::Silu => format!("{x} / (1.0 + exp(-{x}))"),
        UnaryFn::Sin => format!("sin_f32({x})"),
        UnaryFn::Cos => format!("cos_f32({x})"),
        UnaryFn::GeluErf => format!("0.5 * {x} * (1.0 + erf_f32({x} * 0.70710677))"),
        UnaryFn::GeluTanh => {
            format!("0.5 * {x} * (1.0 + tanh_f32(0.7978846 * ({x} + 0.044715 * {x} * {x} * {x})))")
        }
    }
}

fn binary(f: BinaryFn, a: &str, b: &str) -> String {
    // Comparisons work on f32 and i32 operands alike and yield f32 0/1.
    let cmp = |op: &str| format!("select(0.0, 1.0, {a} {op} {b})");
    match f {
        BinaryFn::Add => format!("{a} + {b}"),
        BinaryFn::Sub => format!("{a} - {b}"),
        BinaryFn::Mul => format!("{a} * {b}"),
        BinaryFn::Div => format!("{a} / {b}"),
        BinaryFn::Pow => format!("pow_f32({a}, {b})"),
        BinaryFn::Maximum => format!("max_nan({a}, {b})"),
        BinaryFn::Minimum => format!("min_nan({a}, {b})"),
        BinaryFn::Eq => cmp("=="),
        BinaryFn::Lt => cmp("<"),
        BinaryFn::Le => cmp("<="),
        BinaryFn::Gt => cmp(">"),
        BinaryFn::Ge => cmp(">="),
    }
}
