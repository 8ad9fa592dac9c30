"""diffusers' own context parallelism (ring, Ulysses, unified) with the
libsdpa backend, under torchrun on 2 and 4 gloo processes: a small
FluxTransformer2DModel against the same model in one process
(diffusers_cp_worker.py, which also says what it patches to run diffusers'
enable_parallelism on a CPU)."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="context parallelism needs torch")
pytest.importorskip("diffusers", reason="context parallelism needs diffusers")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(__file__), "diffusers_cp_worker.py")


@pytest.mark.parametrize("procs", [2, 4])
def test_context_parallel_flux(procs, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                        str(procs), "--master-port", str(29510 + procs), WORKER],
                       capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, tail
    assert " 0 failed" in r.stdout and "ring" in r.stdout, tail
