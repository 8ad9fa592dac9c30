"""compare.py NATIVE.json RUN.json...: the tests that pass with diffusers'
native backend and do not with libsdpa, per run, with the calls libsdpa
took (libsdpa_plugin.py writes the files)."""
import collections
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


native = load(sys.argv[1])
base = {k: v for k, v in native["outcomes"].items() if not k.endswith("::message")}
print(f"native: {collections.Counter(base.values())}")
worst = 0
for path in sys.argv[2:]:
    run = load(path)
    got = {k: v for k, v in run["outcomes"].items() if not k.endswith("::message")}
    lost = sorted(k for k, v in base.items() if v == "passed" and got.get(k) != "passed")
    gained = sorted(k for k, v in got.items() if v == "passed" and base.get(k) != "passed")
    print(f"{run['mode']}: {collections.Counter(got.values())}; calls {run['counts']}")
    print(f"  pass with native, not with {run['mode']}: {len(lost)}")
    for k in lost:
        msg = run["outcomes"].get(k + "::message", "").strip().splitlines()
        print(f"    {k}: {got.get(k)}: {msg[-1] if msg else ''}")
    print(f"  pass with {run['mode']}, not with native: {len(gained)}")
    for k in gained:
        print(f"    {k}")
    worst = max(worst, len(lost))
sys.exit(1 if worst else 0)
