// The Torch adapter: libmegamoe_torch.so, loaded with torch.ops.load_library(), registers the
// operators of libmegamoe.so as torch.ops.megamoe.* with schemas, so TorchScript and the
// dispatcher can call them. It uses only the public C API (include/megamoe) and links the shared
// library, so it shares the runtime, the communicators and the workspaces with the ctypes binding
// of the same process.
//
// One home for each concern:
//  * signatures and defaults: the schemas below, which equal the Python wrappers' signatures in
//    python/megamoe/ops.py (tests/python/test_torch_adapter.py compares them);
//  * normalisation of Python-only argument kinds (torch.distributed groups, megamoe.float8_*
//    tokens): the Python wrappers, before they call either backend (python/megamoe/_adapter.py);
//  * argument validation: the C library, on every rank (this file checks only what memory
//    safety needs before a pointer is handed over: device, dtype, element counts);
//  * the tensor <-> descriptor marshalling: here for this backend, in ops.py for ctypes.
//
// A failing call throws c10::Error "[megamoe <STATUS> <code>] <library message>"; the Python
// wrappers turn it back into megamoe.MegaMoeError. Adding an operator the C library implements
// is one function plus one m.def() line at the bottom, and @_operator on its megamoe.ops wrapper
// (the V1 pair needs neither: it is a Python mapping onto the V2 operators).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <cstdint>
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

// megamoe.comm registers every communicator it creates (handle 0 when it is destroyed).
void register_group(c10::string_view name, int64_t handle)
{
    std::lock_guard<std::mutex> lock(groups_mutex);
    std::string key(name.data(), name.size());
    if (handle == 0) {
        groups.erase(key);
    } else {
        groups[key] = reinterpret_cast<megamoe_comm_t *>(static_cast<intptr_t>(handle));
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

int dtype_code(at::ScalarType type)
{
    switch (type) {
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

// fp8 and e8m0 outputs are byte tensors (torch 1.13 has no fp8 types).
at::ScalarType scalar_type(megamoe_dtype_t code)
{
    switch (code) {
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

    // An output with the dtype and shape megamoe_*_infer() chose.
    static Tensor out(megamoe_tensor_t &desc)
    {
        std::vector<int64_t> shape(desc.shape, desc.shape + desc.ndim);
        Tensor t = at::empty(shape, at::TensorOptions().dtype(scalar_type(desc.dtype)));
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

// performance_info accumulates in place; a non-contiguous tensor gets the sum copied back.
void copy_back(const Opt &target, const Tensor &accumulated)
{
    if (accumulated.defined() && !accumulated.is_same(*target)) target->copy_(accumulated);
}

// ---- MoeDistributeDispatchV2 -------------------------------------------------------------

using Tensors7 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

Tensors7 dispatch_v2(const Opt &x, const Opt &expert_ids, c10::string_view group_ep,
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
    Tensor perf = call.in(a.performance_info, performance_info, "performance_info");
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
    if (y_dtype.has_value()) a.expand_x.dtype = static_cast<megamoe_dtype_t>(*y_dtype);
    // a pre-quantised x (int8 / fp8 bytes) and its scales' type (fp32 / e8m0 bytes)
    if (x_dtype.has_value() && a.x.data) a.x.dtype = static_cast<megamoe_dtype_t>(*x_dtype);
    if (scales_dtype.has_value() && a.scales.data)
        a.scales.dtype = static_cast<megamoe_dtype_t>(*scales_dtype);
    else if (a.scales.data && a.scales.dtype == MEGAMOE_DTYPE_UINT8)
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
    } else if (y_dtype.has_value() && a.expand_x.dtype != *y_dtype) {
        a.expand_x.dtype = static_cast<megamoe_dtype_t>(*y_dtype); // rejected by the call
    }
    check(megamoe_dispatch_v2(&a));
    copy_back(performance_info, perf);
    return Tensors7(t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
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

Tensor combine_v2(const Opt &expand_x, const Opt &expert_ids,
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
    Tensor perf = call.in(a.performance_info, performance_info, "performance_info");
    if (megamoe_combine_v2_infer(&a) != MEGAMOE_OK) Call::no_output(a.x);
    Tensor x = Call::out(a.x);
    check(megamoe_combine_v2(&a));
    copy_back(performance_info, perf);
    return x;
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

// ---- MegaMoeExperts forward / backward ---------------------------------------------------
// Thin: the layer handle and its saved state cross as integers and the outputs are allocated
// by the caller, as in the C API; megamoe.MegaMoeExperts owns the handles and checks the user's
// arguments. Sizes are checked against the layer here because the library takes bare pointers.

megamoe_experts_t *layer_of(int64_t handle, megamoe_experts_info_t *info)
{
    TORCH_CHECK_VALUE(handle != 0, "megamoe experts: null layer handle");
    auto *layer = reinterpret_cast<megamoe_experts_t *>(static_cast<intptr_t>(handle));
    check(megamoe_experts_get_info(layer, info));
    return layer;
}

void require(const Tensor &t, const char *name, std::initializer_list<at::ScalarType> types,
             int64_t numel)
{
    TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_contiguous(), name,
                      " must be a contiguous CPU tensor");
    bool ok = false;
    for (at::ScalarType s : types) ok = ok || t.scalar_type() == s;
    TORCH_CHECK_VALUE(ok, name, " has dtype ", t.scalar_type(), ", which the layer does not take");
    TORCH_CHECK_VALUE(t.numel() == numel, name, " has ", t.numel(), " elements, the layer needs ",
                      numel);
}

megamoe_experts_weights_t weights_of(const megamoe_experts_info_t &info, const Tensor &gate_up,
                                     const Tensor &down, int64_t version)
{
    const int64_t h = info.hidden, i = info.intermediate, l = info.local_experts;
    require(gate_up, "gate_up", {at::kBFloat16}, l * h * 2 * i);
    require(down, "down", {at::kBFloat16}, l * i * h);
    return {gate_up.data_ptr(), down.data_ptr(), static_cast<uint64_t>(version)};
}

megamoe_dtype_t code_of(const Tensor &t)
{
    return static_cast<megamoe_dtype_t>(dtype_code(t.scalar_type()));
}

// Writes output [T, H]; returns the saved state for the backward when save (else 0).
int64_t experts_forward(int64_t handle, const Tensor &hidden_states, const Tensor &topk_ids,
                        const Tensor &topk_weights, const Opt &tokens_per_expert,
                        const Tensor &gate_up, const Tensor &down, int64_t weights_version,
                        const Tensor &output, bool save)
{
    megamoe_experts_info_t info;
    megamoe_experts_t *layer = layer_of(handle, &info);
    // the call's rows: the layer's T, or (max_local_num_tokens) what hidden_states holds
    const bool dynamic = info.max_local_num_tokens > 0;
    const int64_t rows = dynamic ? hidden_states.numel() / info.hidden : info.tokens;
    const int64_t th = rows * info.hidden, tk = rows * info.top_k;
    require(hidden_states, "hidden_states", {at::kBFloat16}, th);
    require(topk_ids, "topk_ids", {at::kInt, at::kLong}, tk);
    require(topk_weights, "topk_weights", {at::kFloat, at::kBFloat16}, tk);
    require(output, "output", {at::kBFloat16}, th);
    megamoe_experts_input_t in = megamoe_experts_input_default();
    in.hidden_states = hidden_states.data_ptr();
    in.topk_ids = topk_ids.data_ptr();
    in.topk_ids_dtype = code_of(topk_ids);
    in.topk_weights = topk_weights.data_ptr();
    in.topk_weights_dtype = code_of(topk_weights);
    if (dynamic) in.num_tokens = rows;
    if (tokens_per_expert.has_value() && tokens_per_expert->defined()) {
        require(*tokens_per_expert, "tokens_per_expert", {at::kInt, at::kLong}, info.num_experts);
        in.tokens_per_expert = tokens_per_expert->data_ptr();
        in.tokens_per_expert_dtype = code_of(*tokens_per_expert);
    }
    megamoe_experts_weights_t w = weights_of(info, gate_up, down, weights_version);
    megamoe_experts_saved_t *saved = nullptr;
    check(megamoe_experts_forward(layer, &w, &in, output.data_ptr(), save ? &saved : nullptr));
    return static_cast<int64_t>(reinterpret_cast<intptr_t>(saved));
}

// Writes the gradients (grad_topk_weights may be absent: skipped); the saved state stays valid
// (free it with experts_saved_destroy).
void experts_backward(int64_t handle, int64_t saved, const Tensor &gate_up, const Tensor &down,
                      int64_t weights_version, const Tensor &grad_output,
                      const Tensor &grad_hidden_states, const Opt &grad_topk_weights,
                      const Tensor &grad_gate_up, const Tensor &grad_down)
{
    megamoe_experts_info_t info;
    megamoe_experts_t *layer = layer_of(handle, &info);
    TORCH_CHECK_VALUE(saved != 0, "megamoe experts backward: no saved state (forward with save)");
    // the forward's rows: the layer's T, or (max_local_num_tokens) what grad_output holds
    const int64_t rows =
        info.max_local_num_tokens > 0 ? grad_output.numel() / info.hidden : info.tokens;
    const int64_t th = rows * info.hidden;
    const int64_t wu = info.local_experts * info.hidden * 2 * info.intermediate;
    const int64_t wd = info.local_experts * info.intermediate * info.hidden;
    require(grad_output, "grad_output", {at::kBFloat16}, th);
    require(grad_hidden_states, "grad_hidden_states", {at::kBFloat16}, th);
    require(grad_gate_up, "grad_gate_up", {at::kBFloat16, at::kFloat}, wu);
    require(grad_down, "grad_down", {grad_gate_up.scalar_type()}, wd);
    megamoe_experts_weights_t w = weights_of(info, gate_up, down, weights_version);
    megamoe_experts_grads_t grads = {grad_hidden_states.data_ptr(), nullptr,
                                     grad_gate_up.data_ptr(), grad_down.data_ptr(),
                                     code_of(grad_gate_up)};
    if (grad_topk_weights.has_value() && grad_topk_weights->defined()) {
        require(*grad_topk_weights, "grad_topk_weights", {at::kFloat, at::kBFloat16},
                rows * info.top_k);
        grads.topk_weights = grad_topk_weights->data_ptr();
    }
    auto *state = reinterpret_cast<megamoe_experts_saved_t *>(static_cast<intptr_t>(saved));
    check(megamoe_experts_backward(layer, state, &w, grad_output.data_ptr(), &grads));
}

void experts_saved_destroy(int64_t saved)
{
    megamoe_experts_saved_destroy(
        reinterpret_cast<megamoe_experts_saved_t *>(static_cast<intptr_t>(saved)));
}

// Address of megamoe_version as this adapter resolved it: equal to the ctypes binding's only
// when both use the same loaded libmegamoe (one runtime per process).
int64_t library_id() { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&megamoe_version)); }

int64_t abi_version() { return megamoe_abi_version(); }

} // namespace

// The operators' schemas are torch_npu's, except that every tensor is optional ("Tensor?"): a
// missing required input then reaches the library, which reports it on every rank of the group
// (a schema error would stop one rank only and leave the others waiting in the collective).
TORCH_LIBRARY(megamoe, m)
{
    m.def("npu_moe_distribute_dispatch_v2(Tensor? x, Tensor? expert_ids, str group_ep, "
          "int ep_world_size, int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, "
          "Tensor? x_active_mask=None, Tensor? expert_scales=None, Tensor? elastic_info=None, "
          "Tensor(a!)? performance_info=None, str group_tp=\"\", int tp_world_size=0, "
          "int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
          "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, "
          "int expert_token_nums_type=1, str comm_alg=\"\", int zero_expert_num=0, "
          "int copy_expert_num=0, int const_expert_num=0, int? y_dtype=None, "
          "int? x_dtype=None, int? scales_dtype=None) "
          "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
          &dispatch_v2);
    m.def("npu_moe_distribute_combine_v2(Tensor? expand_x, Tensor? expert_ids, "
          "Tensor? assist_info_for_combine, Tensor? ep_send_counts, Tensor? expert_scales, "
          "str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
          "Tensor? tp_send_counts=None, Tensor? x_active_mask=None, Tensor? expand_scales=None, "
          "Tensor? shared_expert_x=None, Tensor? elastic_info=None, Tensor? ori_x=None, "
          "Tensor? const_expert_alpha_1=None, Tensor? const_expert_alpha_2=None, "
          "Tensor? const_expert_v=None, Tensor(a!)? performance_info=None, str group_tp=\"\", "
          "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, "
          "int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
          "int comm_quant_mode=0, str comm_alg=\"\", int zero_expert_num=0, "
          "int copy_expert_num=0, int const_expert_num=0) -> Tensor",
          &combine_v2);
    m.def("npu_moe_distribute_combine_add_rms_norm(Tensor? expand_x, Tensor? expert_ids, "
          "Tensor? expand_idx, Tensor? ep_send_counts, Tensor? expert_scales, Tensor? residual_x, "
          "Tensor? gamma, str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
          "Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
          "Tensor? activation_scale=None, Tensor? weight_scale=None, Tensor? group_list=None, "
          "Tensor? expand_scales=None, Tensor? shared_expert_x=None, Tensor? elastic_info=None, "
          "Tensor? ori_x=None, Tensor? const_expert_alpha_1=None, "
          "Tensor? const_expert_alpha_2=None, Tensor? const_expert_v=None, str group_tp=\"\", "
          "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, "
          "int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
          "int out_dtype=0, int comm_quant_mode=0, int group_list_type=0, str comm_alg=\"\", "
          "float norm_eps=1e-06, "
          "int zero_expert_num=0, int copy_expert_num=0, int const_expert_num=0) "
          "-> (Tensor, Tensor, Tensor)",
          &combine_add_rms_norm);
    m.def("experts_forward(int layer, Tensor hidden_states, Tensor topk_ids, "
          "Tensor topk_weights, Tensor? tokens_per_expert, Tensor gate_up, Tensor down, "
          "int weights_version, Tensor(a!) output, bool save) -> int",
          &experts_forward);
    m.def("experts_backward(int layer, int saved, Tensor gate_up, Tensor down, "
          "int weights_version, Tensor grad_output, Tensor(a!) grad_hidden_states, "
          "Tensor(b!)? grad_topk_weights, Tensor(c!) grad_gate_up, Tensor(d!) grad_down) -> ()",
          &experts_backward);
    m.def("experts_saved_destroy(int saved) -> ()", &experts_saved_destroy);
    m.def("register_group(str name, int handle) -> ()", &register_group);
    m.def("abi_version() -> int", &abi_version);
    m.def("library_id() -> int", &library_id);
}
