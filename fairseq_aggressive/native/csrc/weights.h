// The named weight layout shared with engine.py: the Python side hands over
// every tensor by name (fairseq's parameter names, with the layer number as a
// separate argument), and the engine checks each name and shape as it comes.
//
// Global tensors (layer -1), for side in {encoder, decoder}:
//   {side}.embed_tokens.weight          vocab x C   (required)
//   {side}.embed_positions.weight       n x C       (the position table; optional)
//   {side}.layernorm_embedding.{weight,bias}, {side}.layer_norm.{weight,bias}   C (optional)
//   decoder.output_projection.{weight,bias,scale}   a linear layer, vocab x C
// Per layer (layer 0 .. n - 1):
//   {side}.layers.self_attn.{q,k,v,out}_proj.{weight,bias,scale}   C x C
//   decoder.layers.encoder_attn.{q,k,v,out}_proj.{weight,bias,scale}   C x C
//   {side}.layers.fc1.{weight,bias,scale}   F x C;   {side}.layers.fc2.*   C x F
//   {side}.layers.{self_attn_layer_norm,final_layer_norm}.{weight,bias}   C
//   decoder.layers.encoder_attn_layer_norm.{weight,bias}   C
// A linear layer's weight (out x in) is float32, float16 (only when every
// value is a float16 value: the same arithmetic at half the bytes) or int8
// (then its .scale, out floats, holds the per-row scales); bias (out) and
// everything else is float32.  Vectors are given as rows x 1.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fa {

struct Config;

enum DType : int32_t { F32 = 0, F16 = 1, I8 = 2 };

struct Tensor {
  int32_t dtype = F32, rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
};

struct WeightSet {
  std::map<std::string, Tensor> tensors;  // by key(name, layer)
  static std::string key(const std::string& name, int layer);
  // Copies a tensor in; "" or why it is refused (unknown name, wrong layer, shape or type)
  std::string put(const Config& cfg, const std::string& name, int layer, int dtype, const void* data, int rows,
                  int cols);
  const Tensor* get(const std::string& name, int layer) const;
};

}  // namespace fa
