"""Warm pools: ready sandboxes for one (provider, placement policy), claimed by one attempt
each (claim.py), refilled as starts under the provider's start rate (refill.py), kept clean
by beat (hygiene.py); operators set them through config.py."""
