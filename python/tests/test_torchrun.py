"""The tests that need several processes, under torchrun on 2 and 4 gloo
processes (4 oversubscribe this 2-core machine), each rank against the
single-process answer:
  distributed_worker.py   libsdpa.distributed (ring, Ulysses, USP, zigzag,
                          joint keys, the refusals)
  diffusers_cp_worker.py  diffusers' own context parallelism with the libsdpa
                          backend on a small FluxTransformer2DModel (it also
                          says what it patches to run it on a CPU)"""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torchrun and torch.distributed need torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize("procs", [2, 4])
@pytest.mark.parametrize("worker", ["distributed_worker.py", "diffusers_cp_worker.py"])
def test_torchrun(worker, procs, tmp_path):
    if worker.startswith("diffusers"):
        pytest.importorskip("diffusers", reason="context parallelism needs diffusers")
    port = 29500 + procs + (10 if worker.startswith("diffusers") else 0)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                        str(procs), "--master-port", str(port), os.path.join(HERE, worker)],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       timeout=900, cwd=tmp_path)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, tail
    assert f"on {procs} ranks" in r.stdout and " 0 failed" in r.stdout, tail
