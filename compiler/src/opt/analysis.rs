//! Facts that hold for a whole e-class: its shape, whether it depends on
//! weights alone (so inference may fold it once at load time), and the input
//! weights it concatenates. `merge` asserts the two sides agree on the shape,
//! so an unsound rewrite fails loudly in tests.

use super::lang::{opaque_index, TensorLang};
use crate::ir::{Dim, NodeId, Op, Program, Shape};
use egg::{Analysis, DidMerge, EGraph, Id};

#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    /// `None` for attribute leaves (`Num`) and the root.
    pub shape: Option<Shape>,
    /// The value depends only on inputs declared `weight`.
    pub weight_only: bool,
    /// For `Num` leaves, the number.
    pub num: Option<u64>,
    /// For a weight input or a column concatenation of weight inputs, their
    /// input indices in order (guards the projection-merging rule so each set
    /// of weights merges in one order only).
    pub concat_of: Option<Vec<usize>>,
}

/// What the analysis needs to know of the program being optimised.
#[derive(Clone, Debug, Default)]
pub struct TensorAnalysis {
    /// The original program's operations, for the attributes of opaque nodes.
    pub original: Vec<Op>,
    /// Each input's name, declared shape and whether it is a weight.
    pub inputs: Vec<(String, Shape, bool)>,
}

impl TensorAnalysis {
    pub fn new(p: &Program) -> TensorAnalysis {
        TensorAnalysis {
            original: p.nodes.iter().map(|n| n.op.clone()).collect(),
            inputs: p.inputs.iter().map(|i| (i.name.clone(), p.shape(i.node).clone(), i.weight)).collect(),
        }
    }
}

pub type TensorGraph = EGraph<TensorLang, TensorAnalysis>;

/// The shape of a tensor e-class.
pub fn shape(egraph: &TensorGraph, id: Id) -> &Shape {
    egraph[id].data.shape.as_ref().expect("a tensor e-class has a shape")
}

/// The known size of the last axis of a tensor e-class.
pub fn cols(egraph: &TensorGraph, id: Id) -> Option<u64> {
    shape(egraph, id).0.last().and_then(Dim::as_known)
}

impl Analysis<TensorLang> for TensorAnalysis {
    type Data = Facts;

    fn make(egraph: &mut TensorGraph, enode: &TensorLang, _id: Id) -> Facts {
        let leaf = Facts { shape: None, weight_only: true, num: None, concat_of: None };
        match enode {
            TensorLang::Num(n) => Facts { num: Some(*n), ..leaf },
            TensorLang::Outputs(_) => leaf,
            TensorLang::Input(name) => {
                let (index, (_, shape, weight)) = egraph
                    .analysis
                    .inputs
                    .iter()
                    .enumerate()
                    .find(|(_, (n, _, _))| n == name.0.as_str())
                    .unwrap_or_else(|| panic!("unknown input {name}"));
                Facts {
                    shape: Some(shape.clone()),
                    weight_only: *weight,
                    num: None,
                    concat_of: weight.then(|| vec![index]),
                }
            }
            _ => {
                let num = |id: Id| egraph[id].data.num.expect("attribute children are numbers");
                let op = super::lang::to_op(enode, &egraph.analysis.original, num, |id| NodeId(usize::from(id) as u32))
                    .expect("tensor operation");
                let shape = match op.infer(&|n| shape(egraph, Id::from(n.0 as usize)).clone()) {
                    Ok(s) => s,
                    Err(e) => panic!("ill-shaped e-node {enode:?}: {}", e.message),
                };
                let tensor_children: Vec<Id> = op.operands().into_iter().map(|n| Id::from(n.0 as usize)).collect();
                let weight_only = match enode {
                    // Inputs are the only non-weight leaves; opaque constants have no operands.
                    TensorLang::Opaque(sym, _) if tensor_children.is_empty() => {
                        matches!(egraph.analysis.original[opaque_index(*sym)], Op::Scalar { .. } | Op::Constant { .. })
                    }
                    _ => tensor_children.iter().all(|c| egraph[*c].data.weight_only),
                };
                let concat_of = match enode {
                    TensorLang::ConcatCols([a, b]) => match (&egraph[*a].data.concat_of, &egraph[*b].data.concat_of) {
                        (Some(x), Some(y)) => Some(x.iter().chain(y).copied().collect()),
                        _ => None,
                    },
                    _ => None,
                };
                Facts { shape: Some(shape), weight_only, num: None, concat_of }
            }
        }
    }

    fn merge(&mut self, a: &mut Facts, b: Facts) -> DidMerge {
        assert_eq!(a.shape, b.shape, "unsound rewrite: merged e-classes have different shapes");
        assert_eq!(a.num, b.num, "unsound rewrite: merged different numbers");
        let mut changed_a = false;
        if b.weight_only && !a.weight_only {
            a.weight_only = true;
            changed_a = true;
        }
        if a.concat_of.is_none() && b.concat_of.is_some() {
            a.concat_of = b.concat_of.clone();
            changed_a = true;
        }
        let changed_b = (a.weight_only && !b.weight_only) || (a.concat_of.is_some() && b.concat_of.is_none());
        DidMerge(changed_a, changed_b)
    }
}
