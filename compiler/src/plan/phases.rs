//! A plan in two phases ([`Phases`]): the launches that do not depend on
//! some of the plan's inputs, and the rest. For a gradient program, the
//! forward (its outputs, and the log-sum-exps and kept products the
//! backward reads) runs when the outputs are asked for, and the backward
//! once the cotangents are known, on what the forward saved: an autodiff
//! graph's two passes (`attnc-burn`), with nothing recomputed.

use super::{BufferRole, Plan};

/// Launch indices of each phase, in the plan's order, and what crosses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phases {
    /// Launches that read none of the later inputs, nor anything written
    /// from them.
    pub first: Vec<usize>,
    /// The others.
    pub second: Vec<usize>,
    /// Buffers the first phase writes that the second reads: what is kept
    /// between them.
    pub saved: Vec<usize>,
}

impl Plan {
    /// This plan's launches split by whether they depend on the inputs
    /// `later` names (a gradient program's cotangents). Each phase keeps
    /// the plan's order, so runs the first then the second as the plan
    /// does; a launch of the first never reads what the second writes.
    pub fn phases(&self, later: &dyn Fn(&str) -> bool) -> Phases {
        let mut tainted: Vec<bool> =
            (self.buffers.iter()).map(|b| matches!(&b.role, BufferRole::Input { name, .. } if later(name))).collect();
        let (mut first, mut second) = (vec![], vec![]);
        for (i, l) in self.launches.iter().enumerate() {
            let reads = &l.bindings[..l.bindings.len() - l.spec.outputs()];
            if reads.iter().any(|&b| tainted[b]) {
                l.outputs().iter().for_each(|&b| tainted[b] = true);
                second.push(i);
            } else {
                first.push(i);
            }
        }
        let written: Vec<usize> = first.iter().flat_map(|&i| self.launches[i].outputs().to_vec()).collect();
        let mut saved: Vec<usize> = (second.iter())
            .flat_map(|&i| {
                let l = &self.launches[i];
                l.bindings[..l.bindings.len() - l.spec.outputs()].to_vec()
            })
            .filter(|b| written.contains(b))
            .collect();
        saved.sort_unstable();
        saved.dedup();
        Phases { first, second, saved }
    }
}
