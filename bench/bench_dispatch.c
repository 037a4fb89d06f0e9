/* bench dispatch: MoeDistributeDispatchV2 + CombineV2 latency and payload bandwidth on 2 ranks,
 * beside the same exchange built on MPI_Alltoallv (Open MPI) and on torch gloo
 * all_to_all_single, in one run.
 *
 * Workload: BS tokens per rank (128 and 4096), H = 7168, K = 8 distinct experts of E = 64
 * (uniform, seeded: the same routing in all three), bf16 tokens, quant_mode 0 (bf16) and 2
 * (int8 per token + fp32 scale). Combine returns bf16 expert rows weighted by fp32 scales.
 * Payload per rank = every (token, expert) row the operator moves (local ones included, as
 * DeepEP counts): dispatch rows x (row + scale bytes) + combine rows x 2H bytes; GBps =
 * payload / (dispatch + combine time). Times are rank 0's medians, each call started right
 * after a barrier. zero_fill 1 = the library default (unwritten output rows zeroed, as the
 * CPU model promises), 0 = the device's contract (left as they were); the MPI baseline
 * produces the same outputs in both modes.
 *
 * Each side runs in its own processes: megamoe under `megamoe launch -n 2` (ranks pinned to
 * cores 0 and 1), MPI under `mpirun -np 2 --bind-to core`, gloo via bench/bench_dispatch_gloo.py.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "megamoe/comm.h"
#include "megamoe/megamoe.h"
#include "megamoe/ops.h"

#include "base/alloc.h"
#include "base/clock.h"
#include "bench_util.h"
#include "bench_wire.h"
#include "kernels/quant.h"
#include "ops/v2_internal.h"

#ifdef MEGAMOE_HAVE_MPI
#include <mpi.h>
#endif

#define MM_BD_H 7168
#define MM_BD_K 8
#define MM_BD_E 64
#define MM_BD_W 2

typedef struct {
    int bs, quant, zero_fill, reps;
    const char *alg; /* comm_alg of the megamoe side ("fullmesh_v1", "hierarchy", ...) */
} mm_bd_case_t;

/* ---- workload (the gloo script reproduces it exactly) ------------------------------------ */

static uint64_t mm_bd_sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void mm_bd_routing(int rank, int bs, int32_t *ids, float *w)
{
    for (int t = 0; t < bs; t++) {
        uint64_t s = (uint64_t)rank * 1000003u + (uint64_t)t;
        int perm[MM_BD_E];
        for (int e = 0; e < MM_BD_E; e++) perm[e] = e;
        for (int i = 0; i < MM_BD_K; i++) {
            int j = i + (int)(mm_bd_sm64(&s) % (uint64_t)(MM_BD_E - i));
            int tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
            ids[t * MM_BD_K + i] = perm[i];
            w[t * MM_BD_K + i] = 1.0f / (float)(i + 2);
        }
    }
}

static void mm_bd_fill(uint16_t *x, int64_t n, int seed)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = megamoe_fp32_to_bf16((float)((i * 31 + seed * 7) % 97) / 97.0f - 0.5f);
}

static double mm_bd_median(double *v, int n) { return mm_bench_median_of(v, n); }

static void mm_bd_pin(int rank)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    CPU_SET(rank % (ncpu > 0 ? ncpu : 1), &set);
    sched_setaffinity(0, sizeof set, &set);
}

/* This process's CPU time (every thread: the engine's progress thread too), seconds. */
static double mm_bd_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mm_bd_result(FILE *f, const char *impl, const mm_bd_case_t *c, double d_us,
                         double c_us, double bytes, double cpu_us, const mm_bench_wire_t *w)
{
    /* the megamoe side's rows name their comm_alg: "megamoe:hierarchy"; across hosts they end
     * with the bytes and engine messages to other hosts per dispatch + combine */
    fprintf(f, "%s%s%s %d %d %d %.3f %.3f %.0f %.3f", impl, strcmp(impl, "megamoe") ? "" : ":",
            strcmp(impl, "megamoe") ? "" : c->alg, c->bs, c->quant, c->zero_fill, d_us, c_us, bytes,
            cpu_us);
    if (w) fprintf(f, " %.0f %.1f", w->bytes, w->messages);
    fprintf(f, "\n");
    fflush(f);
}

/* ---- megamoe side ---------------------------------------------------------------------- */

/* --comm-alg: the algorithms the megamoe side runs, each case in turn */
static char mm_bd_alg_buf[128];
static const char *mm_bd_algs[4];
static int mm_bd_n_algs;

static int mm_bd_parse_algs(const char *list)
{
    snprintf(mm_bd_alg_buf, sizeof mm_bd_alg_buf, "%s", list);
    mm_bd_n_algs = 0;
    for (char *t = strtok(mm_bd_alg_buf, ","); t; t = strtok(NULL, ",")) {
        if (strcmp(t, "fullmesh_v1") && strcmp(t, "fullmesh_v2") && strcmp(t, "hierarchy")) {
            fprintf(stderr, "bench dispatch: --comm-alg takes fullmesh_v1, fullmesh_v2 and "
                    "hierarchy, got '%s'\n", t);
            return -1;
        }
        if (mm_bd_n_algs < 4) mm_bd_algs[mm_bd_n_algs++] = t;
    }
    return mm_bd_n_algs ? 0 : -1;
}

static megamoe_tensor_t mm_bd_t(void *data, megamoe_dtype_t t, int ndim, int64_t d0, int64_t d1)
{
    megamoe_tensor_t x = megamoe_tensor_none();
    x.data = data;
    x.dtype = t;
    x.ndim = ndim;
    x.shape[0] = d0;
    x.shape[1] = d1;
    return x;
}

static int mm_bd_megamoe_case(megamoe_comm_t *world, int rank, const mm_bd_case_t *c, FILE *out)
{
    int bs = c->bs;
    uint16_t *x = NULL, *eo = NULL, *xo = NULL;
    int32_t *ids = malloc((size_t)bs * MM_BD_K * 4);
    float *w = malloc((size_t)bs * MM_BD_K * 4);
    mm_aligned_alloc((size_t)bs * MM_BD_H * 2, 64, "x", (void **)&x);
    mm_aligned_alloc((size_t)bs * MM_BD_H * 2, 64, "out", (void **)&xo);
    mm_bd_routing(rank, bs, ids, w);
    mm_bd_fill(x, (int64_t)bs * MM_BD_H, rank);
    megamoe_dispatch_v2_args_t a = megamoe_dispatch_v2_args_default();
    a.x = mm_bd_t(x, MEGAMOE_DTYPE_BF16, 2, bs, MM_BD_H);
    a.expert_ids = mm_bd_t(ids, MEGAMOE_DTYPE_INT32, 2, bs, MM_BD_K);
    a.group_ep = world;
    a.ep_world_size = MM_BD_W;
    a.ep_rank_id = rank;
    a.moe_expert_num = MM_BD_E;
    a.quant_mode = c->quant;
    a.zero_fill = c->zero_fill;
    a.comm_alg = c->alg;
    if (megamoe_dispatch_v2_infer(&a) != MEGAMOE_OK) return 1;
    void *bufs[7];
    megamoe_tensor_t *outs[7] = {&a.expand_x, &a.dynamic_scales, &a.assist_info_for_combine,
                                 &a.expert_token_nums, &a.ep_recv_counts, &a.tp_recv_counts,
                                 &a.expand_scales};
    for (int i = 0; i < 7; i++) {
        size_t bytes = (size_t)megamoe_tensor_numel(outs[i]) * megamoe_dtype_size(outs[i]->dtype);
        mm_aligned_calloc(bytes ? bytes : 64, 64, "dispatch output", &bufs[i]);
        outs[i]->data = bufs[i];
    }
    int64_t rows = a.expand_x.shape[0];
    if (c->quant) {
        mm_aligned_alloc((size_t)rows * MM_BD_H * 2, 64, "expert out", (void **)&eo);
        mm_bd_fill(eo, rows * MM_BD_H, 3);
    } else {
        eo = a.expand_x.data;
    }
    megamoe_combine_v2_args_t cb = megamoe_combine_v2_args_default();
    cb.expand_x = mm_bd_t(eo, MEGAMOE_DTYPE_BF16, 2, rows, MM_BD_H);
    cb.expert_ids = a.expert_ids;
    cb.assist_info_for_combine = a.assist_info_for_combine;
    cb.ep_send_counts = a.ep_recv_counts;
    cb.expert_scales = mm_bd_t(w, MEGAMOE_DTYPE_FP32, 2, bs, MM_BD_K);
    cb.group_ep = world;
    cb.ep_world_size = MM_BD_W;
    cb.ep_rank_id = rank;
    cb.moe_expert_num = MM_BD_E;
    cb.zero_fill = c->zero_fill;
    cb.comm_alg = c->alg;
    cb.x = mm_bd_t(xo, MEGAMOE_DTYPE_BF16, 2, bs, MM_BD_H);
    int n = c->reps + 2, rc = 0;
    double *td = calloc((size_t)n, sizeof(double)), *tc = calloc((size_t)n, sizeof(double));
    double *tu = calloc((size_t)n, sizeof(double));
    mm_shmem_engine_stats_t s0, s1, w0, w1;
    memset(&w0, 0, sizeof w0);
    memset(&w1, 0, sizeof w1);
    for (int r = 0; r < n && rc == 0; r++) {
        megamoe_comm_barrier(world);
        mm_shmem_engine_stats(&s0);
        double u0 = mm_bd_cpu_s();
        uint64_t t0 = mm_now_ns();
        if (megamoe_dispatch_v2(&a) != MEGAMOE_OK) rc = 1;
        uint64_t t1 = mm_now_ns();
        double u1 = mm_bd_cpu_s();
        mm_shmem_engine_stats(&s1);
        if (r >= 2) { /* the traffic of the timed calls (barriers left out) */
            w1.put_bytes += s1.put_bytes - s0.put_bytes;
            w1.messages += s1.messages - s0.messages;
        }
        megamoe_comm_barrier(world);
        mm_shmem_engine_stats(&s0);
        double u2 = mm_bd_cpu_s();
        uint64_t t2 = mm_now_ns();
        if (rc == 0 && megamoe_combine_v2(&cb) != MEGAMOE_OK) rc = 1;
        uint64_t t3 = mm_now_ns();
        mm_shmem_engine_stats(&s1);
        if (r >= 2) {
            w1.put_bytes += s1.put_bytes - s0.put_bytes;
            w1.messages += s1.messages - s0.messages;
        }
        td[r] = (double)(t1 - t0) * 1e-3;
        tc[r] = (double)(t3 - t2) * 1e-3;
        tu[r] = (u1 - u0 + mm_bd_cpu_s() - u2) * 1e6;
    }
    if (rc == 0 && rank == 0) {
        int64_t recv = ((int32_t *)a.ep_recv_counts.data)[MM_BD_E / MM_BD_W * MM_BD_W - 1];
        double row = (double)MM_BD_H * (c->quant ? 1 : 2) + (c->quant ? 4 : 0);
        double bytes = (double)recv * row + (double)recv * MM_BD_H * 2;
        mm_bench_wire_t wire = mm_bench_wire_delta(&w0, &w1, c->reps);
        mm_bd_result(out, "megamoe", c, mm_bd_median(td + 2, c->reps), mm_bd_median(tc + 2, c->reps),
                     bytes, mm_bd_median(tu + 2, c->reps), &wire);
    }
    free(td);
    free(tc);
    free(tu);
    if (c->quant) mm_aligned_free(eo);
    for (int i = 0; i < 7; i++) mm_aligned_free(bufs[i]);
    mm_aligned_free(x);
    mm_aligned_free(xo);
    free(ids);
    free(w);
    return rc;
}

static int mm_bd_megamoe_worker(const mm_bd_case_t *cases, int ncases, const char *out_path)
{
    megamoe_comm_t *world = NULL;
    if (megamoe_comm_create(NULL, &world) != MEGAMOE_OK) {
        fprintf(stderr, "bench dispatch: %s\n", megamoe_last_error());
        return 1;
    }
    int rank = megamoe_comm_rank(world);
    mm_bd_pin(rank);
    FILE *out = rank == 0 ? fopen(out_path, "a") : NULL;
    int rc = 0;
    for (int i = 0; i < ncases && rc == 0; i++)
        for (int j = 0; j < mm_bd_n_algs && rc == 0; j++) {
            char label[64];
            snprintf(label, sizeof label, "megamoe %s", mm_bd_algs[j]);
            if (rank == 0) mm_bench_progress(i * mm_bd_n_algs + j + 1, ncases * mm_bd_n_algs, label);
            mm_bd_case_t c = cases[i];
            c.alg = mm_bd_algs[j];
            rc = mm_bd_megamoe_case(world, rank, &c, out);
            if (rc) fprintf(stderr, "bench dispatch: %s\n", megamoe_last_error());
        }
    if (out) fclose(out);
    megamoe_ops_release();
    megamoe_comm_destroy(world);
    return rc;
}

/* ---- MPI_Alltoallv side ---------------------------------------------------------------- */

#ifdef MEGAMOE_HAVE_MPI
/* Dispatch: counts (MPI_Alltoall), pack rows by destination in the operator's order (local
 * expert, token; quantised on the way), MPI_Alltoallv, unpack into expand_x's layout (expert,
 * source, token) with scales and assist triples. Combine: pack expert rows by source,
 * MPI_Alltoallv back, weighted sum in k order. Same outputs as the operator. */
typedef struct {
    int bs, L, quant;
    size_t row, rec;          /* payload bytes; record = payload + scale + (t, k) */
    int32_t *ids;
    float *w;
    uint16_t *x;
    int scnt[MM_BD_W][MM_BD_E / MM_BD_W], rcnt[MM_BD_W][MM_BD_E / MM_BD_W];
    int sdisp[MM_BD_W], sbytes[MM_BD_W], rdisp[MM_BD_W], rbytes[MM_BD_W];
    uint8_t *sbuf, *rbuf, *expand, *cs, *cr;
    float *dyn;
    int32_t *assist;
    uint16_t *xo;
    int64_t A, recv;
    int32_t *order;           /* [bs*K] pair index in send order */
} mm_bd_mpi_t;

static void mm_bd_mpi_dispatch(mm_bd_mpi_t *m, int zero_fill)
{
    int L = m->L, K = MM_BD_K;
    memset(m->scnt, 0, sizeof m->scnt);
    for (int i = 0; i < m->bs * K; i++) m->scnt[m->ids[i] / L][m->ids[i] % L]++;
    MPI_Alltoall(m->scnt, L, MPI_INT, m->rcnt, L, MPI_INT, MPI_COMM_WORLD);
    int off[MM_BD_W][MM_BD_E / MM_BD_W], pos = 0, rpos = 0;
    for (int d = 0; d < MM_BD_W; d++) {
        m->sdisp[d] = pos * (int)m->rec;
        for (int le = 0; le < L; le++) {
            off[d][le] = pos;
            pos += m->scnt[d][le];
        }
        m->sbytes[d] = pos * (int)m->rec - m->sdisp[d];
        int n = 0;
        for (int le = 0; le < L; le++) n += m->rcnt[d][le];
        m->rdisp[d] = rpos * (int)m->rec;
        m->rbytes[d] = n * (int)m->rec;
        rpos += n;
    }
    m->recv = rpos;
    for (int t = 0; t < m->bs; t++) {
        const uint16_t *xr = m->x + (size_t)t * MM_BD_H;
        float scale = 0.0f;
        int8_t q[MM_BD_H];
        if (m->quant) mm_quant_dynamic_token(xr, MEGAMOE_DTYPE_BF16, MM_BD_H, NULL, MEGAMOE_DTYPE_INT8, q, &scale);
        for (int k = 0; k < K; k++) {
            int e = m->ids[t * K + k], slot = off[e / L][e % L]++;
            uint8_t *r = m->sbuf + (size_t)slot * m->rec;
            memcpy(r, m->quant ? (const void *)q : (const void *)xr, m->row);
            int32_t meta[3] = {t, k, 0};
            memcpy(r + m->row, &scale, 4);
            memcpy(r + m->row + 4, meta, 8);
            m->order[slot] = t * K + k;
        }
    }
    MPI_Alltoallv(m->sbuf, m->sbytes, m->sdisp, MPI_BYTE, m->rbuf, m->rbytes, m->rdisp, MPI_BYTE,
                  MPI_COMM_WORLD);
    int64_t row = 0;
    for (int le = 0; le < L; le++)
        for (int s = 0; s < MM_BD_W; s++) {
            int first = m->rdisp[s] / (int)m->rec;
            for (int le2 = 0; le2 < le; le2++) first += m->rcnt[s][le2];
            for (int i = 0; i < m->rcnt[s][le]; i++, row++) {
                const uint8_t *r = m->rbuf + (size_t)(first + i) * m->rec;
                memcpy(m->expand + (size_t)row * m->row, r, m->row);
                memcpy(&m->dyn[row], r + m->row, 4);
                int32_t meta[2];
                memcpy(meta, r + m->row + 4, 8);
                m->assist[3 * row] = s;
                m->assist[3 * row + 1] = meta[0];
                m->assist[3 * row + 2] = meta[1];
            }
        }
    if (zero_fill) {
        memset(m->expand + (size_t)row * m->row, 0, (size_t)(m->A - row) * m->row);
        memset(m->dyn + row, 0, (size_t)(m->A - row) * 4);
        memset(m->assist + 3 * row, 0, (size_t)(128 * m->A - 3 * row) * 4);
    }
}

static void mm_bd_mpi_combine(mm_bd_mpi_t *m, const uint16_t *eo)
{
    int L = m->L, K = MM_BD_K;
    size_t hr = (size_t)MM_BD_H * 2;
    int sb[MM_BD_W], sd[MM_BD_W], rb[MM_BD_W], rd[MM_BD_W];
    for (int s = 0; s < MM_BD_W; s++) {
        sb[s] = m->rbytes[s] / (int)m->rec * (int)hr;
        sd[s] = m->rdisp[s] / (int)m->rec * (int)hr;
        rb[s] = m->sbytes[s] / (int)m->rec * (int)hr;
        rd[s] = m->sdisp[s] / (int)m->rec * (int)hr;
    }
    /* rows of source s, in the order s sent them (local expert, token) */
    int64_t row = 0;
    for (int le = 0; le < L; le++)
        for (int s = 0; s < MM_BD_W; s++) {
            int before = 0;
            for (int le2 = 0; le2 < le; le2++) before += m->rcnt[s][le2];
            for (int i = 0; i < m->rcnt[s][le]; i++, row++)
                memcpy(m->cs + (size_t)sd[s] + (size_t)(before + i) * hr, eo + (size_t)row * MM_BD_H, hr);
        }
    MPI_Alltoallv(m->cs, sb, sd, MPI_BYTE, m->cr, rb, rd, MPI_BYTE, MPI_COMM_WORLD);
    /* slot (t, k) -> received row, then the weighted sum in k order */
    const uint16_t **slot = malloc((size_t)m->bs * K * sizeof *slot);
    for (int i = 0; i < m->bs * K; i++) slot[m->order[i]] = (const uint16_t *)(m->cr + (size_t)i * hr);
    float acc[MM_BD_H];
    for (int t = 0; t < m->bs; t++) {
        memset(acc, 0, sizeof acc);
        /* the operator's own accumulate kernel and chunking (accumulator chunk in L1) */
        for (int c0 = 0; c0 < MM_BD_H; c0 += 1024) {
            int n = MM_BD_H - c0 < 1024 ? MM_BD_H - c0 : 1024;
            for (int k = 0; k < K; k++)
                mm_rows_axpy(MEGAMOE_DTYPE_BF16, acc + c0, slot[t * K + k] + c0, m->w[t * K + k], n);
        }
        megamoe_convert(m->xo + (size_t)t * MM_BD_H, MEGAMOE_DTYPE_BF16, acc, MEGAMOE_DTYPE_FP32, MM_BD_H);
    }
    free(slot);
}

static int mm_bd_mpi_worker(const mm_bd_case_t *cases, int ncases, const char *out_path)
{
    MPI_Init(NULL, NULL);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != MM_BD_W) {
        if (rank == 0) fprintf(stderr, "bench dispatch: the MPI side needs 2 ranks\n");
        MPI_Finalize();
        return 1;
    }
    FILE *out = rank == 0 ? fopen(out_path, "a") : NULL;
    for (int ci = 0; ci < ncases; ci++) {
        const mm_bd_case_t *c = &cases[ci];
        if (rank == 0) mm_bench_progress(ci + 1, ncases, "mpi_alltoallv");
        mm_bd_mpi_t m;
        memset(&m, 0, sizeof m);
        m.bs = c->bs;
        m.L = MM_BD_E / MM_BD_W;
        m.quant = c->quant;
        m.row = (size_t)MM_BD_H * (c->quant ? 1 : 2);
        m.rec = mm_align_up(m.row + 12, 16);
        m.A = (int64_t)c->bs * MM_BD_W * (m.L < MM_BD_K ? m.L : MM_BD_K);
        size_t pairs = (size_t)c->bs * MM_BD_K, hr = (size_t)MM_BD_H * 2;
        m.ids = malloc(pairs * 4);
        m.w = malloc(pairs * 4);
        m.order = malloc(pairs * 4);
        mm_aligned_alloc((size_t)c->bs * hr, 64, "x", (void **)&m.x);
        mm_aligned_alloc((size_t)c->bs * hr, 64, "out", (void **)&m.xo);
        mm_aligned_alloc(pairs * m.rec, 64, "send", (void **)&m.sbuf);
        mm_aligned_alloc((size_t)m.A * m.rec, 64, "recv", (void **)&m.rbuf);
        mm_aligned_calloc((size_t)m.A * m.row, 64, "expand_x", (void **)&m.expand);
        mm_aligned_calloc((size_t)m.A * 4, 64, "scales", (void **)&m.dyn);
        mm_aligned_calloc((size_t)m.A * 128 * 4, 64, "assist", (void **)&m.assist);
        mm_aligned_alloc((size_t)m.A * hr, 64, "combine send", (void **)&m.cs);
        mm_aligned_alloc(pairs * hr, 64, "combine recv", (void **)&m.cr);
        uint16_t *eo = NULL;
        mm_aligned_alloc((size_t)m.A * hr, 64, "expert out", (void **)&eo);
        mm_bd_fill(eo, m.A * MM_BD_H, 3);
        mm_bd_routing(rank, c->bs, m.ids, m.w);
        mm_bd_fill(m.x, (int64_t)c->bs * MM_BD_H, rank);
        int n = c->reps + 2;
        double *td = calloc((size_t)n, sizeof(double)), *tc = calloc((size_t)n, sizeof(double));
        double *tu = calloc((size_t)n, sizeof(double));
        for (int r = 0; r < n; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double u0 = mm_bd_cpu_s();
            double t0 = MPI_Wtime();
            mm_bd_mpi_dispatch(&m, c->zero_fill);
            double t1 = MPI_Wtime();
            double u1 = mm_bd_cpu_s();
            MPI_Barrier(MPI_COMM_WORLD);
            double u2 = mm_bd_cpu_s();
            double t2 = MPI_Wtime();
            mm_bd_mpi_combine(&m, c->quant ? eo : (const uint16_t *)m.expand);
            double t3 = MPI_Wtime();
            td[r] = (t1 - t0) * 1e6;
            tc[r] = (t3 - t2) * 1e6;
            tu[r] = (u1 - u0 + mm_bd_cpu_s() - u2) * 1e6;
        }
        if (rank == 0) {
            double row = (double)m.row + (c->quant ? 4 : 0);
            double bytes = (double)m.recv * row + (double)m.recv * (double)hr;
            mm_bd_result(out, "mpi_alltoallv", c, mm_bd_median(td + 2, c->reps),
                         mm_bd_median(tc + 2, c->reps), bytes, mm_bd_median(tu + 2, c->reps), NULL);
        }
        free(td);
        free(tc);
        free(tu);
        free(m.ids);
        free(m.w);
        free(m.order);
        void *bufs[] = {m.x, m.xo, m.sbuf, m.rbuf, m.expand, m.dyn, m.assist, m.cs, m.cr, eo};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mm_aligned_free(bufs[i]);
    }
    if (out) fclose(out);
    MPI_Finalize();
    return 0;
}
#endif

/* ---- driver ---------------------------------------------------------------------------- */

static int mm_bd_spawn(char *const argv[], const char *heap, const char *ranks_per_node)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(2, 1); /* workers talk on stderr; stdout carries only the JSON */
        if (heap) setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", heap, 1);
        /* hierarchy groups = hosts, unless the user chose */
        if (ranks_per_node) setenv("MEGAMOE_RANKS_PER_NODE", ranks_per_node, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int mm_bd_script(char *out, size_t len)
{
    return mm_bench_script("bench_dispatch_gloo.py", out, len);
}

static int mm_bd_parse_cases(const char *bs_list, const char *quants, int reps, int zero_fill_both,
                             mm_bd_case_t *cases, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", bs_list);
    for (char *s = strtok(buf, ","); s && n < max; s = strtok(NULL, ",")) {
        int bs = atoi(s);
        for (const char *q = quants; *q && n < max; q++) {
            if (*q != '0' && *q != '2') continue;
            for (int zf = 1; zf >= (zero_fill_both ? 0 : 1) && n < max; zf--) {
                cases[n].bs = bs;
                cases[n].quant = *q - '0';
                cases[n].zero_fill = zf;
                cases[n].reps = reps > 0 ? reps : bs <= 512 ? 40 : 6;
                n++;
            }
        }
    }
    return n;
}

static int mm_bd_main(int argc, char **argv)
{
    const char *bs_list = mm_bench_opt(argc, argv, "--bs", "128,4096");
    const char *quants = mm_bench_opt(argc, argv, "--quant", "0,2");
    const char *worker = mm_bench_opt(argc, argv, "--worker", NULL);
    const char *out_path = mm_bench_opt(argc, argv, "--out", NULL);
    int reps = atoi(mm_bench_opt(argc, argv, "--reps", "0"));
    int both = !mm_bench_flag(argc, argv, "--zero-fill-only");
    const char *hosts = mm_bench_opt(argc, argv, "--hosts", NULL);
    int multi_host = hosts && atoi(hosts) > 1;
    const char *algs = mm_bench_opt(argc, argv, "--comm-alg",
                                    multi_host ? "fullmesh_v1,hierarchy" : "fullmesh_v1");
    if (mm_bench_flag(argc, argv, "--help")) {
        printf("usage: megamoe bench dispatch [--bs 128,4096] [--quant 0,2] [--reps N] "
               "[--no-mpi] [--no-gloo] [--zero-fill-only] [--hosts H]\n"
               "                              [--comm-alg fullmesh_v1,fullmesh_v2,hierarchy]\n"
               "--hosts H: every side on H simulated hosts (megamoe launch --hosts; root);\n"
               "rows carry \"hosts\" (1 without it)\n"
               "--comm-alg: the megamoe side runs each case with each listed algorithm (rows\n"
               "carry \"comm_alg\"; default fullmesh_v1, and hierarchy too across hosts, with\n"
               "MEGAMOE_RANKS_PER_NODE = ranks per host unless set)\n");
        return 0;
    }
    if (mm_bd_parse_algs(algs) != 0) return 2;
    if (hosts && (atoi(hosts) < 1 || MM_BD_W % atoi(hosts) != 0)) {
        fprintf(stderr, "bench dispatch: --hosts must divide the %d ranks, got '%s'\n", MM_BD_W, hosts);
        return 2;
    }
    mm_bd_case_t cases[32];
    int ncases = mm_bd_parse_cases(bs_list, quants, reps, both, cases, 32);
    if (worker && out_path) {
        if (!strcmp(worker, "megamoe")) return mm_bd_megamoe_worker(cases, ncases, out_path);
#ifdef MEGAMOE_HAVE_MPI
        if (!strcmp(worker, "mpi")) return mm_bd_mpi_worker(cases, ncases, out_path);
#endif
        return 2;
    }
    char dir[] = "/tmp/megamoe-bench-dispatch-XXXXXX";
    if (mkdtemp(dir) == NULL) return 1;
    char res[256], rs[32];
    snprintf(res, sizeof res, "%s/results.txt", dir);
    snprintf(rs, sizeof rs, "%d", reps);
    const char *self = mm_bench_self_exe();
    /* worker arguments: argv[skip..] of each launcher line, worker name in slot `wslot` */
    char *wk[26];
    int n = 0;
    char *opts[] = {"bench", "dispatch", "--bs", (char *)bs_list, "--quant", (char *)quants,
                    "--reps", rs, "--comm-alg", (char *)algs, "--out", res, "--worker"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) wk[n++] = opts[i];
    int wslot = n++;
    if (!both) wk[n++] = "--zero-fill-only";
    wk[n] = NULL;
    /* megamoe launch [--hosts H] -n 2 --timeout 1800 -- (the launcher's line for every side) */
    char *launch[12] = {(char *)self, "launch"};
    int nl = 2;
    if (hosts) {
        launch[nl++] = "--hosts";
        launch[nl++] = (char *)hosts;
    }
    char *a1[48];
    char *rest1[] = {"-n", "2", "--timeout", "1800", "--", (char *)self};
    memcpy(a1, launch, (size_t)nl * sizeof(char *));
    memcpy(a1 + nl, rest1, sizeof rest1);
    wk[wslot] = "megamoe";
    memcpy(a1 + nl + 6, wk, (size_t)(n + 1) * sizeof(char *));
    char rpn[16];
    snprintf(rpn, sizeof rpn, "%d", hosts ? MM_BD_W / atoi(hosts) : MM_BD_W);
    int rc = mm_bd_spawn(a1, "4G", hosts ? rpn : NULL);
    if (rc) fprintf(stderr, "bench dispatch: the megamoe side failed (status %d)\n", rc);
#ifdef MEGAMOE_HAVE_MPI
    if (!mm_bench_flag(argc, argv, "--no-mpi")) {
        char *a2[48] = {"mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "core", (char *)self};
        int na = 7;
        if (hosts) { /* the same simulated hosts, mpirun started by the launcher */
            char *via[] = {"--mpirun", "-n", "2", "--mpi-arg", "--bind-to", "--mpi-arg", "core",
                           "--timeout", "1800", "--", (char *)self};
            memcpy(a2, launch, (size_t)nl * sizeof(char *));
            memcpy(a2 + nl, via, sizeof via);
            na = nl + (int)(sizeof via / sizeof via[0]);
        }
        wk[wslot] = "mpi";
        memcpy(a2 + na, wk, (size_t)(n + 1) * sizeof(char *));
        if (mm_bd_spawn(a2, NULL, NULL)) fprintf(stderr, "bench dispatch: the MPI side failed\n");
    }
#else
    fprintf(stderr, "bench dispatch: built without MPI (MEGAMOE_WITH_MPI=OFF): no mpi_alltoallv rows\n");
#endif
    char script[4096];
    if (!mm_bench_flag(argc, argv, "--no-gloo")) {
        if (mm_bd_script(script, sizeof script) == 0) {
            char *a3[32];
            char *rest3[] = {"-n", "2", "--timeout", "1800", "--", (char *)mm_bench_python(), script,
                             "--bs", (char *)bs_list, "--quant", (char *)quants, "--out", res, NULL};
            memcpy(a3, launch, (size_t)nl * sizeof(char *));
            memcpy(a3 + nl, rest3, sizeof rest3);
            if (mm_bd_spawn(a3, NULL, NULL)) fprintf(stderr, "bench dispatch: the gloo side failed\n");
        } else {
            fprintf(stderr, "bench dispatch: bench/bench_dispatch_gloo.py not found: no gloo rows\n");
        }
    }
    /* across hosts: the engine's own put rate and round trip, for the wire floor (issue 31) */
    mm_bench_wire_engine_t eng;
    memset(&eng, 0, sizeof eng);
    if (multi_host) mm_bench_wire_engine_measure(atoi(hosts), &eng);
    struct {
        char label[112];
        double ratio;
        int bs;
    } floors[64];
    int n_floors = 0;
    mm_bench_begin("dispatch");
    FILE *f = fopen(res, "r");
    char impl[48];
    int bs, q, zf;
    double d, c, bytes;
    typedef struct {
        char impl[112];
        int bs, q, zf;
        double us;
    } mm_bd_row_t;
    mm_bd_row_t rows[128];
    int n_rows = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        double cpu = 0.0 / 0.0; /* the gloo script's lines have no CPU time */
        double wbytes = -1, wmsgs = 0;
        if (sscanf(line, "%47s %d %d %d %lf %lf %lf %lf %lf %lf", impl, &bs, &q, &zf, &d, &c,
                   &bytes, &cpu, &wbytes, &wmsgs) < 7)
            continue;
        char *alg = strchr(impl, ':');
        if (alg) *alg++ = '\0';
        if (n_rows < 128) {
            mm_bd_row_t *r = &rows[n_rows++];
            snprintf(r->impl, sizeof r->impl, "%s%s%s", impl, alg ? " " : "", alg ? alg : "");
            r->bs = bs, r->q = q, r->zf = zf, r->us = d + c;
        }
        mm_bench_row();
        mm_bench_str("impl", impl);
        if (alg) mm_bench_str("comm_alg", alg);
        mm_bench_int("ranks", MM_BD_W);
        mm_bench_int("hosts", hosts ? atoi(hosts) : 1);
        mm_bench_int("bs", bs);
        mm_bench_int("h", MM_BD_H);
        mm_bench_int("k", MM_BD_K);
        mm_bench_int("e", MM_BD_E);
        mm_bench_int("quant_mode", q);
        mm_bench_bool("zero_fill", zf);
        mm_bench_num("dispatch_us", d);
        mm_bench_num("combine_us", c);
        mm_bench_num("GBps", bytes / ((d + c) * 1e-6) * 1e-9);
        mm_bench_num("cpu_us", cpu); /* the rank's CPU time in dispatch + combine, all threads */
        if (multi_host && wbytes >= 0) {
            /* the wire floor: rank 0's bytes to other hosts at the engine's put rate plus two
             * engine round trips per dispatch and per combine (a count exchange, a completion) */
            mm_bench_wire_t w = {wbytes, wmsgs, 0};
            const double us = d + c;
            mm_bench_wire_fields(&eng, &w, 4, us * 1e-3);
            if (n_floors < 64) {
                snprintf(floors[n_floors].label, sizeof floors[0].label, "%s %s quant %d zero_fill %d",
                         impl, alg ? alg : "", q, zf);
                floors[n_floors].bs = bs;
                floors[n_floors++].ratio = us * 1e-3 / mm_bench_wire_floor_ms(&eng, wbytes, 4);
            }
        }
    }
    if (f) fclose(f);
    mm_bench_end();
    /* target (issue 12, across hosts): dispatch+combine >= 1.5 x MPI_Alltoallv */
    int header = 0;
    for (int i = 0; i < n_rows; i++) {
        if (strncmp(rows[i].impl, "megamoe", 7) != 0) continue;
        for (int j = 0; j < n_rows; j++) {
            if (strcmp(rows[j].impl, "mpi_alltoallv") || rows[j].bs != rows[i].bs ||
                rows[j].q != rows[i].q || rows[j].zf != rows[i].zf)
                continue;
            if (!header++)
                fprintf(stderr, "\nmegamoe speed over MPI_Alltoallv (dispatch+combine)%s:\n",
                        multi_host ? "; target across hosts >= 1.5x" : "");
            double ratio = rows[j].us / rows[i].us;
            fprintf(stderr, "  %-22s bs %5d quant %d zero_fill %d: %.2fx%s\n", rows[i].impl,
                    rows[i].bs, rows[i].q, rows[i].zf, ratio,
                    multi_host ? (ratio >= 1.5 ? " met" : " NOT met") : "");
        }
    }
    if (n_floors) {
        fprintf(stderr, "\nmegamoe dispatch+combine over its wire floor (issue 31: <= 1.5x at bs 8-128; "
                "engine's own put %.2f GB/s at 1 MiB, round trip %.1f us):\n", eng.put_gbps,
                eng.signal_rtt_us);
        for (int i = 0; i < n_floors; i++)
            fprintf(stderr, "  %-40s bs %5d: %.2fx%s\n", floors[i].label, floors[i].bs,
                    floors[i].ratio, floors[i].bs >= 8 && floors[i].bs <= 128
                                         ? (floors[i].ratio <= 1.5 ? " met" : " NOT met") : "");
    }
    unlink(res);
    rmdir(dir);
    return rc;
}

const mm_bench_def_t mm_bench_dispatch_def = {
    "dispatch", "DispatchV2+CombineV2 vs MPI_Alltoallv and gloo, 2 ranks", mm_bd_main};
