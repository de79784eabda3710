//! Attention in a plan: its launch shape, its score and mask functions
//! ([`KernelFns`]) and what
//! a launch with a mask function visits, from the mask's tile functions
//! (`sparsity`): the fraction of its tiles (the work the plan prices) and
//! the loop iterations their reads add (what Mesa's CPU drivers bound).

use super::KernelSpec;
use crate::ir::{AttnFns, DimValues, Domain, Func, HeadMix, Mask, MaskKind, NodeId, Op, Program, Weights};
use crate::sparsity::TileFns;
use serde::Serialize;

/// Attention's score and mask functions as kernels compile them: dims
/// replaced by their values. The tensors they read are bound after the
/// launch's operands, before its output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelFns {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<Func>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<Func>,
    /// The mask's tile functions (`sparsity`), which skip empty tiles and
    /// the mask on full ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiles: Option<TileFns>,
    /// The shapes of the tensors read, in binding order.
    pub captures: Vec<Vec<usize>>,
    /// Head mixing inside the softmax (its matrices among the captures).
    #[serde(skip_serializing_if = "HeadMix::is_identity")]
    pub mix: HeadMix,
    /// Per capture: whether its buffer holds integers
    /// (`BufferRole::Input::integers`), which half-precision kernels read
    /// as [`INTEGER_DIGITS`] base-256 digits.
    #[serde(skip_serializing_if = "no_integers")]
    pub integers: Vec<bool>,
    /// How scores become weights, and a softmax's sink (a capture): the
    /// kernels compute a plain softmax only ([`KernelSpec::kernel_gap`]).
    #[serde(skip_serializing_if = "Weights::is_softmax")]
    pub weights: Weights,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink: Option<usize>,
}

fn no_integers(v: &[bool]) -> bool {
    !v.contains(&true)
}

/// Digits a value of an integer buffer takes in a half-precision plan:
/// `v = (d0 · 256 + d1) · 256 + d2` with `d1`, `d2` in `0..256`, each exact
/// in f16 and bf16, so every integer of magnitude below 2^24 is exact.
pub const INTEGER_DIGITS: usize = 3;

/// Elements a value of a buffer takes in a plan of `dtype`:
/// [`INTEGER_DIGITS`] for `integers` in 16-bit storage, else 1.
pub fn value_elements(integers: bool, dtype: super::Dtype) -> usize {
    if integers && dtype.is_half() {
        INTEGER_DIGITS
    } else {
        1
    }
}

/// Per node: an input of integers (`integers(lo, hi)`) that only
/// attention's functions (not as a mixing matrix) and block tables read,
/// and no output is, so its buffer may store digits ([`INTEGER_DIGITS`]).
pub(super) fn integer_reads(p: &Program) -> Vec<bool> {
    let mut ok = vec![false; p.nodes.len()];
    for input in &p.inputs {
        ok[input.node.0 as usize] = matches!(input.domain, Domain::Integers { .. });
    }
    for node in &p.nodes {
        let mut reads: Vec<NodeId> = node.op.attn_fns().map_or(vec![], |f| {
            let mixing = [f.mix.logits, f.mix.probs];
            (f.captures.iter().enumerate()).filter(|(i, _)| !mixing.contains(&Some(*i))).map(|(_, c)| *c).collect()
        });
        // A paged cache's block table (`KernelSpec::Paged` reads its digits).
        if let Op::Paged { pages, .. } = node.op {
            reads.push(pages);
        }
        for o in node.op.operands() {
            if !reads.contains(&o) {
                ok[o.0 as usize] = false;
            }
        }
    }
    for (_, o) in &p.outputs {
        ok[o.0 as usize] = false;
    }
    ok
}

/// Loop iterations the reads of a mask's tile functions add (`sparsity::read_trips`).
pub(super) fn read_trips(fns: &Option<KernelFns>, rows: usize, tile: usize, tiles: usize, keys: bool) -> usize {
    match fns.as_ref().and_then(|f| f.tiles.as_ref()) {
        Some(t) => crate::sparsity::read_trips(t, rows, tile, tiles, keys),
        None => 0,
    }
}

/// The fraction of an attention launch's (query tile, key tile) pairs its
/// kernel visits, by its mask's tile functions at its tiling; 1 without
/// them. A tile whose functions read a tensor counts as visited (no data
/// at plan time).
pub fn visited_fraction(spec: &KernelSpec) -> f64 {
    use crate::ir::func_eval::{eval, FVal, NoData};
    let (KernelSpec::Attention { shape: AttnShape { batch, h, s, sk, fns: Some(f), .. }, .. }
    | KernelSpec::AttentionLse { shape: AttnShape { batch, h, s, sk, fns: Some(f), .. }, .. }
    | KernelSpec::AttentionGrad { shape: AttnShape { batch, h, s, sk, fns: Some(f), .. }, .. }) = spec
    else {
        return 1.0;
    };
    let Some(t) = &f.tiles else { return 1.0 };
    let tiles = spec.attention_tiles();
    let (bq, bk) = (tiles.cube_rows().max(1), tiles.key_tile.max(1));
    // Heads and batches alike unless the functions say otherwise: sample the first of each.
    let (heads, batches) = ((*h).min(4), (*batch).min(2));
    let (mut seen, mut all) = (0usize, 0usize);
    for b in 0..batches {
        for hh in 0..heads {
            for q0 in (0..*s).step_by(bq) {
                for k0 in (0..*sk).step_by(bk) {
                    let (q1, k1) = ((q0 + bq - 1).min(s - 1), (k0 + bk - 1).min(sk - 1));
                    let args = [b, hh, q0, q1, k0, k1].map(|x| FVal::Int(x as i64));
                    let any = eval(&t.any.body, &args, &NoData).map_or(true, FVal::bool);
                    seen += usize::from(any);
                    all += 1;
                }
            }
        }
    }
    if all == 0 {
        1.0
    } else {
        seen as f64 / all as f64
    }
}

/// Attention's functions for kernels (dims resolved, captured shapes), if any.
pub(super) fn kernel_fns(
    fns: &Option<Box<AttnFns>>,
    shapes: &[Vec<usize>],
    dims: &DimValues,
    integers: &[bool],
) -> Option<KernelFns> {
    let f = fns.as_deref()?;
    Some(KernelFns {
        score: f.score.as_ref().map(|x| x.resolve(dims)),
        mask: f.mask.as_ref().map(|x| x.resolve(dims)),
        tiles: f.mask.as_ref().map(|m| {
            let t = crate::sparsity::tile_fns(m);
            crate::sparsity::TileFns { any: t.any.resolve(dims), hidden: t.hidden.resolve(dims) }
        }),
        captures: f.captures.iter().map(|c| shapes[c.0 as usize].clone()).collect(),
        mix: f.mix,
        integers: f.captures.iter().map(|c| integers[c.0 as usize]).collect(),
        weights: f.weights,
        sink: f.sink,
    })
}

/// The attention launch shape of queries `sq` (`[batch, h, s, d]`) against
/// keys `sk` (`[batch, hk, sk, d]`) and values `e` wide (0 where none are read).
pub(super) fn attn_shape(
    sq: &[usize],
    sk: &[usize],
    e: usize,
    mask: &Mask,
    scale: f64,
    fns: Option<KernelFns>,
) -> AttnShape {
    let Mask { kind, window, block } = *mask;
    AttnShape {
        batch: sq[0],
        h: sq[1],
        hk: sk[1],
        s: sq[2],
        sk: sk[2],
        d: sq[3],
        e,
        mask: kind,
        window: window.map(|w| w as usize),
        block: block as usize,
        scale_bits: scale.to_bits(),
        fns,
    }
}

/// What an attention launch (the forward, the log-sum-exp, a gradient)
/// computes with: `batch` × `h` query heads of `s` rows against `hk`
/// key/value heads of `sk` rows, query and key width `d`, value width `e`,
/// the mask, and the score scale (`f64` bits, so the spec compares exactly).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttnShape {
    pub batch: usize,
    pub h: usize,
    pub hk: usize,
    pub s: usize,
    pub sk: usize,
    pub d: usize,
    pub e: usize,
    pub mask: MaskKind,
    pub window: Option<usize>,
    pub block: usize,
    pub scale_bits: u64,
    /// Score and mask functions, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fns: Option<KernelFns>,
}

impl AttnShape {
    /// The score scale the kernels multiply by.
    pub fn scale(&self) -> f32 {
        f64::from_bits(self.scale_bits) as f32
    }

    /// Whether some pair may be hidden: a built-in mask, a window or a mask
    /// function (the kernels tile such a launch as masked: smaller tiles skip more).
    pub fn masked(&self) -> bool {
        self.mask != MaskKind::None || self.window.is_some() || self.fns.as_ref().is_some_and(|f| f.mask.is_some())
    }
}
