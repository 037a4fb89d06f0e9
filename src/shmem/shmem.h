/* Private symmetric-memory runtime (SHMEM) — the internal API used by ops, multicore and moe.
 *
 * Modelled on OpenSHMEM 1.5 / NVSHMEM so kernels read like their GPU counterparts:
 *  - PEs are the ranks of the world (a process each). Every PE owns one heap segment of
 *    HYPER_PARALLEL_SHMEM_HEAP_SIZE bytes; same-host peers map each other's segment, so a remote
 *    object is (peer base + same offset) and can be loaded/stored directly (mm_shmem_ptr).
 *  - Symmetric allocation is collective over the WORLD and must be called in the same order
 *    with the same arguments on every PE (as shmem_malloc); the result has the same offset on
 *    every PE. A mismatch between PEs is detected and reported as CONFIG_MISMATCH on all PEs.
 *  - Signals are uint64_t words in the symmetric heap, one per 64-byte line.
 *
 * Memory ordering (what callers may rely on):
 *  - mm_shmem_put_signal(): the data is visible to the target before the signal update; a
 *    waiter that observes the new signal value (mm_shmem_signal_wait_until, acquire) sees the
 *    data. Plain puts issued earlier by the same thread to the same PE are also visible.
 *  - mm_shmem_fence(): puts/signals issued before it to a PE are delivered before those issued
 *    after it to the same PE. mm_shmem_quiet(): all puts issued before it, to all PEs, are
 *    complete (visible) when it returns. Barriers imply quiet.
 *
 * Errors: waits return TIMEOUT after HYPER_PARALLEL_SHMEM_TIMEOUT_SEC and PEER_LOST within 2 s of
 * a peer's death (process gone or bootstrap connection closed); nothing blocks forever.
 * Threads: data-path calls (put/get/signal/wait) are thread-safe; allocation, teams and
 * barriers on one team must not run concurrently from several threads of a PE.
 */
#ifndef MM_SHMEM_SHMEM_H
#define MM_SHMEM_SHMEM_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

typedef struct mm_shmem_team mm_shmem_team_t;

/* ---- lifecycle (process-wide reference count, exactly as the seed) ---- */

typedef struct mm_shmem_params {
    int rank;              /* -1: RANK, else OMPI_COMM_WORLD_RANK */
    int world_size;        /* -1: WORLD_SIZE, else OMPI_COMM_WORLD_SIZE */
    const char *endpoint;  /* NULL: HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT */
    uint64_t heap_size;    /* 0: HYPER_PARALLEL_SHMEM_HEAP_SIZE */
    int timeout_sec;       /* 0: HYPER_PARALLEL_SHMEM_TIMEOUT_SEC */
    const char *job_token; /* NULL/"": MEGAMOE_JOB_TOKEN, MEGAMOE_JOB_TOKEN_FILE, MPI */
} mm_shmem_params_t;

mm_shmem_params_t mm_shmem_params_default(void);

/* First acquire in the process bootstraps, maps the heaps and returns when every PE is up;
 * later acquires only increment the count (their params must match the running runtime or
 * be defaults, else INVALID_STATE). A failed first acquire leaves no reference and may be
 * retried. */
megamoe_status_t mm_shmem_acquire(const mm_shmem_params_t *params);
/* Pairs with acquire. The last release checks every symmetric allocation was freed (else
 * INVALID_STATE listing the leaks, reference kept), synchronises all PEs and tears down.
 * Release without a reference is INVALID_STATE. */
megamoe_status_t mm_shmem_release(void);
int mm_shmem_refcount(void);

/* Hooks run by the last mm_shmem_release, before its leak check, on every PE (the last release
 * is collective): layers above free the symmetric caches they own (e.g. operator workspaces)
 * so users need not. A hook must be idempotent and may call collective SHMEM functions. They
 * also run when a peer was lost (the release then tears down locally): their collective calls
 * fail at once and their status is ignored, but they must still drop every pointer into the
 * heap, which is unmapped afterwards.
 * Registering the same (fn, arg) twice is a no-op; hooks stay registered for later
 * lifecycles. INVALID_STATE when the table (8 hooks) is full. */
typedef megamoe_status_t (*mm_shmem_release_hook_t)(void *arg);
megamoe_status_t mm_shmem_add_release_hook(mm_shmem_release_hook_t fn, void *arg);
/* 1 between the first acquire and the last release. */
int mm_shmem_is_running(void);

int mm_shmem_my_pe(void);
int mm_shmem_n_pes(void);
uint64_t mm_shmem_timeout_ns(void);

/* ---- symmetric memory ---- */

/* Collective over the world. align: power of two up to 2 MiB (0 = 64); the address is aligned
 * so on every PE. site: "file:line" for debug_state. */
megamoe_status_t mm_shmem_malloc_site(size_t size, size_t align, const char *site, void **ptr_p);
#define MM_SHMEM_STR2_(x) #x
#define MM_SHMEM_STR_(x) MM_SHMEM_STR2_(x)
#define mm_shmem_malloc(size, align, ptr_p) \
    mm_shmem_malloc_site((size), (align), __FILE__ ":" MM_SHMEM_STR_(__LINE__), (ptr_p))
/* Collective over the world; NULL is a no-op. Freeing twice or a non-heap pointer is an error. */
megamoe_status_t mm_shmem_free(void *ptr);

/* The same over a team: collective over the team's members only (ranks outside it never
 * call); the object has the same offset on every member. Free with mm_shmem_team_free on the
 * same team; a team cannot be destroyed while it owns allocations. */
megamoe_status_t mm_shmem_team_malloc_site(mm_shmem_team_t *team, size_t size, size_t align,
                                           const char *site, void **ptr_p);
#define mm_shmem_team_malloc(team, size, align, ptr_p) \
    mm_shmem_team_malloc_site((team), (size), (align), __FILE__ ":" MM_SHMEM_STR_(__LINE__), (ptr_p))
megamoe_status_t mm_shmem_team_calloc_site(mm_shmem_team_t *team, size_t size, size_t align,
                                           const char *site, void **ptr_p);
#define mm_shmem_team_calloc(team, size, align, ptr_p) \
    mm_shmem_team_calloc_site((team), (size), (align), __FILE__ ":" MM_SHMEM_STR_(__LINE__), (ptr_p))
megamoe_status_t mm_shmem_team_free(mm_shmem_team_t *team, void *ptr);

/* Address at which the calling PE can load/store PE pe's copy of symmetric object sym;
 * NULL when sym is not in the heap or pe is not reachable by load/store. */
void *mm_shmem_ptr(const void *sym, int pe);
/* 1 when ptr lies in the calling PE's heap. */
int mm_shmem_is_symmetric(const void *ptr, size_t nbytes);

typedef struct mm_shmem_debug_state {
    int refcount;
    uint64_t heap_size, bytes_used, bytes_peak;
    int live_allocations;
    /* Text listing live allocations (offset, size, site), NUL-terminated, truncated to fit. */
    char live_table[4096];
} mm_shmem_debug_state_t;
megamoe_status_t mm_shmem_debug_state(mm_shmem_debug_state_t *state_p);
/* Bytes of this PE's user heap that are backed by memory: touched by any PE (the segment is
 * sparse), measured with mincore(). 0 when not running. For sizing
 * HYPER_PARALLEL_SHMEM_HEAP_SIZE (megamoe bench layer reports it). */
uint64_t mm_shmem_heap_touched_bytes(void);

/* ---- one-sided data movement (dest/src symmetric on the remote side) ---- */

enum { MM_SHMEM_SIGNAL_SET = 0, MM_SHMEM_SIGNAL_ADD = 1 };
enum {
    MM_SHMEM_CMP_EQ = 0,
    MM_SHMEM_CMP_NE,
    MM_SHMEM_CMP_GT,
    MM_SHMEM_CMP_GE,
    MM_SHMEM_CMP_LT,
    MM_SHMEM_CMP_LE
};

/* The source of a put is reusable on return; a get's destination holds the data on return.
 * Errors (a bad address, an unreachable or lost peer) are returned and logged; a failure on
 * the engine also marks the peer lost, so every later wait on this PE fails too (callers that
 * ignore the status of a put learn of the failure at their next wait). */
megamoe_status_t mm_shmem_put(void *dest, const void *src, size_t nbytes, int pe);
megamoe_status_t mm_shmem_get(void *dest, const void *src, size_t nbytes, int pe);
/* n gets as one: the engine's are in flight together (about one round trip instead of n),
 * mapped peers' are copies. Every dest holds its data on return; on an error (the first is
 * returned) the dests are undefined, and no get is still in flight. */
typedef struct mm_shmem_get_op {
    void *dest;
    const void *src;
    size_t nbytes;
    int pe;
} mm_shmem_get_op_t;
megamoe_status_t mm_shmem_get_many(const mm_shmem_get_op_t *ops, int n);
megamoe_status_t mm_shmem_put_signal(void *dest, const void *src, size_t nbytes, uint64_t *sig,
                                     uint64_t value, int sig_op, int pe);
megamoe_status_t mm_shmem_signal_op(uint64_t *sig, uint64_t value, int sig_op, int pe);
uint64_t mm_shmem_signal_fetch(const uint64_t *sig);
/* Wait until *sig (local, symmetric or not) compares true with value; spin, then pause, then
 * yield/sleep. value_p (may be NULL) gets the satisfying value. TIMEOUT / PEER_LOST. */
megamoe_status_t mm_shmem_signal_wait_until(uint64_t *sig, int cmp, uint64_t value,
                                            uint64_t *value_p);
/* Local copy with non-temporal (streaming) stores, for large copies whose destination is not
 * read again soon; memcpy without AVX-512. Ends with sfence, so a later signal store cannot
 * overtake the data. */
void mm_shmem_copy_streaming(void *dst, const void *src, size_t n);
megamoe_status_t mm_shmem_fence(void);
megamoe_status_t mm_shmem_quiet(void);

/* A control signal that cannot be delivered to pe even on a second try: declare pe lost (as a
 * broken connection; every PE learns it and its waits fail with PEER_LOST) rather than leave
 * it waiting for the timeout. why names the cause. */
void mm_shmem_declare_lost(int pe, const char *why);
/* Test seam: after `skip` more calls of the kinds in `ops` (MM_SHMEM_RMA_* bits) the next one
 * fails once as an engine failure does: lose_peer 1, a broken connection (the target peer,
 * for fence/quiet the next PE, is marked lost, which every PE learns; PEER_LOST); 0, a
 * transient failure (IO; the peer stays, only the caller knows). ops 0 disarms (the counters
 * and the fired flag stay). Arming resets
 * the counters of the calls made while armed (per kind): a run armed with skip LONG_MAX counts
 * a data path's calls, so a test can aim at its middle. */
enum {
    MM_SHMEM_RMA_PUT = 1,
    MM_SHMEM_RMA_GET = 2,
    MM_SHMEM_RMA_SIGNAL = 4,
    MM_SHMEM_RMA_FENCE = 8,
    MM_SHMEM_RMA_QUIET = 16
};
void mm_shmem_test_fail_rma(unsigned ops, long skip, int lose_peer);
unsigned long mm_shmem_test_rma_count(unsigned ops);
/* 1 once the armed failure happened (since the last arming). */
int mm_shmem_test_rma_fired(void);

/* ---- additions: generic waits, zeroed allocation, liveness, introspection ---- */

/* The same wait as mm_shmem_signal_wait_until on ANY local 64-bit word (e.g. an executor's
 * dependency counter in private memory): spin, pause, yield, sleep; TIMEOUT after
 * HYPER_PARALLEL_SHMEM_TIMEOUT_SEC; PEER_LOST when a peer dies (checked only while the runtime
 * is running). The word is read with acquire loads. */
megamoe_status_t mm_shmem_wait_u64(const uint64_t *addr, int cmp, uint64_t value,
                                   uint64_t *value_p);
/* Non-blocking: 1 when *addr (acquire load) compares true with value. */
int mm_shmem_test_u64(const uint64_t *addr, int cmp, uint64_t value);
/* OK while every peer is alive, else PEER_LOST naming the lost PE (for callers that build
 * their own waits around mm_shmem_test_u64). INVALID_STATE when not running. */
megamoe_status_t mm_shmem_check_liveness(void);

/* mm_shmem_malloc, then zero the local copy and barrier, so no peer can write into the
 * object before every PE zeroed it (the pre-launch convergence rule). */
megamoe_status_t mm_shmem_calloc_site(size_t size, size_t align, const char *site, void **ptr_p);
#define mm_shmem_calloc(size, align, ptr_p) \
    mm_shmem_calloc_site((size), (align), __FILE__ ":" MM_SHMEM_STR_(__LINE__), (ptr_p))

/* Name the segment of PE pe was published under ("/megamoe-<hex>"; removed from /dev/shm
 * once every PE mapped it). For tests and diagnostics. */
megamoe_status_t mm_shmem_segment_name(int pe, char *buf, size_t len);

/* ---- teams (subsets of the world, like shmem_team_t / MPI_Comm_split) ---- */

/* The world team; valid while the runtime is running. */
mm_shmem_team_t *mm_shmem_team_world(void);
/* Collective over parent: PEs with the same color >= 0 form a team ordered by (key, parent
 * rank); color < 0 gives *team_p = NULL. */
megamoe_status_t mm_shmem_team_split(mm_shmem_team_t *parent, int color, int key,
                                     mm_shmem_team_t **team_p);
/* A team of the listed world PEs (n >= 1, distinct, in team order), collective over exactly
 * those PEs: the others never take part. Every member must pass the same list (else
 * CONFIG_MISMATCH on every member); the calling PE must be in it. */
megamoe_status_t mm_shmem_team_create(const int *world_pes, int n, mm_shmem_team_t **team_p);
/* The same with a purpose key (equal on every member, e.g. the object the team is for): two
 * creations among the same PEs for different purposes fail on every member instead of pairing
 * up (after a loss the survivors may be at different points of their programs: one rebuilding
 * a group, another already in its next call). PEER_LOST when a loss was acknowledged in this
 * lifecycle (retry after the current call), CONFIG_MISMATCH otherwise. */
megamoe_status_t mm_shmem_team_create_keyed(const int *world_pes, int n, uint64_t key,
                                            mm_shmem_team_t **team_p);
/* Collective over the members; INVALID_STATE on every member (the team stays) while it still
 * owns symmetric allocations. The team-destroy hooks run first (below). */
megamoe_status_t mm_shmem_team_destroy(mm_shmem_team_t *team);
/* Hooks run at the start of every mm_shmem_team_destroy, on every member (destroy is
 * collective): a layer above frees what it allocated on that team (collectively) and forgets
 * the team. Idempotent registration, at most 8; they stay for later lifecycles. */
typedef megamoe_status_t (*mm_shmem_team_hook_t)(mm_shmem_team_t *team, void *arg);
megamoe_status_t mm_shmem_add_team_destroy_hook(mm_shmem_team_hook_t fn, void *arg);
int mm_shmem_team_my_pe(const mm_shmem_team_t *team);
int mm_shmem_team_n_pes(const mm_shmem_team_t *team);
/* A process-unique id of the team (never reused after destroy, unlike its address); 0 for a
 * dead handle. */
uint64_t mm_shmem_team_uid(const mm_shmem_team_t *team);
/* World PE of team member i (-1 when out of range). */
int mm_shmem_team_world_pe(const mm_shmem_team_t *team, int i);

megamoe_status_t mm_shmem_barrier_all(void);
megamoe_status_t mm_shmem_team_barrier(mm_shmem_team_t *team);
/* Every member contributes nbytes from src; dest (any memory) receives n_pes * nbytes in
 * team order. Small control data (<= 64 KiB); over the heap, fast. */
megamoe_status_t mm_shmem_team_allgather(mm_shmem_team_t *team, void *dest, const void *src,
                                         size_t nbytes);
megamoe_status_t mm_shmem_team_broadcast(mm_shmem_team_t *team, void *buf, size_t nbytes,
                                         int root);
/* Collective decision: every member passes its local status (and sets its last error text
 * when failing). All members return the same result: OK when all were OK, else the status of
 * the lowest team rank that failed, with megamoe_last_error() = "rank R: <its message>". */
megamoe_status_t mm_shmem_team_agree(mm_shmem_team_t *team, megamoe_status_t local);

/* ---- hosts ---- */

/* Hosts of the job (PEs that share memory form a host; numbered by their lowest PE). */
int mm_shmem_n_hosts(void);
/* Host index of world PE pe (-1 when out of range or not running). */
int mm_shmem_host_of(int pe);
/* 1 when world PE pe is reached through the inter-host engine (mm_shmem_ptr is NULL for it:
 * use puts/gets), 0 when its heap is mapped here. */
int mm_shmem_pe_remote(int pe);
/* "UCX 1.13.1 (...)" when the engine runs, else "none". */
void mm_shmem_engine_describe(char *buf, size_t len);

/* What this PE's inter-host engine did since the runtime started (all zero without one):
 * the traffic to peers on other hosts (or every peer with MEGAMOE_SHMEM_INTRA_HOST=engine). */
typedef struct mm_shmem_engine_stats {
    uint64_t messages;    /* operations sent: puts, signals, put-with-signals, requests */
    uint64_t put_bytes;   /* data bytes put */
    uint64_t signals;     /* signal and runtime word updates (alone or with data) */
    uint64_t gets;        /* blocking gets (a round trip each) */
    uint64_t get_bytes;
    uint64_t quiet_waits; /* quiets that waited for acknowledgements (a round trip each) */
} mm_shmem_engine_stats_t;
void mm_shmem_engine_stats(mm_shmem_engine_stats_t *stats);

/* 1 while world PE pe is believed alive. */
int mm_shmem_pe_alive(int pe);

/* ---- surviving a lost rank (survive.h; docs/shmem.md "Surviving a lost rank") ---- */

/* Acknowledge every loss known here: waits until the survivors agreed on who is gone (fast when
 * nothing is pending), then waits stop failing for those ranks and teams that hold one are
 * broken. OK: this rank serves on; PEER_LOST: it stopped (declared lost, or on the smaller
 * side of a partition); TIMEOUT: no agreement within the timeout. Every team collective calls
 * it first, so the callers of the upper layers rarely need to. */
megamoe_status_t mm_shmem_recover(void);
/* 1 when world PE pe is in the agreed (acknowledged) lost set. */
int mm_shmem_pe_lost(int pe);
/* A lost (agreed) member of team, -1 when none; a team with one is broken: its collectives
 * fail with PEER_LOST, its frees are local, it can only be destroyed. */
int mm_shmem_team_lost_member(const mm_shmem_team_t *team);

#endif /* MM_SHMEM_SHMEM_H */
