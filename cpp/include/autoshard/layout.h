// What a layout means for one tensor: local shapes under torch.chunk semantics (ceil division,
// several mesh dims sharding one tensor dim split it left to right, trailing ranks may be
// empty), shardability and validity. (Its file form is in io/layout_json.h.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autoshard/tensor.h"
#include "autoshard/placement.h"

namespace autoshard {

// Size of chunk `index` when `size` is split into `parts` chunks like torch.chunk.
int64_t chunk_size(int64_t size, int64_t parts, int64_t index);

// The largest local shape over all ranks (the shape collectives pad to): ceil division,
// applied per mesh dim in order.
std::vector<int64_t> max_local_shape(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh);
// The local shape of the rank at mesh coordinate `coord` (one index per mesh dim).
std::vector<int64_t> local_shape_at(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh,
                                    const std::vector<int64_t>& coord);
// Local shapes of every rank, ranks in row-major mesh order.
std::vector<std::vector<int64_t>> local_shapes_per_rank(const std::vector<int64_t>& global, const Layout& layout,
                                                        const Mesh& mesh);
// TensorMeta with the max local shape.
TensorMeta local_meta(const TensorMeta& global, const Layout& layout, const Mesh& mesh);

// DTensor's shardability: at each mesh dim sharding tensor dim d (in mesh-dim order), the
// current size of d is at least the mesh dim's size. Also false when a Shard names a dim the
// tensor does not have.
bool is_shardable(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh);
// True when a layout holds Partials of different reduce ops.
bool has_mixed_partial(const Layout& layout);
bool has_partial(const Layout& layout);
Layout replicate_layout(int mesh_ndim);
// Product of the mesh dim sizes that shard the tensor (Partials do not divide).
int64_t num_shards(const Layout& layout, const Mesh& mesh);

// Every layout made of R / S(d) per mesh dim that is shardable for `shape` (no Partial), in a
// deterministic order: R first, then S(0), S(1)... on each mesh dim, mesh dim 0 slowest.
std::vector<Layout> all_unpartial_layouts(const std::vector<int64_t>& shape, const Mesh& mesh);

// "[2,16,64]"
std::string shape_str(const std::vector<int64_t>& shape);

// A compact, hashable code of a layout (8 bits per mesh dim, up to 8 mesh dims).
uint64_t layout_code(const Layout& l);

}  // namespace autoshard
