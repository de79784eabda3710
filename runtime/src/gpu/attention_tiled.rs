//! The CPU-tiled attention kernel, FlashAttention-2 style, assembled on the host from
//! `#[cube]` helpers so that every loop over channels and keys is unrolled.
//!
//! A cube of [`ATTN_ROWS`] units owns `ATTN_ROWS · R` query rows of one
//! (batch, head), `R` rows per unit (rows `u`, `u + ATTN_ROWS`, …; see
//! `plan::AttnTiles`), their queries (pre-scaled) and output
//! accumulators in registers as vectors of the line size. It walks key tiles of `bk` rows: each key row is loaded once
//! per plane, every lane loading its share of the row's vectors, and reaches
//! the other lanes by plane broadcasts. Per tile the scores go to registers,
//! the running max is updated once and the accumulator rescaled once, then
//! `exp(score − max)` weights the value rows.
//!
//! The tiles visited come from the mask, per cube: every visible key lies in
//! an interval of rows per query row, monotone in the row, so the visible
//! tiles are consecutive, the few at either end partly masked and those
//! between seen whole by every row; one loop walks them (`kit::walk::KeyWalk`), its
//! tile emitted once, and masks a tile's scores only on the boundary (one
//! uniform branch a tile); tiles no row sees are never loaded. Causal cubes
//! run heaviest first.
//!
//! Loop iterations per unit: one per key tile, and per part of a tile
//! unrolled in parts (see `plan::KernelSpec::loop_trips`).

use super::attention::{load_query, row_slots, store_row};
use super::kernels::{self as k, Stored};
use super::kit::launch::{Inputs, Shape, ROW_I, ROW_OUT, ROW_Q};
use super::kit::norm::{self, store_lse, store_partial, Step};
use super::kit::pair::mask_scores;
use super::kit::source::key_address;
use super::kit::walk::{in_parts, setup, KeyWalk, TileAt, SET_K, SET_V};
use crate::gpu::kernels::Vecs;
use attnc_compiler::plan::ATTN_ROWS;
use cubecl::prelude::*;

/// What the kernel writes: attention's rows, or each query row's
/// log-sum-exp (row-major `[B, H, S]`, `NO_KEYS` for a row that sees no
/// key; `KernelSpec::AttentionLse`), for which no value is read.
pub enum Out<'a, N: Size> {
    Rows(&'a mut Vecs<N>),
    Lse(&'a mut NativeExpand<[Stored]>),
}

/// Emit the kernel body for vectors of `N` (`lanes` floats), spreading each
/// key and value row over planes of `plane` units (1: every unit loads whole rows).
pub fn build<N: Size>(scope: &Scope, x: &Inputs<N>, out: Out<N>, scale: NativeExpand<f32>, a: &Shape, plane: u32) {
    let (q, kb, v, lanes) = (x.q, x.k, x.v, a.lanes);
    let dl = a.g.d / lanes;
    let el = if matches!(out, Out::Lse(_)) { 0 } else { a.g.e / lanes };
    let (bk, nr) = (a.tiles.key_tile, a.tiles.unit_rows);
    let bq = ATTN_ROWS * nr;
    let (split_tiles, split_stride) = a.kv.map_or((0, 0), |kv| (kv.tiles, kv.stride));
    let set = setup::expand(scope, a.g, bq, bk, a.views, split_tiles);
    let mut units = Vec::with_capacity(nr);
    for r in 0..nr {
        let slots = row_slots::expand(scope, a.g, bq, r, a.views, split_stride);
        let qr = load_query::expand::<N>(scope, q, k::uget::expand(scope, &slots, ROW_Q), scale, dl);
        let acc = k::vzeros::expand::<N>(scope, el);
        let state = norm::start(scope, a);
        units.push(UnitRow { slots, qr, acc, state });
    }
    let lane = k::plane_lane::expand(scope, plane.max(1));
    // The tile's rows unrolled at once; a wider tile (fragment tiling) is
    // walked in parts, an online-softmax step each.
    let part = a.tiles.unrolled_rows(dl + el, a.half);
    KeyWalk::new(scope, &set, a, bk).walk(scope, |scope, (kt, masked, hidden)| {
        let k0 = k::mul_const::expand(scope, kt, bk);
        let tile = |scope: &Scope, k0| {
            let at = TileAt { a, set: &set, lane, k0, bk: part, dl, el, plane, masked, hidden };
            let t = KeyTile { at, kb, v, rows: &units };
            t.emit(scope)
        };
        in_parts(scope, k0, bk, part, tile);
    });
    match out {
        Out::Rows(out) => {
            for u in &units {
                match a.kv {
                    Some(kv) => store_partial::expand::<N>(
                        scope,
                        out,
                        &u.acc,
                        &u.state,
                        &u.slots,
                        ROW_OUT,
                        (a.g.s, el),
                        (kv, a.g.norm),
                    ),
                    None => store_row::expand::<N>(scope, out, &u.acc, &u.state, &u.slots, a.g.s, el, a.g.norm),
                }
                if let Some(lse) = &a.lse {
                    store_lse::expand(scope, &mut lse.clone_unchecked(), &u.state, &u.slots, a.g.s, a.g.fold, a.g.norm);
                }
            }
        }
        Out::Lse(out) => {
            for u in &units {
                store_lse::expand(scope, out, &u.state, &u.slots, a.g.s, a.g.fold, a.g.norm);
            }
        }
    }
}

/// One query row of a unit: its addresses, scaled query, accumulator and
/// softmax state `[running max, running sum]`.
struct UnitRow<N: Size> {
    slots: NativeExpand<Array<usize>>,
    qr: NativeExpand<Array<Vector<f32, N>>>,
    acc: NativeExpand<Array<Vector<f32, N>>>,
    state: NativeExpand<Array<f32>>,
}

/// One key tile of one cube ([`TileAt`]) against the unit's rows.
struct KeyTile<'a, N: Size> {
    at: TileAt<'a>,
    kb: &'a Vecs<N>,
    v: &'a Vecs<N>,
    rows: &'a [UnitRow<N>],
}

impl<N: Size> KeyTile<'_, N> {
    fn row(&self, scope: &Scope, x: &Vecs<N>, row: NativeExpand<usize>, n: usize) -> Vec<NativeExpand<Vector<f32, N>>> {
        shared_row(scope, x, row, n, self.at.lane, self.at.plane)
    }

    /// Every key row of the tile is loaded once and serves each of the
    /// unit's query rows; then one rescale per row, and each value row is
    /// loaded once and accumulated into every row.
    fn emit(&self, scope: &Scope) {
        let a = self.at.a;
        let k_base = k::uget::expand(scope, self.at.set, SET_K);
        let v_base = k::uget::expand(scope, self.at.set, SET_V);
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|u| {
                let i = k::uget::expand(scope, &u.slots, ROW_I);
                let qr: Vec<_> = (0..self.at.dl).map(|c| k::vget::expand::<N>(scope, &u.qr, c)).collect();
                (i, qr)
            })
            .collect();
        let mut scores = vec![Vec::with_capacity(self.at.bk); rows.len()];
        let mut value_rows = Vec::with_capacity(self.at.bk);
        for jj in 0..self.at.bk {
            let clamp = self.at.masked.is_some();
            let row = key_address(scope, a, self.at.k0, k_base, jj, clamp, a.views[1]);
            value_rows.push(key_address(scope, a, self.at.k0, v_base, jj, clamp, a.views[2]));
            let keys = self.row(scope, self.kb, row, self.at.dl);
            for ((_, qr), sc) in rows.iter().zip(&mut scores) {
                let mut dot = k::fconst::expand(scope, 0.0);
                for (qc, kc) in qr.iter().zip(&keys) {
                    dot = k::dot_add::expand::<N>(scope, dot, *qc, *kc);
                }
                sc.push(dot);
            }
        }
        let scores: Vec<_> = (rows.iter().zip(scores))
            .map(|((i, _), sc)| mask_scores(scope, sc, &self.at.masked, self.at.hidden, *i, self.at.k0, a))
            .collect();
        // One rescale per row and tile.
        let mut outs = vec![];
        let mut steps = vec![];
        for (u, sc) in self.rows.iter().zip(&scores) {
            let step = Step::open(scope, a.g.norm, &u.state, sc);
            outs.push(
                (0..self.at.el)
                    .map(|c| k::vscale::expand::<N>(scope, k::vget::expand::<N>(scope, &u.acc, c), step.corr))
                    .collect::<Vec<_>>(),
            );
            steps.push(step);
        }
        for (jj, row) in value_rows.into_iter().enumerate() {
            let vals = self.row(scope, self.v, row, self.at.el);
            for r in 0..self.rows.len() {
                let p = steps[r].weight(scope, scores[r][jj]);
                for (o, vc) in outs[r].iter_mut().zip(&vals) {
                    *o = k::axpy::expand::<N>(scope, *o, p, *vc);
                }
            }
        }
        for (r, u) in self.rows.iter().enumerate() {
            let mut acc = u.acc;
            for (c, o) in outs[r].iter().enumerate() {
                k::vset::expand::<N>(scope, &mut acc, c, *o);
            }
            steps[r].close(scope, &u.state);
        }
    }
}

/// The `n` vectors of row `row` of `x`, in chunk order: loaded by their
/// lanes and broadcast when rows are spread over a plane of `plane` units
/// (`lane`: this unit's lane in it).
pub(super) fn shared_row<N: Size>(
    scope: &Scope,
    x: &Vecs<N>,
    row: NativeExpand<usize>,
    n: usize,
    lane: NativeExpand<usize>,
    plane: u32,
) -> Vec<NativeExpand<Vector<f32, N>>> {
    if plane <= 1 {
        let zero = NativeExpand::from_lit(scope, 0usize);
        return (0..n).map(|c| k::vload_share::expand::<N>(scope, x, row, zero, n, c, n)).collect();
    }
    let per = n.div_ceil(plane as usize);
    let held: Vec<_> = (0..per).map(|r| k::vload_share::expand::<N>(scope, x, row, lane, per, r, n)).collect();
    (0..n).map(|c| k::from_lane::expand::<N>(scope, held[c % per], (c / per) as u32)).collect()
}
