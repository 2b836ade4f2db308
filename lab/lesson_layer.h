/* lesson_layer.h — the FSDP unit that labs 02 and 03 move around: the parameters of one Qwen2-style decoder layer
 * (hidden 256, 4 query heads and 1 key/value head of 64, MLP 688), HF names. 693,120 floats = 2.8 MB unsharded.
 * Lab 05 trains real ones; here only their bytes matter. */
#ifndef FSDPLAB_LESSON_LAYER_H
#define FSDPLAB_LESSON_LAYER_H

#include "core/fsdp/flat_param.h"

static const flat_param_tensor_spec lesson_layer_params[] = {
    {"layers.0.input_layernorm.weight", 1, {256}},
    {"layers.0.self_attn.q_proj.weight", 2, {256, 256}},
    {"layers.0.self_attn.q_proj.bias", 1, {256}},
    {"layers.0.self_attn.k_proj.weight", 2, {64, 256}},
    {"layers.0.self_attn.k_proj.bias", 1, {64}},
    {"layers.0.self_attn.v_proj.weight", 2, {64, 256}},
    {"layers.0.self_attn.v_proj.bias", 1, {64}},
    {"layers.0.self_attn.o_proj.weight", 2, {256, 256}},
    {"layers.0.post_attention_layernorm.weight", 1, {256}},
    {"layers.0.mlp.gate_proj.weight", 2, {688, 256}},
    {"layers.0.mlp.up_proj.weight", 2, {688, 256}},
    {"layers.0.mlp.down_proj.weight", 2, {256, 688}},
};
#define LESSON_LAYER_PARAM_COUNT ((int)(sizeof lesson_layer_params / sizeof lesson_layer_params[0]))

#endif
