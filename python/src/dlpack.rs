//! Arrays cross the boundary through DLPack (the `dlpark` crate speaks the
//! protocol): inputs are read where they lie, from any producer (NumPy,
//! PyTorch, JAX, ...) in any real dtype and any strides, bfloat16 included;
//! outputs are host buffers that NumPy and PyTorch adopt without a copy
//! (`numpy.from_dlpack`, `torch.from_dlpack`).
//!
//! Only host memory is read: a tensor on another device is refused with its
//! name and device, and the Python layer moves CUDA tensors to the host
//! before they get here.

use attnc_compiler::plan::Dtype;
use attnc_runtime::Tensor;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::metadata::Dynamic;
use dlpark::python::{export_dlpack, from_dlpack, DlpackExporter, ExportRequest};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use half::{bf16, f16};
use pyo3::prelude::*;
use std::sync::Arc;

/// A DLPack element type attnc reads, with its size in bytes.
#[derive(Clone, Copy)]
enum Element {
    Bool,
    Int(u8),
    UInt(u8),
    Float(u8),
    BFloat16,
}

impl Element {
    fn of(t: DLDataType) -> Option<Element> {
        if t.lanes != 1 {
            return None;
        }
        let sized = |bits: u8, sizes: &[u8]| sizes.contains(&bits).then_some(bits / 8);
        match t.code {
            DLDataTypeCode::BOOL if t.bits == 8 => Some(Element::Bool),
            DLDataTypeCode::INT => sized(t.bits, &[8, 16, 32, 64]).map(Element::Int),
            DLDataTypeCode::UINT => sized(t.bits, &[8, 16, 32, 64]).map(Element::UInt),
            DLDataTypeCode::FLOAT => sized(t.bits, &[16, 32, 64]).map(Element::Float),
            DLDataTypeCode::BFLOAT if t.bits == 16 => Some(Element::BFloat16),
            _ => None,
        }
    }

    fn size(self) -> usize {
        match self {
            Element::Bool => 1,
            Element::BFloat16 => 2,
            Element::Int(n) | Element::UInt(n) | Element::Float(n) => n as usize,
        }
    }

    /// The value at `p`, widened to f64 (exactly, except 64-bit integers past 2^53).
    ///
    /// # Safety
    /// `p` points at `self.size()` readable bytes.
    unsafe fn read(self, p: *const u8) -> f64 {
        let bytes = |n: usize| unsafe { std::slice::from_raw_parts(p, n) };
        let mut b = [0u8; 8];
        b[..self.size()].copy_from_slice(bytes(self.size()));
        match self {
            Element::Bool => (b[0] != 0) as u8 as f64,
            Element::Int(1) => b[0] as i8 as f64,
            Element::Int(2) => i16::from_ne_bytes([b[0], b[1]]) as f64,
            Element::Int(4) => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Element::Int(_) => i64::from_ne_bytes(b) as f64,
            Element::UInt(1) => b[0] as f64,
            Element::UInt(2) => u16::from_ne_bytes([b[0], b[1]]) as f64,
            Element::UInt(4) => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Element::UInt(_) => u64::from_ne_bytes(b) as f64,
            Element::Float(2) => f16::from_ne_bytes([b[0], b[1]]).to_f64(),
            Element::Float(4) => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Element::Float(_) => f64::from_ne_bytes(b),
            Element::BFloat16 => bf16::from_ne_bytes([b[0], b[1]]).to_f64(),
        }
    }
}

fn device_name(d: DLDevice) -> String {
    let kind = match d.device_type {
        DLDeviceType::CPU => "cpu",
        DLDeviceType::CUDA => "cuda",
        DLDeviceType::CUDAHOST => "cuda_host",
        DLDeviceType::CUDAMANAGED => "cuda_managed",
        DLDeviceType::ROCM => "rocm",
        DLDeviceType::METAL => "metal",
        DLDeviceType::VULKAN => "vulkan",
        _ => return format!("DLPack device type {} (id {})", d.device_type.0, d.device_id),
    };
    format!("{kind}:{}", d.device_id)
}

/// The tensor `name` read from `object` (anything with `__dlpack__`, or a
/// DLPack capsule) as float64 in row-major order. `Ok(Err(message))` is a
/// tensor attnc cannot read (device, dtype), the message naming it;
/// `Err` is the producer's own Python exception.
pub fn import(name: &str, object: &Bound<'_, PyAny>) -> PyResult<Result<Tensor, String>> {
    let imported = from_dlpack(object.as_borrowed(), None, None)?;
    let view = match imported.validate() {
        Ok(view) => view,
        Err(e) => return Ok(Err(format!("tensor `{name}` is not a valid DLPack tensor: {e}"))),
    };
    // Host memory that CUDA pinned or manages is host memory too.
    let host = [DLDeviceType::CPU, DLDeviceType::CUDAHOST, DLDeviceType::CUDAMANAGED];
    if !host.contains(&view.device().device_type) {
        let device = device_name(view.device());
        return Ok(Err(format!("tensor `{name}` is on {device}; attnc reads host memory (move it with `.cpu()`)")));
    }
    let Some(element) = Element::of(view.dtype()) else {
        let t = view.dtype();
        let message = format!(
            "tensor `{name}` has DLPack dtype (code {}, {} bits, {} lanes), but the spec takes real numbers \
             (bool, integers, float16/32/64 or bfloat16)",
            t.code.0, t.bits, t.lanes
        );
        return Ok(Err(message));
    };
    let shape: Vec<usize> = view.shape().iter().map(|&n| n as usize).collect();
    let strides = match view.strides_or_compact() {
        Ok(s) => s.into_owned(),
        Err(e) => return Ok(Err(format!("tensor `{name}` has a layout attnc cannot read: {e}"))),
    };
    let count: usize = shape.iter().product();
    let mut data = Vec::with_capacity(count);
    if count > 0 {
        // SAFETY: the producer guarantees the descriptor addresses its
        // allocation: every element at base + Σ index·stride lies within it,
        // and it stays alive until `imported` drops, after this loop.
        let base =
            unsafe { view.offset_bytes_ptr() }.map_err(|e| pyo3::exceptions::PyBufferError::new_err(e.to_string()))?;
        let size = element.size() as isize;
        let mut index = vec![0usize; shape.len()];
        for _ in 0..count {
            let offset: isize = index.iter().zip(&strides).map(|(&i, &s)| i as isize * s as isize).sum();
            data.push(unsafe { element.read(base.offset(offset * size)) });
            for axis in (0..shape.len()).rev() {
                index[axis] += 1;
                if index[axis] < shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
    }
    drop(imported);
    Ok(Ok(Tensor::new(shape, data)))
}

/// The element type outputs are handed back in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OutType {
    F64,
    Storage(Dtype),
}

impl OutType {
    pub fn parse(name: &str) -> Option<OutType> {
        match name {
            "f64" => Some(OutType::F64),
            "f32" => Some(OutType::Storage(Dtype::F32)),
            "f16" => Some(OutType::Storage(Dtype::F16)),
            "bf16" => Some(OutType::Storage(Dtype::Bf16)),
            _ => None,
        }
    }

    fn dl(self) -> DLDataType {
        match self {
            OutType::F64 => DLDataType::F64,
            OutType::Storage(Dtype::F16) => DLDataType::F16,
            OutType::Storage(Dtype::Bf16) => DLDataType::BF16,
            OutType::Storage(_) => DLDataType::F32,
        }
    }
}

/// An output on the host, handed to Python through DLPack: `numpy.from_dlpack`
/// and `torch.from_dlpack` adopt its buffer; it stays alive while any of them does.
#[pyclass(module = "attnc._attnc", frozen)]
pub struct HostArray {
    /// The values in native byte order, in words so any element is aligned.
    words: Arc<Vec<u64>>,
    shape: Vec<i64>,
    dtype: DLDataType,
}

impl HostArray {
    pub fn new(t: &Tensor, out: OutType) -> HostArray {
        let bytes: Vec<u8> = match out {
            OutType::F64 => t.data.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            // Little-endian, which is native on every target attnc builds for.
            OutType::Storage(d) => attnc_runtime::dtype::encode(d, &t.data),
        };
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        HostArray { words: Arc::new(words), shape: t.shape.iter().map(|&n| n as i64).collect(), dtype: out.dl() }
    }

    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let words = Arc::clone(&self.words);
        let data = words.as_ptr() as *mut std::ffi::c_void;
        let mut init = Dynamic::compact(self.shape.clone())
            .initialize_as::<M>(words)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        init.set_data(data).set_dtype(self.dtype).set_device(DLDevice::CPU);
        // SAFETY: `data` is the buffer the context (an `Arc` of it) keeps
        // alive; shape and compact strides describe exactly its elements.
        Ok(unsafe { init.finish() })
    }
}

impl DlpackExporter for HostArray {
    fn device(&self) -> DLDevice {
        DLDevice::CPU
    }

    fn flags(&self) -> DlpackFlags {
        // Each output is adopted by one array, which may write to it.
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _: Python<'_>, _: &ExportRequest<'_>) -> PyResult<()> {
        Ok(())
    }

    fn export_legacy(&self, _: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.managed()
    }

    fn export_versioned(&self, _: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.managed()
    }
}

#[pymethods]
impl HostArray {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        export_dlpack(self, py, request)
    }

    fn __dlpack_device__(&self) -> (u32, i32) {
        (DLDeviceType::CPU.0, 0)
    }

    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }
}
