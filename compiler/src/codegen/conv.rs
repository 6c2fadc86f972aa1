//! Window and gather kernels: conv2d, pooling, embedding. One thread per output element; the
//! loops over a receptive field have trip counts read from the param block.

use sinter_ir::artifact::Storage;
use std::fmt::Write;

use super::{
    ENTRY_ARGS, Emitter, LOOP_BUDGET, NAN, NEG_INF, WORKGROUP, decompose, grid, load, strided_loop,
    thread_index, unroll_factor,
};
use crate::kernel::{Conv2d, Gather, Pool2d};
use crate::layout::View;
use sinter_ir::DType;

/// Binds `{name}_base` and `{name}_s{0..}` for a view and returns its arena binding.
pub(super) fn bind_view(e: &mut Emitter, s: &mut String, name: &str, view: &View) -> String {
    let arena = e.arena(view.buffer);
    let base = e.base(view.buffer, view.offset, name);
    writeln!(s, "    let {name}_base = {base};").unwrap();
    for (axis, &stride) in view.strides.iter().enumerate() {
        let st = e.param(stride, &format!("{name}.stride[{axis}]"));
        writeln!(s, "    let {name}_s{axis} = {st};").unwrap();
    }
    arena
}

pub(super) fn header(s: &mut String, e: &mut Emitter, out: &View) {
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    thread_index(s);
    let n = e.param(out.numel(), "n");
    writeln!(s, "    if (gi >= {n}) {{ return; }}").unwrap();
    let dims = e.params(&out.shape, "out.shape");
    decompose(s, "    ", "gi", "c", &dims);
}

pub fn emit_conv(e: &mut Emitter, k: &Conv2d) -> (String, [u32; 3], u32) {
    let mut s = String::new();
    header(&mut s, e, &k.out);
    let x = bind_view(e, &mut s, "x", &k.x);
    let w = bind_view(e, &mut s, "w", &k.w);
    let o = bind_view(e, &mut s, "o", &k.out);
    let [c, h, wd] = [k.x.shape[1], k.x.shape[2], k.x.shape[3]];
    for (d, extent) in [(0, h), (1, wd)] {
        let padded = extent as u64 + 2 * k.padding[d] as u64;
        e.signed_extent("conv2d", "the padded input extent", padded);
    }
    let [kh, kw] = [k.w.shape[2], k.w.shape[3]];
    let o_per_group = k.out.shape[1] / k.groups;
    let names = [
        "C_G", "H", "W", "KH", "KW", "O_G", "SH", "SW", "PH", "PW", "DH", "DW",
    ];
    let values = [
        c / k.groups,
        h,
        wd,
        kh,
        kw,
        o_per_group,
        k.stride[0],
        k.stride[1],
        k.padding[0],
        k.padding[1],
        k.dilation[0],
        k.dilation[1],
    ];
    for (name, v) in names.iter().zip(values) {
        let p = e.param(v, name);
        writeln!(s, "    let {name} = {p};").unwrap();
    }
    writeln!(s, "    let g = c1 / O_G;").unwrap();
    match &k.bias {
        Some(b) => {
            let arena = bind_view(e, &mut s, "bias", b);
            writeln!(s, "    var acc = {arena}[bias_base + c1 * bias_s0];").unwrap();
        }
        None => writeln!(s, "    var acc = 0.0;").unwrap(),
    }
    let (c_g, kh, kw) = ((c / k.groups) as u64, kh as u64, kw as u64);
    let nested = c_g * (1 + kh * (1 + kw));
    if nested <= LOOP_BUDGET {
        e.loop_trips(nested);
        writeln!(s, "    for (var ci = 0u; ci < C_G; ci = ci + 1u) {{").unwrap();
        writeln!(
            s,
            "        let x_c = x_base + c0 * x_s0 + (g * C_G + ci) * x_s1;"
        )
        .unwrap();
        writeln!(s, "        let w_c = w_base + c1 * w_s0 + ci * w_s1;").unwrap();
        writeln!(s, "        for (var i = 0u; i < KH; i = i + 1u) {{").unwrap();
        writeln!(s, "            let ih = i32(c2 * SH + i * DH) - i32(PH);").unwrap();
        writeln!(
            s,
            "            if (ih < 0i || ih >= i32(H)) {{ continue; }}"
        )
        .unwrap();
        writeln!(s, "            for (var j = 0u; j < KW; j = j + 1u) {{").unwrap();
        writeln!(
            s,
            "                let iw = i32(c3 * SW + j * DW) - i32(PW);"
        )
        .unwrap();
        writeln!(
            s,
            "                if (iw < 0i || iw >= i32(W)) {{ continue; }}"
        )
        .unwrap();
        writeln!(
            s,
            "                acc = fma({x}[x_c + u32(ih) * x_s2 + u32(iw) * x_s3], {w}[w_c + i * w_s2 + j * w_s3], acc);"
        )
        .unwrap();
        writeln!(s, "            }}\n        }}\n    }}").unwrap();
    } else {
        // One loop over the whole receptive field (channel, row, column), unrolled.
        let total = c_g * kh * kw;
        let unroll = unroll_factor(total, 1, 0);
        e.loop_trips(total.div_ceil(u64::from(unroll)));
        let total_p = e.param(total as usize, "loop");
        let body = format!(
            "let ih = i32(c2 * SH + i * DH) - i32(PH);
let iw = i32(c3 * SW + j * DW) - i32(PW);
if (ih >= 0i && ih < i32(H) && iw >= 0i && iw < i32(W)) {{
    acc = fma({x}[x_base + c0 * x_s0 + (g * C_G + ci) * x_s1 + u32(ih) * x_s2 + u32(iw) * x_s3], {w}[w_base + c1 * w_s0 + ci * w_s1 + i * w_s2 + j * w_s3], acc);
}}
{}",
            advance_window("ci")
        );
        writeln!(s, "    var ci = 0u;\n    var i = 0u;\n    var j = 0u;").unwrap();
        window_loop(&mut s, &total_p, unroll, &body);
    }
    let value = match &k.epilogue {
        Some(_) => "epilogue(acc, c0, c1, c2, c3)",
        None => "acc",
    };
    writeln!(
        s,
        "    {o}[o_base + c0 * o_s0 + c1 * o_s1 + c2 * o_s2 + c3 * o_s3] = {value};"
    )
    .unwrap();
    s.push_str("}\n");
    if let Some(epi) = &k.epilogue {
        s.insert_str(0, &super::fused::emit_epilogue(e, epi));
    }
    (s, grid(k.out.numel().div_ceil(WORKGROUP as usize)), 0)
}

pub fn emit_pool(e: &mut Emitter, k: &Pool2d) -> (String, [u32; 3], u32) {
    let mut s = String::new();
    header(&mut s, e, &k.out);
    let x = bind_view(e, &mut s, "x", &k.x);
    let o = bind_view(e, &mut s, "o", &k.out);
    for d in 0..2 {
        let padded = k.x.shape[2 + d] as u64 + 2 * k.padding[d] as u64;
        e.signed_extent("pooling", "the padded input extent", padded);
    }
    let names = ["H", "W", "KH", "KW", "SH", "SW", "PH", "PW"];
    let values = [
        k.x.shape[2],
        k.x.shape[3],
        k.kernel[0],
        k.kernel[1],
        k.stride[0],
        k.stride[1],
        k.padding[0],
        k.padding[1],
    ];
    for (name, v) in names.iter().zip(values) {
        let p = e.param(v, name);
        writeln!(s, "    let {name} = {p};").unwrap();
    }
    let (init, combine) = if k.max {
        (NEG_INF, "max_nan(acc, v)")
    } else {
        ("0.0", "acc + v")
    };
    writeln!(s, "    var acc = {init};").unwrap();
    writeln!(s, "    let x_nc = x_base + c0 * x_s0 + c1 * x_s1;").unwrap();
    let (kh, kw) = (k.kernel[0] as u64, k.kernel[1] as u64);
    if kh * (1 + kw) <= LOOP_BUDGET {
        e.loop_trips(kh * (1 + kw));
        writeln!(s, "    for (var i = 0u; i < KH; i = i + 1u) {{").unwrap();
        writeln!(s, "        let ih = i32(c2 * SH + i) - i32(PH);").unwrap();
        writeln!(s, "        if (ih < 0i || ih >= i32(H)) {{ continue; }}").unwrap();
        writeln!(s, "        for (var j = 0u; j < KW; j = j + 1u) {{").unwrap();
        writeln!(s, "            let iw = i32(c3 * SW + j) - i32(PW);").unwrap();
        writeln!(
            s,
            "            if (iw < 0i || iw >= i32(W)) {{ continue; }}"
        )
        .unwrap();
        writeln!(
            s,
            "            let v = {x}[x_nc + u32(ih) * x_s2 + u32(iw) * x_s3];"
        )
        .unwrap();
        writeln!(s, "            acc = {combine};").unwrap();
        writeln!(s, "        }}\n    }}").unwrap();
    } else {
        // One loop over the window (row, column), unrolled.
        let total = kh * kw;
        let unroll = unroll_factor(total, 1, 0);
        e.loop_trips(total.div_ceil(u64::from(unroll)));
        let total_p = e.param(total as usize, "loop");
        let body = format!(
            "let ih = i32(c2 * SH + i) - i32(PH);
let iw = i32(c3 * SW + j) - i32(PW);
if (ih >= 0i && ih < i32(H) && iw >= 0i && iw < i32(W)) {{
    let v = {x}[x_nc + u32(ih) * x_s2 + u32(iw) * x_s3];
    acc = {combine};
}}
{}",
            advance_window("")
        );
        writeln!(s, "    var i = 0u;\n    var j = 0u;").unwrap();
        window_loop(&mut s, &total_p, unroll, &body);
    }
    if !k.max {
        // count_include_pad: the divisor is the whole window.
        writeln!(s, "    acc = acc / f32(KH * KW);").unwrap();
    }
    writeln!(
        s,
        "    {o}[o_base + c0 * o_s0 + c1 * o_s1 + c2 * o_s2 + c3 * o_s3] = acc;"
    )
    .unwrap();
    s.push_str("}\n");
    (s, grid(k.out.numel().div_ceil(WORKGROUP as usize)), 0)
}

/// WGSL that advances the window position `(outer, i, j)` by one in row-major order over
/// `KH x KW` (`outer` counts whole windows, e.g. channels; none when empty).
/// The flat loop over a window's `total` steps (`t`), each running `body` (which advances the
/// window's counters with [`advance_window`]), unrolled `unroll` times.
pub(super) fn window_loop(s: &mut String, total: &str, unroll: u32, body: &str) {
    strided_loop(s, "    ", "t", "0u", total, "1u", unroll, &|s, indent| {
        for line in body.lines() {
            writeln!(s, "{indent}{line}").unwrap();
        }
    });
}

pub(super) fn advance_window(outer: &str) -> String {
    let carry = if outer.is_empty() {
        String::new()
    } else {
        format!(" if (i == KH) {{ i = 0u; {outer} = {outer} + 1u; }}")
    };
    format!("j = j + 1u;\nif (j == KW) {{ j = 0u; i = i + 1u;{carry} }}")
}

pub fn emit_gather(e: &mut Emitter, k: &Gather) -> (String, [u32; 3], u32) {
    let mut s = String::new();
    header(&mut s, e, &k.out);
    let t = bind_view(e, &mut s, "t", &k.table);
    let ids = bind_view(e, &mut s, "ids", &k.ids);
    let o = bind_view(e, &mut s, "o", &k.out);
    let rank = k.out.rank();
    let vocab = e.param(k.table.shape[0], "vocab");
    let mut id_addr = "ids_base".to_string();
    let mut o_addr = "o_base".to_string();
    for axis in 0..rank - 1 {
        write!(id_addr, " + c{axis} * ids_s{axis}").unwrap();
    }
    for axis in 0..rank {
        write!(o_addr, " + c{axis} * o_s{axis}").unwrap();
    }
    let d = rank - 1;
    writeln!(
        s,
        "    let id = {};",
        load(&ids, &id_addr, DType::I32, Storage::Word)
    )
    .unwrap();
    writeln!(s, "    var v = {NAN};").unwrap();
    writeln!(s, "    if (id >= 0i && u32(id) < {vocab}) {{ v = {t}[t_base + u32(id) * t_s0 + c{d} * t_s1]; }}").unwrap();
    writeln!(s, "    {o}[{o_addr}] = v;").unwrap();
    s.push_str("}\n");
    (s, grid(k.out.numel().div_ceil(WORKGROUP as usize)), 0)
}
