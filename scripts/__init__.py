"""Launchers (TPU VMs, local multi-worker jobs) and their helpers; nothing in the core imports them."""
