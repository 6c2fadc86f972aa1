//! The prefix sum (`cumsum`): one invocation per line along the scanned axis, adding the
//! line's elements in scan order as the interpreter does.
//!
//! An invocation loops over the whole line, so the line's extent is bounded by the loop budget
//! ([`LOOP_BUDGET`], unrolled up to 16 times); a longer line is refused at compile time rather
//! than cut short on Mesa's lavapipe.

use std::fmt::Write;

use super::conv::bind_view;
use super::{
    ENTRY_ARGS, Emitter, LOOP_BUDGET, WORKGROUP, decompose, grid, strided_loop, thread_index,
    unroll_factor,
};
use crate::kernel::Scan;

/// `out[.., i, ..] = x[.., 0, ..] + .. + x[.., i, ..]` along `k.axis` (the elements before `i`
/// with `exclusive`, `0` for the first; from the end with `reverse`).
pub fn emit(e: &mut Emitter, k: &Scan) -> (String, [u32; 3], u32) {
    let a = k.axis;
    let len = k.out.shape[a];
    let lines = k.out.numel() / len.max(1);
    let unroll = unroll_factor(len as u64, 1, 0);
    let trips = (len as u64).div_ceil(u64::from(unroll));
    if trips > LOOP_BUDGET {
        e.refuse(
            "cumsum",
            format!(
                "its axis has extent {len}, past the {} elements one invocation scans within \
                 the loop budget of {LOOP_BUDGET} iterations",
                LOOP_BUDGET * 16
            ),
        );
    }
    e.loop_trips(trips);
    let mut s = String::new();
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    thread_index(&mut s);
    let n = e.param(lines, "lines");
    writeln!(s, "    if (gi >= {n}) {{ return; }}").unwrap();
    // the lines' space: the output's shape with the scanned axis of extent 1
    let mut line_shape = k.out.shape.clone();
    line_shape[a] = 1;
    let dims = e.params(&line_shape, "lines.shape");
    decompose(&mut s, "    ", "gi", "c", &dims);
    let x = bind_view(e, &mut s, "x", &k.x);
    let o = bind_view(e, &mut s, "o", &k.out);
    let len = e.param(len, "len");
    let mut x_line = "x_base".to_string();
    let mut o_line = "o_base".to_string();
    for axis in (0..k.out.rank()).filter(|&axis| axis != a) {
        write!(x_line, " + c{axis} * x_s{axis}").unwrap();
        write!(o_line, " + c{axis} * o_s{axis}").unwrap();
    }
    writeln!(s, "    let x_line = {x_line};").unwrap();
    writeln!(s, "    let o_line = {o_line};").unwrap();
    writeln!(s, "    var acc = 0.0;").unwrap();
    let (exclusive, reverse) = (k.exclusive, k.reverse);
    strided_loop(&mut s, "    ", "t", "0u", &len, "1u", unroll, &|s, ind| {
        let i = if reverse {
            format!("{len} - 1u - t")
        } else {
            "t".to_string()
        };
        writeln!(s, "{ind}let i = {i};").unwrap();
        writeln!(s, "{ind}let v = {x}[x_line + i * x_s{a}];").unwrap();
        if exclusive {
            writeln!(s, "{ind}{o}[o_line + i * o_s{a}] = acc;").unwrap();
        }
        // the first sum is the element itself (so `-0` stays `-0`)
        writeln!(s, "{ind}acc = select(acc + v, v, t == 0u);").unwrap();
        if !exclusive {
            writeln!(s, "{ind}{o}[o_line + i * o_s{a}] = acc;").unwrap();
        }
    });
    s.push_str("}\n");
    (s, grid(lines.div_ceil(WORKGROUP as usize)), 0)
}
