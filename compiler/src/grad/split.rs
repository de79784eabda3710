//! A gradient program cut in two for training: the forward half computes
//! the outputs and saves what the backward reads of the forward (its
//! residuals: attention's log-sum-exps, projections, kept products); the
//! backward half takes the inputs, those residuals and the cotangents and
//! computes only the gradients. Together they compute what the gradient
//! program does, and no node of the forward runs twice.

use crate::ir::*;

/// The two halves of a gradient program (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// The forward inputs → the forward outputs, then the residuals named
    /// `saved_<k>` that are not outputs already.
    pub forward: Program,
    /// The forward inputs, the cotangents `cot_<output>` and `saved`, each
    /// named like the forward output it is → `grad_<input>` for each
    /// differentiated input.
    pub backward: Program,
    /// The forward outputs the backward reads, in its input order: forward
    /// outputs of the spec, or `saved_<k>` residuals.
    pub saved: Vec<String>,
}

/// An operation the backward computes again from its operands rather than
/// save: constants, elementwise operations, reductions and operations that
/// only move elements (views, or one pass over memory). Saving their
/// results would also make the forward write tensors it fuses away (a
/// group kernel's intermediates, a head split read as a view); what is
/// saved is what costs a contraction: projections, attention and its
/// log-sum-exp, head mixing, collapse, RoPE.
fn recomputed(op: &Op) -> bool {
    matches!(
        op,
        Op::Scalar { .. }
            | Op::Constant { .. }
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Where { .. }
            | Op::Reduce { .. }
            | Op::LooMean { .. }
            | Op::Thresholds { .. }
            | Op::SplitHeads { .. }
            | Op::MergeHeads { .. }
            | Op::Transpose { .. }
            | Op::Unsqueeze { .. }
            | Op::Interleave { .. }
            | Op::Deinterleave { .. }
            | Op::FlattenHeads { .. }
            | Op::UnflattenHeads { .. }
    )
}

/// Cut `gradient`, the program `differentiate` made of a forward with
/// `forward_inputs` inputs and `forward_outputs` outputs (which stay its
/// first inputs and outputs; the cotangents come next), into its forward
/// and backward halves.
pub fn split(gradient: &Program, forward_inputs: usize, forward_outputs: usize) -> Split {
    let g = gradient;
    let n = g.nodes.len();
    // Which nodes read a cotangent: the backward's.
    let mut backward = vec![false; n];
    for (i, node) in g.nodes.iter().enumerate() {
        backward[i] = match node.op {
            Op::Input { index } => index >= forward_inputs,
            ref op => op.operands().iter().any(|o| backward[o.0 as usize]),
        };
    }
    // What the backward reads of the forward, users before operands: a
    // node it computes again needs its operands in turn; the rest (inputs
    // aside) is saved.
    let mut read = vec![false; n];
    let gradients = &g.outputs[forward_outputs..];
    let reads = (0..n).filter(|&i| backward[i]).flat_map(|i| g.nodes[i].op.operands());
    for id in reads.chain(gradients.iter().map(|(_, id)| *id)) {
        read[id.0 as usize] = true;
    }
    let mut kept = Vec::new();
    for i in (0..n).rev() {
        let op = &g.nodes[i].op;
        if !read[i] || backward[i] || matches!(op, Op::Input { .. }) {
            continue;
        }
        if recomputed(op) {
            op.operands().iter().for_each(|o| read[o.0 as usize] = true);
        } else {
            kept.push(i);
        }
    }
    kept.reverse();
    let taken = |name: &str| g.inputs.iter().any(|i| i.name == name) || g.outputs.iter().any(|(o, _)| o == name);
    let mut fwd = g.clone();
    fwd.name = format!("{}_forward", g.name.trim_end_matches("_grad"));
    fwd.inputs.truncate(forward_inputs);
    fwd.outputs.truncate(forward_outputs);
    let mut saved = Vec::new();
    for &i in &kept {
        let id = NodeId(i as u32);
        let name = match fwd.outputs.iter().find(|(_, o)| *o == id) {
            Some((name, _)) => name.clone(),
            None => {
                let mut name = format!("saved_{}", fwd.outputs.len() - forward_outputs);
                while taken(&name) {
                    name.push('_');
                }
                fwd.outputs.push((name.clone(), id));
                name
            }
        };
        saved.push(name);
    }
    fwd.prune_dead();

    // The backward: the saved residuals become inputs, placed first so that
    // every node still comes after its operands.
    let mut bwd = g.clone();
    bwd.name = format!("{}_backward", g.name.trim_end_matches("_grad"));
    let k = kept.len() as u32;
    let mut as_input: Vec<Option<NodeId>> = vec![None; n];
    let mut nodes = Vec::with_capacity(n + kept.len());
    for (slot, (&i, name)) in kept.iter().zip(&saved).enumerate() {
        nodes.push(Node { op: Op::Input { index: bwd.inputs.len() }, shape: g.nodes[i].shape.clone() });
        let init = Init::Normal { mean: 0.0, std: 1.0 };
        let node = NodeId(slot as u32);
        bwd.inputs.push(Input { name: name.clone(), node, init, domain: Domain::Any, weight: false });
        as_input[i] = Some(node);
    }
    let moved = |id: NodeId| as_input[id.0 as usize].unwrap_or(NodeId(id.0 + k));
    for node in &g.nodes {
        let mut node = node.clone();
        node.op.map_operands(moved);
        nodes.push(node);
    }
    bwd.nodes = nodes;
    for input in &mut bwd.inputs[..g.inputs.len()] {
        input.node = NodeId(input.node.0 + k);
    }
    bwd.outputs = gradients.iter().map(|(name, id)| (name.clone(), moved(*id))).collect();
    bwd.prune_dead();
    Split { forward: fwd, backward: bwd, saved }
}
