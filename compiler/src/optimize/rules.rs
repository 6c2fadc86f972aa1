//! Algebra and layout rules. Each rule is one line: its name, its identity, and — for rules
//! over ops with attributes, which egg's patterns cannot spell — a Rust function that builds
//! the right side. Every rule is checked by `tests/rules.rs`: both sides compute the same values
//! in the reference interpreter.
//!
//! Identities hold in IEEE arithmetic up to rounding; where one does not hold exactly for every
//! input, its comment says so.

use egg::{
    Applier, ConditionalApplier, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst,
    Symbol, Var, rewrite,
};
use sinter_ir::{Attrs, DType, Op, key};

use super::analysis::{Graph, Types};
use super::lang::{ENode, Kind};

type Rule = Rewrite<ENode, Types>;

fn var(s: &str) -> Var {
    s.parse().expect("a variable")
}

/// The class of `?a` has the type of the matched class (the rewrite keeps shapes).
fn same_type(a: &'static str) -> impl Fn(&mut Graph, Id, &Subst) -> bool {
    let a = var(a);
    move |g, id, s| g[s[a]].data.ty == g[id].data.ty
}

/// `?c` is a scalar constant.
fn scalar_constant(c: &'static str) -> impl Fn(&mut Graph, Id, &Subst) -> bool {
    let c = var(c);
    move |g, _, s| g[s[c]].data.constant.is_some()
}

/// `?a` and `?b` are scalar constants.
fn both_constant(a: &'static str, b: &'static str) -> impl Fn(&mut Graph, Id, &Subst) -> bool {
    let (a, b) = (var(a), var(b));
    move |g, _, s| g[s[a]].data.constant.is_some() && g[s[b]].data.constant.is_some()
}

/// A rule whose right side is computed: for every node of `op`, `build` returns the class the
/// node's class equals, adding what it needs.
struct Computed {
    op: Op,
    build: fn(&mut Graph, &ENode) -> Option<Id>,
}

impl Searcher<ENode, Types> for Computed {
    fn search_eclass_with_limit(
        &self,
        g: &Graph,
        eclass: Id,
        _: usize,
    ) -> Option<SearchMatches<'_, ENode>> {
        g[eclass]
            .nodes
            .iter()
            .any(|n| n.ir().is_some_and(|(o, _)| o == self.op))
            .then(|| SearchMatches {
                eclass,
                substs: vec![Subst::default()],
                ast: None,
            })
    }

    fn search_with_limit(&self, g: &Graph, limit: usize) -> Vec<SearchMatches<'_, ENode>> {
        let Some(classes) = g.classes_for_op(&Kind::Op(self.op)) else {
            return Vec::new();
        };
        classes
            .filter_map(|c| self.search_eclass_with_limit(g, c, limit))
            .take(limit)
            .collect()
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

impl Applier<ENode, Types> for Computed {
    fn apply_one(
        &self,
        g: &mut Graph,
        eclass: Id,
        _: &Subst,
        _: Option<&PatternAst<ENode>>,
        _: Symbol,
    ) -> Vec<Id> {
        let nodes: Vec<ENode> = g[eclass]
            .nodes
            .iter()
            .filter(|n| n.ir().is_some_and(|(o, _)| o == self.op))
            .cloned()
            .collect();
        let mut changed = Vec::new();
        for node in nodes {
            if let Some(rhs) = (self.build)(g, &node)
                && g.union(rhs, eclass)
            {
                changed.push(rhs);
            }
        }
        changed
    }
}

pub(super) fn computed(name: &str, op: Op, build: fn(&mut Graph, &ENode) -> Option<Id>) -> Rule {
    Rewrite::new(name, Computed { op, build }, Computed { op, build }).expect("a valid rule")
}

/// The only node of `op` in class `c`, with its attributes.
fn node_of(g: &Graph, c: Id, op: Op) -> Option<ENode> {
    g[c].nodes
        .iter()
        .find(|n| n.ir().is_some_and(|(o, _)| o == op))
        .cloned()
}

fn add_op(g: &mut Graph, op: Op, attrs: Attrs, kids: Vec<Id>) -> Id {
    g.add(ENode::op(op, attrs, kids))
}

/// Algebraic identities and constant folding.
#[rustfmt::skip]
pub fn algebra() -> Vec<Rule> {
    vec![
        // x · 1 = x
        rewrite!("mul-one";        "(mul ?x 1)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("?x") } }),
        // 1 · x = x
        rewrite!("one-mul";        "(mul 1 ?x)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("?x") } }),
        // x / 1 = x
        rewrite!("div-one";        "(div ?x 1)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("?x") } }),
        // x + 0 = x (−0 + 0 is +0: the sign of a zero sum may change)
        rewrite!("add-zero";       "(add ?x 0)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("?x") } }),
        // 0 + x = x (as above)
        rewrite!("zero-add";       "(add 0 ?x)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("?x") } }),
        // x − 0 = x
        rewrite!("sub-zero";       "(sub ?x 0)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("?x") } }),
        // −(−x) = x
        rewrite!("neg-neg";        "(neg (neg ?x))" => "?x"),
        // a − (−b) = a + b
        rewrite!("sub-neg";        "(sub ?a (neg ?b))" => "(add ?a ?b)"),
        // a + (−b) = a − b
        rewrite!("add-neg";        "(add ?a (neg ?b))" => "(sub ?a ?b)"),
        // x · −1 = −x
        rewrite!("mul-minus-one";  "(mul ?x -1)" => { ConditionalApplier { condition: same_type("?x"), applier: pat("(neg ?x)") } }),
        // a · (1/b) = a / b (rounding: one rounding instead of two)
        rewrite!("mul-reciprocal"; "(mul ?a (reciprocal ?b))" => "(div ?a ?b)"),
        // (x · c1) · c2 = x · (c1 · c2), for scalar literals c1, c2 (rounding: the constants multiply first)
        rewrite!("mul-mul-const";  "(mul (mul ?x ?c1) ?c2)" => { ConditionalApplier { condition: both_constant("?c1", "?c2"), applier: pat("(mul ?x (mul ?c1 ?c2))") } }),
        // (a · c) @ b = (a @ b) · c for a scalar c: the scale moves to the product's epilogue (rounding)
        rewrite!("matmul-scale-left";  "(matmul (mul ?a ?c) ?b)" => { ConditionalApplier { condition: scalar_constant("?c"), applier: pat("(mul (matmul ?a ?b) ?c)") } }),
        // a @ (b · c) = (a @ b) · c for a scalar c (rounding)
        rewrite!("matmul-scale-right"; "(matmul ?a (mul ?b ?c))" => { ConditionalApplier { condition: scalar_constant("?c"), applier: pat("(mul (matmul ?a ?b) ?c)") } }),
        // f(c1, c2) = c3 for scalar literals: evaluated at compile time (in f64, as the interpreter does)
        fold_constants(),
    ]
}

fn pat(s: &str) -> Pattern<ENode> {
    s.parse().expect("a valid pattern")
}

/// Constant folding of elementwise ops whose operands are all scalar literals.
fn fold_constants() -> Rule {
    struct Fold;
    impl Searcher<ENode, Types> for Fold {
        fn search_eclass_with_limit(
            &self,
            g: &Graph,
            eclass: Id,
            _: usize,
        ) -> Option<SearchMatches<'_, ENode>> {
            if g[eclass].data.constant.is_some() || !g[eclass].data.ty.shape.is_empty() {
                return None;
            }
            g[eclass]
                .nodes
                .iter()
                .any(|n| foldable(g, n).is_some())
                .then(|| SearchMatches {
                    eclass,
                    substs: vec![Subst::default()],
                    ast: None,
                })
        }
        fn vars(&self) -> Vec<Var> {
            Vec::new()
        }
    }
    impl Applier<ENode, Types> for Fold {
        fn apply_one(
            &self,
            g: &mut Graph,
            eclass: Id,
            _: &Subst,
            _: Option<&PatternAst<ENode>>,
            _: Symbol,
        ) -> Vec<Id> {
            let Some(v) = g[eclass].nodes.iter().find_map(|n| foldable(g, n)) else {
                return Vec::new();
            };
            let c = g.add(ENode::constant(v));
            if g.union(c, eclass) {
                vec![c]
            } else {
                Vec::new()
            }
        }
    }
    Rewrite::new("fold-constants", Fold, Fold).expect("a valid rule")
}

/// The value of an f32 elementwise node over scalar literals (finite or infinite, never NaN:
/// `constant` cannot hold NaN).
fn foldable(g: &Graph, n: &ENode) -> Option<f64> {
    let (op, _) = n.ir()?;
    if crate::fused::Scalar::of(op).is_none() || op == Op::Gelu || n.kids.is_empty() {
        return None;
    }
    let args: Option<Vec<f64>> = n.kids.iter().map(|&k| g[k].data.constant).collect();
    let v = sinter_ir::interp::scalar(op, false, &args?);
    (!v.is_nan()).then_some(v)
}

/// Layout identities: view ops that cancel or compose.
#[rustfmt::skip]
pub fn layout() -> Vec<Rule> {
    vec![
        // transpose(transpose(x, a, b), a, b) = x
        computed("transpose-transpose", Op::Transpose, transpose_transpose),
        // permute(permute(x, p), q) = permute(x, p∘q), or x when p∘q is the identity
        computed("permute-permute",     Op::Permute, permute_permute),
        // reshape(reshape(x, s1), s2) = reshape(x, s2)
        computed("reshape-reshape",     Op::Reshape, reshape_reshape),
        // reshape(x, shape of x) = x
        computed("reshape-identity",    Op::Reshape, identity_view),
        // broadcast_to(x, shape of x) = x
        computed("broadcast-identity",  Op::BroadcastTo, identity_view),
        // permute(x, [0, 1, ..]) = x
        computed("permute-identity",    Op::Permute, identity_view),
        // squeeze(unsqueeze(x, a), a) = x
        computed("squeeze-unsqueeze",   Op::Squeeze, squeeze_unsqueeze),
        // transpose(sum(x, A, keepdim), a, b) = sum(transpose(x, a, b), σ(A), keepdim), σ = (a b)
        computed("transpose-sum",       Op::Transpose, transpose_sum),
        // slice_grad(a, S, k, s..s+|a|) + slice_grad(b, S, k, s+|a|..) = slice_grad(concat(a, b, k), S, k, s..),
        // which is concat(a, b, k) when it covers axis k (the gradient of a tensor split in parts)
        computed("slice-grad-add",      Op::Add, slice_grad_add),
        // concat(.., concat(a, b, k), .., k) = concat(.., a, b, .., k)
        computed("concat-concat",       Op::Concat, concat_concat),
        // cast(view(x)) = view(cast(x))
        computed("cast-view",           Op::Cast, cast_view),
    ]
}

/// The ops that only view their operand (and so commute with elementwise ops such as `cast`).
pub(super) fn is_view(op: Op) -> bool {
    matches!(
        op,
        Op::Reshape | Op::Permute | Op::Transpose | Op::BroadcastTo | Op::Unsqueeze | Op::Squeeze
    )
}

/// `cast(view(x)) = view(cast(x))` for any view, between float dtypes (autocast's casts): a
/// cast is elementwise, so it commutes with what only moves elements. A kernel can then cast
/// where it copies (a reshape of a permuted tensor, which lowering copies, and the cast after
/// it in one kernel), or cast the smaller side of a broadcast.
fn cast_view(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let dtype: DType = attrs.try_of(key::DTYPE)?;
    let float = |d: DType| matches!(d, DType::F32 | DType::F16);
    if !float(dtype) || !float(g[n.kids[0]].data.ty.dtype) {
        return None;
    }
    let view = (g[n.kids[0]].nodes.iter()).find(|v| v.ir().is_some_and(|(op, _)| is_view(op)))?;
    let (op, view_attrs) = view.ir().expect("a view op");
    let (view_attrs, x) = (view_attrs.clone(), view.kids[0]);
    let cast = add_op(g, Op::Cast, Attrs::new().and(key::DTYPE, dtype), vec![x]);
    Some(add_op(g, op, view_attrs, vec![cast]))
}

fn slice_grad_add(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (x, y) = (
        node_of(g, n.kids[0], Op::SliceGrad)?,
        node_of(g, n.kids[1], Op::SliceGrad)?,
    );
    let (_, ax) = x.ir()?;
    let (_, ay) = y.ir()?;
    let axis = ax.of(key::AXIS);
    if ax.of(key::SHAPE) != ay.of(key::SHAPE)
        || ay.of(key::AXIS) != axis
        || ax.of(key::STEP) != 1
        || ay.of(key::STEP) != 1
        || g[x.kids[0]].data.ty.dtype != g[y.kids[0]].data.ty.dtype
    {
        return None;
    }
    // the positions a part covers: from its start, its own extent along the axis
    let extent = |part: &ENode| g[part.kids[0]].data.ty.shape.get(axis).copied();
    let (ex, ey) = (extent(&x)?, extent(&y)?);
    let (sx, sy) = (ax.of(key::START), ay.of(key::START));
    let (first, second, start) = if sx + ex == sy {
        (&x, &y, sx)
    } else if sy + ey == sx {
        (&y, &x, sy)
    } else {
        return None;
    };
    let joined = add_op(
        g,
        Op::Concat,
        Attrs::new().and(key::AXIS, axis),
        vec![first.kids[0], second.kids[0]],
    );
    let end = start + ex + ey;
    if start == 0 && end == ax.of(key::SHAPE)[axis] {
        return Some(joined);
    }
    Some(add_op(
        g,
        Op::SliceGrad,
        ax.clone().and(key::START, start).and(key::END, end),
        vec![joined],
    ))
}

fn concat_concat(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let axis = attrs.of(key::AXIS);
    let mut kids = Vec::new();
    let mut flattened = false;
    for &k in &n.kids {
        match node_of(g, k, Op::Concat)
            .filter(|c| c.ir().is_some_and(|(_, a)| a.of(key::AXIS) == axis))
        {
            Some(inner) if !flattened => {
                kids.extend(inner.kids.iter().copied());
                flattened = true;
            }
            _ => kids.push(k),
        }
    }
    flattened.then(|| add_op(g, Op::Concat, attrs.clone(), kids))
}

fn transpose_sum(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let sum = node_of(g, n.kids[0], Op::Sum)?;
    let (_, sum_attrs) = sum.ir()?;
    if !sum_attrs.of(key::KEEPDIM) {
        return None;
    }
    let (a, b) = (attrs.of(key::DIM0), attrs.of(key::DIM1));
    let swap = |x: usize| match x {
        x if x == a => b,
        x if x == b => a,
        x => x,
    };
    let mut axes: Vec<usize> = sum_attrs.of(key::AXES).iter().map(|&x| swap(x)).collect();
    axes.sort_unstable();
    let inner = add_op(g, Op::Transpose, attrs.clone(), vec![sum.kids[0]]);
    Some(add_op(
        g,
        Op::Sum,
        sum_attrs.clone().and(key::AXES, axes),
        vec![inner],
    ))
}

fn transpose_transpose(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let inner = node_of(g, n.kids[0], Op::Transpose)?;
    let (_, inner_attrs) = inner.ir()?;
    let dims = |a: &Attrs| {
        let (x, y) = (a.of(key::DIM0), a.of(key::DIM1));
        (x.min(y), x.max(y))
    };
    (dims(attrs) == dims(inner_attrs)).then_some(inner.kids[0])
}

fn permute_permute(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let inner = node_of(g, n.kids[0], Op::Permute)?;
    let (_, inner_attrs) = inner.ir()?;
    let (q, p) = (attrs.of(key::PERM), inner_attrs.of(key::PERM));
    // output axis i of the outer is its input axis q[i], which is the inner's input axis p[q[i]]
    let composed: Vec<usize> = q.iter().map(|&i| p[i]).collect();
    if composed.iter().enumerate().all(|(i, &a)| i == a) {
        return Some(inner.kids[0]);
    }
    Some(add_op(
        g,
        Op::Permute,
        Attrs::new().and(key::PERM, composed),
        vec![inner.kids[0]],
    ))
}

fn reshape_reshape(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let inner = node_of(g, n.kids[0], Op::Reshape)?;
    Some(add_op(
        g,
        Op::Reshape,
        (*attrs).clone(),
        vec![inner.kids[0]],
    ))
}

fn identity_view(g: &mut Graph, n: &ENode) -> Option<Id> {
    let x = n.kids[0];
    let out = super::analysis::node_type(g, n);
    if g[x].data.ty != out {
        return None;
    }
    let (op, attrs) = n.ir()?;
    match op {
        Op::Permute => attrs
            .of(key::PERM)
            .iter()
            .enumerate()
            .all(|(i, &a)| i == a)
            .then_some(x),
        _ => Some(x),
    }
}

fn squeeze_unsqueeze(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let inner = node_of(g, n.kids[0], Op::Unsqueeze)?;
    let (_, inner_attrs) = inner.ir()?;
    (attrs.of(key::AXIS) == inner_attrs.of(key::AXIS)).then_some(inner.kids[0])
}
