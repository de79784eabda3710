/* A stand-in for the NVIDIA driver's libcuda.so.1, for tests on machines
 * without a GPU: device memory is host memory, modules and functions are
 * names, and every call the CUDA backend makes is appended to the file
 * FAKE_CUDA_LOG as one line, so a test can hold the launcher to the
 * manifest up to the driver call. FAKE_CUDA_MODE picks a failure:
 * "nodevice" (no GPU), "oom" (every allocation fails), "launch" (every
 * launch fails with an illegal address), "sm35" (an old architecture).
 * FAKE_CUDA_ARGS gives each entry's parameters, "entry=POINTERS+INFOBYTES;...",
 * which the driver cannot know and the log prints. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, OUT_OF_MEMORY = 2, NO_DEVICE = 100, ILLEGAL_ADDRESS = 700 };

static int mode(const char *m) {
    const char *v = getenv("FAKE_CUDA_MODE");
    return v && strcmp(v, m) == 0;
}

static void say(const char *fmt, ...) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

CUresult cuInit(unsigned flags) { (void)flags; return mode("nodevice") ? NO_DEVICE : OK; }
CUresult cuDeviceGetCount(int *n) { *n = mode("nodevice") ? 0 : 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int i) { *d = i; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) { (void)d; *ctx = (void *)0xc0; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return OK; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, len, "fake H200");
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    (void)d;
    switch (attribute) {
    case 75: *v = mode("sm35") ? 3 : 9; break;   /* compute capability major */
    case 76: *v = mode("sm35") ? 5 : 0; break;   /* minor */
    case 16: *v = 132; break;                    /* multiprocessors */
    default: *v = 0;
    }
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = "fake driver error"; return OK; }
CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = "FAKE_ERROR"; return OK; }

CUresult cuModuleLoadData(void **module, const void *image) {
    /* A cubin is an ELF file. */
    if (memcmp(image, "\177ELF", 4) != 0) return 200; /* CUDA_ERROR_INVALID_IMAGE */
    *module = malloc(1);
    say("module");
    return OK;
}
CUresult cuModuleUnload(void *module) { free(module); return OK; }
CUresult cuModuleGetFunction(void **f, void *module, const char *name) {
    (void)module;
    *f = strdup(name);
    return OK;
}
CUresult cuFuncSetAttribute(void *f, int attribute, int value) {
    say("attribute %s %d %d", (const char *)f, attribute, value);
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (mode("oom")) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)calloc(1, bytes);
    say("alloc %llu %zu", *p, bytes);
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { say("free %llu", p); free((void *)(uintptr_t)p); return OK; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    memcpy((void *)(uintptr_t)dst, src, bytes);
    say("htod %llu %zu", dst, bytes);
    return OK;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    say("dtoh %llu %zu", src, bytes);
    return OK;
}
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = malloc(1); say("stream %llu", (CUdeviceptr)(uintptr_t)*s); return OK; }
CUresult cuStreamSynchronize(void *s) { say("sync %llu", (CUdeviceptr)(uintptr_t)s); return OK; }
CUresult cuStreamDestroy_v2(void *s) { free(s); return OK; }

/* "entry=P+I" in FAKE_CUDA_ARGS: P pointer parameters, then I info bytes. */
static int args_of(const char *entry, int *pointers, int *info) {
    const char *all = getenv("FAKE_CUDA_ARGS");
    size_t n = strlen(entry);
    for (const char *at = all; at && (at = strstr(at, entry)); at += n) {
        if ((at == all || at[-1] == ';') && at[n] == '=') return sscanf(at + n + 1, "%d+%d", pointers, info) == 2;
    }
    return 0;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    (void)extra;
    if (mode("launch")) return ILLEGAL_ADDRESS;
    const char *name = (const char *)f;
    int pointers = 0, info = 0;
    if (!args_of(name, &pointers, &info)) return 1; /* CUDA_ERROR_INVALID_VALUE */
    char line[16384];
    int at = snprintf(line, sizeof line, "launch %s stream %llu grid %u %u %u block %u %u %u shared %u ptrs", name,
                      (CUdeviceptr)(uintptr_t)stream, gx, gy, gz, bx, by, bz, shared);
    for (int i = 0; i < pointers; i++) at += snprintf(line + at, sizeof line - at, " %llu", *(CUdeviceptr *)params[i]);
    at += snprintf(line + at, sizeof line - at, " info ");
    for (int i = 0; i < info; i++) at += snprintf(line + at, sizeof line - at, "%02x", ((unsigned char *)params[pointers])[i]);
    say("%s", line);
    return OK;
}

/* NVRTC opens libcuda.so.1 too and asks for the driver's private tables;
 * a driver without them (as on a machine with none) is what it expects. */
CUresult cuGetExportTable(const void **table, const void *id) {
    (void)id;
    *table = 0;
    return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}

/* Events: a record is a tick of a counter, 10 µs apart. */
static unsigned long long ticks;
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(unsigned long long)); return OK; }
CUresult cuEventRecord(void *e, void *stream) { (void)stream; *(unsigned long long *)e = ++ticks; return OK; }
CUresult cuEventSynchronize(void *e) { (void)e; return OK; }
CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    *ms = 0.01f * (float)(*(unsigned long long *)end - *(unsigned long long *)start);
    return OK;
}
CUresult cuEventDestroy_v2(void *e) { free(e); return OK; }
