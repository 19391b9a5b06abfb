"""Capability tokens: minted at launch, checked by the gateway."""
