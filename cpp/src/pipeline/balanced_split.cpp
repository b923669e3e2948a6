// Split points by time rather than by layer count: the step of a pipeline is paced by its
// slowest stage, so the split minimizing the slowest part's time is exact by dynamic
// programming over (parts, layers), O(stages * layers^2).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "autoshard/pipeline.h"

namespace autoshard {
namespace {

void check_split_input(const std::vector<double>& layer_us, int stages, double first_extra_us, double last_extra_us) {
  int n = static_cast<int>(layer_us.size());
  if (stages < 1 || stages > n)
    throw std::invalid_argument("balanced_split: cannot cut " + std::to_string(n) + " layers into " +
                                std::to_string(stages) + " non-empty stages; give 1 to " + std::to_string(n) +
                                " stages");
  auto check = [](double us, const std::string& what) {
    if (!(std::isfinite(us) && us >= 0))
      throw std::invalid_argument("balanced_split: " + what + " must be a finite time >= 0 us, got " +
                                  (std::isnan(us) ? std::string("nan") : std::to_string(us)));
  };
  for (int i = 0; i < n; ++i) check(layer_us[i], "layer " + std::to_string(i));
  check(first_extra_us, "first_extra_us");
  check(last_extra_us, "last_extra_us");
}

}  // namespace

std::vector<int> balanced_split(const std::vector<double>& layer_us, int stages, double first_extra_us,
                                double last_extra_us) {
  check_split_input(layer_us, stages, first_extra_us, last_extra_us);
  int n = static_cast<int>(layer_us.size());
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_us[i];
  // part(j, a, b): layers [a, b) as part j of `stages`.
  auto part = [&](int j, int a, int b) {
    return prefix[b] - prefix[a] + (j == 0 ? first_extra_us : 0) + (j == stages - 1 ? last_extra_us : 0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[j][b]: the slowest part of the best split of layers [0, b) into parts 0..j; from[j][b]
  // the first layer of part j there.
  std::vector<std::vector<double>> best(stages, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> from(stages, std::vector<int>(n + 1, 0));
  for (int b = 1; b <= n; ++b) best[0][b] = part(0, 0, b);
  for (int j = 1; j < stages; ++j)
    for (int b = j + 1; b <= n; ++b)
      for (int a = j; a < b; ++a) {
        double t = std::max(best[j - 1][a], part(j, a, b));
        if (t < best[j][b]) best[j][b] = t, from[j][b] = a;
      }
  std::vector<int> starts(stages, 0);
  for (int j = stages - 1, b = n; j > 0; --j) b = starts[j] = from[j][b];
  return starts;
}

}  // namespace autoshard
