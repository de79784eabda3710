//! The IR as an egg language, and the conversions between a [`Program`] and
//! a [`RecExpr`] (both keep operands before users, so each is a linear walk).
//!
//! Operations the rules rewrite have their own variants; every other IR
//! operation is `Opaque("name#i", children)`, whose attributes are those of
//! node `i` of the original program (kept in the analysis).

use crate::ir::{Node, NodeId, Op, Program, Shape};
use egg::{define_language, Id, RecExpr, Symbol};
use std::fmt;
use std::str::FromStr;

/// A leaf naming a program input: `$x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputName(pub Symbol);

impl FromStr for InputName {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        s.strip_prefix('$').filter(|n| !n.is_empty()).map(|n| InputName(Symbol::from(n))).ok_or(())
    }
}

impl fmt::Display for InputName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", self.0)
    }
}

define_language! {
    /// Child order is the IR's operand order; integer attributes are `Num`
    /// leaves after the tensor children.
    pub enum TensorLang {
        "matmul" = MatMul([Id; 2]),                 // a, b
        "split_heads" = SplitHeads([Id; 2]),        // x, heads
        "merge_heads" = MergeHeads([Id; 1]),        // x
        "mix_heads" = MixHeads([Id; 2]),            // x, alpha
        "collapse" = Collapse([Id; 2]),             // x, r
        "mix_cols" = MixCols([Id; 2]),              // y, alpha
        "collapse_cols" = CollapseCols([Id; 2]),    // y, r
        "collapse_rows" = CollapseRows([Id; 2]),    // w, r
        "unflatten_heads" = UnflattenHeads([Id; 2]), // x, pseudo
        "flatten_heads" = FlattenHeads([Id; 1]),    // x
        "concat_cols" = ConcatCols([Id; 2]),        // a, b
        "slice_cols" = SliceCols([Id; 3]),          // x, start, len
        "outputs" = Outputs(Box<[Id]>),             // the root: one child per output
        Num(u64),
        Input(InputName),
        Opaque(Symbol, Vec<Id>),                    // "name#i": attributes of original node i
    }
}

/// The original node index of an opaque symbol `name#i`.
pub fn opaque_index(sym: Symbol) -> usize {
    let s = sym.as_str();
    s[s.rfind('#').expect("opaque symbols end in #index") + 1..].parse().expect("opaque index")
}

/// The program as one expression rooted at `outputs`.
pub fn to_expr(p: &Program) -> RecExpr<TensorLang> {
    let mut expr = RecExpr::default();
    let mut ids: Vec<Id> = Vec::with_capacity(p.nodes.len());
    for (i, node) in p.nodes.iter().enumerate() {
        let c = |n: NodeId| ids[n.0 as usize];
        let num = |expr: &mut RecExpr<TensorLang>, v: u64| expr.add(TensorLang::Num(v));
        let enode = match &node.op {
            Op::Input { index } => TensorLang::Input(InputName(Symbol::from(p.inputs[*index].name.as_str()))),
            Op::MatMul { a, b } => TensorLang::MatMul([c(*a), c(*b)]),
            Op::SplitHeads { x, heads } => TensorLang::SplitHeads([c(*x), num(&mut expr, *heads)]),
            Op::MergeHeads { x } => TensorLang::MergeHeads([c(*x)]),
            Op::MixHeads { x, alpha } => TensorLang::MixHeads([c(*x), c(*alpha)]),
            Op::Collapse { x, r } => TensorLang::Collapse([c(*x), c(*r)]),
            Op::MixCols { y, alpha } => TensorLang::MixCols([c(*y), c(*alpha)]),
            Op::CollapseCols { y, r } => TensorLang::CollapseCols([c(*y), c(*r)]),
            Op::CollapseRows { w, r } => TensorLang::CollapseRows([c(*w), c(*r)]),
            Op::UnflattenHeads { x, pseudo } => TensorLang::UnflattenHeads([c(*x), num(&mut expr, *pseudo)]),
            Op::FlattenHeads { x } => TensorLang::FlattenHeads([c(*x)]),
            Op::ConcatCols { a, b } => TensorLang::ConcatCols([c(*a), c(*b)]),
            Op::SliceCols { x, start, len } => {
                let (s, l) = (num(&mut expr, *start), num(&mut expr, *len));
                TensorLang::SliceCols([c(*x), s, l])
            }
            op => TensorLang::Opaque(
                Symbol::from(format!("{}#{i}", op.name())),
                op.operands().into_iter().map(c).collect(),
            ),
        };
        ids.push(expr.add(enode));
    }
    let outs: Vec<Id> = p.outputs.iter().map(|(_, id)| ids[id.0 as usize]).collect();
    expr.add(TensorLang::Outputs(outs.into_boxed_slice()));
    expr
}

/// The IR operation of an e-node, with operand handles from `child` and
/// integer attributes from `num`; `None` for `Num`, `Input` and `Outputs`.
pub fn to_op(node: &TensorLang, original: &[Op], num: impl Fn(Id) -> u64, child: impl Fn(Id) -> NodeId) -> Option<Op> {
    use TensorLang as T;
    Some(match node {
        T::Num(_) | T::Input(_) | T::Outputs(_) => return None,
        T::MatMul([a, b]) => Op::MatMul { a: child(*a), b: child(*b) },
        T::SplitHeads([x, h]) => Op::SplitHeads { x: child(*x), heads: num(*h) },
        T::MergeHeads([x]) => Op::MergeHeads { x: child(*x) },
        T::MixHeads([x, a]) => Op::MixHeads { x: child(*x), alpha: child(*a) },
        T::Collapse([x, r]) => Op::Collapse { x: child(*x), r: child(*r) },
        T::MixCols([y, a]) => Op::MixCols { y: child(*y), alpha: child(*a) },
        T::CollapseCols([y, r]) => Op::CollapseCols { y: child(*y), r: child(*r) },
        T::CollapseRows([w, r]) => Op::CollapseRows { w: child(*w), r: child(*r) },
        T::UnflattenHeads([x, p]) => Op::UnflattenHeads { x: child(*x), pseudo: num(*p) },
        T::FlattenHeads([x]) => Op::FlattenHeads { x: child(*x) },
        T::ConcatCols([a, b]) => Op::ConcatCols { a: child(*a), b: child(*b) },
        T::SliceCols([x, s, l]) => Op::SliceCols { x: child(*x), start: num(*s), len: num(*l) },
        T::Opaque(sym, children) => {
            let mut op = original[opaque_index(*sym)].clone();
            let mut it = children.iter();
            op.map_operands(|_| child(*it.next().expect("opaque arity matches the original op")));
            op
        }
    })
}

/// Rebuild a program from an expression of [`to_expr`]'s form; `template`
/// supplies inputs, dims, names and the attributes of opaque nodes.
pub fn from_expr(expr: &RecExpr<TensorLang>, template: &Program) -> Program {
    let original: Vec<Op> = template.nodes.iter().map(|n| n.op.clone()).collect();
    let mut nodes: Vec<Node> = template.inputs.iter().map(|i| template.nodes[i.node.0 as usize].clone()).collect();
    let mut inputs = template.inputs.clone();
    for (index, input) in inputs.iter_mut().enumerate() {
        input.node = NodeId(index as u32);
        nodes[index].op = Op::Input { index };
    }
    let mut map: Vec<Option<NodeId>> = vec![None; expr.as_ref().len()];
    let mut outputs = vec![];
    for (i, enode) in expr.as_ref().iter().enumerate() {
        match enode {
            TensorLang::Input(name) => {
                let index = inputs.iter().position(|inp| inp.name == name.0.as_str()).expect("input exists");
                map[i] = Some(NodeId(index as u32));
            }
            TensorLang::Outputs(children) => {
                outputs = template
                    .outputs
                    .iter()
                    .zip(children.iter())
                    .map(|((n, _), c)| (n.clone(), map[usize::from(*c)].unwrap()))
                    .collect();
            }
            _ => {
                let num = |id: Id| match expr[id] {
                    TensorLang::Num(v) => v,
                    _ => unreachable!("attributes are Num leaves"),
                };
                if let Some(op) =
                    to_op(enode, &original, num, |id| map[usize::from(id)].expect("operand precedes user"))
                {
                    let shape: Shape = op
                        .infer(&|id| nodes[id.0 as usize].shape.clone())
                        .expect("every e-class has a valid shape (the analysis checks it)");
                    nodes.push(Node { op, shape });
                    map[i] = Some(NodeId(nodes.len() as u32 - 1));
                }
            }
        }
    }
    let mut program = Program { name: template.name.clone(), dims: template.dims.clone(), nodes, inputs, outputs };
    program.prune_dead();
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rewritten operations' egg names are the op table's (`Op::name`),
    /// as the opaque ones' are by construction.
    #[test]
    fn egg_names_are_the_op_tables() {
        use TensorLang as T;
        let z = Id::from(0usize);
        let nodes = [
            T::MatMul([z, z]),
            T::SplitHeads([z, z]),
            T::MergeHeads([z]),
            T::MixHeads([z, z]),
            T::Collapse([z, z]),
            T::MixCols([z, z]),
            T::CollapseCols([z, z]),
            T::CollapseRows([z, z]),
            T::UnflattenHeads([z, z]),
            T::FlattenHeads([z]),
            T::ConcatCols([z, z]),
            T::SliceCols([z, z, z]),
        ];
        for node in nodes {
            let op = to_op(&node, &[], |_| 1, |_| NodeId(0)).expect("an operation");
            assert_eq!(node.to_string(), op.name());
        }
    }
}
