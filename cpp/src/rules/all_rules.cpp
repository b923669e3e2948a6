// Forces registration of every op-rule family (the rule files live in a static library, so
// nothing would pull their static registrars in). Idempotent and thread-safe.
#include <mutex>

#include "autoshard/rules.h"

namespace autoshard {

void register_pointwise_rules();
void register_matmul_rules();
void register_view_rules();
void register_slicing_rules();
void register_reduction_rules();
void register_softmax_rules();
void register_norm_rules();
void register_loss_rules();
void register_embedding_rules();
void register_attention_rules();
void register_flex_attention_rules();
void register_varlen_attention_rules();
void register_factory_rules();
void register_indexing_rules();
void register_convolution_rules();
void register_grouped_mm_rules();
void register_histogram_rules();

void register_all_rules() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_pointwise_rules();
    register_matmul_rules();
    register_view_rules();
    register_slicing_rules();
    register_reduction_rules();
    register_softmax_rules();
    register_norm_rules();
    register_loss_rules();
    register_embedding_rules();
    register_attention_rules();
    register_flex_attention_rules();
    register_varlen_attention_rules();
    register_factory_rules();
    register_indexing_rules();
    register_convolution_rules();
    register_grouped_mm_rules();
    register_histogram_rules();
  });
}

}  // namespace autoshard
