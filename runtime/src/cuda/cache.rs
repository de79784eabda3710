//! Kernel source to cubin: NVRTC at run time for the device's architecture,
//! with a disk cache keyed by the source's hash, the architecture and
//! NVRTC's version, so a program's second run compiles nothing.

use super::CudaError;
use crate::nvidia::Nvrtc;
use std::path::PathBuf;

/// FNV-1a, 64 bits: a hash that is the same on every machine and build.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The cache folder: `ATTNC_CACHE_DIR`, else `$XDG_CACHE_HOME/attnc/cubin`,
/// else `~/.cache/attnc/cubin`; `None` where none can be named.
pub fn folder() -> Option<PathBuf> {
    let env = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    env("ATTNC_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("attnc").join("cubin")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("attnc").join("cubin")))
}

/// NVRTC's options for a device of compute capability `arch` (`major * 10
/// + minor`): a real architecture, so that the result is a cubin, with
/// the `a` features from sm_90 on as cubecl-cuda passes them.
pub fn options(arch: i32) -> Vec<String> {
    let suffix = if arch >= 90 { "a" } else { "" };
    vec![format!("--gpu-architecture=sm_{arch}{suffix}"), "-lineinfo".to_string()]
}

/// The cache file of `source` compiled for `arch` by NVRTC `version`.
pub fn key(source: &str, arch: i32, version: (i32, i32)) -> String {
    let options = options(arch).join(" ");
    let h = fnv1a(format!("{options}\n{source}").as_bytes());
    format!("{h:016x}-sm{arch}-nvrtc{}.{}.cubin", version.0, version.1)
}

/// `source`'s cubin for `arch`: from the cache, or compiled by NVRTC (and
/// then stored, written to a temporary name and renamed so that readers
/// never see half a file). A cache that cannot be written is skipped.
pub fn cubin(nvrtc: &Nvrtc, kernel: &str, source: &str, arch: i32) -> Result<Vec<u8>, CudaError> {
    let file = folder().map(|d| d.join(key(source, arch, nvrtc.version)));
    if let Some(bytes) = file.as_ref().and_then(|f| std::fs::read(f).ok()).filter(|b| !b.is_empty()) {
        return Ok(bytes);
    }
    let cubin = nvrtc.cubin(source, &options(arch)).map_err(|log| CudaError::Compile {
        kernel: kernel.to_string(),
        arch,
        log: log.lines().filter(|l| !l.trim().is_empty()).take(8).collect::<Vec<_>>().join("\n"),
    })?;
    if let Some(file) = file {
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        let stored = file.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, &cubin).is_ok()
            && std::fs::rename(&tmp, &file).is_ok();
        if !stored {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_source_architecture_and_compiler() {
        // FNV-1a's published test vectors.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        let k = key("x", 90, (12, 9));
        assert!(k.ends_with("-sm90-nvrtc12.9.cubin"), "{k}");
        assert_ne!(k, key("y", 90, (12, 9)));
        assert_ne!(k, key("x", 80, (12, 9)));
        assert_ne!(k, key("x", 90, (12, 8)));
        assert_eq!(options(90)[0], "--gpu-architecture=sm_90a");
        assert_eq!(options(86)[0], "--gpu-architecture=sm_86");
    }
}
