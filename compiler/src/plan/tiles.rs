//! How attention launches are tiled: rows per unit and per cube, key (or
//! query) rows per tile, and the bounds that choose them (unrolled code,
//! CUDA's registers, shared memory).

use super::KernelSpec;
use crate::ir::{AttnArg, AttnFns};

/// Units per attention cube; each owns `AttnTiles::unit_rows` query rows.
pub const ATTN_ROWS: usize = 64;

/// How an attention launch is tiled: query rows per unit and key rows per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnTiles {
    /// Query rows each unit owns; a cube owns `ATTN_ROWS · unit_rows`.
    pub unit_rows: usize,
    /// Key rows per tile (one softmax rescale each).
    pub key_tile: usize,
    /// Units sharing a query row, each with a slice of its channels
    /// (register tiling; 1 otherwise).
    pub lanes: usize,
    /// Units per cube where each owns whole rows (`lanes` 1): [`ATTN_ROWS`],
    /// or one plane of 32 for the fragment backward of heads wider than 64
    /// ([`frag_grad_tiles`]), whose units own one row each.
    pub row_units: usize,
}

/// Vector operations one key tile of the CPU drivers' attention unrolls at
/// most (`unit_rows · key_tile · (dl + el)`, [`AttnTiles::new`]; half
/// that in 16-bit storage, [`AttnTiles::unrolled_rows`]): keeps a WGSL
/// attention kernel within about 160 KB. At 2048 the source was 400–540 KB
/// and lavapipe ran no faster (`bench/RESULTS.md`).
pub const UNROLL_OPS: usize = 1024;

/// Units per cube of register-tiled attention at most: CUDA gives a thread
/// of a block of `n` threads at most `65536 / n` registers (255 up to 256
/// threads), so wider rows (more lanes each) mean fewer rows per cube.
pub const REGISTER_UNITS: usize = 256;
/// Query and output floats a unit of register-tiled attention holds at
/// most ([`super::choose_path`]): with the key tile's scores and the
/// addresses, well inside the 255 registers a CUDA thread may use.
pub const REGISTER_FLOATS: usize = 64;
/// Key rows per tile of register-tiled attention.
pub const REGISTER_KEY_TILE: usize = 8;

impl AttnTiles {
    /// Query rows per cube.
    pub fn cube_rows(&self) -> usize {
        if self.lanes > 1 {
            (REGISTER_UNITS / self.lanes).min(ATTN_ROWS)
        } else {
            self.row_units * self.unit_rows
        }
    }

    /// Units per cube.
    pub fn units(&self) -> usize {
        if self.lanes > 1 {
            self.cube_rows() * self.lanes
        } else {
            self.row_units
        }
    }

    /// Key rows the CPU drivers' kernel unrolls at once for rows of `width`
    /// vectors (`dl + el`): the whole key tile where its unit's rows take
    /// at most [`UNROLL_OPS`] vector operations (half that for 16-bit
    /// storage, whose conversions double a load's code), else the largest
    /// power-of-two part of it (at least one row) that does, walked in a
    /// loop. Fragment tiling's 32-row tiles, run by that kernel where no
    /// matrix units are, take this path.
    pub fn unrolled_rows(&self, width: usize, half: bool) -> usize {
        let budget = if half { UNROLL_OPS / 2 } else { UNROLL_OPS };
        let mut rows = self.key_tile;
        while rows > 1 && rows.is_multiple_of(2) && self.unit_rows * rows * width.max(1) > budget {
            rows /= 2;
        }
        rows
    }

    /// Tiles for `dl` query and `el` value vectors a row, `s` queries over
    /// `sk` keys, `masked` when some key tiles are partly visible and
    /// `window_rows` the rows a window spans (0: none).
    ///
    /// Every key and value row a plane loads serves all `unit_rows` rows of
    /// a unit, so more rows per unit amortise the loads, broadcasts and
    /// tile bookkeeping; the registers held (`unit_rows · (dl + el)`
    /// vectors) and the unrolled tile (`unit_rows · key_tile · (dl + el)`
    /// vector operations) are bounded, and under a mask or window a cube
    /// spans at most a quarter of the queries or the window, so that few of
    /// the pairs it computes are masked.
    pub fn new(dl: usize, el: usize, s: usize, sk: usize, masked: bool, window_rows: usize) -> AttnTiles {
        let width = (dl + el).max(1);
        let pow2_floor = |x: usize| 1usize << x.max(1).ilog2();
        let mut rows = pow2_floor((256 / width).clamp(1, 8)).min(pow2_floor(s.div_ceil(ATTN_ROWS)));
        if masked {
            rows = rows.min(pow2_floor(s / (4 * ATTN_ROWS)));
        }
        if window_rows > 0 {
            rows = rows.min(pow2_floor(window_rows / ATTN_ROWS));
        }
        let key_tile = pow2_floor((UNROLL_OPS / (rows * width)).clamp(4, 32)).min(sk.next_power_of_two().max(4));
        AttnTiles { unit_rows: rows, key_tile, lanes: 1, row_units: ATTN_ROWS }
    }
}

/// Key rows per tile of attention on matrix fragments for heads of `d`
/// and `e` read in vectors of `lanes`, if it takes them: heads up to
/// [`FRAG_MAX_HEAD`]; 32 rows, or 16 past 64 so that its shared memory (64
/// query rows, a key and a value tile and the tile's probabilities in 16
/// bits, the scores in f32) stays within 32 KiB (30 KiB at 128) and
/// `tile · (d + e)` within 2048 vectors. The scalar kernel, which runs the
/// same tiling on devices without matrix units, walks such a tile in parts
/// ([`AttnTiles::unrolled_rows`]). 16-bit heads only: TF32's forward stays
/// on the f32 kernels (on fragments, ptxas spilled 8–40 bytes in some
/// specs' forward at every register budget tried).
pub fn frag_key_tile(d: usize, e: usize, lanes: usize) -> Option<usize> {
    let width = (d + e) / lanes;
    let tile = if d.max(e) > 64 { 16 } else { 32 };
    [tile, 16].into_iter().find(|t| t * width <= 2048).filter(|_| d.max(e) <= FRAG_MAX_HEAD)
}

/// Bytes of a fragment kernel's stored element: f32 under TF32 (`tf32`), else 16 bits.
pub fn frag_bytes(tf32: bool) -> usize {
    if tf32 {
        4
    } else {
        2
    }
}

/// The tiling of attention's backward on matrix fragments (dQ walks key
/// tiles, dK and dV query tiles) for heads of `d` and `e` in elements of
/// `bytes` (2, or 4 for TF32), if it takes them: a cube of 64 units (two
/// planes) or, where that does not fit, one plane of 32, each unit owning
/// one row, over tiles of 16 of the other side's rows. Its shared arrays
/// must fit in [`FRAG_SHARED`] (see [`frag_grad_shared`]): 16-bit rows
/// take 64 rows for heads up to 64 wide and 32 rows up to 128, TF32's 32
/// rows up to 64, where `d` and `e` pad to the same width (dK and dV then
/// take turns in one accumulator). A cube holds its own rows of two
/// operands (`q` and `dO`, or `k` and `v`) and one tile of the other two,
/// the tile's two f32 score products (`S` and `dP`, which also serve as the
/// fragments' scratch) and its probabilities or score gradients in the
/// storage type.
pub fn frag_grad_tiles(d: usize, e: usize, bytes: usize) -> Option<AttnTiles> {
    let alike = d.next_multiple_of(16) == e.next_multiple_of(16);
    [ATTN_ROWS, 32]
        .into_iter()
        .filter(|&rows| rows == ATTN_ROWS || alike)
        .find(|&rows| frag_grad_shared(d, e, bytes, F_GRAD_TILE, rows) <= FRAG_SHARED)
        .filter(|_| d.max(e) <= FRAG_MAX_HEAD)
        .map(|row_units| AttnTiles { unit_rows: 1, key_tile: F_GRAD_TILE, lanes: 1, row_units })
}

/// Rows of the other side a tile of the fragment backward ([`frag_grad_tiles`]).
const F_GRAD_TILE: usize = 16;

/// Bytes of shared memory the fragment backward takes for heads of `d` and
/// `e` (padded to 16) in elements of `bytes`, cubes of `rows` rows and
/// tiles of `tile` rows: the cube's rows and a tile of both heads' operands
/// and the tile's probabilities or score gradients in the storage type, two
/// f32 products of `rows` × `tile`, each tile row's log-sum-exp and `D_i`, a word a row
/// (dQ's parked output rows), and 128 bytes of alignment slack.
pub fn frag_grad_shared(d: usize, e: usize, bytes: usize, tile: usize, rows: usize) -> usize {
    let (dp, ep) = (d.next_multiple_of(16), e.next_multiple_of(16));
    bytes * ((rows + tile) * (dp + ep) + rows * tile) + 4 * (2 * rows * tile.max(16) + 2 * tile + rows) + 128
}

/// Shared memory the fragment kernels fit in: 32 KiB, the least of the
/// devices they run on (Metal, lavapipe; CUDA's static limit is 48 KiB).
pub const FRAG_SHARED: usize = 32 * 1024;

/// The widest head (`d` and `e`) attention on matrix fragments takes.
pub const FRAG_MAX_HEAD: usize = 128;

/// Rows per shared-memory tile of attention's backward (and of its
/// log-sum-exp) for heads of `d` and `e`: a power of two up to 32 with
/// `tile · (d + e)` within 2048, so that its tiles (at most
/// `tile · (d + e + 2)` floats) stay near 8 KiB.
pub fn grad_key_tile(d: usize, e: usize) -> usize {
    let t = (2048 / (d + e).max(1)).clamp(1, 32);
    1 << t.ilog2()
}

/// Channels per unrolled step of a row of `n` in attention's backward:
/// the whole row up to 64; past it, the widest power of two up to 32
/// dividing `n`, in a loop (unrolling 256 channels made Mesa's compiler
/// take minutes).
pub fn grad_chunk(n: usize) -> usize {
    if n <= 64 {
        n.max(1)
    } else {
        read_chunk(n)
    }
}

/// The widest power of two up to 32 dividing `n`: channels a loop step of
/// [`grad_chunk`] past 64, and of the read gradient's dot products at any
/// width (`plan::reads`; CUDA's compiler spilled holding whole rows' loads).
pub fn read_chunk(n: usize) -> usize {
    [32, 16, 8, 4, 2, 1].into_iter().find(|c| n.is_multiple_of(*c)).unwrap_or(1)
}

/// Loop trips of one chunked pass over a row of `n` (0 when unrolled whole).
pub(super) fn grad_steps(n: usize) -> usize {
    if grad_chunk(n) >= n {
        0
    } else {
        n / grad_chunk(n)
    }
}

/// Units per cube of attention that mixes heads inside the softmax.
pub const MIX_UNITS: usize = 128;
/// Floats of shared memory a cube of mixed attention may take (48 KiB, what
/// a CUDA block gets without opting in).
pub const MIX_SHARED: usize = 12 * 1024;
/// Query and output floats (`H_q·d + H_o·e`) up to which Mesa's CPU
/// drivers run head mixing's forward and log-sum-exp on their kernel
/// (`gpu::attention_mixed_tiled`, [`MixTiles::on_cpu`]), which holds them
/// in registers for each of a unit's rows with every head's products
/// unrolled.
pub const MIX_CPU_FLOATS: usize = 1024;
/// Rows a unit times query and output floats (`R·(H_q·d + H_o·e)`) up to
/// which the CPU drivers' kernel gives each unit several query rows
/// ([`MixTiles::on_cpu_planes`]): each key and value row a plane loads then
/// serves `R` rows a lane, but the per-key code, unrolled, grows with `R`,
/// and lavapipe's compile time faster (H = 8, d = 64 on 2026-12-06's
/// machine: R = 2 in about 14 s, R = 4 in about 65 s; once, Mesa caches
/// shaders on disk).
pub const MIX_CPU_UNROLL: usize = 4096;
/// Query rows a unit of the CPU drivers' kernel holds at most: 4, as plain
/// attention's CPU kernel (`AttnTiles::unit_rows`), so that a key row
/// serves 32 rows of a plane of 8.
pub const MIX_CPU_ROWS: usize = 4;
/// Output floats each unit of mixed attention accumulates at most.
const MIX_ACCUMULATORS: usize = 32;

/// How attention that mixes heads inside the softmax is tiled
/// (`gpu::attention_mixed`): the head counts, whether each matrix is given,
/// query rows per cube (every head of them) and key rows per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MixTiles {
    /// Softmax, output and value heads.
    pub hs: usize,
    pub ho: usize,
    pub hv: usize,
    pub logits: bool,
    pub probs: bool,
    pub rows: usize,
    pub tile: usize,
}

impl MixTiles {
    /// The tiling of attention with functions `fns` (whose captures have
    /// `shapes`), queries `sq` and values `sv` (`[batch, heads, rows,
    /// width]`; the keys for a log-sum-exp), if it mixes heads.
    pub fn of(fns: Option<&AttnFns>, shapes: &[Vec<usize>], sq: &[usize], sv: &[usize]) -> Option<MixTiles> {
        let f = fns.filter(|f| f.mixes())?;
        let cols = |c: Option<usize>, rows: usize| c.map_or(rows, |c| shapes[f.captures[c].0 as usize][1]);
        let hs = cols(f.mix.logits, sq[1]);
        let ho = cols(f.mix.probs, hs);
        let flags = [f.mix.logits.is_some(), f.mix.probs.is_some()];
        Some(MixTiles::new(sq[1], [hs, ho, sv[1]], sv[3], sq[2], flags))
    }

    /// Rows so that each unit accumulates at most `MIX_ACCUMULATORS` outputs
    /// (a power of two up to 16, no more than the queries need), key tiles of
    /// 16 rows; both halved while the cube's shared memory is past `MIX_SHARED`.
    pub fn new(hq: usize, [hs, ho, hv]: [usize; 3], e: usize, s: usize, [logits, probs]: [bool; 2]) -> MixTiles {
        let fit = (MIX_ACCUMULATORS * MIX_UNITS / (ho * e).max(1)).clamp(1, 16);
        let rows = (1usize << fit.ilog2()).min(s.next_power_of_two());
        let mut t = MixTiles { hs, ho, hv, logits, probs, rows, tile: 16 };
        while t.shared_floats(hq) > MIX_SHARED && (t.rows > 1 || t.tile > 1) {
            if t.rows > 1 {
                t.rows /= 2;
            } else {
                t.tile /= 2;
            }
        }
        t
    }

    /// Whether the CPU drivers' kernel takes a forward of `hq` query heads
    /// of `d` and output heads of `e` (see [`MIX_CPU_FLOATS`]).
    pub fn on_cpu(&self, hq: usize, d: usize, e: usize) -> bool {
        hq * d + self.ho * e <= MIX_CPU_FLOATS
    }

    /// The tiling of the CPU drivers' kernel on planes of `plane` units, for
    /// `s` query rows: one plane walks a cube's keys, each unit holding `R`
    /// rows, `R` the largest power of two up to [`MIX_CPU_ROWS`] with
    /// `R·(H_q·d + H_o·e)` within [`MIX_CPU_UNROLL`]; no more rows than the
    /// queries need.
    pub fn on_cpu_planes(&self, [hq, d, e, s]: [usize; 4], plane: usize) -> MixTiles {
        let per = (MIX_CPU_UNROLL / (hq * d + self.ho * e).max(1)).clamp(1, MIX_CPU_ROWS);
        let rows = (plane.max(1) << per.ilog2()).min(s.next_power_of_two());
        MixTiles { rows, ..*self }
    }

    /// Floats of shared memory a cube takes, at most (the backward's): the
    /// tile's scores and slopes, probabilities, products with the values and
    /// their mixings, the row statistics and the matrices.
    pub fn shared_floats(&self, hq: usize) -> usize {
        let MixTiles { hs, ho, rows, tile, logits, probs, .. } = *self;
        rows * tile * (3 * hq + 2 * hs + 2 * ho)
            + 2 * rows * hs
            + if logits { hq * hs } else { 0 }
            + if probs { hs * ho } else { 0 }
    }

    /// Loop trips of a unit (Mesa's bound), at most: per tile of each walk
    /// (one for the statistics, two for the others), loops over its score,
    /// probability, product and mixing items (each chunked past 64
    /// channels) and over the tile's keys or rows a few times.
    pub fn loop_trips(&self, pass: MixPass, [hq, d, e, s, sk]: [usize; 5]) -> usize {
        let MixTiles { hs, ho, rows, tile, .. } = *self;
        let chunks = |n: usize| if grad_chunk(n) == n { 1 } else { 1 + n / grad_chunk(n) };
        let items = |heads: usize| (rows * heads * tile).div_ceil(MIX_UNITS);
        let walk = 4 + items(hq) * chunks(d) + 4 * tile + items(ho) * chunks(e) + items(hs) + items(hq) + items(ho);
        let (walks, other) = match pass {
            MixPass::Lse => (1, sk),
            MixPass::GradK | MixPass::GradV => (1, s),
            MixPass::Delta | MixPass::GradLogits | MixPass::GradProbs => (2, sk),
            MixPass::Forward | MixPass::GradQ => (2, sk),
        };
        walks * other.div_ceil(tile) * walk
    }
}

/// What a launch of mixed attention computes (`KernelSpec::MixedAttention`).
/// The forward and the statistics run over query rows; so do `D`, `dQ` and
/// the mixing matrices' per-row gradients; `dK` and `dV` run over key rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MixPass {
    /// The output `[B, H_o, S, e]`.
    Forward,
    /// Each softmax head's log-sum-exp, `[B, H_s, S]`.
    Lse,
    /// `AttentionDelta`'s `D`, `[B, H_s, S]`.
    Delta,
    /// `dQ`, `[B, H_q, S, d]`.
    GradQ,
    /// `dK`, `[B, H_k, S_k, d]`.
    GradK,
    /// `dV`, `[B, H_v, S_k, e]`.
    GradV,
    /// `mix_logits`' gradient per (batch, query row), `[B, S, H_q, H_s]`.
    GradLogits,
    /// `mix_probs`' gradient per (batch, query row), `[B, S, H_s, H_o]`.
    GradProbs,
}

impl MixPass {
    /// The backward pass that computes attention's gradient in `wrt`, with
    /// head mixing (none without, or for a tensor a score function reads).
    pub fn of(wrt: crate::ir::AttnArg, fns: Option<&AttnFns>) -> Option<MixPass> {
        use crate::ir::AttnArg;
        let mix = fns.filter(|f| f.mixes())?.mix;
        match wrt {
            AttnArg::Q => Some(MixPass::GradQ),
            AttnArg::K => Some(MixPass::GradK),
            AttnArg::V => Some(MixPass::GradV),
            AttnArg::Read(c) if mix.logits == Some(c) => Some(MixPass::GradLogits),
            AttnArg::Read(c) if mix.probs == Some(c) => Some(MixPass::GradProbs),
            AttnArg::Read(_) => None,
        }
    }

    pub fn is_forward(&self) -> bool {
        *self == MixPass::Forward
    }

    /// The kernel's name in the plan.
    pub fn name(self) -> &'static str {
        match self {
            MixPass::Forward => "attention_mixed",
            MixPass::Lse => "attention_mixed_lse",
            MixPass::Delta => "attention_mixed_delta",
            MixPass::GradQ => "attention_mixed_grad_q",
            MixPass::GradK => "attention_mixed_grad_k",
            MixPass::GradV => "attention_mixed_grad_v",
            MixPass::GradLogits => "attention_mixed_grad_logits",
            MixPass::GradProbs => "attention_mixed_grad_probs",
        }
    }

    /// Whether cubes own key rows (and walk query tiles).
    pub fn over_keys(self) -> bool {
        matches!(self, MixPass::GradK | MixPass::GradV)
    }

    /// Operands before the captures: q, k (Lse); q, k, v (Forward); and
    /// dO, the log-sum-exp (Delta), D (the gradients).
    pub fn operands(self) -> usize {
        match self {
            MixPass::Lse => 2,
            MixPass::Forward => 3,
            MixPass::Delta => 5,
            _ => 6,
        }
    }
}

impl MixTiles {
    /// Output elements of `pass` over `batch` × `s` query rows (`sk` keys),
    /// `hq`/`hk` query and key heads, widths `d`, `e`.
    pub fn len(&self, pass: MixPass, [batch, hq, hk, s, sk, d, e]: [usize; 7]) -> usize {
        let MixTiles { hs, ho, hv, .. } = *self;
        batch
            * match pass {
                MixPass::Forward => ho * s * e,
                MixPass::Lse | MixPass::Delta => hs * s,
                MixPass::GradQ => hq * s * d,
                MixPass::GradK => hk * sk * d,
                MixPass::GradV => hv * sk * e,
                MixPass::GradLogits => s * hq * hs,
                MixPass::GradProbs => s * hs * ho,
            }
    }
}

impl KernelSpec {
    /// How an attention launch (forward or backward) is tiled, and why, in
    /// words: `attnc explain` prints it, and the manifest's `tiling` is it
    /// for launches tiled within the register file. `None` for any other.
    pub fn tiling_note(&self) -> Option<String> {
        let note = self.tiles_note()?;
        Some(match self {
            KernelSpec::Attention { kv: Some(kv), .. } => format!(
                "{note}; split-KV: {} chunks of {} keys on the grid's z, merged by a combine launch",
                kv.splits, kv.keys
            ),
            _ => note,
        })
    }

    fn tiles_note(&self) -> Option<String> {
        if let KernelSpec::MixedAttention { mix, shape, pass, .. } = self {
            let (own, walk) = if pass.over_keys() { ("key", "query") } else { ("query", "key") };
            return Some(format!(
                "head mixing: every head of {} {own} rows a cube, {MIX_UNITS} threads; {walk} tiles of {} rows walked {}, \
                 scores and probabilities in shared memory (at most {} floats)",
                mix.rows,
                mix.tile,
                if matches!(pass, MixPass::Lse | MixPass::GradK | MixPass::GradV) { "once" } else { "twice" },
                mix.shared_floats(shape.h)
            ));
        }
        let t = self.attention_tiles();
        let other = match self {
            KernelSpec::AttentionGrad { wrt: AttnArg::K | AttnArg::V, .. } => "query",
            _ => "key",
        };
        let lanes = match *self {
            KernelSpec::Attention { split, .. }
            | KernelSpec::AttentionLse { split, .. }
            | KernelSpec::AttentionGrad { split, .. } => split,
            _ => return None,
        };
        if lanes >= 1 {
            let floats = self.row_floats()?;
            let row = if matches!(self, KernelSpec::Attention { .. }) { "query row" } else { "row" };
            return Some(format!(
                "registers: {lanes} lane(s) share each {row}, each holding {} of its {} {} floats \
                 (at most {REGISTER_FLOATS} per unit, so CUDA's 255 registers hold them with the scores of a key \
                 tile); {} rows and {} threads per cube; {other} tiles of {} rows",
                floats.held / lanes,
                floats.held,
                floats.what,
                t.cube_rows(),
                t.units(),
                t.key_tile
            ));
        }
        Some(match self {
            KernelSpec::Attention { fragments: true, .. } => format!(
                "matrix fragments: one query row a unit, {} a cube (two planes); key tiles of {} rows, \
                 scores and probabilities through shared memory",
                t.cube_rows(),
                t.key_tile
            ),
            KernelSpec::AttentionGrad { fragments: true, .. } => format!(
                "matrix fragments: one row a unit, {} a cube ({} plane(s)); {other} tiles of {} rows, \
                 scores, their gradients and the probabilities through shared memory",
                t.cube_rows(),
                t.units() / 32,
                t.key_tile
            ),
            KernelSpec::Attention { .. } | KernelSpec::AttentionGrad { .. } if self.vectorised() => format!(
                "{} query row(s) a unit in vectors of {}, {} rows a cube; key tiles of {} rows (the CPU drivers' \
                 tiling: rows a unit amortise each key row's loads, within an unrolling bound)",
                t.unit_rows,
                self.line_size(),
                t.cube_rows(),
                t.key_tile
            ),
            _ => format!(
                "one row a unit, {} a cube; {other} tiles of {} rows in shared memory",
                t.cube_rows(),
                t.key_tile
            ),
        })
    }
}
