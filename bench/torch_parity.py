"""PyTorch parity of sinter's reference interpreter: every op (and the gradients autodiff
derives) evaluated by `sinter eval` and by PyTorch in float64 on the same random inputs.

usage: python3 bench/torch_parity.py PATH/TO/sinter [--keep DIR]

Each case is a .sir program and a PyTorch function of the same inputs returning the same
outputs. Outputs are compared relative to max |reference| (sinter writes f32 .npy files, so
the tolerance is 1e-5); i32 outputs must match exactly. Prints one line per case and a final
`N passed, M failed` line; exits 1 if any case failed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
SINTER = sys.argv[1]
TOL = 1e-5
RNG = np.random.default_rng(0)


def f32(*shape, positive=False):
    v = RNG.uniform(0.25, 2.0, size=shape) * (1 if positive else RNG.choice([-1.0, 1.0], size=shape))
    return v.astype("<f4")


def i32(*shape, bound):
    return RNG.integers(0, bound, size=shape).astype("<i4")


def t(a):
    """A float64 (or int64) torch tensor of an input array."""
    x = torch.from_numpy(np.asarray(a))
    return x.double() if x.dtype == torch.float32 else x.long()


def leaf(a):
    return t(a).clone().requires_grad_(True)


CASES = []


def case(name, src, inputs, reference):
    CASES.append((name, src, inputs, reference))


def program(body, decls):
    lines = [f"  input {n}: {ty}" for n, ty in decls]
    return "graph t {\n" + "\n".join(lines) + "\n" + body + "\n}\n"


def ty(a):
    dtype = "f32" if a.dtype == np.float32 else "i32"
    return f"{dtype}[{', '.join(str(d) for d in a.shape)}]"


def simple(name, expr, inputs, reference, outputs=("y",)):
    decls = [(n, ty(a)) for n, a in inputs.items()]
    body = f"  y = {expr}\n  output {', '.join(outputs)}"
    case(name, program(body, decls), inputs, reference)


# ---------------------------------------------------------------- elementwise (and a loss)
_logits, _labels = f32(6, 5), np.array([1, -100, 3, -100, 0, 4], dtype="<i4")
for _red in ("mean", "sum", "none"):
    case(f"cross_entropy ignore_index {_red}",
         program(f'  y = cross_entropy(x, t, reduction="{_red}", ignore_index=-100)\n  output y',
                 [("x", ty(_logits)), ("t", ty(_labels))]),
         {"x": _logits, "t": _labels},
         lambda v, r=_red: {"y": F.cross_entropy(t(v["x"]), t(v["t"]), reduction=r, ignore_index=-100)})
x = f32(3, 7)
xp = f32(3, 7, positive=True)
for op, fn, arg in [
    ("neg", torch.neg, x), ("abs", torch.abs, x), ("exp", torch.exp, x), ("log", torch.log, xp),
    ("sqrt", torch.sqrt, xp), ("rsqrt", torch.rsqrt, xp), ("reciprocal", torch.reciprocal, x),
    ("square", torch.square, x), ("relu", torch.relu, x), ("sigmoid", torch.sigmoid, x),
    ("tanh", torch.tanh, x), ("silu", F.silu, x), ("sin", torch.sin, x), ("cos", torch.cos, x),
    ("gelu", F.gelu, x),
]:
    simple(op, f"{op}(x)", {"x": arg}, lambda v, fn=fn: {"y": fn(t(v["x"]))})
simple("gelu_tanh", 'gelu(x, approximate="tanh")', {"x": x},
       lambda v: {"y": F.gelu(t(v["x"]), approximate="tanh")})

a, b = f32(2, 3, 1), f32(4)
for op, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
               ("maximum", torch.maximum), ("minimum", torch.minimum)]:
    simple(op, f"{op}(a, b)", {"a": a, "b": b}, lambda v, fn=fn: {"y": fn(t(v["a"]), t(v["b"]))})
for op, fn in [("eq", torch.eq), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)]:
    simple(op, f"{op}(a, b)", {"a": a, "b": b},
           lambda v, fn=fn: {"y": fn(t(v["a"]), t(v["b"])).double()})
simple("pow", "pow(a, b)", {"a": f32(2, 3, 1, positive=True), "b": b},
       lambda v: {"y": torch.pow(t(v["a"]), t(v["b"]))})
simple("pow_int_exponent", "pow(a, 3)", {"a": a}, lambda v: {"y": torch.pow(t(v["a"]), 3.0)})
simple("where", "where(gt(a, 0), a, b)", {"a": a, "b": b},
       lambda v: {"y": torch.where(t(v["a"]) > 0, t(v["a"]), t(v["b"]))})
simple("literals", "add(mul(a, 0.5), -1.25)", {"a": a}, lambda v: {"y": t(v["a"]) * 0.5 - 1.25})
simple("cast_to_i32", 'cast(mul(a, 3), dtype="i32")', {"a": a},
       lambda v: {"y": (t(v["a"]) * 3).to(torch.int32)})

# ---------------------------------------------------------------- reductions
r = f32(3, 5, 4)
for op, fn in [("sum", lambda z, d, k: torch.sum(z, d, keepdim=k)),
               ("mean", lambda z, d, k: torch.mean(z, d, keepdim=k)),
               ("max", lambda z, d, k: torch.amax(z, d, keepdim=k)),
               ("min", lambda z, d, k: torch.amin(z, d, keepdim=k)),
               ("logsumexp", lambda z, d, k: torch.logsumexp(z, d, keepdim=k))]:
    simple(f"{op}_axes", f"{op}(x, axes=[-1, 0], keepdim=true)", {"x": r},
           lambda v, fn=fn: {"y": fn(t(v["x"]), (2, 0), True)})
    simple(f"{op}_all", f"{op}(x)", {"x": r}, lambda v, fn=fn: {"y": fn(t(v["x"]), (0, 1, 2), False)})
simple("argmax", "argmax(x, axis=1)", {"x": r},
       lambda v: {"y": torch.argmax(t(v["x"]), 1).to(torch.int32)})

# ---------------------------------------------------------------- shape
simple("reshape", "reshape(x, shape=[-1, 4])", {"x": r}, lambda v: {"y": t(v["x"]).reshape(-1, 4)})
simple("permute", "permute(x, perm=[2, 0, 1])", {"x": r}, lambda v: {"y": t(v["x"]).permute(2, 0, 1)})
simple("transpose", "transpose(x, dim0=0, dim1=-1)", {"x": r}, lambda v: {"y": t(v["x"]).transpose(0, -1)})
simple("broadcast_to", "broadcast_to(b, shape=[3, 4])", {"b": b}, lambda v: {"y": t(v["b"]).expand(3, 4)})
simple("unsqueeze_squeeze", "squeeze(unsqueeze(x, axis=1), axis=1)", {"x": r}, lambda v: {"y": t(v["x"])})
simple("slice_step", "slice(x, axis=1, start=-4, end=5, step=2)", {"x": r},
       lambda v: {"y": t(v["x"])[:, -4:5:2]})
simple("concat", "concat(x, x, axis=-1)", {"x": r}, lambda v: {"y": torch.cat([t(v["x"])] * 2, -1)})

# ---------------------------------------------------------------- matmul
for sa, sb in [((5,), (5,)), ((3, 5), (5,)), ((5,), (5, 4)), ((2, 1, 3, 5), (4, 5, 6))]:
    simple(f"matmul_{len(sa)}d_{len(sb)}d", "matmul(a, b)", {"a": f32(*sa), "b": f32(*sb)},
           lambda v: {"y": torch.matmul(t(v["a"]), t(v["b"]))})

# ---------------------------------------------------------------- nn
n = f32(2, 3, 6)
g6, b6 = f32(6), f32(6)
simple("softmax", "softmax(x, axis=1)", {"x": n}, lambda v: {"y": torch.softmax(t(v["x"]), 1)})
simple("log_softmax", "log_softmax(x)", {"x": n}, lambda v: {"y": torch.log_softmax(t(v["x"]), -1)})
simple("layer_norm", "layer_norm(x, g, b, eps=0.001)", {"x": n, "g": g6, "b": b6},
       lambda v: {"y": F.layer_norm(t(v["x"]), (6,), t(v["g"]), t(v["b"]), eps=1e-3)})
simple("rms_norm", "rms_norm(x, g)", {"x": n, "g": g6},
       lambda v: {"y": F.rms_norm(t(v["x"]), (6,), t(v["g"]), eps=1e-6)})
img = f32(2, 4, 7, 6)
g4, b4 = f32(4), f32(4)
simple("group_norm", "group_norm(x, g, b, groups=2)", {"x": img, "g": g4, "b": b4},
       lambda v: {"y": F.group_norm(t(v["x"]), 2, t(v["g"]), t(v["b"]), eps=1e-5)})
w = f32(6, 2, 3, 2)
bias = f32(6)
simple("conv2d", "conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=2)",
       {"x": img, "w": w, "b": bias},
       lambda v: {"y": F.conv2d(t(v["x"]), t(v["w"]), t(v["b"]), stride=(2, 1), padding=(1, 2),
                                dilation=(1, 2), groups=2)})
simple("max_pool2d", "max_pool2d(x, kernel=[3, 2], stride=[2, 1], padding=[1, 1])", {"x": img},
       lambda v: {"y": F.max_pool2d(t(v["x"]), (3, 2), (2, 1), (1, 1))})
simple("avg_pool2d", "avg_pool2d(x, kernel=[2, 3], padding=[1, 1])", {"x": img},
       lambda v: {"y": F.avg_pool2d(t(v["x"]), (2, 3), (2, 3), (1, 1))})
table = f32(9, 5)
ids = i32(3, 4, bound=9)
simple("embedding", "embedding(table, ids)", {"table": table, "ids": ids},
       lambda v: {"y": F.embedding(t(v["ids"]), t(v["table"]))})
logits = f32(7, 9)
labels = i32(7, bound=9)
for red in ["mean", "sum", "none"]:
    simple(f"cross_entropy_{red}", f'cross_entropy(l, c, reduction="{red}")', {"l": logits, "c": labels},
           lambda v, red=red: {"y": F.cross_entropy(t(v["l"]), t(v["c"]), reduction=red)})
    simple(f"mse_loss_{red}", f'mse_loss(a, b, reduction="{red}")', {"a": x, "b": f32(3, 7)},
           lambda v, red=red: {"y": F.mse_loss(t(v["a"]), t(v["b"]), reduction=red)})

# ---------------------------------------------------------------- attention
q, k, vv = f32(2, 3, 5, 4), f32(2, 3, 6, 4), f32(2, 3, 6, 3)
keep = (RNG.uniform(size=(2, 1, 5, 6)) > 0.3).astype("<f4")
keep[..., 0] = 1.0  # every row keeps a key
add_mask = f32(1, 3, 5, 6)
att = {"q": q, "k": k, "v": vv, "keep": keep, "m": add_mask}


def sdpa(v, mask=None, causal=False, window=0, scale=None):
    s = t(v["q"]) @ t(v["k"]).transpose(-1, -2) * (scale if scale is not None else 4 ** -0.5)
    i = torch.arange(5)[:, None]
    j = torch.arange(6)[None, :]
    allowed = torch.ones(5, 6, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window:
        allowed &= (i - j).abs() < window
    s = s.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        s = s + mask if mask.dtype != torch.bool else s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ t(v["v"])


def att_case(name, extra, ref):
    decls = [(n, ty(a)) for n, a in att.items()]
    case(name, program(f"  y = attention(q, k, v{extra})\n  output y", decls), att, ref)


att_case("attention", "", lambda v: {"y": sdpa(v)})
att_case("attention_torch_sdpa", "", lambda v: {"y": F.scaled_dot_product_attention(t(v["q"]), t(v["k"]), t(v["v"]))})
att_case("attention_causal_sdpa", ", causal=true",
         lambda v: {"y": F.scaled_dot_product_attention(t(v["q"]), t(v["k"]), t(v["v"]), is_causal=True)})
att_case("attention_window", ", window=2", lambda v: {"y": sdpa(v, window=2)})
att_case("attention_causal_window", ", causal=true, window=3", lambda v: {"y": sdpa(v, causal=True, window=3)})
att_case("attention_boolean", ", keep",
         lambda v: {"y": F.scaled_dot_product_attention(t(v["q"]), t(v["k"]), t(v["v"]),
                                                        attn_mask=t(v["keep"]) != 0)})
att_case("attention_additive", ', m, mask_kind="additive", scale=0.3',
         lambda v: {"y": F.scaled_dot_product_attention(t(v["q"]), t(v["k"]), t(v["v"]),
                                                        attn_mask=t(v["m"]), scale=0.3)})


# ---------------------------------------------------------------- gradients (autodiff vs torch.autograd)
def grad_case(name, expr, inputs, fn, wrt):
    """loss = sum(expr * R) with a fixed random R; gradients with respect to `wrt`."""
    probe = fn({n: t(a) for n, a in inputs.items()})
    rr = f32(*probe.shape) if probe.dim() > 0 else np.asarray(f32(1)[0])
    inputs = dict(inputs, r=rr.astype("<f4"))
    decls = [(n, ty(a)) for n, a in inputs.items()]
    names = ", ".join(f"d_{n}" for n in wrt)
    body = (f"  y = {expr}\n  loss = sum(mul(y, r))\n  {names} = grad(loss, {', '.join(wrt)})\n"
            f"  output {names}")

    def reference(v):
        leaves = {n: (leaf(a) if n in wrt else t(a)) for n, a in v.items()}
        loss = (fn(leaves) * leaves["r"]).sum()
        loss.backward()
        return {f"d_{n}": leaves[n].grad for n in wrt}

    case(f"grad_{name}", program(body, decls), inputs, reference)


grad_case("gelu", "gelu(x)", {"x": x}, lambda v: F.gelu(v["x"]), ["x"])
grad_case("pow", "pow(a, b)", {"a": f32(3, 4, positive=True), "b": f32(4)},
          lambda v: torch.pow(v["a"], v["b"]), ["a", "b"])
grad_case("maximum_broadcast", "maximum(a, b)", {"a": f32(3, 4), "b": f32(4)},
          lambda v: torch.maximum(v["a"], v["b"]), ["a", "b"])
grad_case("matmul_batched", "matmul(a, b)", {"a": f32(2, 3, 5), "b": f32(5, 4)},
          lambda v: v["a"] @ v["b"], ["a", "b"])
grad_case("softmax", "softmax(x, axis=0)", {"x": n}, lambda v: torch.softmax(v["x"], 0), ["x"])
grad_case("logsumexp", "logsumexp(x, axes=[1])", {"x": n}, lambda v: torch.logsumexp(v["x"], 1), ["x"])
grad_case("layer_norm", "layer_norm(x, g, b)", {"x": n, "g": g6, "b": b6},
          lambda v: F.layer_norm(v["x"], (6,), v["g"], v["b"]), ["x", "g", "b"])
grad_case("rms_norm", "rms_norm(x, g)", {"x": n, "g": g6},
          lambda v: F.rms_norm(v["x"], (6,), v["g"], eps=1e-6), ["x", "g"])
grad_case("group_norm", "group_norm(x, g, b, groups=2)", {"x": img, "g": g4, "b": b4},
          lambda v: F.group_norm(v["x"], 2, v["g"], v["b"]), ["x", "g", "b"])
grad_case("conv2d", "conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=2)",
          {"x": img, "w": w, "b": bias},
          lambda v: F.conv2d(v["x"], v["w"], v["b"], stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
          ["x", "w", "b"])
grad_case("max_pool2d", "max_pool2d(x, kernel=[3, 2], stride=[2, 1], padding=[1, 1])", {"x": img},
          lambda v: F.max_pool2d(v["x"], (3, 2), (2, 1), (1, 1)), ["x"])
grad_case("avg_pool2d", "avg_pool2d(x, kernel=[2, 3], padding=[1, 1])", {"x": img},
          lambda v: F.avg_pool2d(v["x"], (2, 3), (2, 3), (1, 1)), ["x"])
grad_case("embedding", "embedding(table, ids)", {"table": table, "ids": i32(4, 5, bound=3)},
          lambda v: F.embedding(v["ids"], v["table"]), ["table"])
grad_case("cross_entropy", "cross_entropy(l, c)", {"l": logits, "c": labels},
          lambda v: F.cross_entropy(v["l"], v["c"]), ["l"])
grad_case("attention_causal", "attention(q, k, v, causal=true)", {"q": q, "k": f32(2, 3, 5, 4), "v": f32(2, 3, 5, 3)},
          lambda v: F.scaled_dot_product_attention(v["q"], v["k"], v["v"], is_causal=True), ["q", "k", "v"])
grad_case("slice_concat", "concat(slice(x, axis=1, start=0, end=5, step=2), x, axis=1)", {"x": r},
          lambda v: torch.cat([v["x"][:, 0:5:2], v["x"]], 1), ["x"])


# ---------------------------------------------------------------- run
def run(name, src, inputs, reference, work):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "p.sir")
    with open(path, "w") as f:
        f.write(src)
    args = [SINTER, "eval", path, "--out", os.path.join(d, "out")]
    for n, a in inputs.items():
        np.save(os.path.join(d, n + ".npy"), a)
        args += ["--input", f"{n}={os.path.join(d, n + '.npy')}"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return f"sinter eval failed ({p.returncode}): {p.stderr.strip()[:400]}"
    want = reference(inputs)
    worst = 0.0
    for out, ref in want.items():
        got = np.load(os.path.join(d, "out", out + ".npy"))
        ref = ref.detach().numpy()
        if got.shape != ref.shape:
            return f"`{out}` has shape {got.shape}, torch {ref.shape}"
        if got.dtype.kind == "i":
            if not np.array_equal(got, ref):
                return f"`{out}` differs (integers)"
            continue
        finite = np.isfinite(ref)
        if not np.array_equal(finite, np.isfinite(got)):
            return f"`{out}` non-finite values differ"
        scale = max(1.0, float(np.abs(ref[finite]).max(initial=0.0)))
        err = float(np.abs(got[finite] - ref[finite]).max(initial=0.0)) / scale
        worst = max(worst, err)
        if err > TOL:
            return f"`{out}` differs by {err:.2e} of max |ref|"
    return worst


def main():
    work = tempfile.mkdtemp(prefix="parity-")
    passed = failed = 0
    for name, src, inputs, reference in CASES:
        try:
            result = run(name, src, inputs, reference, work)
        except Exception as e:  # a broken case is a failure, not a crash
            result = f"error: {e!r}"
        if isinstance(result, float):
            passed += 1
            print(f"ok    {name:28} max err {result:.1e}")
        else:
            failed += 1
            print(f"FAIL  {name:28} {result}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


main()
