//! A program: its nodes, inputs, dims and outputs, and its printing.

use super::*;
use std::fmt;
use std::fmt::Write;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub shape: Shape,
}

/// How `--seed` draws an input. Every value is a pure function of the seed
/// and the input's name (see the runtime's generator).
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Uniform {
        lo: f64,
        hi: f64,
    },
    Normal {
        mean: f64,
        std: f64,
    },
    /// Integers `lo..=hi`, as floats.
    Integers {
        lo: i64,
        hi: Limit,
    },
    Bernoulli {
        p: f64,
    },
}

/// The upper end of an integer domain: a number, or a size (a product of
/// dims) plus a constant, `integers(0, N)` or `integers(0, NB - 1)`, taken
/// at the run's dims, which input tensors may fix. Its `Debug` is its
/// `Display` (`10`, `N`, `NB - 1`), as bindings show domains.
#[derive(Clone, PartialEq)]
pub enum Limit {
    Int(i64),
    Size { size: Dim, plus: i64 },
}

impl Limit {
    /// The value at `dims` (every dim bound).
    pub fn at(&self, dims: &DimValues) -> i64 {
        match self {
            Limit::Int(v) => *v,
            Limit::Size { size, plus } => size
                .eval(&|s| dims.get(s).copied())
                .map_or(i64::MAX, |v| (v.min(i64::MAX as u64 / 2) as i64).saturating_add(*plus)),
        }
    }

    /// The least value it can take (sizes are at least 1).
    pub fn least(&self) -> i64 {
        match self {
            Limit::Int(v) => *v,
            Limit::Size { size, plus } => size.at_ones().saturating_add(*plus),
        }
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Int(v) => write!(f, "{v}"),
            Limit::Size { size, plus: 0 } => write!(f, "{size}"),
            Limit::Size { size, plus } if *plus < 0 => write!(f, "{size} - {}", -plus),
            Limit::Size { size, plus } => write!(f, "{size} + {plus}"),
        }
    }
}

/// The values an input may hold (`input r: [B, G] in integers(1, K)`); checked
/// before a run, with the offending index named.
#[derive(Clone, Debug, PartialEq)]
pub enum Domain {
    /// Anything, NaN and infinities included (they propagate per IEEE).
    Any,
    /// Finite numbers.
    Finite,
    /// Integers `lo..=hi`.
    Integers { lo: i64, hi: Limit },
    /// 0 or 1.
    Binary,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub name: String,
    pub node: NodeId,
    pub init: Init,
    pub domain: Domain,
    /// Declared with `weight`: fixed across calls in inference.
    pub weight: bool,
}

/// A symbolic size and the value it takes when no tensor fixes it (`--seed`).
#[derive(Clone, Debug, PartialEq)]
pub struct DimDecl {
    pub name: String,
    pub default: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub name: String,
    pub dims: Vec<DimDecl>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<(String, NodeId)>,
}

impl Program {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }
    pub fn shape(&self, id: NodeId) -> &Shape {
        &self.node(id).shape
    }
    pub fn input_shape(&self, index: usize) -> &Shape {
        self.shape(self.inputs[index].node)
    }

    /// Removes nodes no output depends on (inputs always stay: they are the
    /// spec's interface), renumbering the rest in order.
    pub fn prune_dead(&mut self) {
        let mut live = vec![false; self.nodes.len()];
        for (_, id) in &self.outputs {
            live[id.0 as usize] = true;
        }
        for input in &self.inputs {
            live[input.node.0 as usize] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for operand in self.nodes[i].op.operands() {
                    live[operand.0 as usize] = true;
                }
            }
        }
        let mut new_id = vec![NodeId(u32::MAX); self.nodes.len()];
        let mut kept = Vec::new();
        for (i, node) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if live[i] {
                new_id[i] = NodeId(kept.len() as u32);
                kept.push(node);
            }
        }
        for node in &mut kept {
            node.op.map_operands(|id| new_id[id.0 as usize]);
        }
        self.nodes = kept;
        self.inputs.iter_mut().for_each(|i| i.node = new_id[i.node.0 as usize]);
        self.outputs.iter_mut().for_each(|o| o.1 = new_id[o.1 .0 as usize]);
    }

    /// A readable listing, one node per line; stable text for snapshots.
    pub fn pretty(&self) -> String {
        let mask_text = |mask: &Mask| {
            let window = mask.window.map_or("none".into(), |w| w.to_string());
            format!("mask={}, window={window}, block={}", mask.kind.name(), mask.block)
        };
        let fns_text = |fns: &Option<Box<AttnFns>>| {
            let Some(f) = fns else { return String::new() };
            let mut t = String::new();
            for func in [&f.score, &f.mask].into_iter().flatten() {
                let _ = write!(t, ", {}_fn={func}", func.kind.name());
            }
            let reads: Vec<String> = f.captures.iter().map(|c| c.to_string()).collect();
            let _ = write!(t, ", reads=[{}]", reads.join(", "));
            for (name, c) in [("mix_logits", f.mix.logits), ("mix_probs", f.mix.probs), ("lengths", f.lengths)] {
                if let Some(c) = c {
                    let _ = write!(t, ", {name}={}", f.captures[c]);
                }
            }
            if !f.weights.is_softmax() {
                let _ = write!(t, ", weights={}", f.weights.name());
            }
            if let Some(c) = f.sink {
                let _ = write!(t, ", sink={}", f.captures[c]);
            }
            t
        };
        let mut out = format!("program {}\n", self.name);
        for d in &self.dims {
            let _ = writeln!(out, "  dim {}{}", d.name, d.default.map_or(String::new(), |v| format!(" = {v}")));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let name = n.op.name();
            let desc = match &n.op {
                Op::Input { index } => {
                    let input = &self.inputs[*index];
                    let kind = if input.weight { "weight" } else { "input" };
                    match &input.domain {
                        Domain::Any => format!("{kind} {}", input.name),
                        Domain::Finite => format!("{kind} {} in finite", input.name),
                        Domain::Binary => format!("{kind} {} in binary", input.name),
                        Domain::Integers { lo, hi } => format!("{kind} {} in integers({lo}, {hi})", input.name),
                    }
                }
                Op::Scalar { value } => format!("{name} {value:?}"),
                Op::MatMul { a, b } => format!("{name} {a}, {b}"),
                Op::SplitHeads { x, heads } => format!("{name} {x}, heads={heads}"),
                Op::MergeHeads { x } => format!("{name} {x}"),
                Op::MixHeads { x, alpha } => format!("{name} {x}, {alpha}"),
                Op::Interleave { x } => format!("{name} {x}"),
                Op::Deinterleave { x, pseudo } => format!("{name} {x}, pseudo={pseudo}"),
                Op::BlockDiag { r, block } => format!("{name} {r}, block={block}"),
                Op::Collapse { x, r } => format!("{name} {x}, {r}"),
                Op::Rope { x, base, offset } if offset.as_known() == Some(0) => format!("{name} {x}, base={base:?}"),
                Op::Rope { x, base, offset } => format!("{name} {x}, base={base:?}, offset={offset}"),
                Op::Concat { a, b, axis } => format!("{name} {a}, {b}, axis={axis}"),
                Op::Slice { x, axis, len, at_end: false } => format!("{name} {x}, axis={axis}, first={len}"),
                Op::Slice { x, axis, len, at_end: true } => format!("{name} {x}, axis={axis}, last={len}"),
                Op::Paged { cache, pages } => format!("{name} {cache}, pages={pages}"),
                Op::Attention { q, k, v, mask, scale, fns } => {
                    format!("{name} {q}, {k}, {v}, {}, scale={scale:?}{}", mask_text(mask), fns_text(fns))
                }
                Op::Binary { op, a, b } => format!("{} {a}, {b}", op.name()),
                Op::Unary { op, x } => format!("{} {x}", op.name()),
                Op::Constant { values, shape } if shape.len() == 1 => format!("{name} {values:?}"),
                Op::Constant { values, shape } => format!("{name} {values:?}, shape={shape:?}"),
                Op::Reduce { x, kind, axes, keepdim } => {
                    format!("{name}_{} {x}, axes={axes:?}, keepdim={keepdim}", kind.name())
                }
                Op::LooMean { x, axis } => format!("{name} {x}, axis={axis}"),
                Op::Where { cond, a, b } => format!("{name} {cond}, {a}, {b}"),
                Op::Thresholds { x, levels } => format!("{name} {x}, levels={levels}"),
                Op::MixCols { y, alpha } => format!("{name} {y}, {alpha}"),
                Op::CollapseCols { y, r } => format!("{name} {y}, {r}"),
                Op::CollapseRows { w, r } => format!("{name} {w}, {r}"),
                Op::UnflattenHeads { x, pseudo } => format!("{name} {x}, pseudo={pseudo}"),
                Op::FlattenHeads { x } => format!("{name} {x}"),
                Op::ConcatCols { a, b } => format!("{name} {a}, {b}"),
                Op::SliceCols { x, start, len } => format!("{name} {x}, start={start}, len={len}"),
                Op::Transpose { x } => format!("{name} {x}"),
                Op::MatMulAt { a, b } => format!("{name} {a}, {b}"),
                Op::Unsqueeze { x, axes } => format!("{name} {x}, axes={axes:?}"),
                Op::MixHeadsT { y, alpha } => format!("{name} {y}, {alpha}"),
                Op::MixHeadsGrad { x, dy } => format!("{name} {x}, {dy}"),
                Op::CollapseT { dy, r, pseudo } => format!("{name} {dy}, {r}, pseudo={pseudo}"),
                Op::CollapseGrad { x, dy } => format!("{name} {x}, {dy}"),
                Op::AttentionLse { q, k, mask, scale, fns } => {
                    format!("{name} {q}, {k}, {}, scale={scale:?}{}", mask_text(mask), fns_text(fns))
                }
                Op::MixColsT { dy, alpha } => format!("{name} {dy}, {alpha}"),
                Op::MixColsGrad { y, dy, m, h, p } => format!("{name} {y}, {dy}, m={m}, h={h}, p={p}"),
                Op::CollapseColsGrad { y, dy, h } => format!("{name} {y}, {dy}, h={h}"),
                Op::CollapseRowsGrad { w, dy, h } => format!("{name} {w}, {dy}, h={h}"),
                Op::AttentionDelta { q, k, v, dout, lse, mask, scale, fns } => format!(
                    "{name} {q}, {k}, {v}, {dout}, {lse}, {}, scale={scale:?}{}",
                    mask_text(mask),
                    fns_text(fns)
                ),
                Op::AttentionGrad { q, k, v, o, dout, lse, mask, scale, wrt, fns } => format!(
                    "{name}_{} {q}, {k}, {v}, {o}, {dout}, {lse}, {}, scale={scale:?}{}",
                    format!("{wrt:?}").to_lowercase(),
                    mask_text(mask),
                    fns_text(fns)
                ),
            };
            let _ = writeln!(out, "  %{i} = {desc} : {}", n.shape);
        }
        for (name, id) in &self.outputs {
            let _ = writeln!(out, "  output {name} = {id}");
        }
        out
    }
}
