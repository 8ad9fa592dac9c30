"""libsdpa.distributed under torchrun: distributed_worker.py on 2 and 4
processes (4 oversubscribe this 2-core machine), gloo on the CPU, every rank's
rows against the single-process call; then the refusals."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="libsdpa.distributed needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


@pytest.mark.parametrize("procs", [2, 4])
def test_torchrun(procs, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                        str(procs), "--master-port", str(29500 + procs), WORKER],
                       capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, tail
    assert f"{procs} ranks" in r.stdout and " 0 failed" in r.stdout, tail
