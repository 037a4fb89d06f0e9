// The Torch adapter: libmegamoe_torch-<torch major.minor>.so, C++ CPU kernels for operators that
// python/megamoe/_library.py defines (torch.ops.megamoe.*). It defines nothing itself: the Python
// registration is the one owner of the namespace, and this library only adds CPU kernels to it,
// through the extern "C" entry points at the bottom (python/megamoe/_adapter.py calls them after
// checking that the library was built for the running torch and resolved the same libmegamoe).
// Registering from a function rather than a static initialiser means a mismatch is an error
// message, never an exception thrown while the library loads.
//
// One home for each concern:
//  * signatures and defaults: the schemas in python/megamoe/ops.py (the kernels below implement
//    them; an operator with an in-place argument is implemented as its functional twin
//    "_<name>", which returns the updated argument as an extra output);
//  * normalisation of Python-only argument kinds (torch.distributed groups, dtypes): the Python
//    entry points, before they call the operator;
//  * argument validation: the C library, on every rank (this file checks only what memory
//    safety needs before a pointer is handed over);
//  * the tensor <-> descriptor marshalling: here for this kernel, in ops.py for the Python body.
//
// A failing call throws c10::Error "[megamoe <STATUS> <code>] <library message>"; the Python
// entry points turn it back into megamoe.MegaMoeError.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>
#include <torch/library.h>
#include <torch/version.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "megamoe/megamoe.h"

namespace {

using at::Tensor;
using c10::optional;
using Opt = optional<Tensor>;

// ---- errors ------------------------------------------------------------------------------

[[noreturn]] void fail(megamoe_status_t status)
{
    TORCH_CHECK(false, "[megamoe ", megamoe_status_name(status), " ", static_cast<int>(status),
                "] ", megamoe_last_error());
}

void check(megamoe_status_t status)
{
    if (status < 0) fail(status);
}

// ---- communicators: the names megamoe.comm gives them ------------------------------------

std::mutex groups_mutex;
std::unordered_map<std::string, megamoe_comm_t *> groups;

// megamoe.comm registers every communicator it creates (NULL when it is destroyed).
void register_group(const char *name, megamoe_comm_t *comm)
{
    std::lock_guard<std::mutex> lock(groups_mutex);
    if (comm == nullptr) {
        groups.erase(name);
    } else {
        groups[name] = comm;
    }
}

// NULL for "" or an unknown name: the library reports that on every rank of the group.
megamoe_comm_t *group(c10::string_view name)
{
    if (name.empty()) return nullptr;
    std::lock_guard<std::mutex> lock(groups_mutex);
    auto it = groups.find(std::string(name.data(), name.size()));
    return it == groups.end() ? nullptr : it->second;
}

// ---- tensors <-> megamoe_tensor_t --------------------------------------------------------

constexpr int kInvalidDtype = 99; // a code the library rejects, naming the parameter

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define MEGAMOE_TORCH_FP8 1 // torch has float8_e4m3fn / float8_e5m2
#endif

int dtype_code(at::ScalarType type)
{
    switch (type) {
#ifdef MEGAMOE_TORCH_FP8
    case at::kFloat8_e4m3fn: return MEGAMOE_DTYPE_FP8_E4M3FN;
    case at::kFloat8_e5m2: return MEGAMOE_DTYPE_FP8_E5M2;
#endif
    case at::kFloat: return MEGAMOE_DTYPE_FP32;
    case at::kBFloat16: return MEGAMOE_DTYPE_BF16;
    case at::kHalf: return MEGAMOE_DTYPE_FP16;
    case at::kChar: return MEGAMOE_DTYPE_INT8;
    case at::kByte: return MEGAMOE_DTYPE_UINT8;
    case at::kInt: return MEGAMOE_DTYPE_INT32;
    case at::kLong: return MEGAMOE_DTYPE_INT64;
    case at::kBool: return MEGAMOE_DTYPE_BOOL;
    default: return kInvalidDtype;
    }
}

// fp8 outputs are float8 tensors where torch has them, bytes before; e8m0 is bytes (torch_npu's
// form) everywhere.
at::ScalarType scalar_type(megamoe_dtype_t code)
{
    switch (code) {
#ifdef MEGAMOE_TORCH_FP8
    case MEGAMOE_DTYPE_FP8_E4M3FN: return at::kFloat8_e4m3fn;
    case MEGAMOE_DTYPE_FP8_E5M2: return at::kFloat8_e5m2;
#endif
    case MEGAMOE_DTYPE_FP32: return at::kFloat;
    case MEGAMOE_DTYPE_BF16: return at::kBFloat16;
    case MEGAMOE_DTYPE_FP16: return at::kHalf;
    case MEGAMOE_DTYPE_INT8: return at::kChar;
    case MEGAMOE_DTYPE_INT32: return at::kInt;
    case MEGAMOE_DTYPE_INT64: return at::kLong;
    case MEGAMOE_DTYPE_BOOL: return at::kBool;
    default: return at::kByte;
    }
}

// A torch_npu integer dtype code (what "int? y_dtype" carries: c10::ScalarType values, and
// torch_npu's own 291-293) as megamoe_dtype_t (python/megamoe/_dtypes.py has the same table).
megamoe_dtype_t from_npu_code(int64_t code)
{
    switch (code) {
    case 0: return MEGAMOE_DTYPE_UINT8;
    case 1: return MEGAMOE_DTYPE_INT8;
    case 3: return MEGAMOE_DTYPE_INT32;
    case 4: return MEGAMOE_DTYPE_INT64;
    case 5: return MEGAMOE_DTYPE_FP16;
    case 6: return MEGAMOE_DTYPE_FP32;
    case 11: return MEGAMOE_DTYPE_BOOL;
    case 15: return MEGAMOE_DTYPE_BF16;
    case 23: case 291: return MEGAMOE_DTYPE_FP8_E5M2;
    case 24: case 292: return MEGAMOE_DTYPE_FP8_E4M3FN;
    case 44: case 293: return MEGAMOE_DTYPE_E8M0;
    default: return static_cast<megamoe_dtype_t>(kInvalidDtype);
    }
}

alignas(64) unsigned char empty_data[64]; // data of empty (but present) tensors

// The tensors one C call reads or writes: contiguous copies are kept alive until it returns.
struct Call {
    std::vector<Tensor> keep;

    // Returns the contiguous tensor the descriptor points to (undefined when absent).
    Tensor in(megamoe_tensor_t &desc, const Opt &t, const char *name)
    {
        if (!t.has_value() || !t->defined()) return Tensor(); // absent: descriptor stays "none"
        return in(desc, *t, name);
    }

    Tensor in(megamoe_tensor_t &desc, const Tensor &t, const char *name)
    {
        TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor (got device ",
                          t.device(), ")");
        Tensor c = t.contiguous();
        keep.push_back(c);
        desc.data = c.numel() ? c.data_ptr() : empty_data;
        desc.dtype = static_cast<megamoe_dtype_t>(dtype_code(c.scalar_type()));
        desc.ndim = static_cast<int>(c.dim());
        for (int64_t i = 0; i < c.dim() && i < MEGAMOE_TENSOR_MAX_DIMS; i++) desc.shape[i] = c.size(i);
        return c;
    }

    // An output with the dtype and shape megamoe_*_infer() chose, on the CPU.
    static Tensor out(megamoe_tensor_t &desc)
    {
        std::vector<int64_t> shape(desc.shape, desc.shape + desc.ndim);
        Tensor t = at::empty(shape, at::TensorOptions().dtype(scalar_type(desc.dtype))
                                        .device(at::kCPU));
        desc.data = t.numel() ? t.data_ptr() : empty_data;
        return t;
    }

    // After a failed infer: an empty output, so the call still runs and reports the error on
    // every rank of the group, as the ctypes path does.
    static void no_output(megamoe_tensor_t &desc)
    {
        desc.ndim = 1;
        desc.shape[0] = 0;
    }
};

// performance_info is an input of the functional twins: the library accumulates into a copy,
// which is the extra output (an empty tensor when performance_info is absent).
Tensor perf_copy(megamoe_tensor_t &desc, const Opt &performance_info, Call &call)
{
    if (!performance_info.has_value() || !performance_info->defined()) {
        return at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
    }
    Tensor copy = performance_info->clone(at::MemoryFormat::Contiguous);
    call.in(desc, copy, "performance_info");
    return copy;
}

// ---- MoeDistributeDispatchV2 -------------------------------------------------------------

using Tensors8 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

Tensors8 dispatch_v2(const Opt &x, const Opt &expert_ids, c10::string_view group_ep,
                     int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num,
                     const Opt &scales, const Opt &x_active_mask, const Opt &expert_scales,
                     const Opt &elastic_info, const Opt &performance_info,
                     c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id,
                     int64_t expert_shard_type, int64_t shared_expert_num,
                     int64_t shared_expert_rank_num, int64_t quant_mode, int64_t global_bs,
                     int64_t expert_token_nums_type, c10::string_view comm_alg,
                     int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num,
                     optional<int64_t> y_dtype, optional<int64_t> x_dtype,
                     optional<int64_t> scales_dtype)
{
    megamoe_dispatch_v2_args_t a = megamoe_dispatch_v2_args_default();
    Call call;
    call.in(a.x, x, "x");
    call.in(a.expert_ids, expert_ids, "expert_ids");
    call.in(a.scales, scales, "scales");
    call.in(a.x_active_mask, x_active_mask, "x_active_mask");
    call.in(a.expert_scales, expert_scales, "expert_scales");
    call.in(a.elastic_info, elastic_info, "elastic_info");
    Tensor perf = perf_copy(a.performance_info, performance_info, call);
    a.group_ep = group(group_ep);
    a.group_tp = group(group_tp);
    a.ep_world_size = ep_world_size;
    a.ep_rank_id = ep_rank_id;
    a.moe_expert_num = moe_expert_num;
    a.tp_world_size = tp_world_size;
    a.tp_rank_id = tp_rank_id;
    a.expert_shard_type = expert_shard_type;
    a.shared_expert_num = shared_expert_num;
    a.shared_expert_rank_num = shared_expert_rank_num;
    a.quant_mode = quant_mode;
    a.global_bs = global_bs;
    a.expert_token_nums_type = expert_token_nums_type;
    std::string alg(comm_alg.data(), comm_alg.size());
    a.comm_alg = alg.c_str();
    a.zero_expert_num = zero_expert_num;
    a.copy_expert_num = copy_expert_num;
    a.const_expert_num = const_expert_num;
    const megamoe_dtype_t y = y_dtype.has_value() ? from_npu_code(*y_dtype) : MEGAMOE_DTYPE_FP32;
    if (y_dtype.has_value()) a.expand_x.dtype = y;
    // a pre-quantised x (int8 / fp8 bytes) and its scales' type (fp32 / e8m0 bytes): torch_npu
    // integer dtype codes like y_dtype
    if (x_dtype.has_value() && a.x.data) a.x.dtype = from_npu_code(*x_dtype);
    if (scales_dtype.has_value() && a.scales.data) {
        a.scales.dtype = from_npu_code(*scales_dtype);
        if (a.scales.dtype == MEGAMOE_DTYPE_UINT8) a.scales.dtype = MEGAMOE_DTYPE_E8M0;
    } else if (a.scales.data && a.scales.dtype == MEGAMOE_DTYPE_UINT8)
        a.scales.dtype = MEGAMOE_DTYPE_E8M0; // MX scales arrive as their bytes

    megamoe_tensor_t *outs[] = {&a.expand_x, &a.dynamic_scales, &a.assist_info_for_combine,
                                &a.expert_token_nums, &a.ep_recv_counts, &a.tp_recv_counts,
                                &a.expand_scales};
    const bool inferred = megamoe_dispatch_v2_infer(&a) == MEGAMOE_OK;
    if (!inferred) {
        for (megamoe_tensor_t *d : outs) Call::no_output(*d);
    }
    Tensor t[7];
    for (int i = 0; i < 7; i++) t[i] = Call::out(*outs[i]);
    if (!inferred) {
        for (megamoe_tensor_t *d : outs) d->data = nullptr; // the call reports infer's error
    } else if (y_dtype.has_value() && a.expand_x.dtype != y) {
        a.expand_x.dtype = y; // rejected by the call
    }
    check(megamoe_dispatch_v2(&a));
    return Tensors8(t[0], t[1], t[2], t[3], t[4], t[5], t[6], perf);
}

// ---- MoeDistributeCombineV2 / CombineAddRmsNorm ------------------------------------------

// The inputs and attributes both combine operators share.
struct CombineInputs {
    const Opt &expand_x, &expert_ids, &assist_info_for_combine, &ep_send_counts, &expert_scales;
    c10::string_view group_ep;
    int64_t ep_world_size, ep_rank_id, moe_expert_num;
    const Opt &tp_send_counts, &x_active_mask, &expand_scales, &shared_expert_x, &elastic_info,
        &ori_x, &const_expert_alpha_1, &const_expert_alpha_2, &const_expert_v;
    c10::string_view group_tp;
    int64_t tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
        shared_expert_rank_num, global_bs, comm_quant_mode;
    std::string comm_alg;
    int64_t zero_expert_num, copy_expert_num, const_expert_num;
};

void combine_args(megamoe_combine_v2_args_t &a, Call &call, const CombineInputs &in)
{
    call.in(a.expand_x, in.expand_x, "expand_x");
    call.in(a.expert_ids, in.expert_ids, "expert_ids");
    call.in(a.assist_info_for_combine, in.assist_info_for_combine, "assist_info_for_combine");
    call.in(a.ep_send_counts, in.ep_send_counts, "ep_send_counts");
    call.in(a.expert_scales, in.expert_scales, "expert_scales");
    call.in(a.tp_send_counts, in.tp_send_counts, "tp_send_counts");
    call.in(a.x_active_mask, in.x_active_mask, "x_active_mask");
    call.in(a.expand_scales, in.expand_scales, "expand_scales");
    call.in(a.shared_expert_x, in.shared_expert_x, "shared_expert_x");
    call.in(a.elastic_info, in.elastic_info, "elastic_info");
    call.in(a.ori_x, in.ori_x, "ori_x");
    call.in(a.const_expert_alpha_1, in.const_expert_alpha_1, "const_expert_alpha_1");
    call.in(a.const_expert_alpha_2, in.const_expert_alpha_2, "const_expert_alpha_2");
    call.in(a.const_expert_v, in.const_expert_v, "const_expert_v");
    a.group_ep = group(in.group_ep);
    a.group_tp = group(in.group_tp);
    a.ep_world_size = in.ep_world_size;
    a.ep_rank_id = in.ep_rank_id;
    a.moe_expert_num = in.moe_expert_num;
    a.tp_world_size = in.tp_world_size;
    a.tp_rank_id = in.tp_rank_id;
    a.expert_shard_type = in.expert_shard_type;
    a.shared_expert_num = in.shared_expert_num;
    a.shared_expert_rank_num = in.shared_expert_rank_num;
    a.global_bs = in.global_bs;
    a.comm_quant_mode = in.comm_quant_mode;
    a.comm_alg = in.comm_alg.c_str();
    a.zero_expert_num = in.zero_expert_num;
    a.copy_expert_num = in.copy_expert_num;
    a.const_expert_num = in.const_expert_num;
}

std::tuple<Tensor, Tensor> combine_v2(const Opt &expand_x, const Opt &expert_ids,
                  const Opt &assist_info_for_combine, const Opt &ep_send_counts,
                  const Opt &expert_scales, c10::string_view group_ep, int64_t ep_world_size,
                  int64_t ep_rank_id, int64_t moe_expert_num, const Opt &tp_send_counts,
                  const Opt &x_active_mask, const Opt &expand_scales, const Opt &shared_expert_x,
                  const Opt &elastic_info, const Opt &ori_x, const Opt &const_expert_alpha_1,
                  const Opt &const_expert_alpha_2, const Opt &const_expert_v,
                  const Opt &performance_info, c10::string_view group_tp, int64_t tp_world_size,
                  int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
                  int64_t shared_expert_rank_num, int64_t global_bs, int64_t comm_quant_mode,
                  c10::string_view comm_alg, int64_t zero_expert_num, int64_t copy_expert_num,
                  int64_t const_expert_num)
{
    megamoe_combine_v2_args_t a = megamoe_combine_v2_args_default();
    Call call;
    combine_args(a, call,
                 {expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                  group_ep, ep_world_size, ep_rank_id, moe_expert_num, tp_send_counts,
                  x_active_mask, expand_scales, shared_expert_x, elastic_info, ori_x,
                  const_expert_alpha_1, const_expert_alpha_2, const_expert_v, group_tp,
                  tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                  shared_expert_rank_num, global_bs, comm_quant_mode,
                  std::string(comm_alg.data(), comm_alg.size()), zero_expert_num,
                  copy_expert_num, const_expert_num});
    Tensor perf = perf_copy(a.performance_info, performance_info, call);
    if (megamoe_combine_v2_infer(&a) != MEGAMOE_OK) Call::no_output(a.x);
    Tensor x = Call::out(a.x);
    check(megamoe_combine_v2(&a));
    return std::make_tuple(x, perf);
}

std::tuple<Tensor, Tensor, Tensor> combine_add_rms_norm(
    const Opt &expand_x, const Opt &expert_ids, const Opt &expand_idx, const Opt &ep_send_counts,
    const Opt &expert_scales, const Opt &residual_x, const Opt &gamma, c10::string_view group_ep, int64_t ep_world_size, int64_t ep_rank_id,
    int64_t moe_expert_num, const Opt &tp_send_counts, const Opt &x_active_mask,
    const Opt &activation_scale, const Opt &weight_scale, const Opt &group_list,
    const Opt &expand_scales, const Opt &shared_expert_x, const Opt &elastic_info,
    const Opt &ori_x, const Opt &const_expert_alpha_1, const Opt &const_expert_alpha_2,
    const Opt &const_expert_v, c10::string_view group_tp, int64_t tp_world_size,
    int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
    int64_t shared_expert_rank_num, int64_t global_bs, int64_t out_dtype,
    int64_t comm_quant_mode, int64_t group_list_type, c10::string_view comm_alg, double norm_eps,
    int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num)
{
    megamoe_combine_add_rms_norm_args_t a = megamoe_combine_add_rms_norm_args_default();
    Call call;
    combine_args(a.combine, call,
                 {expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep,
                  ep_world_size, ep_rank_id, moe_expert_num, tp_send_counts, x_active_mask,
                  expand_scales, shared_expert_x, elastic_info, ori_x, const_expert_alpha_1,
                  const_expert_alpha_2, const_expert_v, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs,
                  comm_quant_mode, std::string(comm_alg.data(), comm_alg.size()),
                  zero_expert_num, copy_expert_num, const_expert_num});
    // reserved inputs: the library rejects them when present
    call.in(a.combine.activation_scale, activation_scale, "activation_scale");
    call.in(a.combine.weight_scale, weight_scale, "weight_scale");
    call.in(a.combine.group_list, group_list, "group_list");
    a.combine.out_dtype = out_dtype;
    a.combine.group_list_type = group_list_type;
    call.in(a.residual_x, residual_x, "residual_x");
    call.in(a.gamma, gamma, "gamma");
    a.norm_eps = norm_eps;
    if (megamoe_combine_add_rms_norm_infer(&a) != MEGAMOE_OK) {
        for (megamoe_tensor_t *d : {&a.combine.x, &a.y, &a.rstd}) Call::no_output(*d);
    }
    Tensor x = Call::out(a.combine.x);
    Tensor y = Call::out(a.y);
    Tensor rstd = Call::out(a.rstd);
    check(megamoe_combine_add_rms_norm(&a));
    return std::make_tuple(y, rstd, x);
}

} // namespace

// ---- entry points for python/megamoe/_adapter.py ------------------------------------------

namespace {

std::mutex registration_mutex;
std::unique_ptr<torch::Library> registration; // the kernels' registration, kept while loaded
std::string registration_error;

} // namespace

extern "C" {

// The kernels this library has, comma-separated (the functional twins of in-place operators).
__attribute__((visibility("default"))) const char *megamoe_torch_adapter_kernels(void)
{
    return "_npu_moe_distribute_dispatch_v2,_npu_moe_distribute_combine_v2,"
           "npu_moe_distribute_combine_add_rms_norm";
}

// Adds the CPU kernels to the operators the Python registration defined. NULL on success (also
// when already registered), else why not (nothing stays registered then).
__attribute__((visibility("default"))) const char *megamoe_torch_adapter_register(void)
{
    std::lock_guard<std::mutex> lock(registration_mutex);
    if (registration) return nullptr;
    try {
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "megamoe",
                                                    c10::DispatchKey::CPU, __FILE__, __LINE__);
        lib->impl("_npu_moe_distribute_dispatch_v2", &dispatch_v2);
        lib->impl("_npu_moe_distribute_combine_v2", &combine_v2);
        lib->impl("npu_moe_distribute_combine_add_rms_norm", &combine_add_rms_norm);
        registration = std::move(lib);
        return nullptr;
    } catch (const std::exception &e) {
        registration_error = e.what();
        return registration_error.c_str();
    }
}

__attribute__((visibility("default"))) void megamoe_torch_adapter_set_group(const char *name,
                                                                            void *comm)
{
    register_group(name, static_cast<megamoe_comm_t *>(comm));
}

// Address of megamoe_version as this adapter resolved it: equal to the ctypes binding's only
// when both use the same loaded libmegamoe (one runtime per process).
__attribute__((visibility("default"))) const void *megamoe_torch_adapter_library_id(void)
{
    return reinterpret_cast<const void *>(&megamoe_version);
}

__attribute__((visibility("default"))) int megamoe_torch_adapter_abi(void)
{
    return megamoe_abi_version();
}

// The torch this adapter was built for.
__attribute__((visibility("default"))) const char *megamoe_torch_adapter_torch_version(void)
{
    return TORCH_VERSION;
}

} // extern "C"
