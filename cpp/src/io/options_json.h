// The planner options JSON the Python API sends (_core.plan_graph), read into PlannerOptions.
//
// Options JSON (every field optional except mesh):
//   {"mesh": {"shape": [8, 8], "dim_names": ["dp", "tp"]},
//    "hardware": "H100",       (or an object of profile fields: {"base": "CPU", ...})
//    "parameter_memory": {"low": 0.0, "high": 0.015625}   (absent: low 0, high 1/mesh size;
//                                                          null: no constraint)
//    "memory_limit_bytes": 80000000000,
//    "input_constraints": {"primals_12": ["S(0)", "R"]},
//    "output_constraints": {"0": ["R", "R"]},
//    "node_constraints": {"mm_3": ["S(0)", "S(1)"]},
//    "time_limit_s": 20,       (wall-clock budget of building the problem and solving it,
//                               default 20; > 0, huge values mean no limit)
//    "gap_tolerance": 0.001,   (stop once the plan is within this fraction of its lower
//                               bound, default 0.1 %; 0: only a proof or the time limit)
//    "max_problem_bytes": 8000000000,  (refuse meshes/graphs whose solver problem is
//                               estimated to need more memory than this; absent or null:
//                               8 GB, or 80% of the available memory / ulimit -v if less)
//    "fp32_matmul_precision": "ieee",  (how float32 matmuls run: "ieee", full float32 at the
//                               profile's peak_flops_fp32_cuda_core, PyTorch's default; "tf32",
//                               TF32 tensor cores at peak_flops_fp32; absent or null: the
//                               profile's fp32_matmul_uses_tf32)
//    "verbose": false}
#pragma once

#include "autoshard/planner.h"
#include "io/json.h"

namespace autoshard {

// Throws JsonError / std::invalid_argument naming the bad field; the result is validated
// (validate_planner_options).
PlannerOptions parse_planner_options(const Json& doc);

}  // namespace autoshard
