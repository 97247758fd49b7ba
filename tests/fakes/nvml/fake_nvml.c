/*
 * A fake libnvidia-ml.so.1 for tests: serves GPUs described in the JSON file named by
 * FAKE_NVML_CONFIG (8 H100-like GPUs when unset), so that pynvml runs for real against it.
 *
 * The file is read again at every nvmlInit*, so a test (or the fake nvidia-smi) can change
 * the machine between two sessions. Faults: "lost" ("handle": the handle cannot be had,
 * "query": every query fails) with NVML_ERROR_GPU_IS_LOST, ECC counters, row remapping
 * pending/failure, retired pages, temperature, narrow or slow PCIe link, NVLink links down,
 * "lost": "unknown" (the handle fails with NVML_ERROR_UNKNOWN, as a GPU that fell off the bus
 * often does), "missing" (the GPU is not enumerated), processes (listed while the pid is alive), and
 * "init_error" (nvmlInit returns that NVML code, e.g. 9 = driver not loaded). What a tenant can set:
 * "mig_mode" (and "mig_mode_pending"), "power_limit_mw" against "power_limit_default_mw",
 * "app_clock_graphics"/"app_clock_memory" against their "_default"s, "persistence_mode",
 * "compute_mode" (0 default, 2 exclusive process, 3 prohibited); node-wide, the top-level
 * "cc_environment"/"cc_feature" (nvmlSystemGetConfComputeState; NOT_SUPPORTED unless
 * "cc_supported" is true).
 * Only what the agent calls is implemented; what a model lacks returns NOT_SUPPORTED.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_PROCS 16
#define MAX_LINKS 18

typedef struct { unsigned pid; unsigned long long used; char name[256]; } fake_proc;

typedef struct fake_gpu {
    int lost;                    /* 0; 1 = GPU_IS_LOST at handle, 2 = at every query, 3 = UNKNOWN at handle */
    char name[96], uuid[96], serial[32], vbios[32], bus_id[32];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    unsigned long long mem_total, mem_used, mem_reserved;
    unsigned temp, temp_slowdown, temp_shutdown;
    unsigned power_mw, power_limit_mw, clock_sm, clock_mem;
    unsigned long long clock_events;
    unsigned pcie_gen, pcie_gen_max, pcie_gen_gpu_max, pcie_width, pcie_width_max;
    int ecc_supported, ecc_enabled;
    unsigned long long ecc[2][2];               /* [corrected/uncorrected][volatile/aggregate] */
    int retired_supported, retired_pending;
    unsigned retired_sbe, retired_dbe;
    int remap_supported, remap_pending, remap_failure;
    unsigned remap_corr, remap_unc;
    unsigned nvlinks; int link_down[MAX_LINKS];
    int persistence, compute_mode;
    int mig_supported, mig_mode, mig_pending;
    unsigned power_default_mw, app_graphics, app_memory, app_graphics_default, app_memory_default;
    int nprocs; fake_proc procs[MAX_PROCS];
} fake_gpu;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;
static int g_count;
static int g_cc_supported;
static unsigned g_cc_environment, g_cc_feature;
static fake_gpu g_gpus[MAX_GPUS];
static char g_driver[80] = "550.90.07", g_nvml[80] = "12.550.90.07";
static int g_cuda = 12040;

/* ------------------------------------------------------------------ tiny JSON reader */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;
typedef struct jval {
    jtype t; double num; char *str; char *key;
    struct jval *kids; int n;
} jval;

typedef struct { const char *p; int err; } jparser;

static void jskip(jparser *ps) { while (*ps->p && isspace((unsigned char)*ps->p)) ps->p++; }

static char *jstring(jparser *ps) {
    size_t cap = 64, len = 0; char *out = malloc(cap);
    if (*ps->p != '"') { ps->err = 1; free(out); return NULL; }
    ps->p++;
    while (*ps->p && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\') {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break; case 't': c = '\t'; break; case 'r': c = '\r'; break;
            case 'b': c = '\b'; break; case 'f': c = '\f'; break;
            case 'u': c = '?'; for (int i = 0; i < 4 && *ps->p; i++) ps->p++; break;
            case 0: ps->err = 1; free(out); return NULL;
            default: c = e;
            }
        }
        if (len + 2 > cap) { cap *= 2; out = realloc(out, cap); }
        out[len++] = c;
    }
    if (*ps->p != '"') { ps->err = 1; free(out); return NULL; }
    ps->p++;
    out[len] = 0;
    return out;
}

static void jparse(jparser *ps, jval *v);

static void jpush(jval *parent, jval *kid) {
    parent->kids = realloc(parent->kids, sizeof(jval) * (parent->n + 1));
    parent->kids[parent->n++] = *kid;
}

static void jparse(jparser *ps, jval *v) {
    memset(v, 0, sizeof(*v));
    jskip(ps);
    char c = *ps->p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        v->t = c == '{' ? J_OBJ : J_ARR;
        ps->p++;
        jskip(ps);
        if (*ps->p == close) { ps->p++; return; }
        for (;;) {
            jval kid; char *key = NULL;
            jskip(ps);
            if (v->t == J_OBJ) {
                key = jstring(ps);
                if (ps->err) return;
                jskip(ps);
                if (*ps->p != ':') { ps->err = 1; free(key); return; }
                ps->p++;
            }
            jparse(ps, &kid);
            kid.key = key;
            jpush(v, &kid);
            if (ps->err) return;
            jskip(ps);
            if (*ps->p == ',') { ps->p++; continue; }
            if (*ps->p == close) { ps->p++; return; }
            ps->err = 1; return;
        }
    } else if (c == '"') {
        v->t = J_STR; v->str = jstring(ps);
    } else if (!strncmp(ps->p, "true", 4)) { v->t = J_BOOL; v->num = 1; ps->p += 4; }
    else if (!strncmp(ps->p, "false", 5)) { v->t = J_BOOL; ps->p += 5; }
    else if (!strncmp(ps->p, "null", 4)) { v->t = J_NULL; ps->p += 4; }
    else if (c == '-' || isdigit((unsigned char)c)) {
        char *end; v->t = J_NUM; v->num = strtod(ps->p, &end);
        if (end == ps->p) ps->err = 1;
        ps->p = end;
    } else ps->err = 1;
}

static void jfree(jval *v) {
    for (int i = 0; i < v->n; i++) jfree(&v->kids[i]);
    free(v->kids); free(v->str); free(v->key);
}

static const jval *jget(const jval *obj, const char *key) {
    if (!obj || obj->t != J_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++) if (!strcmp(obj->kids[i].key, key)) return &obj->kids[i];
    return NULL;
}

static void jnum_u(const jval *o, const char *k, unsigned *dst) {
    const jval *v = jget(o, k); if (v && (v->t == J_NUM || v->t == J_BOOL)) *dst = (unsigned)v->num;
}
static void jnum_ull(const jval *o, const char *k, unsigned long long *dst) {
    const jval *v = jget(o, k); if (v && v->t == J_NUM) *dst = (unsigned long long)v->num;
}
static void jbool(const jval *o, const char *k, int *dst) {
    const jval *v = jget(o, k); if (v && (v->t == J_BOOL || v->t == J_NUM)) *dst = v->num != 0;
}
static void jstr(const jval *o, const char *k, char *dst, size_t size) {
    const jval *v = jget(o, k);
    if (v && v->t == J_STR) { strncpy(dst, v->str, size - 1); dst[size - 1] = 0; }
}

/* ------------------------------------------------------------------ the machine */

static const unsigned k_buses[8] = { 0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb };

static void model_defaults(fake_gpu *g, const char *model, int i) {
    memset(g, 0, sizeof(*g));
    g->domain = 0; g->bus = i < 8 ? k_buses[i] : 0x10u + (unsigned)i; g->device = 0;
    snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-%04x-%04x-%04x-%012llx", 0x5a1e0000u + (unsigned)i, 0x1f2eu, 0x3d4cu,
             0x5b6au + (unsigned)i, 0x798877665ULL + (unsigned)i);
    snprintf(g->serial, sizeof g->serial, "16542201%05d", 3170 + i);
    g->temp = 34 + i % 4; g->power_mw = 71000 + 500 * i;
    g->clock_events = 0x1;                      /* GPU idle */
    g->ecc_supported = g->ecc_enabled = 1;
    g->persistence = 1;
    if (!strcmp(model, "V100")) {
        strcpy(g->name, "Tesla V100-SXM2-32GB"); strcpy(g->vbios, "88.00.80.00.01");
        g->pci_device_id = 0x1DB510DE; g->pci_subsystem_id = 0x124910DE;
        g->mem_total = 34359738368ULL; g->mem_reserved = 0; g->mem_used = 0;
        g->temp_slowdown = 87; g->temp_shutdown = 90;
        g->power_limit_mw = 300000; g->clock_sm = 1530; g->clock_mem = 877;
        g->pcie_gen = g->pcie_gen_max = g->pcie_gen_gpu_max = 3; g->pcie_width = g->pcie_width_max = 16;
        g->retired_supported = 1; g->remap_supported = 0; g->nvlinks = 6;
        g->app_graphics_default = 1312; g->app_memory_default = 877;
    } else if (!strcmp(model, "H200")) {
        strcpy(g->name, "NVIDIA H200"); strcpy(g->vbios, "96.00.A5.00.01");
        g->pci_device_id = 0x233510DE; g->pci_subsystem_id = 0x18A410DE;
        g->mem_total = 150754820096ULL; g->mem_reserved = 596639744ULL; g->mem_used = 0;
        g->temp_slowdown = 90; g->temp_shutdown = 95;
        g->power_limit_mw = 700000; g->clock_sm = 1980; g->clock_mem = 3201;
        g->pcie_gen = g->pcie_gen_max = g->pcie_gen_gpu_max = 5; g->pcie_width = g->pcie_width_max = 16;
        g->retired_supported = 0; g->remap_supported = 1; g->nvlinks = 18;
        g->mig_supported = 1; g->app_graphics_default = 1755; g->app_memory_default = 3201;
    } else {                                     /* H100 SXM */
        strcpy(g->name, "NVIDIA H100 80GB HBM3"); strcpy(g->vbios, "96.00.74.00.01");
        g->pci_device_id = 0x233010DE; g->pci_subsystem_id = 0x16C110DE;
        g->mem_total = 85520809984ULL; g->mem_reserved = 567279616ULL; g->mem_used = 0;
        g->temp_slowdown = 89; g->temp_shutdown = 92;
        g->power_limit_mw = 700000; g->clock_sm = 1980; g->clock_mem = 2619;
        g->pcie_gen = g->pcie_gen_max = g->pcie_gen_gpu_max = 5; g->pcie_width = g->pcie_width_max = 16;
        g->retired_supported = 0; g->remap_supported = 1; g->nvlinks = 18;
        g->mig_supported = 1; g->app_graphics_default = 1755; g->app_memory_default = 2619;
    }
    g->power_default_mw = g->power_limit_mw;
    g->app_graphics = g->app_graphics_default; g->app_memory = g->app_memory_default;
}

static void gpu_from_json(fake_gpu *g, const jval *o, int i) {
    char model[16] = "H100";
    jstr(o, "model", model, sizeof model);
    model_defaults(g, model, i);
    const jval *lost = jget(o, "lost");
    if (lost && lost->t == J_STR)
        g->lost = !strcmp(lost->str, "query") ? 2 : !strcmp(lost->str, "unknown") ? 3 : 1;
    else if (lost && lost->t == J_BOOL) g->lost = lost->num ? 1 : 0;
    jstr(o, "name", g->name, sizeof g->name); jstr(o, "uuid", g->uuid, sizeof g->uuid);
    jstr(o, "serial", g->serial, sizeof g->serial); jstr(o, "vbios", g->vbios, sizeof g->vbios);
    jnum_u(o, "pci_domain", &g->domain); jnum_u(o, "pci_bus", &g->bus);
    jnum_u(o, "pci_device_id", &g->pci_device_id); jnum_u(o, "pci_subsystem_id", &g->pci_subsystem_id);
    jnum_ull(o, "memory_total", &g->mem_total); jnum_ull(o, "memory_used", &g->mem_used);
    jnum_ull(o, "memory_reserved", &g->mem_reserved);
    jnum_u(o, "temperature", &g->temp); jnum_u(o, "temp_slowdown", &g->temp_slowdown);
    jnum_u(o, "temp_shutdown", &g->temp_shutdown);
    jnum_u(o, "power_mw", &g->power_mw); jnum_u(o, "power_limit_mw", &g->power_limit_mw);
    jnum_u(o, "clock_sm", &g->clock_sm); jnum_u(o, "clock_mem", &g->clock_mem);
    jnum_ull(o, "clock_event_reasons", &g->clock_events);
    jnum_u(o, "pcie_gen", &g->pcie_gen); jnum_u(o, "pcie_gen_max", &g->pcie_gen_max);
    jnum_u(o, "pcie_gen_gpu_max", &g->pcie_gen_gpu_max);
    jnum_u(o, "pcie_width", &g->pcie_width); jnum_u(o, "pcie_width_max", &g->pcie_width_max);
    jbool(o, "ecc_supported", &g->ecc_supported); jbool(o, "ecc_enabled", &g->ecc_enabled);
    jnum_ull(o, "ecc_corrected_volatile", &g->ecc[0][0]);
    jnum_ull(o, "ecc_corrected_aggregate", &g->ecc[0][1]);
    jnum_ull(o, "ecc_uncorrected_volatile", &g->ecc[1][0]);
    jnum_ull(o, "ecc_uncorrected_aggregate", &g->ecc[1][1]);
    jbool(o, "retired_pages_supported", &g->retired_supported);
    jnum_u(o, "retired_sbe", &g->retired_sbe); jnum_u(o, "retired_dbe", &g->retired_dbe);
    jbool(o, "retired_pending", &g->retired_pending);
    jbool(o, "row_remap_supported", &g->remap_supported);
    jnum_u(o, "remapped_correctable", &g->remap_corr); jnum_u(o, "remapped_uncorrectable", &g->remap_unc);
    jbool(o, "remap_pending", &g->remap_pending); jbool(o, "remap_failure", &g->remap_failure);
    jnum_u(o, "nvlinks", &g->nvlinks);
    if (g->nvlinks > MAX_LINKS) g->nvlinks = MAX_LINKS;
    const jval *down = jget(o, "nvlink_down");
    for (int k = 0; down && down->t == J_ARR && k < down->n; k++) {
        int l = (int)down->kids[k].num;
        if (l >= 0 && l < MAX_LINKS) g->link_down[l] = 1;
    }
    jbool(o, "persistence_mode", &g->persistence);
    { unsigned cm = (unsigned)g->compute_mode; jnum_u(o, "compute_mode", &cm); g->compute_mode = (int)cm; }
    jbool(o, "mig_supported", &g->mig_supported);
    jbool(o, "mig_mode", &g->mig_mode);
    g->mig_pending = g->mig_mode;
    jbool(o, "mig_mode_pending", &g->mig_pending);
    jnum_u(o, "power_limit_default_mw", &g->power_default_mw);
    jnum_u(o, "app_clock_graphics", &g->app_graphics); jnum_u(o, "app_clock_memory", &g->app_memory);
    jnum_u(o, "app_clock_graphics_default", &g->app_graphics_default);
    jnum_u(o, "app_clock_memory_default", &g->app_memory_default);
    const jval *procs = jget(o, "processes");
    for (int k = 0; procs && procs->t == J_ARR && k < procs->n && g->nprocs < MAX_PROCS; k++) {
        fake_proc *p = &g->procs[g->nprocs++];
        jnum_u(&procs->kids[k], "pid", &p->pid);
        jnum_ull(&procs->kids[k], "used_memory", &p->used);
        jstr(&procs->kids[k], "name", p->name, sizeof p->name);
    }
    snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.0", g->domain, g->bus, g->device);
}

static int load_machine(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    g_count = 0;
    g_cc_supported = 0; g_cc_environment = g_cc_feature = 0;
    strcpy(g_driver, "550.90.07"); strcpy(g_nvml, "12.550.90.07"); g_cuda = 12040;
    if (!path || !*path) {
        for (int i = 0; i < 8; i++) {
            model_defaults(&g_gpus[i], "H100", i);
            snprintf(g_gpus[i].bus_id, sizeof g_gpus[i].bus_id, "%08X:%02X:%02X.0", 0, g_gpus[i].bus, 0);
        }
        g_count = 8;
        return NVML_SUCCESS;
    }
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "fake nvml: cannot open %s\n", path); return NVML_ERROR_UNKNOWN; }
    fseek(f, 0, SEEK_END); long size = ftell(f); fseek(f, 0, SEEK_SET);
    char *text = calloc(1, size + 1);
    size_t got = fread(text, 1, size, f); fclose(f); text[got] = 0;
    jparser ps = { text, 0 }; jval root;
    jparse(&ps, &root);
    free(text);
    if (ps.err || root.t != J_OBJ) {
        fprintf(stderr, "fake nvml: %s is not a JSON object\n", path); jfree(&root);
        return NVML_ERROR_UNKNOWN;
    }
    unsigned init_error = 0; jnum_u(&root, "init_error", &init_error);
    jstr(&root, "driver_version", g_driver, sizeof g_driver);
    jstr(&root, "nvml_version", g_nvml, sizeof g_nvml);
    unsigned cuda = (unsigned)g_cuda; jnum_u(&root, "cuda_driver_version", &cuda); g_cuda = (int)cuda;
    jbool(&root, "cc_supported", &g_cc_supported);
    jnum_u(&root, "cc_environment", &g_cc_environment); jnum_u(&root, "cc_feature", &g_cc_feature);
    const jval *gpus = jget(&root, "gpus");
    for (int i = 0, slot = 0; gpus && gpus->t == J_ARR && i < gpus->n && slot < MAX_GPUS; i++) {
        int missing = 0; jbool(&gpus->kids[i], "missing", &missing);
        if (missing) continue;                  /* not on the bus: not enumerated at all */
        gpu_from_json(&g_gpus[slot], &gpus->kids[i], slot);
        slot++; g_count = slot;
    }
    jfree(&root);
    return (nvmlReturn_t)init_error;
}

/* ------------------------------------------------------------------ helpers */

#define GPU(h) fake_gpu *g = (fake_gpu *)(h); \
    if (!g_refs) return NVML_ERROR_UNINITIALIZED; \
    if (g < g_gpus || g >= g_gpus + g_count) return NVML_ERROR_INVALID_ARGUMENT; \
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;

static nvmlReturn_t copy_str(char *dst, unsigned size, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

static int proc_alive(unsigned pid) {   /* alive and not a zombie */
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f); fclose(f); buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && rp[2] == 'Z');
}

/* ------------------------------------------------------------------ the API */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = load_machine();
    if (r == NVML_SUCCESS) g_refs++;
    pthread_mutex_unlock(&g_lock);
    return r;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = g_refs ? (g_refs--, NVML_SUCCESS) : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&g_lock);
    return r;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { return copy_str(v, n, g_driver); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n) { return copy_str(v, n, g_nvml); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { if (!v) return 2; *v = g_cuda; return 0; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    if (!g_refs) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < g_count; i++)
        for (int k = 0; k < g_gpus[i].nprocs; k++)
            if (g_gpus[i].procs[k].pid == pid && g_gpus[i].procs[k].name[0])
                return copy_str(name, length, g_gpus[i].procs[k].name);
    char path[64], comm[256] = "";
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
    fclose(f);
    return copy_str(name, length, comm);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!g_refs) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)g_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!g_refs) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)g_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (g_gpus[index].lost == 1) return NVML_ERROR_GPU_IS_LOST;
    if (g_gpus[index].lost == 3) return NVML_ERROR_UNKNOWN;
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    if (!g_refs) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_count; i++)
        if (!strcmp(g_gpus[i].uuid, uuid)) {
            if (g_gpus[i].lost == 1) return NVML_ERROR_GPU_IS_LOST;
            if (g_gpus[i].lost == 3) return NVML_ERROR_UNKNOWN;
            *device = &g_gpus[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(void *h, unsigned int *index) {
    GPU(h); if (!index) return 2; *index = (unsigned)(g - g_gpus); return 0;
}
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *v, unsigned int n) { GPU(h); return copy_str(v, n, g->uuid); }
nvmlReturn_t nvmlDeviceGetSerial(void *h, char *v, unsigned int n) { GPU(h); return copy_str(v, n, g->serial); }
nvmlReturn_t nvmlDeviceGetName(void *h, char *v, unsigned int n) { GPU(h); return copy_str(v, n, g->name); }
nvmlReturn_t nvmlDeviceGetVbiosVersion(void *h, char *v, unsigned int n) { GPU(h); return copy_str(v, n, g->vbios); }

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *pci) {
    GPU(h);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", g->domain, g->bus, g->device);
    pci->domain = g->domain; pci->bus = g->bus; pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id; pci->pciSubSystemId = g->pci_subsystem_id;
    strcpy(pci->busId, g->bus_id);
    return NVML_SUCCESS;
}

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    GPU(h);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = g->mem_total; m->used = g->mem_used + g->mem_reserved; m->free = m->total - m->used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *m) {
    GPU(h);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = g->mem_total; m->reserved = g->mem_reserved; m->used = g->mem_used;
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *t) {
    GPU(h); if (sensor != 0 || !t) return NVML_ERROR_INVALID_ARGUMENT; *t = g->temp; return 0;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(void *h, int which, unsigned int *t) {
    GPU(h);
    if (!t) return NVML_ERROR_INVALID_ARGUMENT;
    if (which == 0) { *t = g->temp_shutdown; return 0; }
    if (which == 1) { *t = g->temp_slowdown; return 0; }
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned int *p) { GPU(h); if (!p) return 2; *p = g->power_mw; return 0; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned int *p) {
    GPU(h); if (!p) return 2; *p = g->power_limit_mw; return 0;
}
nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned int *c) {
    GPU(h);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    if (type == 0 || type == 1) { *c = g->clock_sm; return 0; }
    if (type == 2) { *c = g->clock_mem; return 0; }
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r) {
    GPU(h); if (!r) return 2; *r = g->clock_events; return 0;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *r) {
    return nvmlDeviceGetCurrentClocksEventReasons(h, r);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned int *v) { GPU(h); if (!v) return 2; *v = g->pcie_gen; return 0; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned int *v) { GPU(h); if (!v) return 2; *v = g->pcie_gen_max; return 0; }
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(void *h, unsigned int *v) {
    GPU(h); if (!v) return 2; *v = g->pcie_gen_gpu_max; return 0;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned int *v) { GPU(h); if (!v) return 2; *v = g->pcie_width; return 0; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned int *v) { GPU(h); if (!v) return 2; *v = g->pcie_width_max; return 0; }

nvmlReturn_t nvmlDeviceGetEccMode(void *h, int *current, int *pending) {
    GPU(h);
    if (!g->ecc_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = g->ecc_enabled;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *h, int error_type, int counter_type, unsigned long long *count) {
    GPU(h);
    if (!g->ecc_supported || !g->ecc_enabled) return NVML_ERROR_NOT_SUPPORTED;
    if (!count || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g->ecc[error_type][counter_type];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(void *h, int cause, unsigned int *count, unsigned long long *addresses) {
    GPU(h);
    if (!g->retired_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (!count || cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned have = cause == 0 ? g->retired_sbe : g->retired_dbe;
    if (*count < have) { *count = have; return NVML_ERROR_INSUFFICIENT_SIZE; }
    for (unsigned i = 0; i < have && addresses; i++) addresses[i] = 0x1000ULL * (i + 1) + (cause << 20);
    *count = have;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *h, int *pending) {
    GPU(h);
    if (!g->retired_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (!pending) return NVML_ERROR_INVALID_ARGUMENT;
    *pending = g->retired_pending;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(void *h, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                                       unsigned int *failure) {
    GPU(h);
    if (!g->remap_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (!corr || !unc || !pending || !failure) return NVML_ERROR_INVALID_ARGUMENT;
    *corr = g->remap_corr; *unc = g->remap_unc; *pending = (unsigned)g->remap_pending;
    *failure = (unsigned)g->remap_failure;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *h, unsigned int link, int *active) {
    GPU(h);
    if (!g->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
    if (!active || link >= g->nvlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *active = !g->link_down[link];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(void *h, int *mode) {
    GPU(h); if (!mode) return 2; *mode = g->persistence; return 0;
}

nvmlReturn_t nvmlDeviceGetComputeMode(void *h, int *mode) {
    GPU(h); if (!mode) return 2; *mode = g->compute_mode; return 0;
}

typedef struct { unsigned environment, ccFeature, devToolsMode; } fake_cc_state;

nvmlReturn_t nvmlSystemGetConfComputeState(fake_cc_state *state) {
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    int supported = g_cc_supported;
    state->environment = g_cc_environment; state->ccFeature = g_cc_feature; state->devToolsMode = 0;
    pthread_mutex_unlock(&g_lock);
    return supported ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned int *current, unsigned int *pending) {
    GPU(h);
    if (!g->mig_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = (unsigned)g->mig_mode; *pending = (unsigned)g->mig_pending;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(void *h, unsigned int *p) {
    GPU(h); if (!p) return 2; *p = g->power_limit_mw; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(void *h, unsigned int *p) {
    GPU(h); if (!p) return 2; *p = g->power_default_mw; return 0;
}
/* NVML_CLOCK_GRAPHICS 0, NVML_CLOCK_MEM 2 */
nvmlReturn_t nvmlDeviceGetApplicationsClock(void *h, int type, unsigned int *c) {
    GPU(h);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->app_graphics_default) return NVML_ERROR_NOT_SUPPORTED;
    if (type == 0) { *c = g->app_graphics; return 0; }
    if (type == 2) { *c = g->app_memory; return 0; }
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(void *h, int type, unsigned int *c) {
    GPU(h);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->app_graphics_default) return NVML_ERROR_NOT_SUPPORTED;
    if (type == 0) { *c = g->app_graphics_default; return 0; }
    if (type == 2) { *c = g->app_memory_default; return 0; }
    return NVML_ERROR_NOT_SUPPORTED;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, nvmlProcessInfo_t *infos) {
    GPU(h);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned alive[MAX_PROCS], n = 0;
    for (int k = 0; k < g->nprocs; k++) if (proc_alive(g->procs[k].pid)) alive[n++] = (unsigned)k;
    if (*count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    for (unsigned i = 0; i < n; i++) {
        if (!infos) return NVML_ERROR_INVALID_ARGUMENT;
        infos[i].pid = g->procs[alive[i]].pid;
        infos[i].usedGpuMemory = g->procs[alive[i]].used;
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = n;
    return NVML_SUCCESS;
}
