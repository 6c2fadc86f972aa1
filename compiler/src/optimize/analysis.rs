//! The e-class analysis: every e-class's type, by the IR's own shape and dtype rules
//! ([`sinter_ir::infer`]), and its value when it is a scalar constant.
//!
//! Types never change under a valid rewrite (both sides of a rule have the same type), so
//! merging two classes asserts that they agree and reports no change; that keeps egg's rebuild
//! from re-running the analysis up the graph (measured: seconds against milliseconds on deep
//! training graphs).

use egg::{Analysis, DidMerge, EGraph, Id};
use sinter_ir::{DType, TensorType};

use super::lang::{ENode, Head};
use crate::fused::eval::shape_of;

pub type Graph = EGraph<ENode, Types>;

/// The analysis state: the types of the source graph's leaves.
#[derive(Debug, Default)]
pub struct Types {
    /// Type of each input, param and state, by value index.
    pub leaves: Vec<Option<TensorType>>,
    /// Classes a computed rule made from a new identity (`D = rowsum(dO ∘ O)`), with the rule's
    /// name, so that `inspect` credits the kernel that computes one to that rule.
    pub built_by: Vec<(egg::Id, &'static str)>,
}

#[derive(Clone, Debug)]
pub struct Data {
    pub ty: TensorType,
    /// The value of a class that holds a scalar `constant`.
    pub constant: Option<f64>,
}

impl Analysis<ENode> for Types {
    type Data = Data;

    fn make(egraph: &mut Graph, enode: &ENode, _id: Id) -> Data {
        let ty = node_type(egraph, enode);
        Data {
            ty,
            constant: enode.constant_value(),
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        debug_assert_eq!(a.ty, b.ty, "a rewrite merged values of different types");
        match (a.constant, b.constant) {
            (None, Some(c)) => {
                a.constant = Some(c);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            _ => DidMerge(false, false),
        }
    }
}

/// The type of the value `enode` computes.
pub fn node_type(egraph: &Graph, enode: &ENode) -> TensorType {
    let kid = |i: usize| egraph[enode.kids[i]].data.ty.clone();
    match &enode.head {
        Head::Leaf(v) => egraph.analysis.leaves[v.index()]
            .clone()
            .expect("a leaf of the source graph"),
        Head::Op(op, attrs) => {
            let types: Vec<TensorType> = (0..enode.kids.len()).map(kid).collect();
            let mut attrs = (**attrs).clone();
            let mut results = sinter_ir::infer::infer(*op, &types, &mut attrs)
                .unwrap_or_else(|e| panic!("a rewrite built an ill-typed `{}`: {e}", op.name()));
            results.swap_remove(0)
        }
        Head::Kernel(p) | Head::Epilogue(_, _, p) => {
            let out = &p.outputs[0].access;
            TensorType::new(out.dtype, shape_of(p, out))
        }
        Head::Proj(i) => {
            let flash = egraph[enode.kids[0]]
                .nodes
                .iter()
                .find_map(|n| match &n.head {
                    Head::Flash(spec) => Some((spec.clone(), n.kids.clone())),
                    _ => None,
                })
                .expect("a projection of a flash node");
            let types: Vec<TensorType> =
                flash.1.iter().map(|&k| egraph[k].data.ty.clone()).collect();
            flash.0.output_types(&types).swap_remove(*i as usize)
        }
        // a tuple: its results have their own types
        Head::Root | Head::Flash(_) => TensorType::scalar(DType::F32),
    }
}
