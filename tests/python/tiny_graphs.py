"""A two-node graph JSON (docs/formats.md section 1) for tests of the C++ core's bindings:
an input x [8, 4] and one op y = op(x)."""

from __future__ import annotations

import json


def tiny_graph(op: str = "aten.relu.default") -> str:
    return json.dumps(
        {
            "version": 1,
            "nodes": [
                {
                    "name": "x",
                    "op": "placeholder",
                    "role": "input",
                    "input_index": 0,
                    "outputs": [{"shape": [8, 4], "dtype": "float32"}],
                },
                {
                    "name": "y",
                    "op": op,
                    "args": [{"ref": "x", "index": 0}],
                    "kwargs": {},
                    "outputs": [{"shape": [8, 4], "dtype": "float32"}],
                },
            ],
            "outputs": [],
        }
    )
