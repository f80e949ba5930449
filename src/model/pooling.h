#pragma once
// Pooling: what a model declares about its embeddings, and the host-side
// pooling of a sequence's last hidden states into one vector.
#include <cstdint>
#include <string>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/model.h"

namespace rill {

// Reads a sentence-transformers model directory: modules.json names a
// Pooling module (its <path>/config.json: pooling_mode_mean_tokens,
// pooling_mode_cls_token or pooling_mode_lasttoken; max and sqrt-length
// modes are refused) and optionally a Normalize module after it;
// sentence_bert_config.json's max_seq_length, when present, is returned in
// max_seq_length (0 otherwise). No modules.json: pooling kNone. Errors name
// the file and field.
struct SentenceTransformersConfig {
  EmbeddingSpec spec;
  int64_t max_seq_length = 0;
};
Result<SentenceTransformersConfig> read_sentence_transformers(const std::string& dir, int64_t n_dims);

// The pooling a decoder's files declare: a Hugging Face directory's
// sentence-transformers config (read_sentence_transformers), or a GGUF
// file's <arch>.pooling_type (1 mean, 2 cls, 3 last; normalized, as
// llama.cpp's embeddings are by default). kNone when they declare none.
Result<EmbeddingSpec> declared_pooling(const ModelFiles& files);

// out[n_dims] = pooling of rows [n_rows, n_dims] (row-major f32), then L2
// normalization when spec.normalize. Requires n_rows >= 1.
void pool_rows(const EmbeddingSpec& spec, const float* rows, int64_t n_rows, int64_t n_dims, float* out);

}  // namespace rill
