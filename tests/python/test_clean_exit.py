"""The exit hook that lets gloo's worker threads finish before the interpreter ends
(runtime/clean_exit.py). Whether runs really end cleanly is measured by
bench/clean_exit.py, which repeats torchrun jobs with and without the hook."""

from __future__ import annotations

import atexit
import subprocess
import sys
import textwrap

from autoshard.runtime import clean_exit


def test_hook_is_registered_once_per_process():
    before = atexit._ncallbacks()
    clean_exit.guard_process_exit()
    clean_exit.guard_process_exit()
    assert clean_exit._registered
    assert atexit._ncallbacks() <= before + 1


def test_without_gloo_workers_the_hook_returns_at_once():
    # this test process holds no gloo process group
    assert clean_exit._gloo_worker_states("/proc/self/task") == []
    assert clean_exit.wait_for_gloo_workers()


def test_hook_sees_idle_gloo_workers_of_a_real_process_group():
    script = textwrap.dedent("""
        import torch, torch.distributed as dist
        from autoshard.runtime import clean_exit
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        t = torch.ones(4)
        dist.all_reduce(t)
        states = clean_exit._gloo_worker_states("/proc/self/task")
        print("STATES", "".join(sorted(states)), clean_exit.wait_for_gloo_workers())
        dist.destroy_process_group()
        """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATES"))
    _, states, waited = line.split()
    assert states and set(states) <= set("RS"), line  # gloo's worker threads, by name
    assert waited == "True"


def test_a_wait_that_runs_out_says_so(monkeypatch, capsys):
    monkeypatch.setattr(clean_exit, "wait_for_gloo_workers", lambda: False)
    clean_exit.wait_at_exit()
    err = capsys.readouterr().err
    assert "gloo worker threads were still busy" in err and "never waited for" in err
    monkeypatch.setattr(clean_exit, "wait_for_gloo_workers", lambda: True)
    clean_exit.wait_at_exit()
    assert capsys.readouterr().err == ""
