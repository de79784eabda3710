//! Built-in masks in the kernels: which key a query sees, the band of keys
//! a block of queries sees and the band of queries a block of keys is seen
//! by, and the tests of a tile (partly masked or not). The one definition is
//! the IR's `Mask::visible`; this is its kernel form, and the only one here.
//!
//! Positions: the queries are the last `s` of `sk` positions, so with
//! unequal lengths query row `i` is position `i + sk` against key row
//! `j + s` ([`Mask::offsets`]; equal lengths shift neither).

use cubecl::prelude::*;

pub const MASK_NONE: u32 = 0;
pub const MASK_CAUSAL: u32 = 1;
pub const MASK_TOKEN_CAUSAL: u32 = 2;

/// The score of a key a query does not see: `exp(MASKED − m)` is 0 for any
/// finite running max `m ≥ norm::M_INIT` (WGSL has no infinite literals).
pub const MASKED: f32 = -3.4e38;
/// Any score below this is [`MASKED`] (it may have been rounded or moved).
pub const MASKED_BELOW: f32 = -1.0e38;

/// The kernels' code (`MASK_*`) of a built-in mask.
pub fn mask_code(mask: attnc_compiler::ir::MaskKind) -> u32 {
    use attnc_compiler::ir::MaskKind;
    match mask {
        MaskKind::None => MASK_NONE,
        MaskKind::Causal => MASK_CAUSAL,
        MaskKind::TokenCausal => MASK_TOKEN_CAUSAL,
    }
}

/// A launch's built-in mask: its kind (`MASK_*`), window in blocks (0:
/// none), block (tokens a block) and the two lengths it compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    pub kind: u32,
    pub window: usize,
    pub block: usize,
    pub s: usize,
    pub sk: usize,
}

impl Mask {
    /// The positions of query row 0 and of key row 0.
    pub fn offsets(&self) -> (usize, usize) {
        if self.s == self.sk {
            (0, 0)
        } else {
            (self.sk, self.s)
        }
    }

    /// Whether no tile of `bk` keys is partly masked: no mask, no window,
    /// and the keys fill whole tiles.
    pub fn whole_tiles(&self, bk: usize) -> bool {
        self.kind == MASK_NONE && self.window == 0 && self.sk % bk == 0
    }
}

/// `x + off`, with no addition emitted when `off` is 0.
#[cube]
pub fn shifted(x: usize, #[comptime] off: usize) -> usize {
    let mut y = x;
    if comptime![off > 0] {
        y += off;
    }
    y
}

/// Whether query position `i` sees key position `j` (`Mask::visible`).
#[cube]
pub fn visible(i: usize, j: usize, #[comptime] m: Mask) -> bool {
    let (kind, window, block) = comptime![(m.kind, m.window, m.block)];
    let n = i / block;
    let q = j / block;
    let mut ok = true;
    if comptime![kind == MASK_CAUSAL] {
        ok = j <= i;
        if comptime![window > 0] {
            ok = ok && i < j + comptime![window * block];
        }
    } else if comptime![kind == MASK_TOKEN_CAUSAL] {
        ok = q <= n;
        if comptime![window > 0] {
            ok = ok && n < q + window;
        }
    } else if comptime![window > 0] {
        ok = n < q + window && q < n + window;
    }
    ok
}

/// Whether query row `i` sees key row `j` (both inside their lengths).
#[cube]
pub fn sees(i: usize, j: usize, #[comptime] m: Mask) -> bool {
    let (qoff, koff) = comptime![m.offsets()];
    visible(shifted(i, qoff), shifted(j, koff), m)
}

/// `score` if query row `i` sees key row `k0 + jj` (inside the keys), else [`MASKED`].
#[cube]
pub fn mask_score(score: f32, i: usize, k0: usize, #[comptime] jj: usize, #[comptime] m: Mask) -> f32 {
    let j = k0 + jj;
    let mut r = f32::new(MASKED);
    if j < comptime![m.sk] && sees(i, j, m) {
        r = score;
    }
    r
}

/// [`mask_score`] over the `bk` scores of key rows `k0 ..` of a boundary
/// tile (`masked`): one uniform branch a tile, full tiles pass unchanged.
#[cube]
pub fn mask_tile(
    scores: &mut Array<f32>,
    masked: bool,
    i: usize,
    k0: usize,
    #[comptime] bk: usize,
    #[comptime] m: Mask,
) {
    if masked {
        #[unroll]
        for jj in 0..bk {
            scores[jj] = mask_score(scores[jj], i, k0, jj, m);
        }
    }
}

/// Whether `score` is a seen key's ([`MASKED_BELOW`]).
#[cube]
pub fn unmasked(score: f32) -> bool {
    score > f32::new(MASKED_BELOW)
}

/// `score` where `seen`, else [`MASKED`].
#[cube]
pub fn seen_or_masked(seen: bool, score: f32) -> f32 {
    select(seen, score, f32::new(MASKED))
}

/// First key position that query position `p` sees.
#[cube]
fn key_lo(p: usize, #[comptime] m: Mask) -> usize {
    let (kind, window, block) = comptime![(m.kind, m.window, m.block)];
    let mut lo = 0usize;
    if comptime![window > 0] {
        if comptime![kind == MASK_CAUSAL] {
            let w = comptime![window * block];
            if p + 1 > w {
                lo = p + 1 - w;
            }
        } else {
            let n = p / block;
            if n + 1 > window {
                lo = (n + 1 - window) * block;
            }
        }
    }
    lo
}

/// One past the last key position that query position `p` sees.
#[cube]
fn key_hi(p: usize, #[comptime] m: Mask) -> usize {
    let (kind, window, block) = comptime![(m.kind, m.window, m.block)];
    let mut hi = comptime![m.sk + m.offsets().1].runtime();
    if comptime![kind == MASK_CAUSAL] {
        hi = p + 1;
    } else if comptime![kind == MASK_TOKEN_CAUSAL] {
        hi = (p / block + 1) * block;
    } else if comptime![window > 0] {
        hi = (p / block + window) * block;
    }
    hi
}

/// First query position that sees key position `p` ([`key_lo`] inverted).
#[cube]
fn query_lo(p: usize, #[comptime] m: Mask) -> usize {
    let (kind, window, block) = comptime![(m.kind, m.window, m.block)];
    let mut lo = 0usize;
    if comptime![kind == MASK_CAUSAL] {
        lo = p;
    } else if comptime![kind == MASK_TOKEN_CAUSAL] {
        lo = p / block * block;
    } else if comptime![window > 0] {
        let n = p / block;
        if n + 1 > window {
            lo = (n + 1 - window) * block;
        }
    }
    lo
}

/// One past the last query position that sees key position `p`.
#[cube]
fn query_hi(p: usize, #[comptime] m: Mask) -> usize {
    let (kind, window, block) = comptime![(m.kind, m.window, m.block)];
    let mut hi = comptime![m.s + m.offsets().0].runtime();
    if comptime![window > 0] {
        if comptime![kind == MASK_CAUSAL] {
            hi = p + comptime![window * block];
        } else {
            hi = (p / block + window) * block;
        }
    }
    hi
}

/// A position as a row of a side whose positions start at `off`, clamped
/// to `0..=n`.
#[cube]
fn row_of(p: usize, #[comptime] off: usize, #[comptime] n: usize) -> usize {
    let mut j = 0usize;
    if p > off {
        j = p - off;
    }
    if j > n {
        j = n;
    }
    j
}

/// Rows `lo .. hi` of one side.
#[derive(CubeType)]
pub struct Rows {
    pub lo: usize,
    pub hi: usize,
}

/// The key rows that some query row of `q0 ..= q1` sees.
#[cube]
pub fn key_rows(q0: usize, q1: usize, #[comptime] m: Mask) -> Rows {
    let (qoff, koff) = comptime![m.offsets()];
    let sk = comptime![m.sk];
    Rows { lo: row_of(key_lo(shifted(q0, qoff), m), koff, sk), hi: row_of(key_hi(shifted(q1, qoff), m), koff, sk) }
}

/// The key rows that every query row of `q0 ..= q1` sees (empty, `hi ≤ lo`, when none).
#[cube]
pub fn key_rows_all(q0: usize, q1: usize, #[comptime] m: Mask) -> Rows {
    let (qoff, koff) = comptime![m.offsets()];
    let sk = comptime![m.sk];
    Rows { lo: row_of(key_lo(shifted(q1, qoff), m), koff, sk), hi: row_of(key_hi(shifted(q0, qoff), m), koff, sk) }
}

/// The query rows of which some sees a key row of `j0 ..= j1`.
#[cube]
pub fn query_rows(j0: usize, j1: usize, #[comptime] m: Mask) -> Rows {
    let (qoff, koff) = comptime![m.offsets()];
    let lo = query_lo(shifted(j0, koff), m);
    let hi = query_hi(shifted(j1, koff), m);
    Rows { lo: row_of(lo, qoff, comptime![m.s]), hi: row_of(hi, qoff, comptime![m.s]) }
}

/// Tiles `lo .. hi` of the other side that a cube walks.
#[derive(CubeType)]
pub struct Tiles {
    pub lo: usize,
    pub hi: usize,
}

/// The tiles of `tile` rows holding rows `r.lo .. r.hi` (none when empty).
#[cube]
pub fn tiles_of(r: Rows, #[comptime] tile: usize) -> Tiles {
    let t0 = r.lo / tile;
    let mut t1 = (r.hi + comptime![tile - 1]) / tile;
    if r.hi <= r.lo {
        t1 = t0;
    }
    Tiles { lo: t0, hi: t1 }
}

/// The tiles of `tile` rows wholly inside rows `r.lo .. r.hi` (from
/// [`key_rows_all`]): tiles every query row of the block sees
/// whole; `none` for both ends where there are none.
#[cube]
pub fn whole_tiles_of(r: Rows, none: usize, #[comptime] tile: usize) -> Tiles {
    let mut t0 = (r.lo + comptime![tile - 1]) / tile;
    let mut t1 = r.hi / tile;
    if r.hi <= r.lo || t1 <= t0 {
        t0 = none;
        t1 = none;
    }
    Tiles { lo: t0, hi: t1 }
}
