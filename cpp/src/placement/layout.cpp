// Local shapes and shardability of layouts (torch.chunk semantics, see docs/formats.md 2).
#include "autoshard/layout.h"

#include <stdexcept>

namespace autoshard {

int64_t chunk_size(int64_t size, int64_t parts, int64_t index) {
  if (parts <= 1) return size;
  int64_t c = (size + parts - 1) / parts;
  int64_t begin = index * c;
  int64_t end = std::min(size, (index + 1) * c);
  return std::max<int64_t>(0, end - begin);
}

static void check_dims(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh) {
  if (static_cast<int>(layout.size()) != mesh.ndim())
    throw std::invalid_argument("layout " + layout_list_str(layout) + " has " + std::to_string(layout.size()) +
                                " placements but the mesh has " + std::to_string(mesh.ndim()) + " dims");
  for (const auto& p : layout)
    if (p.is_shard() && p.dim >= static_cast<int>(global.size()))
      throw std::invalid_argument("layout " + layout_list_str(layout) + " shards dim " + std::to_string(p.dim) +
                                  " of a tensor with " + std::to_string(global.size()) + " dims");
}

std::vector<int64_t> local_shape_at(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh,
                                    const std::vector<int64_t>& coord) {
  check_dims(global, layout, mesh);
  std::vector<int64_t> s = global;
  for (int i = 0; i < mesh.ndim(); ++i)
    if (layout[i].is_shard()) s[layout[i].dim] = chunk_size(s[layout[i].dim], mesh.shape[i], coord[i]);
  return s;
}

std::vector<int64_t> max_local_shape(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh) {
  return local_shape_at(global, layout, mesh, std::vector<int64_t>(mesh.ndim(), 0));
}

std::vector<std::vector<int64_t>> local_shapes_per_rank(const std::vector<int64_t>& global, const Layout& layout,
                                                        const Mesh& mesh) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> coord(mesh.ndim(), 0);
  for (int64_t r = 0; r < mesh.size(); ++r) {
    int64_t rest = r;
    for (int i = mesh.ndim() - 1; i >= 0; --i) {
      coord[i] = rest % mesh.shape[i];
      rest /= mesh.shape[i];
    }
    out.push_back(local_shape_at(global, layout, mesh, coord));
  }
  return out;
}

TensorMeta local_meta(const TensorMeta& global, const Layout& layout, const Mesh& mesh) {
  TensorMeta m = global;
  m.shape = max_local_shape(global.shape, layout, mesh);
  return m;
}

bool is_shardable(const std::vector<int64_t>& global, const Layout& layout, const Mesh& mesh) {
  if (static_cast<int>(layout.size()) != mesh.ndim()) return false;
  std::vector<int64_t> s = global;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!layout[i].is_shard()) continue;
    int d = layout[i].dim;
    if (d < 0 || d >= static_cast<int>(s.size())) return false;
    if (s[d] < mesh.shape[i]) return false;
    s[d] = (s[d] + mesh.shape[i] - 1) / mesh.shape[i];
  }
  return true;
}

bool has_partial(const Layout& layout) {
  for (const auto& p : layout)
    if (p.is_partial()) return true;
  return false;
}

bool has_mixed_partial(const Layout& layout) {
  const Placement* first = nullptr;
  for (const auto& p : layout) {
    if (!p.is_partial()) continue;
    if (first && first->reduce != p.reduce) return true;
    first = &p;
  }
  return false;
}

Layout replicate_layout(int mesh_ndim) { return Layout(mesh_ndim, Placement::replicate()); }

int64_t num_shards(const Layout& layout, const Mesh& mesh) {
  int64_t n = 1;
  for (size_t i = 0; i < layout.size(); ++i)
    if (layout[i].is_shard()) n *= mesh.shape[i];
  return n;
}

std::vector<Layout> all_unpartial_layouts(const std::vector<int64_t>& shape, const Mesh& mesh) {
  std::vector<Placement> choices{Placement::replicate()};
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) choices.push_back(Placement::shard(d));
  std::vector<Layout> out;
  Layout cur(mesh.ndim());
  std::vector<size_t> idx(mesh.ndim(), 0);
  while (true) {
    for (int i = 0; i < mesh.ndim(); ++i) cur[i] = choices[idx[i]];
    if (is_shardable(shape, cur, mesh)) out.push_back(cur);
    int i = mesh.ndim() - 1;
    while (i >= 0 && ++idx[i] == choices.size()) idx[i--] = 0;
    if (i < 0) break;
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t layout_code(const Layout& l) {
  if (l.size() > 8) throw std::invalid_argument("meshes with more than 8 dims are not supported");
  uint64_t code = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    uint64_t c = 0;
    if (l[i].is_shard())
      c = 1 + static_cast<uint64_t>(l[i].dim & 0x3f);
    else if (l[i].is_partial())
      c = 0x80 | static_cast<uint64_t>(l[i].reduce);
    code |= c << (8 * i);
  }
  return code;
}

}  // namespace autoshard
