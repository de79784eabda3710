//! Which key tiles an attention cube visits: the mask's band of tiles
//! (`setup`'s slots), boundary tiles partly masked, and with a mask
//! function the tiles its tile functions may see, listed once per cube in
//! shared memory ([`walk_tiles`]).

use super::attention::{cube_head, Shape, SET_FULL0, SET_FULL1, SET_Q0, SET_Q1, SET_VIS0, SET_VIS1};
use super::func::Tile;
use super::kernels::{self as k, MASK_NONE};
use cubecl::prelude::*;

/// Whether key tile `kt` is a boundary tile, partly masked for some row of
/// the cube (outside `SET_FULL0..SET_FULL1`).
#[cube]
pub(super) fn boundary_tile(set: &Array<usize>, kt: usize) -> bool {
    kt < set[SET_FULL0] || kt >= set[SET_FULL1]
}

/// Runs `tile(scope, kt, masked)` for every key tile `kt` the cube sees, in
/// one loop so that the tile's code is emitted once. `masked` is `None`
/// when the shape leaves no tile partly masked (no mask or window, whole
/// tiles), else a flag true on the boundary tiles ([`boundary_tile`]), on
/// which the tile masks its scores and clamps its key rows to the last.
pub(super) fn key_tiles(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    a: &Shape,
    bk: usize,
    mut tile: impl FnMut(&Scope, NativeExpand<usize>, Option<NativeExpand<bool>>),
) {
    if whole_tiles(a, bk) {
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

/// Whether no key tile of `bk` rows is partly masked: no mask, no window,
/// and the keys fill whole tiles.
fn whole_tiles(a: &Shape, bk: usize) -> bool {
    a.kind == MASK_NONE && a.window == 0 && a.sk % bk == 0
}

/// With a mask function, key tile `k0 .. k0 + bk` against the cube's query
/// rows: whether some pair may be seen (else the tile is skipped) and
/// whether the mask may hide some pair (else it is not evaluated); `None`
/// without one (`sparsity`).
/// `prep`: the cube's reads ([`prepare_tiles`]).
pub(super) fn tile_state(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    k0: NativeExpand<usize>,
    bk: usize,
    a: &Shape,
    prep: &[NativeExpand<f32>],
) -> Option<(NativeExpand<bool>, NativeExpand<bool>)> {
    let fns = a.fns.as_ref()?;
    fns.tiles.as_ref()?;
    let mut at = cube_tile(scope, set, a);
    (at.j0, at.j1) = (k0, last_key::expand(scope, k0, bk, a.sk));
    fns.tile(scope, &at, prep, true)
}

/// The cube's batch, head and query rows, as a tile (its key rows unset).
fn cube_tile(scope: &Scope, set: &NativeExpand<Array<usize>>, a: &Shape) -> Tile {
    let (b, h) = cube_head(scope, a);
    let (i0, i1) = (k::uget::expand(scope, set, SET_Q0), k::uget::expand(scope, set, SET_Q1));
    Tile { b, h, i0, i1, j0: i0, j1: i1 }
}

/// The reads of the mask's tile functions that are the same for every key
/// tile (`func::Fns::prepare`), made once per cube before the tile loop.
pub(super) fn prepare_tiles(scope: &Scope, set: &NativeExpand<Array<usize>>, a: &Shape) -> Vec<NativeExpand<f32>> {
    match a.fns.as_ref().filter(|f| f.tiles.is_some()) {
        Some(fns) => fns.prepare(scope, &cube_tile(scope, set, a), true),
        None => vec![],
    }
}

/// The most key tiles a cube lists in shared memory ([`walk_tiles`]); past
/// it, each tile is tested in the loop instead.
const LISTED_TILES: usize = 8192;

/// Runs `tile(scope, kt, masked, hidden)` for every key tile `kt` the cube
/// may see: [`key_tiles`]' tiles, and with a mask function's tile functions
/// only those they may see (`hidden`: whether the mask may hide a key of
/// it). The visible tiles are listed first, by one unit, in shared memory,
/// and the loop walks the list: Mesa's CPU drivers run both sides of a
/// branch, so a tile skipped by a branch would cost as much as one computed.
pub(super) fn walk_tiles(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    a: &Shape,
    bk: usize,
    prep: &[NativeExpand<f32>],
    mut tile: impl FnMut(&Scope, NativeExpand<usize>, Option<NativeExpand<bool>>, Option<NativeExpand<bool>>),
) {
    let tiles = a.sk.div_ceil(bk);
    let listed = a.fns.as_ref().is_some_and(|f| f.tiles.is_some());
    if !listed {
        return key_tiles(scope, set, a, bk, |scope, kt, masked| tile(scope, kt, masked, None));
    }
    if tiles > LISTED_TILES {
        return visit_tiles(scope, set, a, bk, prep, tile);
    }
    // Unit 0 lists the tiles (a flag bit marks the mask hiding part of one), the cube waits, all walk.
    let list = k::shared_words::expand(scope, tiles + 1);
    let first = first_unit::expand(scope);
    if_expand(scope, first, |scope| {
        let mut count = counter::expand(scope);
        key_tiles(scope, set, a, bk, |scope, kt, _| {
            let k0 = k::mul_const::expand(scope, kt, bk);
            let (any, hidden) = tile_state(scope, set, k0, bk, a, prep).expect("tile functions");
            let mut list = list.clone_unchecked();
            if_expand(scope, any, |scope| push_tile::expand(scope, &mut list, &mut count, kt, hidden));
        });
        let mut list = list.clone_unchecked();
        close_list::expand(scope, &mut list, &count, tiles);
    });
    sync_cube::expand(scope);
    let count = listed_count::expand(scope, &list, tiles);
    let masked = !whole_tiles(a, bk);
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), count);
    for_expand(scope, range, false, |scope, n| {
        let entry = listed_entry::expand(scope, &list, n);
        let kt = entry_tile::expand(scope, entry);
        let masked = masked.then(|| boundary_tile::expand(scope, set, kt));
        tile(scope, kt, masked, Some(entry_hidden::expand(scope, entry)))
    });
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

/// Runs `tile(scope, hidden)` for key tile `k0 ..`, skipped where the mask
/// function sees none of it ([`tile_state`]).
/// [`walk_tiles`] without the shared list: each key tile's state is
/// evaluated where the tile is visited (for kernels whose shared memory is
/// spoken for, and lists too long to hold).
pub(super) fn visit_tiles(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    a: &Shape,
    bk: usize,
    prep: &[NativeExpand<f32>],
    mut tile: impl FnMut(&Scope, NativeExpand<usize>, Option<NativeExpand<bool>>, Option<NativeExpand<bool>>),
) {
    if !a.fns.as_ref().is_some_and(|f| f.tiles.is_some()) {
        return key_tiles(scope, set, a, bk, |scope, kt, masked| tile(scope, kt, masked, None));
    }
    key_tiles(scope, set, a, bk, |scope, kt, masked| {
        let k0 = k::mul_const::expand(scope, kt, bk);
        visit_tile(scope, set, k0, bk, a, prep, |scope, hidden| tile(scope, kt, masked, hidden));
    });
}

pub(super) fn visit_tile(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    k0: NativeExpand<usize>,
    bk: usize,
    a: &Shape,
    prep: &[NativeExpand<f32>],
    tile: impl FnOnce(&Scope, Option<NativeExpand<bool>>),
) {
    match tile_state(scope, set, k0, bk, a, prep) {
        Some((any, hidden)) => if_expand(scope, any, |scope| tile(scope, Some(hidden))),
        None => tile(scope, None),
    }
}

/// The last key row of tile `k0 ..` of `bk` rows.
#[cube]
fn last_key(k0: usize, #[comptime] bk: usize, #[comptime] sk: usize) -> usize {
    min(k0 + comptime![bk - 1], comptime![sk - 1])
}

/// Runs `tile(scope, r)` over a tile of `rows` rows from row `r0`, `part`
/// rows at a time: once with `r0` when the whole tile is unrolled, else in
/// a loop over its parts (the rows unrolled at once are bounded:
/// `AttnTiles::unrolled_rows`).
pub(super) fn in_parts(
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
