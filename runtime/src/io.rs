//! safetensors files: reading named tensors (F32, F64, F16, BF16, and I32
//! and I64 for integer inputs only, such as lengths) and writing outputs
//! atomically (a temporary file in the same folder, then a rename), so an
//! error never leaves a partial or stale output behind.

use crate::error::RunError;
use crate::tensor::Tensor;
use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The element type written to output files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileDtype {
    F32,
    F64,
}

/// Every tensor of a safetensors file, by name, widened to f64. A tensor
/// stored as integers (I32, I64) is read only for the names in `integers`
/// (the spec's inputs declared `in integers(...)`, `bind::integer_inputs`):
/// for any other a float input would silently take rounded integers.
pub fn read_tensors(path: &Path, integers: &BTreeSet<String>) -> Result<BTreeMap<String, Tensor>, RunError> {
    let bytes = std::fs::read(path).map_err(|e| RunError::Io(format!("cannot read `{}`: {e}", path.display())))?;
    decode_for(&bytes, Some(integers)).map_err(|m| RunError::TensorFile(format!("`{}`: {m}", path.display())))
}

/// Every tensor of safetensors bytes, by name, widened to f64 (integer
/// types included: [`read_tensors`] decides who may give them).
pub fn decode(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, String> {
    decode_for(bytes, None)
}

/// [`decode`], refusing integer tensors but for the names in `integers` where given.
fn decode_for(bytes: &[u8], integers: Option<&BTreeSet<String>>) -> Result<BTreeMap<String, Tensor>, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("not a valid safetensors file ({e})"))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let integer = matches!(view.dtype(), Dtype::I32 | Dtype::I64);
        if integer && integers.is_some_and(|names| !names.contains(&name)) {
            return Err(format!(
                "tensor `{name}` has dtype {:?}, an integer type, but the spec's `{name}` is not an integer \
                 input (`in integers(...)`); attnc reads F32, F64, F16 or BF16 for it",
                view.dtype()
            ));
        }
        let bytes = view.data();
        let data: Vec<f64> = match view.dtype() {
            Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            Dtype::F64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f64()).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f64()).collect(),
            // Block tables and lengths: what users' caches hold.
            Dtype::I32 => bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            Dtype::I64 => {
                let wide = |c: &[u8]| i64::from_le_bytes(c.try_into().unwrap());
                if let Some(v) = bytes.chunks_exact(8).map(wide).find(|v| v.unsigned_abs() > 1 << 53) {
                    return Err(format!(
                        "tensor `{name}` holds the I64 value {v}, beyond what a float64 holds exactly"
                    ));
                }
                bytes.chunks_exact(8).map(|c| wide(c) as f64).collect()
            }
            other => {
                return Err(format!(
                    "tensor `{name}` has dtype {other:?}; attnc reads F32, F64, F16, BF16, I32 and I64"
                ))
            }
        };
        out.insert(name.clone(), Tensor::new(view.shape().to_vec(), data));
    }
    Ok(out)
}

pub fn encode(tensors: &[(String, &Tensor)], dtype: FileDtype) -> Result<Vec<u8>, String> {
    let buffers: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, t)| match dtype {
            FileDtype::F32 => t.data.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect(),
            FileDtype::F64 => t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
        .collect();
    let st_dtype = match dtype {
        FileDtype::F32 => Dtype::F32,
        FileDtype::F64 => Dtype::F64,
    };
    let views = tensors
        .iter()
        .zip(&buffers)
        .map(|((name, t), buf)| TensorView::new(st_dtype, t.shape.clone(), buf).map(|v| (name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot encode tensors: {e}"))?;
    safetensors::serialize(views, &None).map_err(|e| format!("cannot encode tensors: {e}"))
}

/// Write `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| RunError::Io(format!("`{}` is not a file path", path.display())))?;
    let tmp = dir.join(format!(".{}.{}.tmp", file_name.to_string_lossy(), std::process::id()));
    let result = std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(RunError::Io(format!("cannot write `{}`: {e}", path.display())));
    }
    Ok(())
}

/// Write named tensors to a safetensors file, atomically.
pub fn write_tensors(path: &Path, tensors: &[(String, &Tensor)], dtype: FileDtype) -> Result<(), RunError> {
    let bytes = encode(tensors, dtype).map_err(RunError::Io)?;
    write_atomic(path, &bytes)
}
