/* The ONE table of every environment variable megamoe reads (C library, CLI and Python).
 *
 * MM_ENV(ID, NAME, TYPE, DEFAULT, MIN, MAX, CHOICES, HELP)
 *   TYPE    STRING | SIZE | BOOL | INT | ENUM
 *   DEFAULT text form of the default ("" = none)
 *   MIN/MAX bounds for INT and SIZE (inclusive)
 *   CHOICES '|'-separated words for ENUM, else ""
 *
 * Adding a variable: one line here, then regenerate docs/env.md with
 * `megamoe info --config --markdown > docs/env.md` (a test compares them).
 */
/* clang-format off */
#define MM_ENV_TABLE(MM_ENV) \
    MM_ENV(SHMEM_BOOTSTRAP_ENDPOINT, "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", STRING, "tcp://127.0.0.1:8662", 0, 0, "", \
           "Bootstrap endpoint tcp://host:port shared by all ranks; rank 0 listens on it.") \
    MM_ENV(SHMEM_HEAP_SIZE, "HYPER_PARALLEL_SHMEM_HEAP_SIZE", SIZE, "1G", 1048576, 1099511627776LL, "", \
           "Bytes of symmetric heap per rank (sparse; fixed for one SHMEM lifecycle).") \
    MM_ENV(SHMEM_TIMEOUT_SEC, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", INT, "120", 1, 86400, "", \
           "Seconds a bootstrap connect or a wait on a peer may take before TIMEOUT.") \
    MM_ENV(SHMEM_LOG_LEVEL, "HYPER_PARALLEL_SHMEM_LOG_LEVEL", INT, "2", 0, 2, "", \
           "SHMEM runtime log level: 0 debug (with allocation call sites), 1 info, 2 error.") \
    MM_ENV(LOG_LEVEL, "MEGAMOE_LOG_LEVEL", ENUM, "warn", 0, 0, "trace|debug|info|warn|error|off", \
           "Library log level.") \
    MM_ENV(JOB_TOKEN, "MEGAMOE_JOB_TOKEN", STRING, "", 0, 0, "", \
           "Secret shared by the ranks of one job (set by megamoe launch); peers prove it at bootstrap. Required for a non-loopback endpoint unless mpirun or torchrun carry one.") \
    MM_ENV(JOB_TOKEN_FILE, "MEGAMOE_JOB_TOKEN_FILE", STRING, "", 0, 0, "", \
           "File holding the job secret (mode 0600, this user's; used when MEGAMOE_JOB_TOKEN is unset).") \
    MM_ENV(BOOTSTRAP_INSECURE, "MEGAMOE_BOOTSTRAP_INSECURE", BOOL, "0", 0, 0, "", \
           "1: start without a job secret even when the bootstrap endpoint is not a loopback address (warned on every rank).") \
    MM_ENV(RANK, "RANK", INT, "", 0, 1048575, "", \
           "This process's rank when no rank is passed to the API (torchrun, megamoe launch).") \
    MM_ENV(WORLD_SIZE, "WORLD_SIZE", INT, "", 1, 1048576, "", \
           "Number of ranks when none is passed to the API.") \
    MM_ENV(LOCAL_RANK, "LOCAL_RANK", INT, "", 0, 1048575, "", \
           "Rank within this host.") \
    MM_ENV(LOCAL_WORLD_SIZE, "LOCAL_WORLD_SIZE", INT, "", 1, 1048576, "", \
           "Number of ranks on this host.") \
    MM_ENV(OMPI_RANK, "OMPI_COMM_WORLD_RANK", INT, "", 0, 1048575, "", \
           "Rank set by Open MPI's mpirun (used when RANK is unset).") \
    MM_ENV(OMPI_SIZE, "OMPI_COMM_WORLD_SIZE", INT, "", 1, 1048576, "", \
           "World size set by Open MPI's mpirun (used when WORLD_SIZE is unset).") \
    MM_ENV(RANKS_PER_NODE, "MEGAMOE_RANKS_PER_NODE", INT, "0", 0, 1048576, "", \
           "Ranks per group for the 'hierarchy' dispatch algorithm (0 = all ranks of the host).") \
    MM_ENV(SHMEM_INTRA_HOST, "MEGAMOE_SHMEM_INTRA_HOST", ENUM, "shm", 0, 0, "shm|engine", \
           "How ranks on one host reach each other: shm (mapped heaps) or engine (every peer through the inter-host engine, as if on other hosts; for tests and measurements). One rank asking for engine is enough.") \
    MM_ENV(SHMEM_ENGINE_PROTOCOL, "MEGAMOE_SHMEM_ENGINE_PROTOCOL", ENUM, "am", 0, 0, "am|rma", \
           "How the inter-host engine carries puts and signals (the same on every rank): am (default) sends each put, signal or put-with-signal as one UCP active message that the target applies in issue order, so a signal rides with its data; rma uses UCP puts and atomics, each signal after data waiting for a flush of the puts before it (for networks where UCP puts are RDMA writes that need no progress at the target).") \
    MM_ENV(UCX_TLS, "UCX_TLS", STRING, "", 0, 0, "", \
           "UCX's own transport list, used by the inter-host engine as given; unset: megamoe excludes UCX's shared-memory transports (same-host peers are mapped directly).") \
    MM_ENV(UCX_NET_DEVICES, "UCX_NET_DEVICES", STRING, "", 0, 0, "", \
           "UCX's own device list, used as given; unset: megamoe picks the interface that carries the bootstrap connection to rank 0.") \
    MM_ENV(UCX_TCP_TX_SEG_SIZE, "UCX_TCP_TX_SEG_SIZE", STRING, "", 0, 0, "", \
           "UCX's own TCP send segment size, used as given; unset: the inter-host engine uses 64k (UCX's default 8k costs about twice the CPU per byte).") \
    MM_ENV(UCX_TCP_RX_SEG_SIZE, "UCX_TCP_RX_SEG_SIZE", STRING, "", 0, 0, "", \
           "UCX's own TCP receive segment size, used as given; unset: the inter-host engine uses 256k (UCX's default 64k).") \
    MM_ENV(UCX_TCP_MAX_POLL, "UCX_TCP_MAX_POLL", STRING, "", 0, 0, "", \
           "UCX's own limit of socket events a TCP progress call handles, used as given; unset: the inter-host engine uses 1 (UCX 1.13 aborts on a batched event of a connection that an earlier event of the same batch closed, which a lost host triggers).") \
    MM_ENV(UCX_PROTO_ENABLE, "UCX_PROTO_ENABLE", STRING, "", 0, 0, "", \
           "UCX's own switch for its protocol selection v2, used as given; unset: the inter-host engine uses n (v2, the default from UCX 1.16, has no software-emulated fetching atomics over TCP, which the engine's signals need).") \
    MM_ENV(GEMM, "MEGAMOE_GEMM", ENUM, "auto", 0, 0, "auto|amx|avx512|onednn|ref", \
           "BF16 GEMM backend, read when a MegaMoeExperts layer is created; auto: the own amx kernel where the CPU has usable AMX-BF16, else the own avx512 kernel on CPUs without AVX512-BF16 (its FMA form, or its AVX2 form without AVX-512), else oneDNN where built, with big packed weights on the own avx512 kernel (docs/kernels.md).") \
    MM_ENV(THREADS, "MEGAMOE_THREADS", INT, "0", 0, 4096, "", \
           "Cores given to each rank (0 = online cores / local ranks).") \
    MM_ENV(CUBE_WORKERS, "MEGAMOE_CUBE_WORKERS", INT, "0", 0, 4096, "", \
           "O1 GEMM ('cube') worker threads per rank (0 = derived: 1 core -> one worker running both queues, n -> n - max(1, n/4)).") \
    MM_ENV(VECTOR_WORKERS, "MEGAMOE_VECTOR_WORKERS", INT, "0", 0, 4096, "", \
           "O1 communication/elementwise ('vector') worker threads per rank (0 = derived: max(1, n/4) of n >= 2 cores).") \
    MM_ENV(CHECK, "MEGAMOE_CHECK", BOOL, "0", 0, 0, "", \
           "Verify trusted inputs (tokens_per_expert, symmetric allocation order) at extra cost.") \
    MM_ENV(CHECK_FINITE, "MEGAMOE_CHECK_FINITE", BOOL, "1", 0, 0, "", \
           "MegaMoeExperts refuses NaN/Inf in hidden_states, topk_weights and grad_output (INVALID_ARGUMENT on every rank, before data moves); 0 lets them through (one pass over the inputs saved).") \
    MM_ENV(PROFILE, "MEGAMOE_PROFILE", STRING, "", 0, 0, "", \
           "Directory for MegaKernel Chrome traces (trace_<rank>.json); empty = profiling off.") \
    MM_ENV(LIB, "MEGAMOE_LIB", STRING, "", 0, 0, "", \
           "Python binding in a source checkout: path of libmegamoe.so to load instead of searching the build tree (an installed package always loads its own).") \
    MM_ENV(BUILD_DIR, "MEGAMOE_BUILD_DIR", STRING, "", 0, 0, "", \
           "Source checkout: build directory whose src/libmegamoe.so Python loads (when MEGAMOE_LIB is unset) and which 'pip install .' packages.") \
    MM_ENV(TORCH_ADAPTER, "MEGAMOE_TORCH_ADAPTER", ENUM, "auto", 0, 0, "auto|on|off", \
           "Python binding: the Torch adapter's C++ CPU kernels for torch.ops.megamoe when one is built for the running torch and links its libtorch (auto; a warning when one is there but unusable), always (on: ImportError without it) or never (off: the Python bodies only).") \
    MM_ENV(PYTHON, "MEGAMOE_PYTHON", STRING, "", 0, 0, "", \
           "The Python interpreter the CLI starts for its Python parts (bench layer/dispatch torch baselines, bench report); unset: the one chosen at build time (CMake MEGAMOE_PYTHON, default /usr/bin/python3, Debian's with python3-torch).") \
    MM_ENV(USE_LIBUV, "USE_LIBUV", STRING, "", 0, 0, "", \
           "torch's own: 0 = TCPStores without libuv; python3 -m megamoe.torchrun sets it to 0 on a torch built without libuv (Debian 13's 2.6) and makes its rendezvous stores follow it (docs/torch.md).") \
    MM_ENV(SERVE_WEIGHT_CACHE, "MEGAMOE_SERVE_WEIGHT_CACHE", SIZE, "0", 0, 1099511627776LL, "", \
           "mega_moe: bytes of packed expert-weight copies kept between calls (process-wide, least recently used dropped first); 0 = no bound (docs/serve.md).") \
    MM_ENV(SHMEM_PEER_TIMEOUT_MS, "MEGAMOE_SHMEM_PEER_TIMEOUT_MS", INT, "10000", 100, 3600000, "", \
           "A rank on another host from which nothing arrives this long (no heartbeat, no data, no acknowledgement) is declared unreachable (its host is cut off or down); also the bootstrap connections' keepalive bound. A killed process is seen at once (docs/reliability.md).") \
    MM_ENV(SHMEM_ON_LOSS, "MEGAMOE_SHMEM_ON_LOSS", ENUM, "survive", 0, 0, "survive|stop", \
           "After a rank is lost: survive (the survivors agree on who is gone, the calls in flight fail with PEER_LOST, later calls run among the survivors) or stop (every rank stops with PEER_LOST).") \
    MM_ENV(LAUNCH_T0_NS, "MEGAMOE_LAUNCH_T0_NS", STRING, "", 0, 0, "", \
           "Set by megamoe launch: CLOCK_MONOTONIC nanoseconds at the job's start, the clock of --fault times (read by megamoe bench serve --loop).") \
    MM_ENV(LAUNCH_FAULTS, "MEGAMOE_LAUNCH_FAULTS", STRING, "", 0, 0, "", \
           "Set by megamoe launch --fault: the fault specs, comma-separated (kill-rank:R@S, kill-host:I@S, cut-host:I@S).") \
    MM_ENV(LAUNCH_FAULT_LOG, "MEGAMOE_LAUNCH_FAULT_LOG", STRING, "", 0, 0, "", \
           "Set by megamoe launch --fault: a file where the launcher writes each fault's real injection time (\"spec ns\" lines, CLOCK_MONOTONIC).") \
    MM_ENV(SERVE_SCHEDULE, "MEGAMOE_SERVE_SCHEDULE", ENUM, "auto", 0, 0, "auto|o1|host", \
           "mega_moe: auto runs a call on the O1 executor's inference plan when it can (a token bound, no rank masked, not an MX scene), else host-scheduled phases; o1 / host force one (o1 falls back where it cannot run); every rank the same (docs/serve.md).") \
    MM_ENV(GMM_PACK, "MEGAMOE_GMM_PACK", ENUM, "on", 0, 0, "on|off", \
           "megamoe.ops.npu_grouped_matmul (and the companion operators on it): keep a packed copy of each weight tensor for later calls, re-packed when the tensor changes and freed with it (on); off: use the weights as they are on every call (no extra memory, slower).")
/* clang-format on */
