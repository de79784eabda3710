//! The error catalogue: every diagnostic has a stable code and an explanation
//! (`attnc explain-error CODE`). Codes are never reused or renumbered.

macro_rules! codes {
    ($($variant:ident = $code:literal, $title:literal, $text:literal;)*) => {
        /// A stable diagnostic code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $($variant),* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant),*];
            /// The code as printed, e.g. `E0101`.
            pub fn as_str(self) -> &'static str { match self { $(Code::$variant => $code),* } }
            /// A one-line summary.
            pub fn title(self) -> &'static str { match self { $(Code::$variant => $title),* } }
            /// A longer explanation with an example of the fix.
            pub fn explanation(self) -> &'static str { match self { $(Code::$variant => $text),* } }
            pub fn parse(s: &str) -> Option<Code> {
                Code::ALL.iter().copied().find(|c| c.as_str().eq_ignore_ascii_case(s))
            }
        }
    };
}

codes! {
    Syntax = "E0001", "syntax error",
        "The text does not follow the grammar of `.attn` files. A spec is `spec NAME` followed by items, each starting with `param`, `dim`, `input`, `let`, `output` or `require`.\n\n    spec tiny\n    dim N = 4\n    input x: [N, N]\n    output y = x @ x\n";
    TooLarge = "E0002", "input too large or too deeply nested",
        "Specs are limited in size (1 MiB) and nesting (64 brackets, 256 operators deep) so that checking them always takes bounded time and stack. Name intermediate results with `let` instead of nesting.";
    BadNumber = "E0003", "number literal out of range",
        "Integers must fit in a signed 64-bit integer and floats must be finite.";
    UnknownName = "E0101", "unknown name",
        "A name was used that no `param`, `dim`, `input` or `let` before it declares. Names are visible only after their declaration. The error suggests the closest declared name.";
    UnknownFunction = "E0102", "unknown function",
        "The called function is not a builtin. `attnc` knows the builtins listed in docs/language.md (e.g. `split_heads`, `mix_heads`, `attention`, `group_mean`).";
    Duplicate = "E0103", "duplicate definition",
        "Each name may be declared once: a parameter, dim, input, let or output with the same name already exists.";
    UnknownArgument = "E0104", "unknown keyword argument",
        "A keyword argument was passed that the function does not take.";
    MissingArgument = "E0105", "missing argument",
        "A required argument of a builtin was not given, positionally or by keyword.";
    TooManyArguments = "E0106", "too many positional arguments",
        "More positional arguments were given than the builtin takes.";
    RepeatedArgument = "E0107", "argument given twice",
        "The same argument was given positionally and by keyword, or twice by keyword.";
    TypeMismatch = "E0201", "type mismatch",
        "A value does not have the type its place needs: for example a float given to an `int` parameter, or `none` to a parameter that is not optional (`T?`).";
    UnknownVariant = "E0202", "unknown enum variant",
        "An enum value is not one of the variants its place accepts, e.g. `mask = causl` instead of `causal`.";
    WrongKind = "E0203", "tensor where a constant is needed, or the reverse",
        "Builtin sizes, masks and other options must be compile-time constants (parameters and literals); tensor arguments must be tensors (inputs or `let` results).";
    NoValue = "E0204", "parameter without a value",
        "A parameter has no default and was not set. Give it a default in the spec or pass `--set NAME=VALUE`.";
    RequirementFailed = "E0205", "requirement failed",
        "A `require` condition is false for the bound parameters.";
    Arithmetic = "E0206", "invalid arithmetic",
        "Division by zero, an integer overflow, or arithmetic on values that are not numbers.";
    ShapeMismatch = "E0301", "shape mismatch",
        "The shapes of two operands do not agree, e.g. the inner dimensions of a matmul. The message names both shapes.";
    RankMismatch = "E0302", "wrong rank",
        "An operation needs operands of a given rank (number of axes), e.g. `split_heads` needs at least 2 axes.";
    NotDivisible = "E0303", "size not divisible",
        "A size must split evenly, e.g. the last axis into heads, or query heads into key/value head groups.";
    BadShapeExpr = "E0304", "shape is not a product",
        "Input shapes are products of dims and integer parameters, e.g. `[B, N * P, H * d]`; sums of symbolic dims are not allowed.";
    BadSize = "E0305", "size out of range",
        "A size, head count, window or level count must be at least 1 (or 2 for level counts), and every tensor must have fewer than 2^31 elements so that kernels index it with 32-bit integers.";
    NoOutput = "E0401", "spec has no output",
        "A spec must declare at least one `output NAME = EXPR`.";
    UnusedInput = "E0402", "unused input",
        "An input is never used by an output. This is a warning.";
    BadSetting = "E0501", "bad --set",
        "A `--set NAME=VALUE` names no parameter or dim of the spec, or its value has the wrong type.";
    OverBudget = "E0502", "over a resource budget",
        "The float64 interpreter would need more memory than the memory budget (`--memory-budget`, 8 GiB by default) or more floating-point work than `--max-flops` (5e10, about a minute) at these sizes. The message gives the estimate and the limit. Lower the sizes (`--set`), raise the flag, or run the kernels with `--backend wgpu|cuda`, which hold no N x N tensor.";
    TensorFile = "E0601", "bad tensor file",
        "An input tensor file is missing a tensor, has an extra one, or a tensor with the wrong shape or dtype, or the file is not valid safetensors.";
    Io = "E0603", "file cannot be read or written",
        "A spec, tensor or output file could not be read or written: the message names the path and the operating system's reason (no such file, permission denied, disk full). Check the path; outputs are written whole or not at all.";
    BadInputValue = "E0602", "invalid input value",
        "An input holds a value the spec's semantics reject, e.g. a rating outside 1..K or a NaN reward. The message names the group and sample.";
    OutOfRange = "E0604", "a function reads out of range or overflows",
        "A score or mask function would read an entry outside a tensor's shape (e.g. `bias[h, i - j]` without a causal mask, where query 0 reads `bias[h, -1]`), or one of its integers would leave 32 bits (e.g. `i * 100000 * 100000`). The message names the function, the tensor and index (or the integer expression and its value) and the (b, h, i, j) of the first such call. Every backend refuses the spec before it runs: the kernels would clamp the index or wrap the integer and compute a wrong number. \"may read\" means the read sits behind a condition the check cannot decide before the run (on the logit `s`, or on a tensor held on the device): keep the index in range wherever the pair is visible, e.g. with `clamp` (docs/language.md, \"Score and mask functions\").";
    NonFinite = "E0605", "non-finite output",
        "An output holds NaN or an infinity and `attnc run --finite` was given: the message names the output, how many NaN and infinite values it holds and the first one's index. Without `--finite` the run says so on stderr and writes its outputs. NaN comes from the spec's arithmetic (e.g. `log` of a negative number, `0 / 0`) or from NaN inputs (`--check-inputs` reports those); it propagates through every later operation (docs/semantics.md).";
    NoGradient = "E0801", "no gradient",
        "A gradient was asked of an input that has none: its values are discrete (`integers`, `binary`), or it is not an input of the spec. Gradients flow through every continuous operation; comparisons, `thresholds` and `count` pass none. `attnc grad --wrt` takes the continuous inputs.";
    Internal = "E0901", "internal compiler error",
        "The compiler produced an invalid program. This is a bug in attnc; please report it with the spec.";
    Backend = "E0701", "backend unavailable",
        "The requested backend cannot run here: no wgpu adapter (on Linux without a GPU, install Mesa's lavapipe: `apt-get install mesa-vulkan-drivers libvulkan1`), a dtype the device cannot store, a size past a CPU driver's loop bound, or a kernel the backend does not have.";
    NoCudaDriver = "E0702", "no CUDA driver",
        "`--backend cuda` loads the NVIDIA driver's library, `libcuda.so.1`, at run time, and it was not found: this machine has no NVIDIA driver (or the library is not on the loader's path). attnc itself needs no CUDA toolkit to build or run; install the NVIDIA driver, or run on `--backend wgpu` or `--backend interp`.";
    NoCudaDevice = "E0703", "no CUDA device",
        "The NVIDIA driver was loaded but reports no usable GPU, or the device index asked for is past the devices it reports (the message says how many there are). Check `nvidia-smi` and `CUDA_VISIBLE_DEVICES`.";
    CudaArchitecture = "E0704", "architecture NVRTC cannot target",
        "The kernels are compiled at run time by NVRTC for the device's own architecture (`sm_XY`), and the NVRTC found cannot target it (the message lists those it can). Install a newer NVRTC (`pip install nvidia-cuda-nvrtc-cu12`, or a CUDA toolkit) and point `ATTNC_CUDA_TOOLS` or `CUDA_HOME` at it.";
    CudaCompile = "E0705", "kernel failed to compile for CUDA",
        "NVRTC refused a kernel's source: the message names the kernel and the architecture and shows the first lines of NVRTC's log. The same source is what `attnc compile --target cuda` writes; this is a bug in attnc, please report it with the spec and the sizes.";
    CudaLaunch = "E0706", "CUDA launch failed",
        "The driver refused a launch or reported an error while the kernels ran: the message names the launch (its entry point in the manifest) and the driver's own words. An illegal address usually means a device buffer smaller than the manifest's sizes; `CUDA_ERROR_INVALID_VALUE` a grid or shared-memory size the device does not take.";
    CudaMemory = "E0707", "out of CUDA device memory",
        "An allocation on the GPU failed: the message gives the bytes asked for and what they were for. Lower the sizes, free memory held elsewhere, or pass a smaller batch.";
    CudaTools = "E0708", "NVRTC or CUDA headers not found",
        "The CUDA backend compiles the emitted kernels with NVRTC at run time (cached on disk after the first run) and needs NVRTC and the CUDA headers: `pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12` (PyTorch's CUDA wheels bring both) and set `ATTNC_CUDA_TOOLS` to the folder that holds `nvidia/` (a `site-packages`), or set `CUDA_HOME` to a CUDA toolkit.";
    DeviceTensor = "E0709", "device tensor does not fit the plan",
        "A plan run on the caller's device memory was given no pointer for one of its inputs or outputs, or a buffer smaller than the plan needs, or a workspace smaller than `workspace_bytes()`: the message names the tensor, the bytes given and the bytes needed (its shape and dtype).";
}
