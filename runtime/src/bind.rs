//! Binding a program to concrete tensors: matching input tensors by name,
//! solving the dims from their shapes, or drawing inputs for `--seed`.

use crate::error::RunError;
use crate::interp::{concrete, DimValues};
use crate::rng::Rng;
use crate::tensor::Tensor;
use attnc_compiler::ir::{Domain, NodeId, Op, Program};
use attnc_compiler::opt::cost;
use std::collections::{BTreeMap, BTreeSet};

/// The names of `program`'s inputs declared `in integers(...)` (lengths,
/// block tables): the only inputs a file may store as integers (`io::read_tensors`).
pub fn integer_inputs(program: &Program) -> BTreeSet<String> {
    program.inputs.iter().filter(|i| matches!(i.domain, Domain::Integers { .. })).map(|i| i.name.clone()).collect()
}

/// Match `tensors` to the program's inputs and solve every dim.
/// `explicit` holds dims set on the command line: they must agree with the tensors.
/// Tensors named like an output are ignored (a `--seed` run's file can be fed back).
pub fn bind_inputs(
    program: &Program,
    tensors: BTreeMap<String, Tensor>,
    explicit: &BTreeSet<String>,
) -> Result<(Vec<Tensor>, DimValues), RunError> {
    let inputs = in_input_order(program, tensors, true)?;
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape.as_slice()).collect();
    let dims = solve_dims(program, &shapes, explicit)?;
    check_tables(program, &inputs, &dims)?;
    for (i, t) in inputs.iter().enumerate() {
        check_domain(&program.inputs[i].name, &program.inputs[i].domain, t, &dims)?;
    }
    Ok((inputs, dims))
}

/// `given` (tensors, or what a caller holds of them, by name) in the order
/// of the program's inputs; an error names a missing input and its shape,
/// or a name that is not an input (one named like an output is dropped
/// where `outputs_too`: a `--seed` run's file fed back).
pub fn in_input_order<T>(
    program: &Program,
    mut given: BTreeMap<String, T>,
    outputs_too: bool,
) -> Result<Vec<T>, RunError> {
    let names: Vec<&str> = program.inputs.iter().map(|i| i.name.as_str()).collect();
    for name in given.keys() {
        let known = names.contains(&name.as_str()) || (outputs_too && program.outputs.iter().any(|(o, _)| o == name));
        if !known {
            return Err(RunError::TensorFile(format!(
                "unexpected tensor `{name}`: the spec's inputs are {}",
                names.join(", ")
            )));
        }
    }
    let mut inputs = Vec::new();
    for input in &program.inputs {
        let declared = program.input_shape(inputs.len());
        let t = given
            .remove(&input.name)
            .ok_or_else(|| RunError::TensorFile(format!("missing tensor `{}` of shape {declared}", input.name)))?;
        inputs.push(t);
    }
    Ok(inputs)
}

/// Solve every dim from the inputs' `shapes` (in declaration order), as
/// [`bind_inputs`] does, without their values (what a caller holding the
/// tensors on a device can give). `explicit` as for [`bind_inputs`].
pub fn solve_dims(program: &Program, shapes: &[&[usize]], explicit: &BTreeSet<String>) -> Result<DimValues, RunError> {
    let shape_error = |i: usize| {
        RunError::TensorFile(format!(
            "tensor `{}` has shape {:?}, but the spec declares {}",
            program.inputs[i].name,
            shapes[i],
            program.input_shape(i)
        ))
    };
    for (i, shape) in shapes.iter().enumerate() {
        if shape.len() != program.input_shape(i).rank() {
            return Err(shape_error(i));
        }
    }
    let mut dims = DimValues::new();
    // Solve dims from axes of the form a·X + c (the other dims known), until nothing changes.
    loop {
        let mut progress = false;
        for (i, shape) in shapes.iter().enumerate() {
            for (axis, d) in program.input_shape(i).0.iter().enumerate() {
                if let Some((sym, a, c)) = d.linear_in(&|s| dims.get(s).copied()) {
                    let rest = shape[axis] as i64 - c;
                    if rest % a != 0 || rest / a < 1 {
                        return Err(shape_error(i));
                    }
                    dims.insert(sym, (rest / a) as u64);
                    progress = true;
                }
            }
        }
        if !progress {
            break;
        }
    }
    for decl in &program.dims {
        if !dims.contains_key(&decl.name) {
            let v = decl.default.ok_or_else(|| {
                RunError::BadSetting(format!(
                    "dim `{}` is fixed by no input and has no default; pass --set {}=VALUE",
                    decl.name, decl.name
                ))
            })?;
            dims.insert(decl.name.clone(), v);
        } else if explicit.contains(&decl.name) && decl.default != Some(dims[&decl.name]) {
            return Err(RunError::BadSetting(format!(
                "--set {}={} disagrees with the input tensors, which give {} = {}",
                decl.name,
                decl.default.unwrap_or(0),
                decl.name,
                dims[&decl.name]
            )));
        }
    }
    check_sizes(program, &dims)?;
    for (i, shape) in shapes.iter().enumerate() {
        if concrete(program.input_shape(i), &dims) != *shape {
            return Err(shape_error(i));
        }
    }
    Ok(dims)
}

/// Attention's serving tables, checked on the host before any launch,
/// naming the tensor, the sequence and the value: every `lengths` entry
/// (a sequence's key count) an integer from 0 to the attention's key rows,
/// every block-table entry (`pages`) a page of its cache.
pub fn check_tables(program: &Program, inputs: &[Tensor], dims: &DimValues) -> Result<(), RunError> {
    let input_of = |node: NodeId| program.inputs.iter().position(|i| i.node == node);
    let shape = |node: NodeId| concrete(&program.nodes[node.0 as usize].shape, dims);
    for node in &program.nodes {
        if let Op::Paged { cache, pages } = node.op {
            let Some(index) = input_of(pages) else { continue };
            let (name, t, blocks) = (&program.inputs[index].name, &inputs[index], shape(cache)[0]);
            let slots = t.shape.get(1).copied().unwrap_or(1).max(1);
            if let Some((at, v)) = first_outside(t, blocks.saturating_sub(1)) {
                let (b, slot) = (at / slots, at % slots);
                return Err(RunError::BadInputValue(format!(
                    "`{name}`[{b}, {slot}] (sequence {b}'s page {slot}) is {v}, but the cache has {blocks} pages: \
                     a page index must be an integer in 0..={}",
                    blocks.saturating_sub(1)
                )));
            }
        }
        let Some(fns) = node.op.attn_fns() else { continue };
        let Some(c) = fns.lengths else { continue };
        let Some(index) = input_of(fns.captures[c]) else { continue };
        let keys = shape(node.op.operands()[1]).iter().rev().nth(1).copied().unwrap_or(0);
        let (name, t) = (&program.inputs[index].name, &inputs[index]);
        if let Some((b, v)) = first_outside(t, keys) {
            return Err(RunError::BadInputValue(format!(
                "`{name}`[{b}] (sequence {b}'s key count) is {v}, but must be an integer in 0..={keys}, the attention's key rows"
            )));
        }
    }
    Ok(())
}

/// The first entry of `t` (flat index, value) that is not an integer in `0..=hi`.
fn first_outside(t: &Tensor, hi: usize) -> Option<(usize, f64)> {
    t.data.iter().copied().enumerate().find(|(_, v)| !(v.fract() == 0.0 && *v >= 0.0 && *v <= hi as f64))
}

/// The integers attention's functions read (`lengths`, document ids) are
/// exact in kernels up to 2^24 in magnitude (f32, or digits in a
/// half-precision plan: `plan::INTEGER_DIGITS`); a larger one is refused,
/// naming the tensor, the entry and the value.
pub fn check_exact_reads(program: &Program, inputs: &BTreeMap<String, Tensor>) -> Result<(), RunError> {
    for node in &program.nodes {
        let Some(fns) = node.op.attn_fns() else { continue };
        for c in &fns.captures {
            let Some(input) = program.inputs.iter().find(|i| i.node == *c) else { continue };
            let Some(t) = inputs.get(&input.name).filter(|_| matches!(input.domain, Domain::Integers { .. })) else {
                continue;
            };
            if let Some((i, v)) = t.data.iter().enumerate().find(|(_, v)| v.abs() >= (1u64 << 24) as f64) {
                return Err(RunError::BadInputValue(format!(
                    "`{}`[{i}] is {v}: attention's kernels read integers exactly below 2^24 = 16777216 in magnitude",
                    input.name
                )));
            }
        }
    }
    Ok(())
}

/// Names index `[i, j, ...]` of a reward-shaped tensor as a person reads it.
fn describe_index(index: &[usize]) -> String {
    let roles = ["group", "sample", "component"];
    let parts: Vec<String> = match index.len() {
        2 | 3 => index.iter().zip(roles).map(|(i, r)| format!("{r} {i}")).collect(),
        _ => vec![format!("index {index:?}")],
    };
    parts.join(", ")
}

/// Every value of `t` must lie in `domain`.
pub fn check_domain(name: &str, domain: &Domain, t: &Tensor, dims: &DimValues) -> Result<(), RunError> {
    let ok = |v: f64| match domain {
        Domain::Any => true,
        Domain::Finite => v.is_finite(),
        Domain::Binary => v == 0.0 || v == 1.0,
        Domain::Integers { lo, hi } => v.fract() == 0.0 && v >= *lo as f64 && v <= hi.at(dims) as f64,
    };
    let Some(flat) = t.data.iter().position(|v| !ok(*v)) else { return Ok(()) };
    let index = t.index_of(flat);
    let want = match domain {
        Domain::Any => unreachable!(),
        Domain::Finite => "a finite number".to_string(),
        Domain::Binary => "0 or 1".to_string(),
        Domain::Integers { lo, hi } => format!("an integer in {lo}..={}", hi.at(dims)),
    };
    Err(RunError::BadInputValue(format!(
        "`{name}`{index:?} ({}) is {}, but must be {want}",
        describe_index(&index),
        t.data[flat]
    )))
}

/// The most elements one tensor may have: kernels index with 32-bit integers.
pub const MAX_ELEMENTS: u64 = i32::MAX as u64;

/// The default limit on the memory one run may use (`--memory-budget`).
pub const DEFAULT_MEMORY_BUDGET: u64 = 8 << 30;

/// The bytes the float64 interpreter would hold for `program` at `dims`
/// (every intermediate value stays alive), after checking every tensor's size.
pub fn interpreter_bytes(program: &Program, dims: &DimValues) -> Result<u64, RunError> {
    let mut total: u64 = 0;
    for (i, node) in program.nodes.iter().enumerate() {
        let what = || match &node.op {
            Op::Input { index } => format!("input `{}`", program.inputs[*index].name),
            _ => format!("intermediate %{i}"),
        };
        // A size with a difference (`N - 1`, `2 * N - 5`) can be negative at small dims.
        if let Some(d) = node.shape.0.iter().find(|d| d.negative_at(&|s| dims.get(s).copied())) {
            let at: Vec<String> = d.symbols().map(|s| format!("{s} = {}", dims.get(s).copied().unwrap_or(0))).collect();
            return Err(RunError::BadSize(format!(
                "{} has shape {}, whose size {d} is negative at {}; choose larger dims",
                what(),
                node.shape,
                at.join(", ")
            )));
        }
        let n = node
            .shape
            .0
            .iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(d.eval(&|s| dims.get(s).copied())?))
            .filter(|n| *n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                let what = what();
                let bound: Vec<String> = dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
                RunError::BadSize(format!(
                    "{what} of shape {} would have more than {MAX_ELEMENTS} elements at {}; kernels index with 32-bit integers",
                    node.shape,
                    bound.join(" ")
                ))
            })?;
        total = total.saturating_add(n.saturating_mul(8));
    }
    Ok(total)
}

/// Refuses a run whose interpreter would hold more than `budget` bytes.
pub fn check_budget(program: &Program, dims: &DimValues, budget: u64) -> Result<(), RunError> {
    let bytes = interpreter_bytes(program, dims)?;
    if bytes > budget {
        return Err(RunError::OverBudget(format!(
            "this run needs about {:.2} GiB, over the memory budget of {:.2} GiB; lower the sizes or raise --memory-budget",
            bytes as f64 / (1u64 << 30) as f64,
            budget as f64 / (1u64 << 30) as f64
        )));
    }
    Ok(())
}

/// The default limit on the interpreter's work (`--max-flops`): about a
/// minute of the float64 interpreter, which does roughly 1 GFLOP/s.
pub const DEFAULT_MAX_FLOPS: f64 = 5e10;

/// The floating-point operations the interpreter would do for `program` at
/// `dims`: the cost model's count with nothing folded (it recomputes weight-only work).
pub fn interpreter_flops(program: &Program, dims: &DimValues) -> f64 {
    program
        .nodes
        .iter()
        .map(|node| {
            let operands: Vec<Vec<usize>> =
                node.op.operands().iter().map(|o| concrete(program.shape(*o), dims)).collect();
            cost::op_cost(&node.op, &concrete(&node.shape, dims), &operands).flops
        })
        .sum()
}

/// Refuses an interpreter run that would do more than `max_flops` operations,
/// so an oversized `--set` fails at once instead of running for hours.
pub fn check_work(program: &Program, dims: &DimValues, max_flops: f64) -> Result<(), RunError> {
    let flops = interpreter_flops(program, dims);
    if flops > max_flops {
        let bound: Vec<String> = dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
        return Err(RunError::OverBudget(format!(
            "the float64 interpreter would do about {flops:.3e} floating-point operations at {} (over --max-flops {max_flops:.3e}; at about 1 GFLOP/s that is {:.0} s); lower the sizes, raise --max-flops, or run the kernels with --backend wgpu|cuda",
            bound.join(" "),
            flops / 1e9
        )));
    }
    Ok(())
}

/// Size conditions only the bound dims can decide: 32-bit indexable tensors,
/// and at least two entries along a leave-one-out axis.
pub fn check_sizes(program: &Program, dims: &DimValues) -> Result<(), RunError> {
    interpreter_bytes(program, dims)?;
    for node in &program.nodes {
        if let Op::LooMean { x, axis } = &node.op {
            let n = concrete(program.shape(*x), dims)[*axis];
            if n < 2 {
                return Err(RunError::BadSize(format!(
                    "a leave-one-out mean needs at least 2 entries along axis {axis}, but it has {n} (a group of one sample has no other samples to average)"
                )));
            }
        }
    }
    Ok(())
}

/// The dims' default values (after `--set`), all of which must be known.
pub fn default_dims(program: &Program) -> Result<DimValues, RunError> {
    program
        .dims
        .iter()
        .map(|d| {
            d.default.map(|v| (d.name.clone(), v)).ok_or_else(|| {
                RunError::BadSetting(format!("dim `{}` has no default; pass --set {}=VALUE", d.name, d.name))
            })
        })
        .collect()
}

/// Draw every input for `--seed`: a pure function of the seed, the input's
/// name, its distribution and its size.
pub fn generate_inputs(program: &Program, seed: u64) -> Result<(Vec<Tensor>, DimValues), RunError> {
    let dims = default_dims(program)?;
    check_sizes(program, &dims)?;
    let inputs: Vec<Tensor> = (0..program.inputs.len()).map(|i| draw_input(program, i, &dims, seed)).collect();
    check_tables(program, &inputs, &dims)?;
    Ok((inputs, dims))
}

/// Input `index` drawn for `--seed` at `dims`: a pure function of the seed,
/// the input's name, its distribution and its size.
pub fn draw_input(program: &Program, index: usize, dims: &DimValues, seed: u64) -> Tensor {
    let input = &program.inputs[index];
    let shape = concrete(program.input_shape(index), dims);
    let mut rng = Rng::for_input(seed, &input.name);
    let n = shape.iter().product();
    Tensor::new(shape, (0..n).map(|_| rng.draw(&input.init, dims)).collect())
}
