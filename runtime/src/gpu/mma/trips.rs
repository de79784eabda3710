//! Loop trips of the fragment kernels where software multiplies the
//! fragments (`Frags` without matrix units, how the tests run them on CPU
//! drivers): `sw_mma` loops over each fragment's depth, so every product
//! adds trips to the bound Mesa's CPU drivers put on a unit's loop
//! iterations (`KernelSpec::loop_trips`, `plan::LOOP_TRIPS_CPU`). Mesa
//! 22.3's gallivm counts every loop's iterations against one budget of
//! 65535 per invocation and silently leaves the loops past it, so a launch
//! past the bound must be refused, not run.

use super::flash_grad::held_most;
use super::{fragment_depth, F};
use attnc_compiler::ir::AttnArg;
use attnc_compiler::plan::{AttnShape, Dtype, KernelSpec, ATTN_ROWS, GEMM_COLS, GEMM_ROWS};

/// The most loop trips one unit of fragment kernel `spec` runs with the
/// fragments multiplied in software, its products' loops counted (every
/// count an upper bound); `None` for a kernel without fragments.
pub fn software_trips(spec: &KernelSpec, dtype: Dtype, half: bool) -> Option<usize> {
    if !spec.fragments() {
        return None;
    }
    let mma = |n: usize| products(n, dtype);
    // Fragments across `x` columns or rows.
    let frags = |x: usize| x.div_ceil(F);
    Some(match *spec {
        KernelSpec::MatMul { k, .. } => {
            // Per stage of 16: the stage loop, `a`'s copy loop (64 vectors a unit at most, 16 a trip), 8 row fragments by the columns.
            let copies = GEMM_ROWS * F / 16 + 1;
            let per_stage = 1 + copies + mma(8 * frags(GEMM_COLS));
            k.div_ceil(F) * per_stage + spec.loop_trips(half)
        }
        KernelSpec::Attention { shape: AttnShape { d, e, .. }, .. } => {
            let (dp, ep, bk) = (frags(d), frags(e), frags(spec.attention_tiles().key_tile));
            // S = Q·Kᵀ, then P·V, for the cube's 32 rows a plane (two row fragments); rows of 64 units add in unrolled code.
            spec.walk_trips(mma(2 * bk * dp + 2 * bk * ep)) + ep * F + 1
        }
        KernelSpec::AttentionGrad { shape: AttnShape { d, e, .. }, wrt, dv, .. } => {
            let t = spec.attention_tiles();
            let (dp, ep, bt, units) = (frags(d), frags(e), frags(t.key_tile), t.units());
            let stores = (dp + ep) * F + 2;
            // Each side's products: the scores and their gradient's (2 row fragments by the tile), an accumulation.
            let (scores, acc_k, acc_v) = (2 * bt * dp, 2 * bt * dp, 2 * bt * ep);
            let most = held_most(dtype);
            let (d_scores, looped_k, looped_v) =
                (2 * bt * ep, looped_adds(dp, most.kv, units), looped_adds(ep, most.kv, units));
            match wrt {
                AttnArg::Q | AttnArg::Read(_) => {
                    spec.walk_trips(mma(scores + d_scores + acc_k) + looped_adds(dp, most.dq, units)) + stores
                }
                AttnArg::K | AttnArg::V => {
                    let (wrt_k, with_v) = (wrt == AttnArg::K, dv.is_some() || wrt == AttnArg::V);
                    if wrt_k && with_v && units < ATTN_ROWS {
                        // Two walks (`flash_grad::Walk::Either`): dV's, then dK's, in the same columns.
                        let (v_pass, k_pass) =
                            (mma(scores + acc_v) + looped_k, mma(scores + d_scores + acc_k) + looped_k);
                        spec.walk_trips(v_pass) + spec.walk_trips(k_pass) + 3 + stores
                    } else {
                        let k_side = if wrt_k { mma(d_scores + acc_k) + looped_k } else { 0 };
                        let v_side = if with_v { mma(acc_v) + looped_v } else { 0 };
                        spec.walk_trips(mma(scores) + k_side + v_side) + stores
                    }
                }
            }
        }
        _ => return None,
    })
}

/// Loop trips of `n` fragment products in software: `sw_mma`'s loop over
/// each step's depth, its exit test counted.
fn products(n: usize, dtype: Dtype) -> usize {
    let k = fragment_depth(dtype);
    n * (F / k) * (k + 1)
}

/// Loop trips of adding one product's `width` 16-column fragments to the
/// accumulators in a cube of `units`: in one-plane cubes, each fragment
/// wholly past the columns held in registers (at least `most`,
/// `flash::held_columns`) is added in a loop of 16 (`flash::add_fragment_row`).
fn looped_adds(width: usize, most: usize, units: usize) -> usize {
    if units < ATTN_ROWS {
        (width * F).saturating_sub(most).div_ceil(F) * (F + 1)
    } else {
        0
    }
}
