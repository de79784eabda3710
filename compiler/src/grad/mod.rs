//! Reverse-mode differentiation as an IR → IR transformation.
//!
//! [`differentiate`] turns a forward program and the inputs to differentiate
//! into one ordinary program that computes the forward outputs and, given a
//! cotangent for every output (inputs named `cot_<output>`), the gradient of
//! every requested input (outputs named `grad_<input>`). It is validated,
//! interpreted, optimized and planned like any spec.
//!
//! Each forward node gets its vector-Jacobian product from [`Builder::vjp`]
//! in reverse order, contributions to an operand summed. What the backward
//! needs of the forward is read from the forward's own nodes; attention saves
//! its rows' log-sum-exp (`AttentionLse`), not its probabilities, and
//! `AttentionGrad` recomputes them (FlashAttention-2's backward).
//!
//! No gradient flows through comparisons, `thresholds` and `count`
//! (piecewise constant); an input with a discrete domain (`integers`,
//! `binary`) has none, and asking for it is error E0801.

mod elementwise;
mod func;
mod split;

pub use func::{read_partials, score_slope, Lines};
pub use split::{split, Split};

use crate::ir::*;
use crate::Code;
use std::collections::BTreeMap;

/// Why a gradient program cannot be built.
#[derive(Clone, Debug, PartialEq)]
pub struct GradError {
    pub code: Code,
    pub message: String,
}

impl std::fmt::Display for GradError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn no_gradient(message: String) -> GradError {
    GradError { code: Code::NoGradient, message }
}

fn internal(e: ShapeError) -> GradError {
    GradError { code: Code::Internal, message: format!("a gradient node has no valid shape: {}", e.message) }
}

/// The name of the cotangent input for output `name`.
pub fn cotangent_name(output: &str) -> String {
    format!("cot_{output}")
}

/// The name of the gradient output for input `name`.
pub fn gradient_name(input: &str) -> String {
    format!("grad_{input}")
}

/// The inputs a gradient may be asked for: every input whose domain is
/// continuous.
pub fn differentiable_inputs(program: &Program) -> Vec<String> {
    let read = asked_for_by_name(program);
    program.inputs.iter().filter(|i| continuous(i) && !read.contains(&i.node)).map(|i| i.name.clone()).collect()
}

/// The tensors attention's score and mask functions read (head-mixing
/// matrices aside) that are differentiated only when asked for by name
/// (`--wrt`): every one but a `weight` (a learned table such as a relative
/// bias) whose reads the kernels differentiate ([`Lines::on_kernels`]). An
/// `input` a function reads, such as ALiBi's fixed slopes, is a constant of
/// the model more often than a parameter, and the kernels refuse the rest
/// (the interpreter computes them).
fn asked_for_by_name(program: &Program) -> Vec<NodeId> {
    let weight = |id: &NodeId| program.inputs.iter().any(|i| i.node == *id && i.weight);
    let fns = program.nodes.iter().filter_map(|n| match &n.op {
        Op::Attention { fns: Some(f), .. } => Some(
            (f.captures.iter().enumerate())
                .filter(|(c, _)| !f.mix.reads(*c) && f.sink != Some(*c))
                .filter(|(c, id)| !weight(id) || Lines::on_kernels(f.score.as_ref(), f.mix, *c).is_none())
                .map(|(_, id)| *id)
                .collect::<Vec<_>>(),
        ),
        _ => None,
    });
    fns.flatten().collect()
}

fn continuous(input: &Input) -> bool {
    matches!(input.domain, Domain::Any | Domain::Finite)
}

/// The gradient program of `program` with respect to the inputs `wrt`
/// (every differentiable input when empty).
pub fn differentiate(program: &Program, wrt: &[String]) -> Result<Program, GradError> {
    let wrt: Vec<String> = if wrt.is_empty() { differentiable_inputs(program) } else { wrt.to_vec() };
    let mut wanted = Vec::new();
    for name in &wrt {
        let Some(index) = program.inputs.iter().position(|i| &i.name == name) else {
            let names: Vec<&str> = program.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(no_gradient(format!(
                "`{name}` is not an input of `{}` (its inputs: {})",
                program.name,
                names.join(", ")
            )));
        };
        let input = &program.inputs[index];
        if !continuous(input) {
            return Err(no_gradient(format!(
                "input `{name}` takes discrete values ({:?}): it has no gradient; differentiate by {}",
                input.domain,
                match differentiable_inputs(program).join(", ") {
                    s if s.is_empty() => "nothing: no input of this spec is continuous".to_string(),
                    s => s,
                }
            )));
        }
        if !wanted.contains(&index) {
            wanted.push(index);
        }
    }
    if wanted.is_empty() {
        return Err(no_gradient(format!(
            "`{}` has no input with a continuous domain to differentiate by",
            program.name
        )));
    }
    let wanted_nodes = wanted.iter().map(|i| program.inputs[*i].node).collect();
    // Which forward nodes depend on a differentiated input.
    let n = program.nodes.len();
    let mut depends = vec![false; n];
    for (i, node) in program.nodes.iter().enumerate() {
        depends[i] = match node.op {
            Op::Input { index } => wanted.contains(&index),
            ref op => op.operands().iter().any(|o| depends[o.0 as usize]),
        };
    }
    let mut b =
        Builder { p: program.clone(), adjoint: BTreeMap::new(), wanted: wanted_nodes, depends: depends.clone() };
    b.p.name = format!("{}_grad", program.name);
    // Cotangents: one input per output, drawn standard normal by `--seed`.
    for (name, id) in program.outputs.clone() {
        let shape = program.shape(id).clone();
        let index = b.p.inputs.len();
        let node = b.p.nodes.len();
        b.p.nodes.push(Node { op: Op::Input { index }, shape });
        b.p.inputs.push(Input {
            name: cotangent_name(&name),
            node: NodeId(node as u32),
            init: Init::Normal { mean: 0.0, std: 1.0 },
            domain: Domain::Any,
            weight: false,
        });
        if depends[id.0 as usize] {
            b.accumulate(id, NodeId(node as u32))?;
        }
    }
    for i in (0..n).rev() {
        let id = NodeId(i as u32);
        let Some(g) = b.adjoint.get(&id).copied() else { continue };
        if !depends[i] {
            continue;
        }
        let op = program.nodes[i].op.clone();
        for (operand, contribution) in b.vjp(id, &op, g)? {
            if depends[operand.0 as usize] {
                b.accumulate(operand, contribution)?;
            }
        }
    }
    for index in wanted {
        let input = &program.inputs[index];
        let grad = match b.adjoint.get(&input.node) {
            Some(g) => *g,
            // No path to an output (or only through piecewise-constant operations): zeros.
            None => {
                let zero = b.scalar(0.0)?;
                b.push(Op::Where { cond: zero, a: input.node, b: zero })?
            }
        };
        b.p.outputs.push((gradient_name(&input.name), grad));
    }
    let problems = crate::valid::validate(&b.p);
    if !problems.is_empty() {
        return Err(GradError { code: Code::Internal, message: problems.join("; ") });
    }
    Ok(b.p)
}

struct Builder {
    p: Program,
    /// The summed cotangent of each forward node reached so far.
    adjoint: BTreeMap<NodeId, NodeId>,
    /// The input nodes differentiated by (a score function's reads get a
    /// gradient operation only when asked for).
    wanted: Vec<NodeId>,
    /// Which forward nodes depend on a differentiated input (a computed
    /// head-mixing matrix gets a gradient operation only then).
    depends: Vec<bool>,
}

impl Builder {
    fn push(&mut self, op: Op) -> Result<NodeId, GradError> {
        let shape = op.infer(&|id| self.p.shape(id).clone()).map_err(internal)?;
        self.p.nodes.push(Node { op, shape });
        Ok(NodeId(self.p.nodes.len() as u32 - 1))
    }

    fn shape(&self, id: NodeId) -> Shape {
        self.p.shape(id).clone()
    }

    fn scalar(&mut self, value: f64) -> Result<NodeId, GradError> {
        self.push(Op::Scalar { value })
    }

    fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, GradError> {
        self.push(Op::Binary { op, a, b })
    }

    fn accumulate(&mut self, id: NodeId, g: NodeId) -> Result<(), GradError> {
        let sum = match self.adjoint.get(&id) {
            Some(prev) => self.binary(BinaryOp::Add, *prev, g)?,
            None => g,
        };
        self.adjoint.insert(id, sum);
        Ok(())
    }

    /// A known size of `id`'s axis `axis`, for an attribute of a gradient node.
    fn known(&self, id: NodeId, axis: usize, what: &str) -> Result<u64, GradError> {
        self.p.shape(id).0[axis].as_known().ok_or_else(|| {
            no_gradient(format!("the gradient needs a fixed {what}, but it is {}", self.p.shape(id).0[axis]))
        })
    }

    /// `g` (of a broadcast result's shape) summed down to the shape of `target`.
    fn reduce_to(&mut self, g: NodeId, target: NodeId) -> Result<NodeId, GradError> {
        let (sg, st) = (self.shape(g), self.shape(target));
        let mut g = g;
        let lead = sg.rank() - st.rank();
        if lead > 0 {
            g = self.push(Op::Reduce { x: g, kind: ReduceKind::Sum, axes: (0..lead).collect(), keepdim: false })?;
        }
        let one = Dim::known(1);
        let axes: Vec<usize> = (0..st.rank()).filter(|&i| st.0[i] == one && sg.0[lead + i] != one).collect();
        if !axes.is_empty() {
            g = self.push(Op::Reduce { x: g, kind: ReduceKind::Sum, axes, keepdim: true })?;
        }
        Ok(g)
    }

    /// `x` broadcast to the shape of `like` (whose values are never read).
    fn expand(&mut self, x: NodeId, like: NodeId) -> Result<NodeId, GradError> {
        let one = self.scalar(1.0)?;
        self.push(Op::Where { cond: one, a: x, b: like })
    }

    /// The vector-Jacobian products of node `id` (operation `op`) for its cotangent `g`.
    fn vjp(&mut self, id: NodeId, op: &Op, g: NodeId) -> Result<Vec<(NodeId, NodeId)>, GradError> {
        use BinaryOp as B;
        Ok(match *op {
            Op::Input { .. } | Op::Scalar { .. } | Op::Constant { .. } | Op::Thresholds { .. } => vec![],
            Op::Paged { .. } => {
                return Err(no_gradient(
                    "a paged key/value cache has no gradient: `pages =` serves inference (a page may be shared)".into(),
                ))
            }
            Op::MatMul { a, b } => {
                let bt = self.push(Op::Transpose { x: b })?;
                vec![(a, self.push(Op::MatMul { a: g, b: bt })?), (b, self.push(Op::MatMulAt { a, b: g })?)]
            }
            Op::SplitHeads { x, .. } => vec![(x, self.push(Op::MergeHeads { x: g })?)],
            Op::MergeHeads { x } => {
                let heads = self.known(x, self.shape(x).rank() - 3, "head count")?;
                vec![(x, self.push(Op::SplitHeads { x: g, heads })?)]
            }
            Op::MixHeads { x, alpha } => {
                vec![(x, self.push(Op::MixHeadsT { y: g, alpha })?), (alpha, self.push(Op::MixHeadsGrad { x, dy: g })?)]
            }
            Op::Interleave { x } => {
                let pseudo = self.known(x, 2, "number of pseudo-heads")?;
                vec![(x, self.push(Op::Deinterleave { x: g, pseudo })?)]
            }
            Op::Deinterleave { x, .. } => vec![(x, self.push(Op::Interleave { x: g })?)],
            Op::UnflattenHeads { x, .. } => vec![(x, self.push(Op::FlattenHeads { x: g })?)],
            Op::FlattenHeads { x } => {
                let pseudo = self.known(x, 2, "number of pseudo-heads")?;
                vec![(x, self.push(Op::UnflattenHeads { x: g, pseudo })?)]
            }
            Op::BlockDiag { r, block } => vec![(r, self.push(Op::BlockDiag { r: g, block })?)],
            Op::Collapse { x, r } => {
                let pseudo = self.known(x, 2, "number of pseudo-heads")?;
                vec![
                    (x, self.push(Op::CollapseT { dy: g, r, pseudo })?),
                    (r, self.push(Op::CollapseGrad { x, dy: g })?),
                ]
            }
            Op::Rope { x, base, ref offset } => {
                // A rotation's transpose rotates back: R(−θ) = N·R(θ)·N with N
                // negating the second half of each row.
                let d = self.known(x, self.shape(x).rank() - 1, "head width")? as usize;
                let values = (0..d).map(|i| if i < d / 2 { 1.0 } else { -1.0 }).collect();
                let n = self.push(Op::Constant { values, shape: vec![d as u64] })?;
                let flipped = self.binary(B::Mul, g, n)?;
                let rotated = self.push(Op::Rope { x: flipped, base, offset: offset.clone() })?;
                vec![(x, self.binary(B::Mul, rotated, n)?)]
            }
            Op::Attention { q, k, v, mask, scale, ref fns } => {
                let fns = fns.clone();
                let lse = self.push(Op::AttentionLse { q, k, mask, scale, fns: fns.clone() })?;
                let mixes = fns.as_ref().is_some_and(|f| f.mixes());
                // With head mixing, D is not rowsum(dO ∘ O): its own pass computes it.
                let o = match mixes {
                    true => self.push(Op::AttentionDelta { q, k, v, dout: g, lse, mask, scale, fns: fns.clone() })?,
                    false => id,
                };
                let mut out = vec![];
                // Only the operands a differentiated input flows into (`--wrt q` plans no dK or dV).
                for (operand, wrt) in [(q, AttnArg::Q), (k, AttnArg::K), (v, AttnArg::V)] {
                    if !self.depends[operand.0 as usize] {
                        continue;
                    }
                    let fns = fns.clone();
                    out.push((
                        operand,
                        self.push(Op::AttentionGrad { q, k, v, o, dout: g, lse, mask, scale, wrt, fns })?,
                    ));
                }
                // The tensors the score function reads (a mask's reads pass
                // no gradient) and the head-mixing matrices.
                let reads = fns.as_ref().map_or(vec![], |f| f.captures.clone());
                for (c, operand) in reads.into_iter().enumerate() {
                    let read =
                        fns.as_ref().and_then(|f| f.score.as_ref()).is_some_and(|s| !read_partials(s, c).is_empty());
                    let mixed = fns.as_ref().is_some_and(|f| f.mix.reads(c));
                    let sink = fns.as_ref().is_some_and(|f| f.sink == Some(c));
                    if ((read || sink) && self.wanted.contains(&operand)) || (mixed && self.depends[operand.0 as usize])
                    {
                        let wrt = AttnArg::Read(c);
                        let fns = fns.clone();
                        let grad = self.push(Op::AttentionGrad { q, k, v, o, dout: g, lse, mask, scale, wrt, fns })?;
                        // A mixing matrix's gradient comes per (batch, query row).
                        let grad = match mixed {
                            true => self.push(Op::Reduce {
                                x: grad,
                                kind: ReduceKind::Sum,
                                axes: vec![0, 1],
                                keepdim: false,
                            })?,
                            false => grad,
                        };
                        out.push((operand, grad));
                    }
                }
                out
            }
            Op::Binary { op, a, b } => match op {
                B::Add => vec![(a, self.reduce_to(g, a)?), (b, self.reduce_to(g, b)?)],
                B::Sub => {
                    let neg = self.push(Op::Unary { op: UnaryOp::Neg, x: g })?;
                    vec![(a, self.reduce_to(g, a)?), (b, self.reduce_to(neg, b)?)]
                }
                B::Mul => {
                    let (ga, gb) = (self.binary(B::Mul, g, b)?, self.binary(B::Mul, g, a)?);
                    vec![(a, self.reduce_to(ga, a)?), (b, self.reduce_to(gb, b)?)]
                }
                B::Div => {
                    // d(a/b)/db = −(a/b)/b.
                    let ga = self.binary(B::Div, g, b)?;
                    let go = self.binary(B::Mul, ga, id)?;
                    let gb = self.push(Op::Unary { op: UnaryOp::Neg, x: go })?;
                    vec![(a, self.reduce_to(ga, a)?), (b, self.reduce_to(gb, b)?)]
                }
                B::Max | B::Min => {
                    // The chosen operand takes the cotangent; ties go to `a`.
                    let pick_a = if op == B::Max { self.binary(B::Ge, a, b)? } else { self.binary(B::Ge, b, a)? };
                    let zero = self.scalar(0.0)?;
                    let ga = self.push(Op::Where { cond: pick_a, a: g, b: zero })?;
                    let gb = self.push(Op::Where { cond: pick_a, a: zero, b: g })?;
                    vec![(a, self.reduce_to(ga, a)?), (b, self.reduce_to(gb, b)?)]
                }
                B::Pow => {
                    let [da, db] = elementwise::pow_partials(self, a, b, id)?;
                    let (ga, gb) = (self.binary(B::Mul, g, da)?, self.binary(B::Mul, g, db)?);
                    vec![(a, self.reduce_to(ga, a)?), (b, self.reduce_to(gb, b)?)]
                }
                B::Ge | B::Gt | B::Eq => vec![],
            },
            Op::Unary { op, x } => match op {
                UnaryOp::Neg => vec![(x, self.push(Op::Unary { op: UnaryOp::Neg, x: g })?)],
                UnaryOp::Sqrt => {
                    // g / (2 √x); at 0, where √ has no derivative, 0 (as `abs` takes sign(0) = 0),
                    // so that a standard deviation of equal values passes no NaN back.
                    let (two, zero) = (self.scalar(2.0)?, self.scalar(0.0)?);
                    let denom = self.binary(B::Mul, two, id)?;
                    let quotient = self.binary(B::Div, g, denom)?;
                    let positive = self.binary(B::Gt, id, zero)?;
                    vec![(x, self.push(Op::Where { cond: positive, a: quotient, b: zero })?)]
                }
                UnaryOp::Abs => {
                    let zero = self.scalar(0.0)?;
                    let (pos, neg) = (self.binary(B::Gt, x, zero)?, self.binary(B::Gt, zero, x)?);
                    let sign = self.binary(B::Sub, pos, neg)?;
                    vec![(x, self.binary(B::Mul, g, sign)?)]
                }
                _ => match elementwise::unary_derivative(self, op, x, id)? {
                    Some(d) => vec![(x, self.binary(B::Mul, g, d)?)],
                    None => vec![],
                },
            },
            Op::Reduce { x, kind, ref axes, keepdim } => {
                let axes = axes.clone();
                let kept = if keepdim { g } else { self.push(Op::Unsqueeze { x: g, axes: axes.clone() })? };
                let spread = self.expand(kept, x)?;
                // The number of reduced elements, as a tensor (dims may be symbolic).
                let count = |b: &mut Builder| -> Result<NodeId, GradError> {
                    let one = b.scalar(1.0)?;
                    let ones = b.expand(one, x)?;
                    b.push(Op::Reduce { x: ones, kind: ReduceKind::Sum, axes: axes.clone(), keepdim: true })
                };
                match kind {
                    ReduceKind::Sum => vec![(x, spread)],
                    ReduceKind::Count => vec![],
                    ReduceKind::Mean => {
                        let n = count(self)?;
                        vec![(x, self.binary(B::Div, spread, n)?)]
                    }
                    ReduceKind::Max | ReduceKind::Min => {
                        // Shared evenly among the elements that attain the extremum.
                        let m = if keepdim { id } else { self.push(Op::Unsqueeze { x: id, axes: axes.clone() })? };
                        let hit = self.binary(B::Eq, x, m)?;
                        let ties =
                            self.push(Op::Reduce { x: hit, kind: ReduceKind::Sum, axes: axes.clone(), keepdim: true })?;
                        let share = self.binary(B::Div, spread, ties)?;
                        vec![(x, self.binary(B::Mul, share, hit)?)]
                    }
                    ReduceKind::Var { bessel } => {
                        // d var / d x_i = 2 (x_i − mean) / (n − bessel).
                        let mean =
                            self.push(Op::Reduce { x, kind: ReduceKind::Mean, axes: axes.clone(), keepdim: true })?;
                        let centred = self.binary(B::Sub, x, mean)?;
                        let mut n = count(self)?;
                        if bessel {
                            let one = self.scalar(1.0)?;
                            n = self.binary(B::Sub, n, one)?;
                        }
                        let two = self.scalar(2.0)?;
                        let scaled = self.binary(B::Mul, spread, centred)?;
                        let doubled = self.binary(B::Mul, scaled, two)?;
                        vec![(x, self.binary(B::Div, doubled, n)?)]
                    }
                }
            }
            // Leave-one-out means are a symmetric linear map.
            Op::LooMean { x, axis } => vec![(x, self.push(Op::LooMean { x: g, axis })?)],
            Op::Where { cond, a, b } => {
                let zero = self.scalar(0.0)?;
                let ga = self.push(Op::Where { cond, a: g, b: zero })?;
                let gb = self.push(Op::Where { cond, a: zero, b: g })?;
                vec![(a, self.reduce_to(ga, a)?), (b, self.reduce_to(gb, b)?)]
            }
            // The optimizer's folded forms (so that its candidates can be priced for training).
            Op::MixCols { y, alpha } => {
                let [m, h, p] = [0, 1, 2].map(|i| self.known(alpha, i, "mixing size"));
                let (m, h, p) = (m?, h?, p?);
                vec![
                    (y, self.push(Op::MixColsT { dy: g, alpha })?),
                    (alpha, self.push(Op::MixColsGrad { y, dy: g, m, h, p })?),
                ]
            }
            Op::CollapseCols { y, r } => {
                // y's transpose collapses with rᵀ.
                let h = self.known(r, 0, "head count")?;
                let rt = self.push(Op::Transpose { x: r })?;
                vec![
                    (y, self.push(Op::CollapseCols { y: g, r: rt })?),
                    (r, self.push(Op::CollapseColsGrad { y, dy: g, h })?),
                ]
            }
            Op::CollapseRows { w, r } => {
                let h = self.known(r, 0, "head count")?;
                let rt = self.push(Op::Transpose { x: r })?;
                vec![
                    (w, self.push(Op::CollapseRows { w: g, r: rt })?),
                    (r, self.push(Op::CollapseRowsGrad { w, dy: g, h })?),
                ]
            }
            Op::ConcatCols { a, b } => {
                let f1 = self.known(a, 1, "column count")?;
                let f2 = self.known(b, 1, "column count")?;
                vec![
                    (a, self.push(Op::SliceCols { x: g, start: 0, len: f1 })?),
                    (b, self.push(Op::SliceCols { x: g, start: f1, len: f2 })?),
                ]
            }
            Op::Concat { a, b, axis } => {
                let (la, lb) = (self.shape(a).0[axis].clone(), self.shape(b).0[axis].clone());
                vec![
                    (a, self.push(Op::Slice { x: g, axis, len: la, at_end: false })?),
                    (b, self.push(Op::Slice { x: g, axis, len: lb, at_end: true })?),
                ]
            }
            Op::Slice { x, axis, ref len, at_end } => {
                // The cotangent, with zeros for the entries left out.
                let rest = self.shape(x).0[axis].sub(len);
                if rest.as_known() == Some(0) {
                    vec![(x, g)]
                } else {
                    let like = self.push(Op::Slice { x, axis, len: rest, at_end: !at_end })?;
                    let zero = self.scalar(0.0)?;
                    let zeros = self.push(Op::Where { cond: zero, a: like, b: zero })?;
                    let (a, b) = if at_end { (zeros, g) } else { (g, zeros) };
                    vec![(x, self.push(Op::Concat { a, b, axis })?)]
                }
            }
            Op::SliceCols { x, start, len } => {
                // Zeros around the slice's cotangent, as wide as the columns left out.
                let cols = self.known(x, self.shape(x).rank() - 1, "column count")?;
                let zero = self.scalar(0.0)?;
                let mut out = g;
                if start > 0 {
                    let like = self.push(Op::SliceCols { x, start: 0, len: start })?;
                    let left = self.push(Op::Where { cond: zero, a: like, b: zero })?;
                    out = self.push(Op::ConcatCols { a: left, b: out })?;
                }
                if start + len < cols {
                    let like = self.push(Op::SliceCols { x, start: start + len, len: cols - start - len })?;
                    let right = self.push(Op::Where { cond: zero, a: like, b: zero })?;
                    out = self.push(Op::ConcatCols { a: out, b: right })?;
                }
                vec![(x, out)]
            }
            Op::Transpose { .. }
            | Op::MatMulAt { .. }
            | Op::Unsqueeze { .. }
            | Op::MixHeadsT { .. }
            | Op::MixHeadsGrad { .. }
            | Op::CollapseT { .. }
            | Op::CollapseGrad { .. }
            | Op::AttentionLse { .. }
            | Op::AttentionDelta { .. }
            | Op::AttentionGrad { .. }
            | Op::MixColsT { .. }
            | Op::MixColsGrad { .. }
            | Op::CollapseColsGrad { .. }
            | Op::CollapseRowsGrad { .. } => {
                return Err(GradError {
                    code: Code::Internal,
                    message: format!(
                        "no derivative rule for `{}`: gradient programs are not differentiated again",
                        op.name()
                    ),
                })
            }
        })
    }
}
