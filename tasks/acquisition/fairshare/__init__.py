"""Fair share of the fleet's start rate between orgs: the order (order.py, lua/), its
state in Redis (store.py) and the relay that publishes starts in that order (relay.py)."""
