"""Calibration: where no tuning table fits the platform, measure the candidates 'auto' may choose and build one.

* ``strategy``: what to measure and what to pick (pure: the GPU run and the offline replay share it);
* ``platform``: the platform key (GPU, world, topology, driver, dmacoll code), agreed by every rank;
* ``measure``: times candidates through a ``Communicator`` with the options fixed, the slowest rank's median;
* ``cache``: calibrated tables in the user's cache directory, one per platform;
* ``lookup``: which table a new ``Communicator`` takes (given, shipped, cached, calibrated now, or none), the
  switch ``DMACOLL_CALIBRATE`` and the notice.

This module imports nothing, so that the analysis can use ``strategy`` without torch.
"""
