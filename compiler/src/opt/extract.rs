//! Extraction by total (DAG) cost: a sub-term shared by several users is paid
//! once, which is what makes merged projections worth choosing. Start from the
//! best tree-cost choice per e-class, then improve one class at a time while the
//! DAG cost of the whole selection falls.

use super::analysis::TensorGraph;
use super::lang::TensorLang;
use egg::{Id, Language, RecExpr};
use std::collections::{BTreeMap, BTreeSet};

pub struct Selection {
    choice: BTreeMap<Id, usize>,
}

/// The cost of choosing `node` for its e-class, excluding its children.
pub trait NodeCost {
    fn cost(&self, g: &TensorGraph, class: Id, node: &TensorLang) -> f64;
}

/// Up to this many e-classes, a switch that raises the cost is followed by a
/// greedy sweep before it is judged, so moves that only pay once several
/// classes share a new sub-term (merged projections) can be found.
const LOOKAHEAD_CLASSES: usize = 400;

pub fn extract(g: &TensorGraph, root: Id, nc: &impl NodeCost) -> (RecExpr<TensorLang>, f64) {
    let root = g.find(root);
    let mut sel = tree_selection(g, nc);
    let mut best = dag_cost(g, root, &sel, nc).expect("the tree-cost selection is acyclic");
    best = sweep(g, root, &mut sel, best, nc);
    if g.number_of_classes() <= LOOKAHEAD_CLASSES {
        for _ in 0..4 {
            let before = best;
            for class in reachable(g, root, &sel) {
                for i in 0..g[class].nodes.len() {
                    let saved = sel.choice.clone();
                    if !switch(g, &mut sel, class, i) {
                        continue;
                    }
                    let Some(cost) = dag_cost(g, root, &sel, nc) else {
                        sel.choice = saved;
                        continue;
                    };
                    let cost = sweep(g, root, &mut sel, cost, nc);
                    if cost < best - 1e-12 * best.abs() {
                        best = cost;
                    } else {
                        sel.choice = saved;
                    }
                }
            }
            if best >= before {
                break;
            }
        }
    }
    (build(g, root, &sel), best)
}

/// Points `class` at its `i`-th node, if that is a change and its children are selectable.
fn switch(g: &TensorGraph, sel: &mut Selection, class: Id, i: usize) -> bool {
    if sel.choice.get(&class) == Some(&i)
        || !g[class].nodes[i].children().iter().all(|c| sel.choice.contains_key(&g.find(*c)))
    {
        return false;
    }
    sel.choice.insert(class, i);
    true
}

/// Greedy single-class improvements until none helps; returns the new cost.
fn sweep(g: &TensorGraph, root: Id, sel: &mut Selection, mut best: f64, nc: &impl NodeCost) -> f64 {
    for _ in 0..8 {
        let mut improved = false;
        for class in reachable(g, root, sel) {
            let current = sel.choice[&class];
            for i in 0..g[class].nodes.len() {
                if !switch(g, sel, class, i) {
                    continue;
                }
                match dag_cost(g, root, sel, nc) {
                    Some(c) if c < best - 1e-12 * best.abs() => {
                        best = c;
                        improved = true;
                        break;
                    }
                    _ => {
                        sel.choice.insert(class, current);
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    best
}

fn tree_selection(g: &TensorGraph, nc: &impl NodeCost) -> Selection {
    let mut best: BTreeMap<Id, (f64, usize)> = BTreeMap::new();
    let mut classes: Vec<Id> = g.classes().map(|c| c.id).collect();
    classes.sort();
    loop {
        let mut changed = false;
        for &class in &classes {
            for (i, node) in g[class].nodes.iter().enumerate() {
                let children: Option<f64> = node.children().iter().map(|c| best.get(&g.find(*c)).map(|b| b.0)).sum();
                let Some(children) = children else { continue };
                let total = nc.cost(g, class, node) + children;
                if best.get(&class).is_none_or(|b| total < b.0) {
                    best.insert(class, (total, i));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    Selection { choice: best.into_iter().map(|(c, (_, i))| (c, i)).collect() }
}

/// The classes the selection reaches from `root`, in id order.
fn reachable(g: &TensorGraph, root: Id, sel: &Selection) -> BTreeSet<Id> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(c) = stack.pop() {
        if seen.insert(c) {
            stack.extend(g[c].nodes[sel.choice[&c]].children().iter().map(|x| g.find(*x)));
        }
    }
    seen
}

/// Each reached class paid once; `None` if the selection has a cycle.
fn dag_cost(g: &TensorGraph, root: Id, sel: &Selection, nc: &impl NodeCost) -> Option<f64> {
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state: BTreeMap<Id, u8> = BTreeMap::new();
    let mut total = 0.0;
    let mut stack = vec![(root, false)];
    while let Some((c, children_done)) = stack.pop() {
        if children_done {
            state.insert(c, 2);
            total += nc.cost(g, c, &g[c].nodes[sel.choice[&c]]);
            continue;
        }
        match state.get(&c) {
            Some(2) => continue,
            Some(1) => return None,
            _ => {}
        }
        state.insert(c, 1);
        stack.push((c, true));
        for child in g[c].nodes[*sel.choice.get(&c)?].children() {
            let child = g.find(*child);
            match state.get(&child) {
                Some(1) => return None,
                Some(2) => {}
                _ => stack.push((child, false)),
            }
        }
    }
    Some(total)
}

fn build(g: &TensorGraph, root: Id, sel: &Selection) -> RecExpr<TensorLang> {
    let mut expr = RecExpr::default();
    let mut done: BTreeMap<Id, Id> = BTreeMap::new();
    let mut stack = vec![(root, false)];
    while let Some((c, ready)) = stack.pop() {
        if done.contains_key(&c) {
            continue;
        }
        let node = &g[c].nodes[sel.choice[&c]];
        if ready {
            let n = node.clone().map_children(|x| done[&g.find(x)]);
            done.insert(c, expr.add(n));
        } else {
            stack.push((c, true));
            for child in node.children().iter().rev() {
                stack.push((g.find(*child), false));
            }
        }
    }
    expr
}
