/* State shared by the files of the SHMEM runtime (not for other layers: use shmem.h).
 *
 * One process-wide runtime (mm_shmem_g). Lifecycle fields change only under `lock` in
 * acquire/release; the data path reads the immutable-while-running fields after an acquire
 * load of `running`. The liveness fields are written by the monitor thread with atomics.
 *
 * Each PE's segment = [reserve | user heap]. The reserve (MM_SHMEM_RESERVE bytes) holds the
 * runtime's own symmetric state:
 *   header page   line 0: magic; line 1: job-lost word (every PE's own copy; a loss is
 *                 pushed into every peer's)
 *   team slots    MM_SHMEM_MAX_TEAMS x MM_SHMEM_SLOT_STRIDE, one per live team on this PE:
 *                   MM_SHMEM_BAR_ROUNDS barrier lines (64 B each, generation numbers) and
 *                     the push collectives' arrival words (one per source member)
 *                   2 collective outboxes of MM_SHMEM_COLL_CHUNK bytes (double buffered)
 *                   2 push inboxes of MM_SHMEM_COLL_CHUNK bytes (an entry per member)
 *   mailboxes     per source PE an inbox line (sequence + 48-byte payload), then per
 *                   destination PE an ack line: small messages between any two PEs, used to
 *                   create a team among a subset of the world without the others
 *   survivors     per PE a loss-report word, a heartbeat word and a proposal word, written
 *                   by the other PEs' monitors (survive.h)
 */
#ifndef MM_SHMEM_INTERNAL_H
#define MM_SHMEM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/error.h"
#include "bootstrap.h"
#include "heap_alloc.h"
#include "shmem.h"
#include "shmem_log.h"
#include "transport.h"

#define MM_SHMEM_MAX_PES 4096
#define MM_SHMEM_MAX_TEAMS 64
#define MM_SHMEM_BAR_ROUNDS 16 /* dissemination rounds: 2^16 PEs > MM_SHMEM_MAX_PES */
#define MM_SHMEM_COLL_CHUNK (64u << 10)
#define MM_SHMEM_HEADER_BYTES 4096u
#define MM_SHMEM_SLOT_SYNC 4096u
#define MM_SHMEM_SLOT_STRIDE (MM_SHMEM_SLOT_SYNC + 4u * MM_SHMEM_COLL_CHUNK)
/* Mailboxes: per source PE one 64-byte inbox line and one ack line. */
#define MM_SHMEM_MAIL_OFF (MM_SHMEM_HEADER_BYTES + (uint64_t)MM_SHMEM_MAX_TEAMS * MM_SHMEM_SLOT_STRIDE)
#define MM_SHMEM_MAIL_BYTES (2u * 64u * (uint64_t)MM_SHMEM_MAX_PES)
#define MM_SHMEM_MAIL_PAYLOAD 48
/* Survivor words (survive.c): per PE a loss-report word, a heartbeat word, a proposal word. */
#define MM_SHMEM_SURV_OFF (MM_SHMEM_MAIL_OFF + MM_SHMEM_MAIL_BYTES)
#define MM_SHMEM_SURV_BYTES (3u * 8u * (uint64_t)MM_SHMEM_MAX_PES)
#define MM_SHMEM_RESERVE_RAW (MM_SHMEM_SURV_OFF + MM_SHMEM_SURV_BYTES)
/* Rounded to 2 MiB so the user heap starts on a huge-page boundary. */
#define MM_SHMEM_RESERVE ((MM_SHMEM_RESERVE_RAW + (2u << 20) - 1) / (2u << 20) * (2u << 20))
#define MM_SHMEM_HEADER_MAGIC 0x6d6567616d6f6531ull /* "megamoe1" */
/* Identifies the reserve layout in the settings check (same build = same layout). */
#define MM_SHMEM_LAYOUT_ID \
    ((uint64_t)MM_SHMEM_RESERVE ^ ((uint64_t)MM_SHMEM_MAX_TEAMS << 40) ^ \
     ((uint64_t)MM_SHMEM_COLL_CHUNK << 8) ^ MM_SHMEM_BAR_ROUNDS)

typedef struct mm_shmem_header {
    uint64_t magic;
    char pad0[56];
    uint64_t lost; /* 1 + the first PE found dead by anyone (pushed to every PE), 0 while all alive */
    char pad1[56];
} mm_shmem_header_t;

struct mm_shmem_team {
    uint32_t magic;
    int n, me, slot;
    int *pes;          /* world PE of each member */
    uint64_t bar_gen;  /* barriers done (generation numbers, monotone) */
    uint64_t coll_gen; /* collectives with data done (outbox parity) */
    uint64_t push_gen; /* push collectives done (the arrival words' values, team.c) */
    uint64_t alloc_seq; /* symmetric allocations and frees done on this team */
    uint64_t uid;       /* unique in this process (never reused, unlike the address) */
    megamoe_status_t failed; /* a barrier of this team did not complete: the team is done */
    int is_world;
    struct mm_shmem_team *next; /* live non-world teams */
    void *agree_buf; /* [n] entries of mm_shmem_team_agree: made at the first, kept */
    void *push_buf;  /* a push collective's message (MM_SHMEM_COLL_CHUNK), made at the first */
};
#define MM_SHMEM_TEAM_MAGIC 0x7465616du

typedef struct mm_shmem_peer {
    int pid;
    int pidfd;           /* -1 when pidfd_open is unavailable */
    uint64_t start_time; /* /proc/<pid>/stat starttime, for the fallback check */
    mm_shmem_segment_t seg;
} mm_shmem_peer_t;

typedef struct mm_shmem_global {
    pthread_mutex_t lock; /* lifecycle, allocation and team bookkeeping */
    int refcount;
    atomic_int running;

    /* fixed while running */
    int my_pe, n_pes;
    mm_shmem_params_t params; /* resolved values of the first acquire */
    char endpoint[MM_ENDPOINT_MAX_LEN + 1];
    uint64_t heap_size, seg_size, timeout_ns;
    char *my_base;   /* my segment */
    char *heap_base; /* my_base + MM_SHMEM_RESERVE */
    char **bases;    /* per PE: mapping of its segment (NULL: not load/store reachable) */
    mm_shmem_peer_t *peers;
    mm_boot_t *boot;
    const mm_shmem_seg_transport_t *transport;
    /* hosts: PEs with the same host identity share memory; the others go through the engine */
    int *host_of;         /* per PE: host index (hosts numbered by their lowest PE) */
    int n_hosts, my_host;
    unsigned char *remote; /* per PE: 1 when reached through the engine */
    const mm_shmem_engine_ops_t *engine_ops;
    mm_shmem_engine_t *engine; /* NULL when every peer is mapped */

    /* symmetric allocation (collective, main thread) */
    mm_heap_alloc_t alloc;
    /* point-to-point mailboxes (team creation among a subset): messages sent to and
     * received from each PE */
    uint64_t *mail_sent, *mail_recv;

    /* teams */
    struct mm_shmem_team world;
    struct mm_shmem_team *teams;
    uint64_t slots_used; /* bit s: slot s in use on this PE */

    /* liveness (monitor thread writes, everyone reads) */
    atomic_int lost_pe; /* -1 while everyone is alive */
    atomic_uchar *dead; /* per PE */
    char lost_why[160]; /* written before lost_pe is published */
    atomic_int closing; /* teardown started: peers leaving is expected */
    pthread_t monitor;
    int monitor_started;
    int wake_fd; /* eventfd that stops the monitor */
} mm_shmem_global_t;

extern mm_shmem_global_t mm_shmem_g;

static inline int mm_shmem_running_now(void)
{
    return atomic_load_explicit(&mm_shmem_g.running, memory_order_acquire);
}

megamoe_status_t mm_shmem_not_running(const char *what);

static inline mm_shmem_header_t *mm_shmem_header(char *base) { return (mm_shmem_header_t *)base; }

/* Offsets in every PE's segment (the same on all) of a team slot's barrier line / outbox. */
static inline uint64_t mm_shmem_slot_line_off(int slot, int round)
{
    return MM_SHMEM_HEADER_BYTES + (uint64_t)slot * MM_SHMEM_SLOT_STRIDE + (uint64_t)round * 64u;
}

/* Push collectives (team.c) among at most MM_SHMEM_PUSH_MAX members: per source member one
 * 8-byte arrival word (its push count, monotone), after the barrier lines of the sync area. */
#define MM_SHMEM_PUSH_MAX 128
#define MM_SHMEM_SLOT_WORDS (MM_SHMEM_BAR_ROUNDS * 64u + MM_SHMEM_PUSH_MAX * 8u)
_Static_assert(MM_SHMEM_SLOT_WORDS <= MM_SHMEM_SLOT_SYNC, "the push words fit the sync area");
static inline uint64_t mm_shmem_slot_push_off(int slot, int src)
{
    return MM_SHMEM_HEADER_BYTES + (uint64_t)slot * MM_SHMEM_SLOT_STRIDE +
           MM_SHMEM_BAR_ROUNDS * 64u + (uint64_t)src * 8u;
}

static inline uint64_t mm_shmem_slot_outbox_off(int slot, uint64_t parity)
{
    return MM_SHMEM_HEADER_BYTES + (uint64_t)slot * MM_SHMEM_SLOT_STRIDE + MM_SHMEM_SLOT_SYNC +
           (parity & 1) * MM_SHMEM_COLL_CHUNK;
}

static inline uint64_t mm_shmem_slot_inbox_off(int slot, uint64_t parity)
{
    return MM_SHMEM_HEADER_BYTES + (uint64_t)slot * MM_SHMEM_SLOT_STRIDE + MM_SHMEM_SLOT_SYNC +
           (2u + (parity & 1)) * MM_SHMEM_COLL_CHUNK;
}

static inline uint64_t mm_shmem_inbox_off(int src)
{
    return MM_SHMEM_MAIL_OFF + (uint64_t)src * 64u;
}

static inline uint64_t mm_shmem_ack_off(int dst)
{
    return MM_SHMEM_MAIL_OFF + (uint64_t)MM_SHMEM_MAX_PES * 64u + (uint64_t)dst * 64u;
}

static inline uint64_t *mm_shmem_slot_line(char *base, int slot, int round)
{
    return (uint64_t *)(base + mm_shmem_slot_line_off(slot, round));
}

static inline char *mm_shmem_slot_outbox(char *base, int slot, uint64_t parity)
{
    return base + mm_shmem_slot_outbox_off(slot, parity);
}

/* ---- copy.c ---- */
/* Copy for puts/gets: memcpy below MM_SHMEM_MOVSB_MIN bytes, `rep movsb` (CPUs with ERMS) up
 * to mm_shmem_nt_threshold(), non-temporal AVX-512 stores above (followed by sfence, so a
 * later signal store cannot overtake the data). */
void mm_shmem_copy(void *dst, const void *src, size_t n);
/* Half the L3 size the kernel reports (16 MiB on the 2-core EPYC), at least MM_SHMEM_NT_MIN,
 * MM_SHMEM_NT_DEFAULT when unknown, SIZE_MAX without AVX-512. */
size_t mm_shmem_nt_threshold(void);
/* mm_shmem_copy_streaming (shmem.h) is the streaming copy itself, any size. */
#define MM_SHMEM_NT_MIN (1u << 20)
#define MM_SHMEM_MOVSB_MIN (64u << 10)
#define MM_SHMEM_NT_DEFAULT (16u << 20)

/* ---- liveness.c ---- */
/* Forget the loss of an earlier lifecycle: a new one starts clean, also for its engine's
 * start-up, which runs before the monitor (and its own reset) starts. */
void mm_shmem_liveness_reset(void);
megamoe_status_t mm_shmem_liveness_start(void);
/* Stop and join the monitor (idempotent). */
void mm_shmem_liveness_stop(void);
/* Record pe as lost (first caller wins for the message) and tell the other PEs. */
void mm_shmem_mark_lost(int pe, const char *why);
/* OK, or PEER_LOST (logged, naming the lost PE and `what` the caller was doing). */
megamoe_status_t mm_shmem_check_peers(const char *what);
/* Lost PE (-1 when none), from this PE's monitor or from the job-lost word. */
int mm_shmem_lost_pe(void);

/* 1 when pe is on this PE's host (its process can be watched through a pidfd). */
static inline int mm_shmem_same_host(int pe)
{
    return mm_shmem_g.host_of && mm_shmem_g.host_of[pe] == mm_shmem_g.my_host;
}

/* Atomic on the 64-bit word at offset off of pe's segment: a direct atomic when mapped, else
 * through the engine (ordered after earlier puts to pe). op: MM_ENGINE_SET/ADD/CAS0. */
megamoe_status_t mm_shmem_word_op(int pe, uint64_t off, uint64_t value, int op);
/* n bytes to offset off of pe's segment, then the atomic op (MM_ENGINE_*, with
 * MM_ENGINE_NO_QUIET) on the word at sig_off: direct stores and a release atomic when mapped,
 * else one engine put-with-signal (one message). */
megamoe_status_t mm_shmem_seg_put_signal(int pe, uint64_t off, const void *src, size_t n,
                                         uint64_t sig_off, uint64_t value, int op);
/* Copy n bytes from offset off of pe's segment (direct or a blocking engine get). */
megamoe_status_t mm_shmem_seg_read(int pe, uint64_t off, void *dst, size_t n);

/* ---- mailbox.c ---- */
/* Every member of pes (n world PEs, this PE at index me) sends MM_SHMEM_MAIL_PAYLOAD bytes to
 * every other member; out receives n payloads in member order. Only the members take part. */
megamoe_status_t mm_shmem_mail_exchange(const int *pes, int n, int me, const void *payload,
                                        void *out, const char *what);
/* The last release's barrier of every PE not lost (over the mailboxes: the bootstrap needs
 * every rank); no mailbox message may follow it in this lifecycle. */
megamoe_status_t mm_shmem_survivors_barrier(const char *what);

/* ---- wait.c ---- */
/* The spin -> pause -> yield -> sleep wait with timeout and liveness checks. what: for
 * messages ("team barrier", "signal wait"). */
megamoe_status_t mm_shmem_wait_impl(const uint64_t *addr, int cmp, uint64_t value,
                                    uint64_t *value_p, const char *what);
/* As mm_shmem_wait_impl, but only pe's loss fails it, and only when the word still does not
 * hold 1 s after the loss (its message may still sit in the engine's receive queue): for the
 * last exchange of a lifecycle, whose members leave as soon as they have every message, so
 * their endpoints closing is not a loss. */
megamoe_status_t mm_shmem_wait_from(const uint64_t *addr, int cmp, uint64_t value, int pe,
                                    const char *what);
static inline int mm_shmem_cmp(uint64_t v, int cmp, uint64_t value)
{
    switch (cmp) {
    case MM_SHMEM_CMP_EQ: return v == value;
    case MM_SHMEM_CMP_NE: return v != value;
    case MM_SHMEM_CMP_GT: return v > value;
    case MM_SHMEM_CMP_GE: return v >= value;
    case MM_SHMEM_CMP_LT: return v < value;
    case MM_SHMEM_CMP_LE: return v <= value;
    }
    return 0;
}

/* ---- symheap.c ---- */
/* Text of the live allocations, one per line, at most max_rows rows (caller holds lock). */
size_t mm_shmem_live_table(char *out, size_t len, int max_rows);

/* ---- team.c ---- */
/* A fresh process-unique team id. */
uint64_t mm_shmem_team_next_uid(void);
/* Set up the world team (slot 0) for a new lifecycle. */
void mm_shmem_team_world_init(void);
/* Free every team structure (teardown). */
void mm_shmem_team_drop_all(void);
int mm_shmem_team_live_count(void);
/* Forget a team on this PE only (no synchronisation). */
void mm_shmem_team_destroy_local(mm_shmem_team_t *t);
/* Live symmetric allocations owned by team t on this PE. */
int mm_shmem_team_live_allocations(const mm_shmem_team_t *t);

#endif /* MM_SHMEM_INTERNAL_H */
