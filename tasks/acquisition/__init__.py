"""Acquiring what a run needs before its play starts: claims, start permits, sandboxes."""
