//! Kernels for the backward primitives autodiff emits. All are gathers — each output element
//! (or segment of threads) sums what flows into it — because WGSL has no float atomics.

use sinter_ir::artifact::Storage;
use std::fmt::Write;

use super::conv::{advance_window, bind_view, header, window_loop};
use super::{
    ENTRY_ARGS, Emitter, LOOP_BUDGET, NEG_INF, WORKGROUP, decompose, grid, load, strided_loop,
    unroll_factor,
};
use crate::kernel::{Conv2dGrad, Pool2dGrad, ScatterAdd, SliceGrad};
use crate::layout::View;
use sinter_ir::DType;
use sinter_ir::artifact::WORD_BYTES;

fn constants(s: &mut String, e: &mut Emitter, names: &[&str], values: &[usize]) {
    for (name, &v) in names.iter().zip(values) {
        let p = e.param(v, name);
        writeln!(s, "    let {name} = {p};").unwrap();
    }
}

/// `dx[n, c, h, w] = sum over o in c's group, i, j of dy[n, o, oh, ow] * w[o, c % C_G, i, j]`
/// where `oh * SH = h + PH - i * DH` (and likewise for `ow`).
pub fn emit_conv_grad_input(e: &mut Emitter, k: &Conv2dGrad) -> (String, [u32; 3], u32) {
    let mut s = String::new();
    header(&mut s, e, &k.out);
    let dy = bind_view(e, &mut s, "dy", &k.a);
    let w = bind_view(e, &mut s, "w", &k.b);
    let o = bind_view(e, &mut s, "o", &k.out);
    let (c, oc) = (k.out.shape[1], k.a.shape[1]);
    for d in 0..2 {
        let padded = k.out.shape[2 + d] as u64 + 2 * k.padding[d] as u64;
        e.signed_extent("conv2d_grad_input", "the padded input extent", padded);
    }
    let names = [
        "C_G", "O_G", "OH", "OW", "KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW",
    ];
    let values = [
        c / k.groups,
        oc / k.groups,
        k.a.shape[2],
        k.a.shape[3],
        k.b.shape[2],
        k.b.shape[3],
        k.stride[0],
        k.stride[1],
        k.padding[0],
        k.padding[1],
        k.dilation[0],
        k.dilation[1],
    ];
    constants(&mut s, e, &names, &values);
    s.push_str("    let g = c1 / C_G;\n    let ci = c1 % C_G;\n    var acc = 0.0;\n");
    let (o_g, kh, kw) = (
        (oc / k.groups) as u64,
        k.b.shape[2] as u64,
        k.b.shape[3] as u64,
    );
    let product = format!(
        "acc = fma({dy}[dy_base + c0 * dy_s0 + oc * dy_s1 + oh * dy_s2 + ow * dy_s3], {w}[w_base + oc * w_s0 + ci * w_s1 + i * w_s2 + j * w_s3], acc);"
    );
    let nested = o_g * (1 + kh * (1 + kw));
    if nested <= LOOP_BUDGET {
        e.loop_trips(nested);
        s.push_str(
            "    for (var oo = 0u; oo < O_G; oo = oo + 1u) {
        let oc = g * O_G + oo;
        for (var i = 0u; i < KH; i = i + 1u) {
            let th = i32(c2 + PH) - i32(i * DH);
            if (th < 0i || u32(th) % SH != 0u) { continue; }
            let oh = u32(th) / SH;
            if (oh >= OH) { continue; }
            for (var j = 0u; j < KW; j = j + 1u) {
                let tw = i32(c3 + PW) - i32(j * DW);
                if (tw < 0i || u32(tw) % SW != 0u) { continue; }
                let ow = u32(tw) / SW;
                if (ow >= OW) { continue; }
",
        );
        writeln!(s, "                {product}").unwrap();
        s.push_str("            }\n        }\n    }\n");
    } else {
        // One loop over (output channel, kernel row, kernel column), unrolled.
        let total = o_g * kh * kw;
        let unroll = unroll_factor(total, 1, 0);
        e.loop_trips(total.div_ceil(u64::from(unroll)));
        let total_p = e.param(total as usize, "loop");
        let body = format!(
            "let oc = g * O_G + oo;
let th = i32(c2 + PH) - i32(i * DH);
let tw = i32(c3 + PW) - i32(j * DW);
if (th >= 0i && u32(th) % SH == 0u && tw >= 0i && u32(tw) % SW == 0u) {{
    let oh = u32(th) / SH;
    let ow = u32(tw) / SW;
    if (oh < OH && ow < OW) {{
        {product}
    }}
}}
{}",
            advance_window("oo")
        );
        s.push_str("    var oo = 0u;\n    var i = 0u;\n    var j = 0u;\n");
        window_loop(&mut s, &total_p, unroll, &body);
    }
    writeln!(
        s,
        "    {o}[o_base + c0 * o_s0 + c1 * o_s1 + c2 * o_s2 + c3 * o_s3] = acc;\n}}"
    )
    .unwrap();
    (s, grid(k.out.numel().div_ceil(WORKGROUP as usize)), 0)
}

/// The start of a segment kernel, one output element of `out` per segment of `SEG` threads
/// that share its `len` terms: `SEG`, the `red` buffer, the entry point, `lane`, `row`, `live`,
/// `len` and the element's coordinates `k0, k1, ..`. Returns `(SEG, segments per workgroup)`.
fn segment_prologue(e: &mut Emitter, s: &mut String, out: &View, len: usize) -> (u32, u32) {
    let seg = (len.next_power_of_two() as u32).clamp(1, WORKGROUP);
    let per_group = WORKGROUP / seg;
    writeln!(s, "const SEG: u32 = {seg}u;").unwrap();
    writeln!(s, "var<workgroup> red: array<f32, {WORKGROUP}>;").unwrap();
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    writeln!(s, "    let lane = lid % SEG;").unwrap();
    writeln!(
        s,
        "    let row = (wid.x + wid.y * nwg.x) * {per_group}u + lid / SEG;"
    )
    .unwrap();
    let (rows_p, len_p) = (e.param(out.numel(), "rows"), e.param(len, "row_len"));
    writeln!(
        s,
        "    let live = row < {rows_p};\n    let len = select(0u, {len_p}, live);"
    )
    .unwrap();
    let out_dims = e.params(&out.shape, "out.shape");
    decompose(s, "    ", "select(0u, row, live)", "k", &out_dims);
    (seg, per_group)
}

/// `dw[o, ci, i, j] = sum over n, oh, ow of x[n, g * C_G + ci, ih, iw] * dy[n, o, oh, ow]`:
/// a segment of threads reduces each weight element's `N * OH * OW` terms.
pub fn emit_conv_grad_weight(e: &mut Emitter, k: &Conv2dGrad) -> (String, [u32; 3], u32) {
    let rows = k.out.numel();
    let (n, oh, ow) = (k.b.shape[0], k.b.shape[2], k.b.shape[3]);
    let len = n * oh * ow;
    let mut s = String::new();
    let (seg, per_group) = segment_prologue(e, &mut s, &k.out, len);
    let x = bind_view(e, &mut s, "x", &k.a);
    let dy = bind_view(e, &mut s, "dy", &k.b);
    let o = bind_view(e, &mut s, "o", &k.out);
    for d in 0..2 {
        let padded = k.a.shape[2 + d] as u64 + 2 * k.padding[d] as u64;
        e.signed_extent("conv2d_grad_weight", "the padded input extent", padded);
    }
    let names = ["C_G", "O_G", "H", "W", "SH", "SW", "PH", "PW", "DH", "DW"];
    let values = [
        k.out.shape[1],
        k.out.shape[0] / k.groups,
        k.a.shape[2],
        k.a.shape[3],
        k.stride[0],
        k.stride[1],
        k.padding[0],
        k.padding[1],
        k.dilation[0],
        k.dilation[1],
    ];
    constants(&mut s, e, &names, &values);
    writeln!(s, "    let c = (k0 / O_G) * C_G + k1;").unwrap();
    writeln!(s, "    var acc = 0.0;").unwrap();
    let red_dims = e.params(&[n, oh, ow], "reduced");
    let per_thread = (len as u64).div_ceil(u64::from(seg));
    let combine = u64::from(seg.trailing_zeros());
    let unroll = unroll_factor(per_thread, 1, combine);
    e.loop_trips(per_thread.div_ceil(u64::from(unroll)) + combine);
    let body = format!(
        "let ih = i32(r1 * SH + k2 * DH) - i32(PH);
let iw = i32(r2 * SW + k3 * DW) - i32(PW);
if (ih >= 0i && ih < i32(H) && iw >= 0i && iw < i32(W)) {{
    acc = fma({x}[x_base + r0 * x_s0 + c * x_s1 + u32(ih) * x_s2 + u32(iw) * x_s3], {dy}[dy_base + r0 * dy_s0 + k0 * dy_s1 + r1 * dy_s2 + r2 * dy_s3], acc);
}}"
    );
    strided_loop(
        &mut s,
        "    ",
        "j",
        "lane",
        "len",
        "SEG",
        unroll,
        &|s, indent| {
            decompose(s, indent, "j", "r", &red_dims);
            for line in body.lines() {
                writeln!(s, "{indent}{line}").unwrap();
            }
        },
    );
    combine_segment(&mut s, "acc", "total", "a + b");
    writeln!(
        s,
        "    if (live && lane == 0u) {{ {o}[o_base + k0 * o_s0 + k1 * o_s1 + k2 * o_s2 + k3 * o_s3] = total; }}\n}}"
    )
    .unwrap();
    (
        s,
        grid(rows.div_ceil(per_group as usize)),
        WORKGROUP * WORD_BYTES as u32,
    )
}

/// Each input position sums the gradient of every window that covers it: for max pooling,
/// only windows whose first maximum is this position.
pub fn emit_pool_grad(e: &mut Emitter, k: &Pool2dGrad) -> (String, [u32; 3], u32) {
    let mut s = String::new();
    header(&mut s, e, &k.out);
    let dy = bind_view(e, &mut s, "dy", &k.dy);
    let x = k.x.as_ref().map(|x| bind_view(e, &mut s, "x", x));
    let o = bind_view(e, &mut s, "o", &k.out);
    for d in 0..2 {
        let padded = k.out.shape[2 + d] as u64 + 2 * k.padding[d] as u64;
        e.signed_extent("pooling gradient", "the padded input extent", padded);
    }
    let names = ["H", "W", "OH", "OW", "KH", "KW", "SH", "SW", "PH", "PW"];
    let values = [
        k.out.shape[2],
        k.out.shape[3],
        k.dy.shape[2],
        k.dy.shape[3],
        k.kernel[0],
        k.kernel[1],
        k.stride[0],
        k.stride[1],
        k.padding[0],
        k.padding[1],
    ];
    constants(&mut s, e, &names, &values);
    // Windows covering one position, per axis: at most ceil(K / S) (and the output extent).
    let covering = |d: usize| (k.kernel[d].div_ceil(k.stride[d]).min(k.dy.shape[2 + d])) as u64;
    let (wh, ww) = (covering(0), covering(1));
    let window = if k.x.is_some() {
        (k.kernel[0] as u64) * (1 + k.kernel[1] as u64)
    } else {
        0
    };
    e.loop_trips(wh * (1 + ww * (1 + window)));
    s.push_str(
        "    let hp = c2 + PH;
    let wp = c3 + PW;
    // Windows oh with oh * SH <= hp < oh * SH + KH.
    let oh_lo = select(0u, (hp - KH) / SH + 1u, hp >= KH);
    let oh_hi = min(hp / SH, OH - 1u);
    let ow_lo = select(0u, (wp - KW) / SW + 1u, wp >= KW);
    let ow_hi = min(wp / SW, OW - 1u);
    var acc = 0.0;
    for (var oh = oh_lo; oh <= oh_hi; oh = oh + 1u) {
        for (var ow = ow_lo; ow <= ow_hi; ow = ow + 1u) {
",
    );
    let g = format!("{dy}[dy_base + c0 * dy_s0 + c1 * dy_s1 + oh * dy_s2 + ow * dy_s3]");
    match x {
        Some(x) => {
            writeln!(s, "            var best = {NEG_INF};\n            var bh = 0u;\n            var bw = 0u;\n            var found = false;").unwrap();
            s.push_str(
                "            for (var i = 0u; i < KH; i = i + 1u) {
                let ih = i32(oh * SH + i) - i32(PH);
                if (ih < 0i || ih >= i32(H)) { continue; }
                for (var j = 0u; j < KW; j = j + 1u) {
                    let iw = i32(ow * SW + j) - i32(PW);
                    if (iw < 0i || iw >= i32(W)) { continue; }
",
            );
            writeln!(s, "                    let v = {x}[x_base + c0 * x_s0 + c1 * x_s1 + u32(ih) * x_s2 + u32(iw) * x_s3];").unwrap();
            s.push_str(
                "                    if (!found || (!is_nan_f32(best) && (v > best || is_nan_f32(v)))) { best = v; bh = u32(ih); bw = u32(iw); found = true; }
                }
            }
",
            );
            writeln!(
                s,
                "            if (found && bh == c2 && bw == c3) {{ acc = acc + {g}; }}"
            )
            .unwrap();
        }
        None => writeln!(s, "            acc = acc + {g};").unwrap(),
    }
    s.push_str("        }\n    }\n");
    if k.x.is_none() {
        writeln!(s, "    acc = acc / f32(KH * KW);").unwrap();
    }
    writeln!(
        s,
        "    {o}[o_base + c0 * o_s0 + c1 * o_s1 + c2 * o_s2 + c3 * o_s3] = acc;\n}}"
    )
    .unwrap();
    (s, grid(k.out.numel().div_ceil(WORKGROUP as usize)), 0)
}

/// `out[v, d]` sums `dy[p, d]` over every position `p` whose id is `v`. Without float atomics
/// this is a gather: [`emit_scatter_add_lists`] where its loops fit the loop budget, else
/// [`emit_scatter_add_scan`].
pub fn emit_scatter_add(e: &mut Emitter, k: &ScatterAdd) -> (String, [u32; 3], u32) {
    let chunks = k.ids.numel().div_ceil(WORKGROUP as usize) as u64;
    if chunks * list_trips_per_chunk() <= LOOP_BUDGET {
        emit_scatter_add_lists(e, k)
    } else {
        emit_scatter_add_scan(e, k)
    }
}

/// The addresses of a scatter-add's id at position `q0, q1, ..` and of its `dy` element in
/// column `col` (bound by [`bind_view`] as `ids` and `dy`).
fn scatter_addresses(k: &ScatterAdd, col: &str) -> (String, String) {
    let r = k.ids.rank();
    let mut id_addr = "ids_base".to_string();
    let mut dy_addr = "dy_base".to_string();
    for axis in 0..r {
        write!(id_addr, " + q{axis} * ids_s{axis}").unwrap();
        write!(dy_addr, " + q{axis} * dy_s{axis}").unwrap();
    }
    write!(dy_addr, " + {col} * dy_s{r}").unwrap();
    (id_addr, dy_addr)
}

/// Loop iterations of one chunk of [`emit_scatter_add_lists`] at worst: the scan's rounds and
/// a list as long as the chunk.
fn list_trips_per_chunk() -> u64 {
    u64::from(WORKGROUP.trailing_zeros()) + u64::from(WORKGROUP) + 1
}

/// One workgroup per output row `v` and block of 256 columns. It walks the positions in chunks
/// of 256: each thread tests one position's id, a prefix sum in workgroup memory lists the
/// chunk's matching positions in order, and each thread adds the listed `dy` rows in its column.
/// The ids are read once per row (not once per element), the rows of `dy` only where they
/// match, and every sum runs in position order, so results are deterministic.
fn emit_scatter_add_lists(e: &mut Emitter, k: &ScatterAdd) -> (String, [u32; 3], u32) {
    let (rows, width) = (k.out.shape[0], k.out.shape[1]);
    let len = k.ids.numel();
    let col_blocks = width.div_ceil(WORKGROUP as usize);
    let mut s = String::new();
    writeln!(s, "var<workgroup> hits: array<u32, {WORKGROUP}>;").unwrap();
    writeln!(s, "var<workgroup> list: array<u32, {WORKGROUP}>;").unwrap();
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    let (rows_p, width_p, blocks_p, len_p) = (
        e.param(rows, "rows"),
        e.param(width, "width"),
        e.param(col_blocks, "col_blocks"),
        e.param(len, "len"),
    );
    writeln!(s, "    let g = wid.x + wid.y * nwg.x;").unwrap();
    writeln!(s, "    let v = g / {blocks_p};").unwrap();
    // uniform: the whole workgroup leaves
    writeln!(s, "    if (v >= {rows_p}) {{ return; }}").unwrap();
    writeln!(
        s,
        "    let col = (g % {blocks_p}) * {WORKGROUP}u + lid;
    let live = col < {width_p};
    let colc = min(col, {width_p} - 1u);
    let len = {len_p};"
    )
    .unwrap();
    let dy = bind_view(e, &mut s, "dy", &k.dy);
    let ids = bind_view(e, &mut s, "ids", &k.ids);
    let o = bind_view(e, &mut s, "o", &k.out);
    let id_dims = e.params(&k.ids.shape, "ids.shape");
    let (id_addr, dy_addr) = scatter_addresses(k, "colc");
    writeln!(s, "    var acc = 0.0;").unwrap();
    writeln!(
        s,
        "    for (var c = 0u; c < (len + {WORKGROUP}u - 1u) / {WORKGROUP}u; c = c + 1u) {{"
    )
    .unwrap();
    writeln!(
        s,
        "        let pos = c * {WORKGROUP}u + lid;
        let posc = min(pos, len - 1u);"
    )
    .unwrap();
    decompose(&mut s, "        ", "posc", "q", &id_dims);
    writeln!(
        s,
        "        let hit = pos < len && {} == i32(v);",
        load(&ids, &id_addr, DType::I32, Storage::Word)
    )
    .unwrap();
    writeln!(s, "        hits[lid] = select(0u, 1u, hit);").unwrap();
    writeln!(s, "        workgroupBarrier();").unwrap();
    // inclusive prefix sum of the hits (Hillis and Steele)
    writeln!(
        s,
        "        for (var w = 1u; w < {WORKGROUP}u; w = w << 1u) {{
            var t = hits[lid];
            if (lid >= w) {{ t = t + hits[lid - w]; }}
            workgroupBarrier();
            hits[lid] = t;
            workgroupBarrier();
        }}"
    )
    .unwrap();
    writeln!(
        s,
        "        if (hit) {{ list[hits[lid] - 1u] = posc; }}
        let count = hits[{}u];
        workgroupBarrier();",
        WORKGROUP - 1
    )
    .unwrap();
    writeln!(s, "        for (var j = 0u; j < count; j = j + 1u) {{").unwrap();
    decompose(&mut s, "            ", "list[j]", "q", &id_dims);
    writeln!(
        s,
        "            acc = acc + {dy}[{dy_addr}];
        }}"
    )
    .unwrap();
    // the next chunk overwrites the hits and the list
    writeln!(
        s,
        "        workgroupBarrier();
    }}"
    )
    .unwrap();
    writeln!(
        s,
        "    if (live) {{ {o}[o_base + v * o_s0 + col * o_s1] = acc; }}
}}"
    )
    .unwrap();
    e.loop_trips(len.div_ceil(WORKGROUP as usize) as u64 * list_trips_per_chunk());
    (
        s,
        grid(rows * col_blocks),
        2 * WORKGROUP * WORD_BYTES as u32,
    )
}

/// The scan form: each output element scans all ids, which a segment of threads shares (as a
/// row kernel does) so that no thread's loop grows with the number of positions beyond
/// `positions / 256`.
fn emit_scatter_add_scan(e: &mut Emitter, k: &ScatterAdd) -> (String, [u32; 3], u32) {
    let rows = k.out.numel();
    let len = k.ids.numel();
    let mut s = String::new();
    let (seg, per_group) = segment_prologue(e, &mut s, &k.out, len);
    let dy = bind_view(e, &mut s, "dy", &k.dy);
    let ids = bind_view(e, &mut s, "ids", &k.ids);
    let o = bind_view(e, &mut s, "o", &k.out);
    let id_dims = e.params(&k.ids.shape, "ids.shape");
    let (id_addr, dy_addr) = scatter_addresses(k, "k1");
    let body = format!(
        "if ({} == i32(k0)) {{ acc = acc + {dy}[{dy_addr}]; }}",
        load(&ids, &id_addr, DType::I32, Storage::Word)
    );
    let per_thread = (len as u64).div_ceil(u64::from(seg));
    let combine = u64::from(seg.trailing_zeros());
    let unroll = unroll_factor(per_thread, 1, combine);
    e.loop_trips(per_thread.div_ceil(u64::from(unroll)) + combine);
    writeln!(s, "    var acc = 0.0;").unwrap();
    strided_loop(
        &mut s,
        "    ",
        "pos",
        "lane",
        "len",
        "SEG",
        unroll,
        &|s, indent| {
            decompose(s, indent, "pos", "q", &id_dims);
            writeln!(s, "{indent}{body}").unwrap();
        },
    );
    combine_segment(&mut s, "acc", "total", "a + b");
    writeln!(
        s,
        "    if (live && lane == 0u) {{ {o}[o_base + k0 * o_s0 + k1 * o_s1] = total; }}\n}}"
    )
    .unwrap();
    (
        s,
        grid(rows.div_ceil(per_group as usize)),
        WORKGROUP * WORD_BYTES as u32,
    )
}

/// Zeros except where the forward slice read, which take `dy`.
pub fn emit_slice_grad(e: &mut Emitter, k: &SliceGrad) -> (String, [u32; 3], u32) {
    let mut s = String::new();
    header(&mut s, e, &k.out);
    let dy = bind_view(e, &mut s, "dy", &k.dy);
    let o = bind_view(e, &mut s, "o", &k.out);
    let (start, step, len) = (
        e.param(k.start, "start"),
        e.param(k.step, "step"),
        e.param(k.dy.shape[k.axis], "dy.len"),
    );
    let a = k.axis;
    let mut dy_addr = "dy_base".to_string();
    let mut o_addr = "o_base".to_string();
    for axis in 0..k.out.rank() {
        let coord = if axis == a {
            "q".to_string()
        } else {
            format!("c{axis}")
        };
        write!(dy_addr, " + {coord} * dy_s{axis}").unwrap();
        write!(o_addr, " + c{axis} * o_s{axis}").unwrap();
    }
    writeln!(s, "    var v = 0.0;").unwrap();
    writeln!(
        s,
        "    if (c{a} >= {start} && (c{a} - {start}) % {step} == 0u) {{"
    )
    .unwrap();
    writeln!(s, "        let q = (c{a} - {start}) / {step};").unwrap();
    writeln!(s, "        if (q < {len}) {{ v = {dy}[{dy_addr}]; }}").unwrap();
    writeln!(s, "    }}").unwrap();
    writeln!(s, "    {o}[{o_addr}] = v;\n}}").unwrap();
    (s, grid(k.out.numel().div_ceil(WORKGROUP as usize)), 0)
}

/// Sums every thread's `partial` over its segment through `red` (segments of `SEG` consecutive
/// threads) and binds the segment's total to `name` in every thread of the segment.
fn combine_segment(s: &mut String, partial: &str, name: &str, combine: &str) {
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
}
