//! How many loop iterations one unit of a launch runs ([`KernelSpec::loop_trips`]):
//! Mesa's CPU drivers bound them ([`LOOP_TRIPS_CPU`]), so the executor
//! refuses a launch past the bound before anything runs.

use super::group;
use super::reads::SUM_UNROLL;
use super::spec::*;
use super::tiles::*;
use super::visited::read_trips;
use crate::ir::{AttnArg, ReduceKind};

impl KernelSpec {
    /// The most loop iterations one unit runs (every loop, nested ones
    /// multiplied, each counting its exit test), for drivers that bound them
    /// ([`LOOP_TRIPS_CPU`]), with 16-bit storage when `half`.
    pub fn loop_trips(&self, half: bool) -> usize {
        match *self {
            KernelSpec::MatMul { k, mix, .. } => k / self.line_size() + mix.map_or(0, |m| m.h * m.p),
            // One loop over the visible key tiles; a tile unrolled in parts
            // loops over them (`AttnTiles::unrolled_rows`).
            KernelSpec::Attention { shape: AttnShape { d, e, .. }, split, .. } => {
                self.walk_trips(if split == 0 { self.part_trips(d + e, half) } else { 0 })
            }
            KernelSpec::MixHeads { m, .. } => m,
            KernelSpec::MixCols { m, .. } => m,
            KernelSpec::Collapse { c, .. } | KernelSpec::CollapseCols { c, .. } => c,
            KernelSpec::CollapseRows { h, .. } => h,
            KernelSpec::Reduce { op, count, .. } => {
                if matches!(op, ReduceKind::Var { .. }) {
                    2 * count
                } else {
                    count
                }
            }
            KernelSpec::LooMean { n, .. } => n,
            KernelSpec::SinkGrad { batch, s, .. } => batch * s,
            KernelSpec::Contract { rows, inner, .. } => {
                (rows * inner).div_ceil(GROUP_UNITS) + GROUP_UNITS.ilog2() as usize
            }
            // A line's pairs, two dot products a pair in steps of `read_chunk`
            // channels; per read, each (batch, head)'s lines, `SUM_UNROLL` a step.
            KernelSpec::AttentionReadLines { shape: AttnShape { s, sk, d, e, .. }, .. } => {
                s.max(sk) * (1 + d / read_chunk(d) + e / read_chunk(e)) + 1
            }
            KernelSpec::AttentionReadSum { shape: AttnShape { batch, h, s, sk, .. }, reads, lines, .. } => {
                reads * (batch * h * (lines.count(s, sk).div_ceil(SUM_UNROLL) + 1) + 1)
            }
            KernelSpec::AttentionGrad { shape: AttnShape { d, e, .. }, wrt, dv, .. } if self.tiled_grad() => {
                let width = match wrt {
                    AttnArg::V => d + e,
                    AttnArg::K if dv.is_some() => 2 * d + 2 * e,
                    _ => 2 * d + e,
                };
                self.walk_trips(self.part_trips(width, half))
            }
            KernelSpec::AttentionLse { shape: AttnShape { d, .. }, split: 0, .. } => {
                self.walk_trips(self.part_trips(d, half))
            }
            KernelSpec::MixedAttention { shape: AttnShape { h, s, sk, d, e, .. }, mix, pass, .. } => {
                mix.loop_trips(pass, [h, d, e, s, sk])
            }
            // A loop over a tile's rows, and per row the channel loops of `grad_chunk`.
            KernelSpec::AttentionLse { shape: AttnShape { sk, d, ref fns, .. }, tile, split, .. } => {
                let d = d / split.max(1);
                let reads = read_trips(fns, self.attention_tiles().cube_rows(), tile, sk.div_ceil(tile), true);
                sk.div_ceil(tile) * (1 + tile * (1 + grad_steps(d))) + grad_steps(d) + reads
            }
            KernelSpec::AttentionGrad {
                shape: AttnShape { s, sk, h, hk, d, e, ref fns, .. },
                tile,
                wrt,
                split,
                dv,
                ..
            } => {
                let (d, e) = (d / split.max(1), e / split.max(1));
                let per_row = 1 + 2 * grad_steps(d) + grad_steps(e);
                let once = 2 * grad_steps(d) + 3 * grad_steps(e);
                let rows = self.attention_tiles().cube_rows();
                match wrt {
                    AttnArg::Q | AttnArg::Read(_) => {
                        sk.div_ceil(tile) * (1 + tile * per_row)
                            + once
                            + read_trips(fns, rows, tile, sk.div_ceil(tile), true)
                    }
                    AttnArg::K | AttnArg::V => {
                        let reads = read_trips(fns, rows, tile, s.div_ceil(tile), false);
                        // dV beside dK: one more channel loop a pair.
                        let per_row = per_row + usize::from(dv.is_some()) * grad_steps(e);
                        (h / hk) * (1 + s.div_ceil(tile) * (1 + tile * per_row + grad_steps(e)) + reads) + once
                    }
                }
            }
            KernelSpec::Group { ref steps, .. } => group::loop_trips(steps),
            _ => 1,
        }
    }

    /// Loop trips of a tiled attention launch's walk (the forward's and
    /// dQ's over key tiles, dK's and dV's over each query head's query
    /// tiles) whose tiles each run `per_tile` more: the tiles walked in
    /// parts ([`KernelSpec::part_trips`]), or the loops of the fragment
    /// kernels' products where software multiplies the fragments (the
    /// runtime's `mma::software_trips`).
    pub fn walk_trips(&self, per_tile: usize) -> usize {
        match *self {
            KernelSpec::AttentionGrad { shape: AttnShape { h, hk, s, .. }, wrt: AttnArg::K | AttnArg::V, .. } => {
                // Query heads, then the query tiles of each.
                let tiles = s.div_ceil(self.attention_tiles().key_tile);
                (h / hk) * (1 + (tiles + 1) * (1 + per_tile)) + 1
            }
            KernelSpec::Attention { shape: AttnShape { sk, ref fns, .. }, .. }
            | KernelSpec::AttentionLse { shape: AttnShape { sk, ref fns, .. }, .. }
            | KernelSpec::AttentionGrad { shape: AttnShape { sk, ref fns, .. }, .. } => {
                self.key_walk_trips(sk, per_tile, fns)
            }
            _ => 1 + per_tile,
        }
    }

    /// Loop trips of the forward's walk over `sk` keys (the forward, the
    /// log-sum-exp and dQ on the CPU drivers' tiling): one loop over the
    /// visible key tiles, `parts` more per tile walked in parts
    /// ([`KernelSpec::part_trips`]); with tile functions, unit 0 first lists
    /// the tiles (`runtime::gpu::kit::walk::KeyWalk`) and the cube reads what they read.
    fn key_walk_trips(&self, sk: usize, parts: usize, fns: &Option<KernelFns>) -> usize {
        let t = self.attention_tiles();
        let tiles = sk.div_ceil(t.key_tile);
        let listing = if fns.as_ref().is_some_and(|f| f.tiles.is_some()) { tiles + 1 } else { 0 };
        (tiles + 1) * (1 + parts) + 1 + listing + read_trips(fns, t.cube_rows(), t.key_tile, tiles, true)
    }

    /// Loop trips of one tile walked in parts (`tiles::in_parts`) for rows
    /// of `width` floats, 0 when the whole tile is unrolled
    /// ([`AttnTiles::unrolled_rows`]).
    fn part_trips(&self, width: usize, half: bool) -> usize {
        let t = self.attention_tiles();
        let part = t.unrolled_rows(width / self.line_size(), half);
        if part < t.key_tile {
            t.key_tile / part + 1
        } else {
            0
        }
    }
}
