"""A pytest plugin that runs diffusers' own test suite with libsdpa as
diffusers' active attention backend (bench/diffusers_tests/run.sh loads it
with -p libsdpa_plugin). LIBSDPA_DIFFUSERS_MODE says what:

  native        diffusers as it is (the baseline run)
  libsdpa       libsdpa.diffusers.enable(), and "libsdpa" made the active
                backend, so every dispatch_attention_fn call without an
                explicit backend reaches libsdpa
  libsdpa+route the same, and libsdpa.torch_route.enable(): the processors
                that call torch's F.scaled_dot_product_attention themselves
                reach libsdpa too

It records each test's outcome and the calls libsdpa took (the backend's,
forward and backward; the routing's, taken and handed back) into the JSON
file LIBSDPA_DIFFUSERS_REPORT names."""
import json
import os

MODE = os.environ.get("LIBSDPA_DIFFUSERS_MODE", "native")
REPORT = os.environ.get("LIBSDPA_DIFFUSERS_REPORT", "diffusers-tests.json")
outcomes, counts = {}, {"backend_calls": 0, "backend_calls_with_grad": 0}


def pytest_configure(config):
    if MODE == "native":
        return
    import libsdpa
    import libsdpa.diffusers
    from diffusers.models import attention_dispatch as ad
    member = libsdpa.diffusers.enable()
    ad._AttentionBackendRegistry.set_active_backend(member)
    real = ad._AttentionBackendRegistry._backends[member]

    def counting(query, key, value, *args, **kwargs):
        counts["backend_calls"] += 1
        counts["backend_calls_with_grad"] += int(libsdpa._wants_grad(query, key, value))
        return real(query, key, value, *args, **kwargs)

    for name in ("__name__", "__qualname__", "__signature__"):
        try:
            setattr(counting, name, getattr(real, name))
        except AttributeError:
            pass
    import inspect
    counting.__signature__ = inspect.signature(real)  # diffusers filters kwargs by signature
    ad._AttentionBackendRegistry._backends[member] = counting
    if MODE == "libsdpa+route":
        libsdpa.torch_route.enable()


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcomes[report.nodeid] = report.outcome
        if report.outcome == "failed":
            outcomes[report.nodeid + "::message"] = str(report.longrepr)[-600:]


def pytest_sessionfinish(session, exitstatus):
    if MODE == "libsdpa+route":
        import libsdpa
        counts["route"] = libsdpa.torch_route.stats()
    with open(REPORT, "w") as f:
        json.dump({"mode": MODE, "counts": counts, "outcomes": outcomes}, f, indent=0)
