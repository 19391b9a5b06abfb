"""Settlement: the first fenced terminal write wins; later ones report what won."""
