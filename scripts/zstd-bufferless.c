// Does the codec's streaming zstd lose speed to zstd's two-segment ("extDict") matchers?
// (issue #12, docs/keeping-up.md, twenty-seventh round).
//
// A streaming zstd context copies its input into a buffer of one window plus one block and
// wraps around at its end, so once a stream has passed its window every block is compressed
// by the extDict variant of the matcher, which checks two segments. The buffer-less API
// (ZSTD_compressContinue) reads the caller's memory instead: with a ring of k windows, a
// block sees one contiguous segment for all but the first window after each wrap.
//
// This compresses a file in 256 kB chunks, each flushed (as `CStream::compress` does), either
// with ZSTD_compressStream2 (mode 0, what the codec does) or with ZSTD_compressContinue on a
// ring of k windows (mode 1); then checks that a streaming decoder restores the file from
// either output, and prints the ratio and MB/s of the compression alone.
//
//   Z=$(echo ~/.cargo/registry/src/index.crates.io-*/zstd-sys-2.0.13+zstd.1.5.6/zstd/lib)
//   S="scripts/zstd-bufferless.c $Z/common/*.c $Z/compress/*.c $Z/decompress/*.c"
//   gcc -O3 -Wno-deprecated-declarations -DZSTD_DISABLE_ASM -I$Z -I$Z/common $S -o /tmp/zstd-bufferless
//   # file, mode (0 streaming, 1 buffer-less), level, window log, long-distance matching
//   # (0/1, minimum match 128 as the DATA stream), windows in the ring (mode 1)
//   /tmp/zstd-bufferless bulk.wal 0 1 22 0 1    # the PAGE, RAW and MAIN streams today
//   /tmp/zstd-bufferless bulk.wal 1 1 22 0 4
//   /tmp/zstd-bufferless toast.wal 0 1 27 1 1   # the DATA stream today (128 MiB window)
//   /tmp/zstd-bufferless toast.wal 1 1 27 1 2
//
// ZSTD_compressBegin_advanced_internal is libzstd's own (zstd_compress_internal.h), the one
// buffer-less entry that takes long-distance matching; a measurement, not for the codec.
#define ZSTD_STATIC_LINKING_ONLY
#include "zstd.h"
#include "compress/zstd_compress_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory allocating %zu bytes\n", n);
        exit(1);
    }
    return p;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHK(x)                                                                   \
    do {                                                                         \
        size_t r_ = (x);                                                         \
        if (ZSTD_isError(r_)) {                                                  \
            fprintf(stderr, "%s: %s\n", #x, ZSTD_getErrorName(r_));              \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s FILE MODE LEVEL WINDOW_LOG LDM RING_WINDOWS\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int mode = atoi(argv[2]), level = atoi(argv[3]), wlog = atoi(argv[4]);
    int ldm = atoi(argv[5]), k = atoi(argv[6]);
    const size_t chunk = 256 * 1024;

    FILE *fp = fopen(path, "rb");
    if (!fp) {
        perror(path);
        return 1;
    }
    long len = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    if (len <= 0 || fseek(fp, 0, SEEK_SET) != 0) {
        fprintf(stderr, "%s: not a non-empty regular file\n", path);
        return 1;
    }
    size_t n = (size_t)len;
    char *in = xmalloc(n);
    if (fread(in, 1, n, fp) != n) {
        perror(path);
        return 1;
    }
    fclose(fp);
    size_t cap = ZSTD_compressBound(n) + n / 10, op = 0;
    char *out = xmalloc(cap);

    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_params *p = ZSTD_createCCtxParams();
    ZSTD_parameters zp = ZSTD_getParams(level, ZSTD_CONTENTSIZE_UNKNOWN, 0);
    zp.cParams.windowLog = wlog;
    CHK(ZSTD_CCtxParams_init_advanced(p, zp));
    if (ldm) {
        CHK(ZSTD_CCtxParams_setParameter(p, ZSTD_c_enableLongDistanceMatching, 1));
        CHK(ZSTD_CCtxParams_setParameter(p, ZSTD_c_ldmMinMatch, 128));
    }
    size_t ring_len = (size_t)k * ((size_t)1 << wlog) + chunk, rp = 0;
    char *ring = xmalloc(ring_len);
    memset(ring, 0, ring_len); /* faulted in before the clock starts */

    double t0 = now();
    if (mode == 0) {
        CHK(ZSTD_CCtx_setParametersUsingCCtxParams(c, p));
        for (size_t i = 0; i < n; i += chunk) {
            size_t l = n - i < chunk ? n - i : chunk, r;
            ZSTD_inBuffer ib = {in + i, l, 0};
            ZSTD_outBuffer ob = {out, cap, op};
            do {
                r = ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_flush);
                CHK(r);
            } while (r);
            op = ob.pos;
        }
    } else {
        CHK(ZSTD_compressBegin_advanced_internal(c, NULL, 0, ZSTD_dct_auto, ZSTD_dtlm_fast,
                                                 NULL, p, ZSTD_CONTENTSIZE_UNKNOWN));
        for (size_t i = 0; i < n; i += chunk) {
            size_t l = n - i < chunk ? n - i : chunk;
            if (rp + l > ring_len)
                rp = 0;
            memcpy(ring + rp, in + i, l);
            size_t r = ZSTD_compressContinue(c, out + op, cap - op, ring + rp, l);
            CHK(r);
            op += r;
            rp += l;
        }
    }
    double t1 = now();

    ZSTD_DCtx *d = ZSTD_createDCtx();
    CHK(ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, 30));
    char *dec = xmalloc(n + chunk);
    ZSTD_inBuffer ib = {out, op, 0};
    ZSTD_outBuffer ob = {dec, n + chunk, 0};
    while (ib.pos < ib.size) {
        CHK(ZSTD_decompressStream(d, &ob, &ib));
        if (ob.pos == ob.size)
            break;
    }
    int ok = ob.pos == n && memcmp(dec, in, n) == 0;
    printf("mode %d level %d wlog %d ldm %d ring %d: %zu -> %zu (%.4f) %.0f MB/s, restored %s\n",
           mode, level, wlog, ldm, k, n, op, (double)op / n, n / 1e6 / (t1 - t0),
           ok ? "ok" : "DIFFERENT");
    return ok ? 0 : 1;
}
