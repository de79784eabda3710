//! The validator: checks the structural invariants of a [`Program`]. Run after
//! lowering and after every transformation in tests.

use crate::ir::*;

/// Every violated invariant, as a message; empty when the program is valid.
pub fn validate(p: &Program) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, node) in p.nodes.iter().enumerate() {
        let id = NodeId(i as u32);
        for operand in node.op.operands() {
            if operand >= id {
                problems.push(format!("{id}: operand {operand} does not precede its user"));
            }
        }
        if !problems.is_empty() {
            continue;
        }
        match &node.op {
            Op::Input { index } => match p.inputs.get(*index) {
                Some(input) if input.node == id => {}
                _ => problems.push(format!("{id}: input #{index} is not declared with this node")),
            },
            op => match op.infer(&|x| p.shape(x).clone()) {
                Ok(shape) if shape == node.shape => {}
                Ok(shape) => problems.push(format!("{id}: recorded shape {} but the rule gives {shape}", node.shape)),
                Err(e) => problems.push(format!("{id}: {}", e.message)),
            },
        }
        if let Op::Attention { mask, scale, .. } = &node.op {
            if !(scale.is_finite() && *scale > 0.0) {
                problems.push(format!("{id}: attention scale {scale} is not a positive number"));
            }
            if mask.block == 0 {
                problems.push(format!("{id}: attention block is 0"));
            }
        }
    }
    for (index, input) in p.inputs.iter().enumerate() {
        if p.nodes.get(input.node.0 as usize).map(|n| &n.op) != Some(&Op::Input { index }) {
            problems.push(format!("input `{}` does not point at its input node", input.name));
        }
    }
    for (name, id) in &p.outputs {
        if id.0 as usize >= p.nodes.len() {
            problems.push(format!("output `{name}` points past the program"));
        }
    }
    let mut names: Vec<&str> =
        p.inputs.iter().map(|i| i.name.as_str()).chain(p.outputs.iter().map(|o| o.0.as_str())).collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        problems.push("input and output names are not unique".into());
    }
    problems
}
