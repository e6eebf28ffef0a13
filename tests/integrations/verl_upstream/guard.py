"""pytest plugin for the ported verl tests: the run is void unless verl's functions are what
REASONRL_FAST_VERL_PATCH says they are (reasonrl_fast's with it set to 1, verl's without), as
verl's own plugin loading left them when `verl` was imported."""

import os

import pytest


def _patched_names() -> dict[str, bool]:
    import verl
    import verl.utils.experimental.torch_functional as exp_F
    import verl.utils.kernel.linear_cross_entropy as lce
    import verl.utils.torch_functional as verl_F

    import reasonrl_fast.integrations.verl as rv

    state = {f"verl.utils.torch_functional.{n}": getattr(verl_F, n) is getattr(rv, n)
             for n in ("logprobs_from_logits", "entropy_from_logits", "entropy_from_logits_with_chunking")}
    state["verl.utils.kernel.linear_cross_entropy.linear_cross_entropy"] = (
        lce.linear_cross_entropy is rv.linear_cross_entropy)
    state["FusedLinearForPPO.forward"] = hasattr(exp_F.FusedLinearForPPO.forward, "__reasonrl_fast_original__")
    return state


def pytest_sessionstart(session):
    want = os.environ.get("REASONRL_FAST_VERL_PATCH") == "1"
    wrong = [name for name, ours in _patched_names().items() if ours != want]
    if wrong:
        raise pytest.UsageError(f"REASONRL_FAST_VERL_PATCH={int(want)} but these are "
                                f"{'not ' if want else ''}reasonrl_fast's: {', '.join(wrong)}")


def pytest_report_header(config):
    on = os.environ.get("REASONRL_FAST_VERL_PATCH") == "1"
    return f"verl functions: {'reasonrl_fast (patched)' if on else 'verl'}"


@pytest.fixture(autouse=True)
def _verl_registries():
    """verl's registry tests rebind and empty core_algos' registries (upstream they run in a
    process of their own per file); put back what `import verl` registered after each test, so
    that a later test finds the plugin's estimator and policy loss."""
    from verl.trainer.ppo import core_algos

    saved = {name: (getattr(core_algos, name), dict(getattr(core_algos, name)))
             for name in ("ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY")}
    yield
    for name, (registry, content) in saved.items():
        registry.clear()
        registry.update(content)
        setattr(core_algos, name, registry)
