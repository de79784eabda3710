//! The tile walks. Over keys: which key tiles a cube of query rows visits
//! (the mask's band, [`setup`]'s slots), its boundary tiles partly masked,
//! and with a mask function only the tiles its tile functions may see,
//! listed once per cube in shared memory ([`KeyWalk`]). Over queries:
//! the query tiles a cube of key rows visits ([`walk_query_tiles`], the
//! same band inverted), for dK and dV. Both skip by the same mask
//! (`mask::key_rows`, `mask::query_rows`).

use super::launch::{Dims, Shape};
use super::mask::{key_rows, key_rows_all, query_rows, tiles_of, whole_tiles_of, Tiles, MASK_NONE};
use super::source::view_row;
use crate::gpu::func::Tile;
use crate::gpu::kernels as k;
use attnc_compiler::plan::RowView;
use cubecl::prelude::*;

/// Slots of the per-cube setup array ([`setup`]): the key and value bases,
/// the key tiles every query row sees whole (`FULL`) and those some row
/// sees (`VIS`), the cube's first and last query rows.
pub const SET_K: usize = 0;
pub const SET_V: usize = 1;
pub const SET_FULL0: usize = 2;
pub const SET_FULL1: usize = 3;
pub const SET_VIS0: usize = 4;
pub const SET_VIS1: usize = 5;
pub const SET_Q0: usize = 6;
pub const SET_Q1: usize = 7;
const SET_LEN: usize = 8;

/// The key tiles (`g.tile` rows) that some query row of `q0 ..= q1` sees:
/// the others are never loaded.
#[cube]
pub fn key_tiles(q0: usize, q1: usize, #[comptime] g: Dims) -> Tiles {
    tiles_of(key_rows(q0, q1, comptime![g.mask()]), comptime![g.tile])
}

/// The query tiles (`g.tile` rows) holding a query row that sees a key row
/// of `j0 ..= j1`.
#[cube]
pub fn query_tiles(j0: usize, j1: usize, #[comptime] g: Dims) -> Tiles {
    tiles_of(query_rows(j0, j1, comptime![g.mask()]), comptime![g.tile])
}

/// This cube's query tile of `bq` rows; masked cubes in reverse, since later
/// query tiles see more keys and should start first.
#[cube]
pub fn query_tile(#[comptime] g: Dims, #[comptime] bq: usize) -> usize {
    let mut qt = k::cube_x(comptime![g.fold]);
    if comptime![g.kind != MASK_NONE] {
        qt = comptime![g.s.div_ceil(bq) - 1] - qt;
    }
    qt
}

/// The cube's key and value bases and key-tile ranges (slots `SET_*`), for
/// query tiles of `bq` rows and key tiles of `bk`; with `split_tiles`, the
/// cube's chunk of a split-KV launch.
#[cube]
pub fn setup(
    #[comptime] g: Dims,
    #[comptime] bq: usize,
    #[comptime] bk: usize,
    #[comptime] views: [RowView; 4],
    #[comptime] split_tiles: usize,
) -> Array<usize> {
    let mut r = Array::<usize>::new(comptime![SET_LEN]);
    let bh = k::cube_y(comptime![g.fold]);
    let grp = (bh % comptime![g.h]) / comptime![g.h / g.hk];
    let q0 = query_tile(g, bq) * bq;
    let q1 = min(q0 + comptime![bq - 1], comptime![g.s - 1]);
    let b = bh / comptime![g.h];
    r[SET_K] = view_row(b, grp, 0, comptime![views[1]]);
    r[SET_V] = view_row(b, grp, 0, comptime![views[2]]);
    let m = comptime![g.mask()];
    let vis = tiles_of(key_rows(q0, q1, m), bk);
    let full = whole_tiles_of(key_rows_all(q0, q1, m), vis.hi, bk);
    r[SET_FULL0] = full.lo;
    r[SET_FULL1] = full.hi;
    r[SET_VIS0] = vis.lo;
    r[SET_VIS1] = vis.hi;
    if comptime![split_tiles > 0] {
        split_range(&mut r, split_tiles);
    }
    r[SET_Q0] = q0;
    r[SET_Q1] = q1;
    r
}

/// Split-KV: narrows the cube's key tiles (`SET_*`) to its chunk of
/// `tiles` key tiles (the grid's z), keeping `vis0 ≤ full0 ≤ full1 ≤ vis1`.
#[cube]
fn split_range(r: &mut Array<usize>, #[comptime] tiles: usize) {
    let lo = CUBE_POS_Z as usize * tiles;
    let vis0 = max(r[SET_VIS0], lo);
    let vis1 = max(min(r[SET_VIS1], lo + tiles), vis0);
    let full0 = min(max(r[SET_FULL0], vis0), vis1);
    r[SET_FULL1] = min(max(r[SET_FULL1], full0), vis1);
    r[SET_FULL0] = full0;
    r[SET_VIS0] = vis0;
    r[SET_VIS1] = vis1;
}

/// Whether key tile `kt` is a boundary tile, partly masked for some row of
/// the cube (outside `SET_FULL0..SET_FULL1`).
#[cube]
pub fn boundary_tile(set: &Array<usize>, kt: usize) -> bool {
    kt < set[SET_FULL0] || kt >= set[SET_FULL1]
}

/// The cube's batch, head and query rows, as a tile (its key rows unset).
fn cube_tile(scope: &Scope, set: &NativeExpand<Array<usize>>, a: &Shape) -> Tile {
    let (b, h) = a.cube_head(scope);
    let (i0, i1) = (k::uget::expand(scope, set, SET_Q0), k::uget::expand(scope, set, SET_Q1));
    Tile { b, h, i0, i1, j0: i0, j1: i1 }
}

/// The most key tiles a cube lists in shared memory ([`KeyWalk::walk`]); past
/// it, each tile is tested in the loop instead.
const LISTED_TILES: usize = 8192;

/// What a tile of a key walk is given: its key tile, whether it is a
/// boundary tile (`None` where no tile is partly masked) and whether a mask
/// function may hide a key of it (`None` without tile functions).
pub type TileFlags = (NativeExpand<usize>, Option<NativeExpand<bool>>, Option<NativeExpand<bool>>);

/// A cube's walk over its key tiles of `bk` rows: its setup slots
/// ([`setup`]), the launch, and the reads of the mask's tile functions that
/// are the same for every key tile (`func::Fns::prepare`), made once per
/// cube before the tile loop ([`KeyWalk::new`]).
pub struct KeyWalk<'a> {
    pub set: &'a NativeExpand<Array<usize>>,
    pub a: &'a Shape,
    pub bk: usize,
    prep: Vec<NativeExpand<f32>>,
}

impl<'a> KeyWalk<'a> {
    pub fn new(scope: &Scope, set: &'a NativeExpand<Array<usize>>, a: &'a Shape, bk: usize) -> KeyWalk<'a> {
        let prep = match a.fns.as_ref().filter(|f| f.tiles.is_some()) {
            Some(fns) => fns.prepare(scope, &cube_tile(scope, set, a), true),
            None => vec![],
        };
        KeyWalk { set, a, bk, prep }
    }

    fn listed(&self) -> bool {
        self.a.fns.as_ref().is_some_and(|f| f.tiles.is_some())
    }

    /// Runs `tile(scope, kt, masked)` for every key tile `kt` the cube sees, in
    /// one loop so that the tile's code is emitted once. `masked` is `None`
    /// when the shape leaves no tile partly masked (no mask or window, whole
    /// tiles), else a flag true on the boundary tiles ([`boundary_tile`]), on
    /// which the tile masks its scores and clamps its key rows to the last.
    fn band(&self, scope: &Scope, mut tile: impl FnMut(&Scope, NativeExpand<usize>, Option<NativeExpand<bool>>)) {
        let set = self.set;
        if self.a.mask().whole_tiles(self.bk) {
            let full = RangeExpand::new(k::uget::expand(scope, set, SET_FULL0), k::uget::expand(scope, set, SET_FULL1));
            for_expand(scope, full, false, |scope, kt| tile(scope, kt, None));
        } else {
            let seen = RangeExpand::new(k::uget::expand(scope, set, SET_VIS0), k::uget::expand(scope, set, SET_VIS1));
            for_expand(scope, seen, false, |scope, kt| {
                let masked = boundary_tile::expand(scope, set, kt);
                tile(scope, kt, Some(masked))
            });
        }
    }

    /// With a mask function, key tile `k0 .. k0 + bk` against the cube's query
    /// rows: whether some pair may be seen (else the tile is skipped) and
    /// whether the mask may hide some pair (else it is not evaluated); `None`
    /// without one (`sparsity`).
    fn state(&self, scope: &Scope, k0: NativeExpand<usize>) -> Option<(NativeExpand<bool>, NativeExpand<bool>)> {
        let fns = self.a.fns.as_ref()?;
        fns.tiles.as_ref()?;
        let mut at = cube_tile(scope, self.set, self.a);
        (at.j0, at.j1) = (k0, last_key::expand(scope, k0, self.bk, self.a.g.sk));
        fns.tile(scope, &at, &self.prep, true)
    }

    /// Runs `tile(scope, flags)` for every key tile the cube may see: the
    /// band's tiles, and with a mask function's tile functions only those they
    /// may see. The visible tiles are listed first, by one unit, in shared
    /// memory, and the loop walks the list: Mesa's CPU drivers run both sides
    /// of a branch, so a tile skipped by a branch would cost as much as one
    /// computed.
    pub fn walk(&self, scope: &Scope, mut tile: impl FnMut(&Scope, TileFlags)) {
        let (set, bk) = (self.set, self.bk);
        let tiles = self.a.g.sk.div_ceil(bk);
        if !self.listed() {
            return self.band(scope, |scope, kt, masked| tile(scope, (kt, masked, None)));
        }
        if tiles > LISTED_TILES {
            return self.visit(scope, tile);
        }
        // Unit 0 lists the tiles (a flag bit marks the mask hiding part of one), the cube waits, all walk.
        let list = k::shared_words::expand(scope, tiles + 1);
        let first = first_unit::expand(scope);
        if_expand(scope, first, |scope| {
            let mut count = counter::expand(scope);
            self.band(scope, |scope, kt, _| {
                let k0 = k::mul_const::expand(scope, kt, bk);
                let (any, hidden) = self.state(scope, k0).expect("tile functions");
                let mut list = list.clone_unchecked();
                if_expand(scope, any, |scope| push_tile::expand(scope, &mut list, &mut count, kt, hidden));
            });
            let mut list = list.clone_unchecked();
            close_list::expand(scope, &mut list, &count, tiles);
        });
        sync_cube::expand(scope);
        let count = listed_count::expand(scope, &list, tiles);
        let masked = !self.a.mask().whole_tiles(bk);
        let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), count);
        for_expand(scope, range, false, |scope, n| {
            let entry = listed_entry::expand(scope, &list, n);
            let kt = entry_tile::expand(scope, entry);
            let masked = masked.then(|| boundary_tile::expand(scope, set, kt));
            tile(scope, (kt, masked, Some(entry_hidden::expand(scope, entry))))
        });
    }

    /// [`KeyWalk::walk`] without the shared list: each key tile's state is
    /// evaluated where the tile is visited, and the tile skipped by a branch
    /// (for kernels whose shared memory is spoken for, and lists too long to
    /// hold).
    pub fn visit(&self, scope: &Scope, mut tile: impl FnMut(&Scope, TileFlags)) {
        if !self.listed() {
            return self.band(scope, |scope, kt, masked| tile(scope, (kt, masked, None)));
        }
        self.band(scope, |scope, kt, masked| {
            let k0 = k::mul_const::expand(scope, kt, self.bk);
            match self.state(scope, k0) {
                Some((any, hidden)) => if_expand(scope, any, |scope| tile(scope, (kt, masked, Some(hidden)))),
                None => tile(scope, (kt, masked, None)),
            }
        });
    }
}

/// The flag bit of a listed tile: the mask may hide some of its keys.
const HIDDEN_BIT: u32 = 1 << 31;

#[cube]
fn first_unit() -> bool {
    UNIT_POS == 0
}

#[cube]
fn counter() -> Array<u32> {
    let mut c = Array::<u32>::new(1usize);
    c[0] = 0u32;
    c
}

#[cube]
fn push_tile(list: &mut [u32], count: &mut Array<u32>, kt: usize, hidden: bool) {
    let mut e = u32::cast_from(kt);
    if hidden {
        e |= u32::new(HIDDEN_BIT as i64);
    }
    list[count[0] as usize] = e;
    count[0] += 1u32;
}

#[cube]
fn close_list(list: &mut [u32], count: &Array<u32>, #[comptime] tiles: usize) {
    list[tiles] = count[0];
}

#[cube]
fn listed_count(list: &[u32], #[comptime] tiles: usize) -> usize {
    list[tiles] as usize
}

#[cube]
fn listed_entry(list: &[u32], n: usize) -> u32 {
    list[n]
}

#[cube]
fn entry_tile(e: u32) -> usize {
    (e & u32::new((HIDDEN_BIT - 1) as i64)) as usize
}

#[cube]
fn entry_hidden(e: u32) -> bool {
    (e & u32::new(HIDDEN_BIT as i64)) != 0u32
}

/// The last row of tile `k0 ..` of `bk` rows (of `sk`).
#[cube]
fn last_key(k0: usize, #[comptime] bk: usize, #[comptime] sk: usize) -> usize {
    min(k0 + comptime![bk - 1], comptime![sk - 1])
}

/// Runs `tile(scope, r)` over a tile of `rows` rows from row `r0`, `part`
/// rows at a time: once with `r0` when the whole tile is unrolled, else in
/// a loop over its parts (the rows unrolled at once are bounded:
/// `AttnTiles::unrolled_rows`).
pub fn in_parts(
    scope: &Scope,
    r0: NativeExpand<usize>,
    rows: usize,
    part: usize,
    tile: impl Fn(&Scope, NativeExpand<usize>),
) {
    if part == rows {
        return tile(scope, r0);
    }
    let parts = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, rows / part));
    for_expand(scope, parts, false, |scope, p| {
        let at = k::mul_const::expand(scope, p, part);
        tile(scope, k::add_index::expand(scope, r0, at))
    });
}

/// Runs `tile(scope, hi, i0)` for every query head `hi` reading key/value
/// head `kh` (of batch `b`) and every query tile (of `tile` rows, from row
/// `i0`) holding a query row that sees one of the cube's `rows` key rows
/// (the dK and dV kernels' walk: this one and `mma::flash_grad`'s). With a
/// mask function's tile functions, a query tile they say no pair of is seen
/// is skipped, as the forward and dQ skip key tiles ([`KeyWalk`]),
/// where `skip` says so (not in the fragment kernel: the branch took its
/// dK/dV on TF32 from 182 registers to 255 and spills on sm_90;
/// `plan::KernelSpec::skips_hidden_tiles` prices what each kernel does).
pub fn walk_query_tiles(
    scope: &Scope,
    a: &Shape,
    (b, kh): (NativeExpand<usize>, NativeExpand<usize>),
    (tile, rows): (usize, usize),
    skip: bool,
    mut body: impl FnMut(&Scope, NativeExpand<usize>, NativeExpand<usize>),
) {
    let keys = cube_keys::expand(scope, rows, a.g.sk, a.g.fold);
    let dims = Dims { tile, rows, lanes: 1, ..a.g };
    let (j0, j1) = (k::uget::expand(scope, &keys, 0), k::uget::expand(scope, &keys, 1));
    let band = query_tiles::expand(scope, j0, j1, dims);
    let fns = a.fns.as_ref().filter(|f| skip && f.tiles.is_some());
    let heads = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, a.g.h / a.g.hk));
    for_expand(scope, heads, false, |scope, hq| {
        let hi = k::add_index::expand(scope, k::mul_const::expand(scope, kh, a.g.h / a.g.hk), hq);
        // The tile functions' reads that depend on the cube's key rows only, made once a head.
        let prep = fns.map(|f| f.prepare(scope, &Tile { b, h: hi, i0: j0, i1: j1, j0, j1 }, false));
        let tiles = RangeExpand::new(band.lo.clone(), band.hi.clone());
        for_expand(scope, tiles, false, |scope, t| {
            let i0 = k::mul_const::expand(scope, t, tile);
            match (fns, &prep) {
                (Some(f), Some(prep)) => {
                    let at = Tile { b, h: hi, i0, i1: last_key::expand(scope, i0, tile, a.g.s), j0, j1 };
                    let (any, _) = f.tile(scope, &at, prep, false).expect("tile functions");
                    if_expand(scope, any, |scope| body(scope, hi, i0));
                }
                _ => body(scope, hi, i0),
            }
        });
    });
}

/// The cube's first and last key rows.
#[cube]
pub fn cube_keys(#[comptime] cube_rows: usize, #[comptime] sk: usize, #[comptime] fold: usize) -> Array<usize> {
    let mut a = Array::<usize>::new(2usize);
    let j0 = k::cube_x(fold) * cube_rows;
    a[0] = j0;
    a[1] = min(j0 + comptime![cube_rows - 1], comptime![sk - 1]);
    a
}

/// Where a host-assembled mainloop (`attention_tiled`, `attention_tiled_grad`)
/// stands in its key walk: one key tile (or part of one, `bk` rows) of one
/// cube from key row `k0`, the cube's `set` ([`setup`]), this unit's lane of
/// a plane of `plane`, row widths `dl` and `el` in vectors, and the tile's
/// flags from [`KeyWalk`] (`masked`: a boundary tile; `hidden`: a mask
/// function may hide a key).
pub struct TileAt<'a> {
    pub a: &'a Shape,
    pub set: &'a NativeExpand<Array<usize>>,
    pub lane: NativeExpand<usize>,
    pub k0: NativeExpand<usize>,
    pub bk: usize,
    pub dl: usize,
    pub el: usize,
    pub plane: u32,
    pub masked: Option<NativeExpand<bool>>,
    pub hidden: Option<NativeExpand<bool>>,
}
