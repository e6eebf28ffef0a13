"""Drop-in use of the fused ops inside other trainers.

    from reasonrl_fast.integrations import trl as rf_trl
    rf_trl.patch()          # before building the TRL trainer

    from reasonrl_fast.integrations import verl as rf_verl
    rf_verl.patch()         # or REASONRL_FAST_VERL_PATCH=1 with the `verl.plugins` entry point

Each integration imports its trainer library only when used, so importing this package needs
neither TRL nor verl.
"""
