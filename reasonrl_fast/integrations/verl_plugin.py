"""The `verl.plugins` entry point: verl imports it (it loads each entry point, it does not call
it) in every process that imports verl, and importing it registers reasonrl_fast's advantage
estimator and policy loss (and the patch under REASONRL_FAST_VERL_PATCH=1).

verl logs a failing plugin at debug level only, so a failure is also reported here as a warning
before it propagates: a missing estimator would otherwise surface much later as "Unknown
advantage estimator".
"""

from __future__ import annotations

import logging

from reasonrl_fast.integrations.verl import register

try:
    register()
except Exception as e:  # reported, then re-raised for verl's own handling
    logging.getLogger("reasonrl_fast").warning("reasonrl_fast's verl plugin failed to register: %s", e)
    raise

__all__ = ["register"]
