"""Drop-in use of the fused ops inside other trainers.

    from reasonrl_fast.integrations import trl as rf_trl
    rf_trl.patch()          # before building the TRL trainer

Each integration imports its trainer library only when used, so importing this package needs
neither TRL nor verl.
"""
