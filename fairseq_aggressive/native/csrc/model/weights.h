// A model's configuration and weights, and how they are built from named
// tensors.  The named weight layout shared with engine.py: the Python side hands over
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
#include <memory>
#include <string>
#include <vector>

#include "cpu/linear.h"
#include "model/screen.h"

namespace fa {

struct Config;
struct PolicyCache;

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

// Config::act: the feed-forward layers' activation (c_api.ACTIVATIONS by index)
enum Activation : int32_t { kRelu = 0, kGelu = 1, kSwish = 2 };

// The model's shape and fairseq options (mirrored by Config in c_api.py)
struct Config {
  int32_t C, H, F, enc_layers, dec_layers, src_vocab, tgt_vocab;
  int32_t enc_normalize_before, dec_normalize_before, act, pad, unk, eos;  // act: kRelu, kGelu, kSwish
  float enc_embed_scale, dec_embed_scale, ln_eps;
  // The width of the encoder output the decoder attends to; 0: C.  Another
  // width: a decoder over another model's encoder output (a --shared-encoder
  // drafter narrower than its verifier), with no encoder of its own (no
  // encoder tensors, enc_layers 0; it starts from fa_begin_encoded only).
  int32_t enc_dim;

  int enc_width() const { return enc_dim > 0 ? enc_dim : C; }
  bool has_encoder() const { return enc_width() == C; }
};

struct Norm {
  std::vector<float> w, b;
  bool on = false;
};

struct EncLayer {
  Linear qkv, out, fc1, fc2;
  Norm ln_attn, ln_ffn;
};
struct DecLayer {
  Linear qkv, out, cq, ckv, cout, fc1, fc2;  // self-attention q + k + v, its output; encoder attention q, k + v, output
  Norm ln_self, ln_cross, ln_ffn;
};

// The weights of a model: given by name (fa_set_weight), packed once
// (fa_model_build), then only read.  Every decoder made from a model
// (fa_model_share) reads the same copy; nothing changes them once a second
// decoder exists (the C API refuses).
struct Weights {
  WeightSet staged;  // named tensors given by fa_set_weight until build_weights packs them
  std::vector<float> src_embed, tgt_embed, src_pos, tgt_pos;  // pos tables may be empty
  std::vector<float> mask_embed;  // a block drafter's slot input (fa_set_mask_embed): target id -1
  Linear feat_proj;  // a --verifier-features drafter's projection of the verifier's features (fa_set_feature_proj)
  // a --feature-ar drafter's projection of its own output where that is
  // narrower than the verifier's features (fa_set_own_feature_proj); empty: feat_proj
  Linear own_feat_proj;
  // a transformer_blockwise model's proposal heads 2..k (fa_set_heads): n_heads
  // outputs of heads_fc2(relu(heads_fc1(x))), each C wide and added to x, read
  // with the output projection; proposals only, float32
  Linear heads_fc1, heads_fc2;
  int n_heads = 0;
  Norm enc_ln_embed, enc_final, dec_ln_embed, dec_final;
  std::vector<EncLayer> enc;
  std::vector<DecLayer> dec;
  Linear proj;
  Screen screen;  // the output projection's int8 screen, where it is float (screen.h)
  bool built = false;
  // the draft-length policies its decoders left (draft_lengths.h); not weights, shared as they are
  std::shared_ptr<PolicyCache> policies;

  explicit Weights(const Config& c);
  // linear layers stored as float16 / as int8
  int half_linears() const;
  int int8_linears() const;
  // bytes of the weights a verification pass reads: the decoder's products and the output projection
  size_t pass_bytes() const;
  // f(layer) for every linear layer of the encoder, the decoder and the output projection
  template <class F>
  void for_each_linear(F&& f) {
    visit_decoder(*this, f);
    visit_encoder(*this, f);
  }
  template <class F>
  void for_each_linear(F&& f) const {
    visit_decoder(*this, f);
    visit_encoder(*this, f);
  }
  // the same for the encoder's layers alone, and for the decoder's with the output projection
  template <class F>
  void for_each_encoder_linear(F&& f) {
    visit_encoder(*this, f);
  }
  template <class F>
  void for_each_decoder_linear(F&& f) {
    visit_decoder(*this, f);
  }

 private:
  template <class W, class F>
  static void visit_encoder(W& w, F& f) {
    for (auto& L : w.enc)
      for (auto* x : {&L.qkv, &L.out, &L.fc1, &L.fc2}) f(*x);
  }
  template <class W, class F>
  static void visit_decoder(W& w, F& f) {
    f(w.proj);
    for (auto& L : w.dec)
      for (auto* x : {&L.qkv, &L.out, &L.cq, &L.ckv, &L.cout, &L.fc1, &L.fc2}) f(*x);
  }
};

// "" if a model of shape c can be made, else what is wrong (widths, heads, layers, vocabularies, symbols)
std::string check_config(const Config& c);

// Packs the tensors W.staged holds into W's layers (a model of shape cfg); "" or what is wrong
std::string build_weights(Weights& W, const Config& cfg);

}  // namespace fa
