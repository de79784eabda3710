//! The launch ABI of the kernels `attnc compile --target cuda` emits, read
//! from the manifest alone: each binding's device pointer in order, then
//! the `info` struct by value, laid out as its C declaration (the
//! manifest's `info_struct`) says; the temporaries' places in one
//! workspace; every tensor's size in bytes. No driver here: everything up
//! to the driver call is computed (and tested) on the CPU.

use crate::gpu::emit::{LaunchInfo, Manifest};
use attnc_compiler::plan::{value_elements, BufferRole, Dtype};

/// Alignment of every buffer placed in a workspace (what `cudaMalloc` gives,
/// and more than any vector load of the kernels needs).
pub const ALIGN: u64 = 256;

/// One field of the `info` struct: `ty name[count];`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoField {
    pub ty: String,
    pub name: String,
    pub count: usize,
    /// Byte offset in the struct.
    pub offset: usize,
}

/// The `info` struct's fields and size, with C's layout rules (each field
/// aligned to its element's size, the struct to its largest).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct InfoLayout {
    pub fields: Vec<InfoField>,
    pub size: usize,
}

/// Bytes of a C scalar type the emitted structs use.
fn c_size(ty: &str) -> Option<usize> {
    Some(match ty {
        "float" | "uint32_t" | "int32_t" | "unsigned int" | "int" => 4,
        "double" | "uint64_t" | "int64_t" => 8,
        "__half" | "__nv_bfloat16" | "uint16_t" | "int16_t" => 2,
        "uint8_t" | "int8_t" => 1,
        _ => return None,
    })
}

impl InfoLayout {
    /// The layout of `struct info_st { float scalars_f32[2];uint32_t static_meta[4]; }`
    /// (empty text: a kernel without the struct).
    pub fn parse(declaration: &str) -> Result<InfoLayout, String> {
        let text = declaration.trim();
        if text.is_empty() {
            return Ok(InfoLayout::default());
        }
        let body = text
            .strip_prefix("struct info_st")
            .and_then(|t| t.trim().strip_prefix('{'))
            .and_then(|t| t.trim().strip_suffix('}'))
            .ok_or_else(|| format!("`{text}` is not a `struct info_st {{ ... }}` declaration"))?;
        let mut layout = InfoLayout::default();
        let mut align = 1;
        for field in body.split(';').map(str::trim).filter(|f| !f.is_empty()) {
            let bad = || format!("field `{field}` of `{text}` is not `TYPE NAME[COUNT]`");
            let (ty, rest) = field.rsplit_once(' ').ok_or_else(bad)?;
            let (name, count) = rest.strip_suffix(']').and_then(|r| r.split_once('[')).ok_or_else(bad)?;
            let count: usize = count.parse().map_err(|_| bad())?;
            let size = c_size(ty.trim()).ok_or_else(|| format!("unknown type `{ty}` in `{text}`"))?;
            let offset = layout.size.next_multiple_of(size);
            layout.fields.push(InfoField { ty: ty.trim().to_string(), name: name.to_string(), count, offset });
            layout.size = offset + size * count;
            align = align.max(size);
        }
        layout.size = layout.size.next_multiple_of(align);
        Ok(layout)
    }

    fn field(&self, name: &str) -> Option<&InfoField> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// The `info` struct's bytes for `launch`: its scalars (f32) in
/// `scalars_f32`, then each binding's length in the elements the kernel
/// reads it in (`len / line_size`) in `static_meta`, in binding order.
pub fn pack_info(manifest: &Manifest, launch: &LaunchInfo) -> Result<Vec<u8>, String> {
    let layout = InfoLayout::parse(&launch.info_struct)?;
    let mut bytes = vec![0u8; layout.size];
    let mut put = |field: &str, values: &[[u8; 4]]| -> Result<(), String> {
        if values.is_empty() {
            return Ok(());
        }
        let f = layout
            .field(field)
            .ok_or_else(|| format!("`{}` has no `{field}` for its {} values", launch.info_struct, values.len()))?;
        if f.count < values.len() || c_size(&f.ty) != Some(4) {
            return Err(format!("`{}`: `{field}` cannot hold {} 4-byte values", launch.info_struct, values.len()));
        }
        for (i, v) in values.iter().enumerate() {
            bytes[f.offset + 4 * i..f.offset + 4 * i + 4].copy_from_slice(v);
        }
        Ok(())
    };
    let scalars: Vec<[u8; 4]> = launch.scalars.iter().map(|s| (s.value as f32).to_ne_bytes()).collect();
    put("scalars_f32", &scalars)?;
    let lens = launch
        .bindings
        .iter()
        .map(|b| {
            let len = manifest.buffers[b.buffer].len / b.line_size.max(1);
            u32::try_from(len)
                .map(u32::to_ne_bytes)
                .map_err(|_| format!("binding {} is past 32-bit lengths", b.binding))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if layout.field("static_meta").is_some() {
        put("static_meta", &lens)?;
    }
    Ok(bytes)
}

/// The manifest's storage dtype.
pub fn dtype(manifest: &Manifest) -> Result<Dtype, String> {
    manifest.dtype.parse::<Dtype>().map_err(|_| format!("unknown dtype `{}` in the manifest", manifest.dtype))
}

/// Bytes buffer `id` takes on the device (integer inputs of half precision
/// as three digits a value).
pub fn buffer_bytes(manifest: &Manifest, id: usize) -> u64 {
    let b = &manifest.buffers[id];
    let dtype = dtype(manifest).unwrap_or(Dtype::F32);
    let integers = matches!(b.role, BufferRole::Input { integers: true, .. });
    (b.len * value_elements(integers, dtype) * dtype.size()) as u64
}

/// Where a plan's buffers live when it runs on the caller's memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// An input or an output: the caller's tensor of this name.
    Tensor(String),
    /// A constant, uploaded once when the kernels are loaded.
    Constant,
    /// A temporary at this byte offset of the workspace.
    Workspace(u64),
}

/// Every buffer's place and the workspace's size: temporaries whose
/// lifetimes (first to last launch binding them) do not overlap share
/// bytes, each at a multiple of [`ALIGN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub places: Vec<Place>,
    pub workspace_bytes: u64,
}

impl Layout {
    pub fn of(manifest: &Manifest) -> Layout {
        let n = manifest.buffers.len();
        let mut span: Vec<Option<(usize, usize)>> = vec![None; n];
        for (i, l) in manifest.launches.iter().enumerate() {
            for b in &l.bindings {
                let s = span[b.buffer].get_or_insert((i, i));
                s.1 = i;
            }
        }
        let output = |id: usize| manifest.outputs.iter().find(|(_, o)| **o == id).map(|(n, _)| n.clone());
        let mut places = vec![Place::Constant; n];
        let mut placed: Vec<(u64, u64, usize, usize)> = vec![]; // offset, bytes, first, last
        let mut workspace_bytes = 0;
        for (id, b) in manifest.buffers.iter().enumerate() {
            places[id] = match (&b.role, output(id)) {
                (BufferRole::Input { name, .. }, _) => Place::Tensor(name.clone()),
                (_, Some(name)) => Place::Tensor(name),
                (BufferRole::Constant { .. }, None) => Place::Constant,
                (BufferRole::Temp, None) => {
                    let (first, last) = span[id].unwrap_or((0, 0));
                    let bytes = buffer_bytes(manifest, id).next_multiple_of(ALIGN);
                    // The lowest offset clear of every temporary alive at the same time.
                    let mut live: Vec<(u64, u64)> = placed
                        .iter()
                        .filter(|(_, _, f, l)| *f <= last && first <= *l)
                        .map(|(o, s, _, _)| (*o, o + s))
                        .collect();
                    live.sort();
                    let mut offset = 0;
                    for (start, end) in live {
                        if offset + bytes <= start {
                            break;
                        }
                        offset = offset.max(end);
                    }
                    placed.push((offset, bytes, first, last));
                    workspace_bytes = workspace_bytes.max(offset + bytes);
                    Place::Workspace(offset)
                }
            };
        }
        Layout { places, workspace_bytes }
    }
}

/// One launch as the driver takes it: the function's name, the grid, the
/// block, dynamic shared memory, the argument pointers and the `info` bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Call<'a> {
    pub entry: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    /// Device addresses of the bindings, in order.
    pub pointers: Vec<u64>,
    /// The `info` struct's bytes (empty: the kernel takes none).
    pub info: &'a [u8],
}

/// Every launch's `info` bytes ([`pack_info`]): they depend on the sizes
/// alone, so a program packs them once.
pub fn infos(manifest: &Manifest) -> Result<Vec<Vec<u8>>, String> {
    manifest.launches.iter().map(|l| pack_info(manifest, l)).collect()
}

/// The calls of `manifest`'s launches `range` (their `infos`), each binding
/// resolved by `address` (a buffer id to its device address).
pub fn calls<'a>(
    manifest: &'a Manifest,
    infos: &'a [Vec<u8>],
    range: std::ops::Range<usize>,
    address: impl Fn(usize) -> u64,
) -> Vec<Call<'a>> {
    (manifest.launches[range.clone()].iter().zip(&infos[range]))
        .map(|(l, info)| Call {
            entry: &l.entry,
            grid: l.grid,
            block: l.workgroup_size,
            shared_bytes: l.shared_memory_bytes as u32,
            pointers: l.bindings.iter().map(|b| address(b.buffer)).collect(),
            info,
        })
        .collect()
}

/// How many of the manifest's launches prepare the weights (they come first).
pub fn prepared(manifest: &Manifest) -> usize {
    manifest.launches.iter().take_while(|l| l.prepare).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_info_structs_cubecl_emits() {
        let l = InfoLayout::parse("struct info_st { float scalars_f32[2];uint32_t static_meta[4]; }").unwrap();
        assert_eq!(l.size, 24);
        assert_eq!((l.fields[0].offset, l.fields[1].offset), (0, 8));
        let l = InfoLayout::parse("struct info_st { uint32_t static_meta[6]; }").unwrap();
        assert_eq!((l.size, l.fields[0].count), (24, 6));
        assert_eq!(InfoLayout::parse("").unwrap(), InfoLayout::default());
        assert!(InfoLayout::parse("struct other { int x; }").is_err());
        assert!(InfoLayout::parse("struct info_st { quad x[2]; }").is_err());
        // C's rules: a 2-byte field after an odd count of bytes, an 8-byte one aligned.
        let l = InfoLayout::parse("struct info_st { uint8_t a[3]; uint16_t b[1]; double c[1]; }").unwrap();
        assert_eq!(l.fields.iter().map(|f| f.offset).collect::<Vec<_>>(), [0, 4, 8]);
        assert_eq!(l.size, 16);
    }
}
