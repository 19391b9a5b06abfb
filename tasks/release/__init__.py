"""Release: delete the attempt's sandboxes and give back its capacity, best effort."""
