// A model's Weights: made, the named tensors checked as they arrive
// (WeightSet::put) and packed into the layers (build_weights).  See weights.h
// for the names.
#include "model/weights.h"

#include <cstring>

#include "loop/draft_lengths.h"
#include "cpu/vec.h"

namespace fa {

Weights::Weights(const Config& c) : policies(std::make_shared<PolicyCache>()) {
  enc.resize(c.enc_layers);
  dec.resize(c.dec_layers);
}

int Weights::half_linears() const {
  int n = 0;
  for_each_linear([&](const Linear& L) { n += L.half; });
  return n;
}

int Weights::int8_linears() const {
  int n = 0;
  for_each_linear([&](const Linear& L) { n += L.q8; });
  return n;
}

size_t Weights::pass_bytes() const {
  size_t n = proj.bytes();
  for (const auto& L : dec)
    for (const Linear* x : {&L.qkv, &L.out, &L.cq, &L.cout, &L.fc1, &L.fc2}) n += x->bytes();
  return n;
}

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// the module names of a layer's linear layers (out, in in units of C or F;
// in_enc: the input is the encoder output, Config::enc_width() wide)
struct LinearShape {
  const char* name;
  bool decoder_only;
  bool out_ffn, in_ffn;  // F instead of C
  bool in_enc;
};
const LinearShape kLayerLinears[] = {
    {"self_attn.q_proj", false, false, false, false},   {"self_attn.k_proj", false, false, false, false},
    {"self_attn.v_proj", false, false, false, false},   {"self_attn.out_proj", false, false, false, false},
    {"encoder_attn.q_proj", true, false, false, false}, {"encoder_attn.k_proj", true, false, false, true},
    {"encoder_attn.v_proj", true, false, false, true},  {"encoder_attn.out_proj", true, false, false, false},
    {"fc1", false, true, false, false},                 {"fc2", false, false, true, false},
};
const char* const kLayerNorms[] = {"self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"};

// The expected rows x cols (rows -1: any) and whether the tensor is a linear
// layer's weight (any dtype) of `name` at `layer`; "" or why it is wrong.
std::string expected(const Config& cfg, const std::string& name, int layer, int& rows, int& cols, bool& weight) {
  weight = false;
  cols = 1;
  for (const char* side : {"encoder", "decoder"}) {
    const bool dec = side[0] == 'd';
    const std::string top = std::string(side) + ".", per_layer = top + "layers.";
    if (!starts_with(name, top)) continue;
    if (!dec && !cfg.has_encoder())
      return name + ": this decoder reads an encoder output " + std::to_string(cfg.enc_width()) +
             " wide and has no encoder of its own";
    const int n_layers = dec ? cfg.dec_layers : cfg.enc_layers;
    if (starts_with(name, per_layer)) {
      if (layer < 0 || layer >= n_layers)
        return name + ": layer " + std::to_string(layer) + ", the model has " + std::to_string(n_layers);
      const std::string part = name.substr(per_layer.size());
      for (const LinearShape& l : kLayerLinears) {
        if (l.decoder_only && !dec) continue;
        const std::string module = std::string(l.name) + ".";
        if (!starts_with(part, module)) continue;
        const std::string param = part.substr(module.size());
        rows = l.out_ffn ? cfg.F : cfg.C;
        if (param == "weight") {
          cols = l.in_ffn ? cfg.F : l.in_enc ? cfg.enc_width() : cfg.C;
          weight = true;
          return "";
        }
        if (param == "bias" || param == "scale") return "";
        return "unknown tensor " + name;
      }
      for (const char* norm : kLayerNorms) {
        if (!dec && std::strcmp(norm, "encoder_attn_layer_norm") == 0) continue;
        if (part == std::string(norm) + ".weight" || part == std::string(norm) + ".bias") {
          rows = cfg.C;
          return "";
        }
      }
      return "unknown tensor " + name;
    }
    if (layer != -1) return name + ": layer " + std::to_string(layer) + " given for a tensor outside the layers (-1)";
    const std::string part = name.substr(top.size());
    if (part == "embed_tokens.weight") {
      rows = dec ? cfg.tgt_vocab : cfg.src_vocab;
      cols = cfg.C;
      return "";
    }
    if (part == "embed_positions.weight") {
      rows = -1;
      cols = cfg.C;
      return "";
    }
    if (part == "layernorm_embedding.weight" || part == "layernorm_embedding.bias" || part == "layer_norm.weight" ||
        part == "layer_norm.bias") {
      rows = cfg.C;
      return "";
    }
    if (dec && starts_with(part, "output_projection.")) {
      const std::string param = part.substr(std::strlen("output_projection."));
      rows = cfg.tgt_vocab;
      if (param == "weight") {
        cols = cfg.C;
        weight = true;
        return "";
      }
      if (param == "bias" || param == "scale") return "";
    }
    return "unknown tensor " + name;
  }
  return "unknown tensor " + name;
}

size_t dtype_size(int dtype) { return dtype == F32 ? 4 : dtype == F16 ? 2 : 1; }

// Packing the staged tensors; the first problem found goes to `error`.
struct Builder {
  Weights& W;
  const Config& cfg;
  std::string error;

  const Tensor* get(const std::string& name, int layer, bool required) {
    const Tensor* t = W.staged.get(name, layer);
    if (t == nullptr && required && error.empty())
      error = "missing " + name + (layer >= 0 ? " of layer " + std::to_string(layer) : "");
    return t;
  }
  static const float* f32(const Tensor* t) { return t ? reinterpret_cast<const float*>(t->bytes.data()) : nullptr; }

  void norm(Norm& n, const std::string& name, int layer, bool required) {
    const Tensor* w = get(name + ".weight", layer, required);
    const Tensor* b = get(name + ".bias", layer, w != nullptr);
    n.on = w != nullptr && b != nullptr;
    if (n.on) {
      n.w.assign(f32(w), f32(w) + cfg.C);
      n.b.assign(f32(b), f32(b) + cfg.C);
    }
  }

  // The linear layers `modules` (each n x k) stacked into one n_parts * n x k layer
  void linear(Linear& L, const std::string& prefix, int layer, std::initializer_list<const char*> modules, int n,
              int k) {
    std::vector<const Tensor*> w, b, s;
    for (const char* mod : modules) {
      const std::string name = prefix + mod;
      w.push_back(get(name + ".weight", layer, true));
      b.push_back(get(name + ".bias", layer, false));
      s.push_back(get(name + ".scale", layer, w.back() != nullptr && w.back()->dtype == I8));
    }
    if (!error.empty()) return;
    const int n_parts = (int)w.size();
    bool q8 = true, half = true, any_q8 = false;
    for (const Tensor* t : w) {
      q8 = q8 && t->dtype == I8;
      any_q8 = any_q8 || t->dtype == I8;
      half = half && t->dtype == F16;
    }
    if (any_q8 && !q8) {
      error = prefix + *modules.begin() + ": int8 and float parts in one layer";
      return;
    }
    const size_t sz = (size_t)n * k;
    std::vector<float> bias((size_t)n_parts * n, 0.f);
    bool has_bias = false;
    for (int p = 0; p < n_parts; ++p)
      if (b[p]) {
        has_bias = true;
        std::copy(f32(b[p]), f32(b[p]) + n, bias.begin() + (size_t)p * n);
      }
    const float* bp = has_bias ? bias.data() : nullptr;
    if (q8) {
      std::vector<int8_t> cat((size_t)n_parts * sz);
      std::vector<float> scale((size_t)n_parts * n);
      for (int p = 0; p < n_parts; ++p) {
        const int8_t* q = reinterpret_cast<const int8_t*>(w[p]->bytes.data());
        std::copy(q, q + sz, cat.begin() + p * sz);
        std::copy(f32(s[p]), f32(s[p]) + n, scale.begin() + (size_t)p * n);
      }
      L.pack_q8(cat.data(), scale.data(), bp, n_parts * n, k);
    } else if (half) {
      std::vector<uint16_t> cat((size_t)n_parts * sz);
      for (int p = 0; p < n_parts; ++p) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(w[p]->bytes.data());
        std::copy(h, h + sz, cat.begin() + p * sz);
      }
      L.pack(nullptr, cat.data(), bp, n_parts * n, k);
    } else {  // float32; a float16 part is widened exactly
      std::vector<float> cat((size_t)n_parts * sz);
      for (int p = 0; p < n_parts; ++p) {
        float* dst = cat.data() + p * sz;
        if (w[p]->dtype == F16) {
          const uint16_t* h = reinterpret_cast<const uint16_t*>(w[p]->bytes.data());
          for (size_t i = 0; i < sz; ++i) dst[i] = half_to_float(h[i]);
        } else {
          std::copy(f32(w[p]), f32(w[p]) + sz, dst);
        }
      }
      L.pack(cat.data(), nullptr, bp, n_parts * n, k);
    }
  }

  void table(std::vector<float>& dst, const std::string& name, bool required) {
    const Tensor* t = get(name, -1, required);
    if (t) dst.assign(f32(t), f32(t) + (size_t)t->rows * t->cols);
  }
};

}  // namespace

std::string WeightSet::key(const std::string& name, int layer) { return name + "#" + std::to_string(layer); }

std::string WeightSet::put(const Config& cfg, const std::string& name, int layer, int dtype, const void* data,
                           int rows, int cols) {
  int want_rows = 0, want_cols = 0;
  bool weight = false;
  std::string err = expected(cfg, name, layer, want_rows, want_cols, weight);
  if (!err.empty()) return err;
  if ((want_rows >= 0 && rows != want_rows) || cols != want_cols || rows < 0)
    return name + ": " + std::to_string(rows) + " x " + std::to_string(cols) + ", expected " +
           (want_rows >= 0 ? std::to_string(want_rows) : std::string("n")) + " x " + std::to_string(want_cols);
  if (dtype != F32 && !(weight && (dtype == F16 || dtype == I8)))
    return name + ": dtype " + std::to_string(dtype) + " (float32 only, or float16 / int8 for a linear weight)";
  if (data == nullptr) return name + ": no data";
  Tensor& t = tensors[key(name, layer)];
  t.dtype = dtype;
  t.rows = rows;
  t.cols = cols;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  t.bytes.assign(p, p + (size_t)rows * cols * dtype_size(dtype));
  return "";
}

const Tensor* WeightSet::get(const std::string& name, int layer) const {
  auto it = tensors.find(key(name, layer));
  return it == tensors.end() ? nullptr : &it->second;
}

std::string check_config(const Config& c) {
  auto bad = [](const std::string& what) { return "model configuration: " + what; };
  if (c.C < 1 || c.H < 1 || c.C % c.H != 0)
    return bad("the width " + std::to_string(c.C) + " is not a positive multiple of the heads " + std::to_string(c.H));
  if (c.F < 1 || c.dec_layers < 1 || c.enc_layers < 0)
    return bad("feed-forward width " + std::to_string(c.F) + ", " + std::to_string(c.enc_layers) + " encoder and " +
               std::to_string(c.dec_layers) + " decoder layers (at least 1 each, 0 encoder layers allowed)");
  if (c.tgt_vocab < 1 || c.src_vocab < 0 || c.enc_dim < 0)
    return bad("vocabularies " + std::to_string(c.src_vocab) + " / " + std::to_string(c.tgt_vocab) +
               ", encoder width " + std::to_string(c.enc_dim));
  for (int s : {c.pad, c.unk, c.eos})
    if (s < 0 || s >= c.tgt_vocab) return bad("a special symbol id (" + std::to_string(s) + ") outside the vocabulary");
  if (!(c.ln_eps > 0.f)) return bad("layer norm epsilon must be positive");
  if (c.act != kRelu && c.act != kGelu && c.act != kSwish) return bad("activation " + std::to_string(c.act) + " (0 relu, 1 gelu, 2 swish)");
  return "";
}

std::string build_weights(Weights& W, const Config& cfg) {
  const int C = cfg.C, F = cfg.F;
  Builder b{W, cfg, ""};
  if (!cfg.has_encoder() && cfg.enc_layers != 0) return "a decoder over another encoder's output has no encoder layers";
  b.table(W.src_embed, "encoder.embed_tokens.weight", cfg.has_encoder());
  b.table(W.src_pos, "encoder.embed_positions.weight", false);
  b.norm(W.enc_ln_embed, "encoder.layernorm_embedding", -1, false);
  b.norm(W.enc_final, "encoder.layer_norm", -1, false);
  b.table(W.tgt_embed, "decoder.embed_tokens.weight", true);
  b.table(W.tgt_pos, "decoder.embed_positions.weight", false);
  b.norm(W.dec_ln_embed, "decoder.layernorm_embedding", -1, false);
  b.norm(W.dec_final, "decoder.layer_norm", -1, false);
  b.linear(W.proj, "decoder.", -1, {"output_projection"}, cfg.tgt_vocab, C);
  for (int l = 0; l < cfg.enc_layers; ++l) {
    EncLayer& L = W.enc[l];
    const std::string p = "encoder.layers.";
    b.linear(L.qkv, p, l, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, C, C);
    b.linear(L.out, p, l, {"self_attn.out_proj"}, C, C);
    b.norm(L.ln_attn, p + "self_attn_layer_norm", l, true);
    b.linear(L.fc1, p, l, {"fc1"}, F, C);
    b.linear(L.fc2, p, l, {"fc2"}, C, F);
    b.norm(L.ln_ffn, p + "final_layer_norm", l, true);
  }
  for (int l = 0; l < cfg.dec_layers; ++l) {
    DecLayer& L = W.dec[l];
    const std::string p = "decoder.layers.";
    b.linear(L.qkv, p, l, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, C, C);
    b.linear(L.out, p, l, {"self_attn.out_proj"}, C, C);
    b.norm(L.ln_self, p + "self_attn_layer_norm", l, true);
    b.linear(L.cq, p, l, {"encoder_attn.q_proj"}, C, C);
    b.linear(L.ckv, p, l, {"encoder_attn.k_proj", "encoder_attn.v_proj"}, C, cfg.enc_width());
    b.linear(L.cout, p, l, {"encoder_attn.out_proj"}, C, C);
    b.norm(L.ln_cross, p + "encoder_attn_layer_norm", l, true);
    b.linear(L.fc1, p, l, {"fc1"}, F, C);
    b.linear(L.fc2, p, l, {"fc2"}, C, F);
    b.norm(L.ln_ffn, p + "final_layer_norm", l, true);
  }
  W.staged.tensors.clear();
  // the tiles ask for their weights ahead where the encoder's layers, or the
  // decoder's with the output projection (what a pass reads), outgrow the
  // caches (linear.cpp)
  size_t enc_bytes = 0, dec_bytes = 0;
  W.for_each_encoder_linear([&](const Linear& L) { enc_bytes += L.bytes(); });
  W.for_each_decoder_linear([&](const Linear& L) { dec_bytes += L.bytes(); });
  W.for_each_encoder_linear([&](Linear& L) { L.prefetch = enc_bytes >= kPrefetchModelBytes; });
  W.for_each_decoder_linear([&](Linear& L) { L.prefetch = dec_bytes >= kPrefetchModelBytes; });
  if (b.error.empty()) build_screen(W.proj, W.screen);
  return b.error;
}

}  // namespace fa
