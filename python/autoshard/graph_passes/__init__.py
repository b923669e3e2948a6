"""``autoshard.graph_passes``: analyses of a per-rank program graph under the module names
AutoParallel users import them from (``autoparallel.graph_passes.estimate_graph_metrics``,
``autoparallel.graph_passes.debug_helpers``).

They read a graph such as ``AutoParallel.parallel_gm`` (local shapes, functional
collectives and their waits) and price it; they change nothing. The planner's own estimate
of a plan is ``get_json()["summary"]`` and ``autoshard view``'s timeline; these answer the
same question for any graph, including one a user edited after planning."""
