"""Helpers the tests share; fixtures stay in tests/conftest.py.

Modules here that reach PostgreSQL or Redis (`session`, `stack`) are imported only by
integration and end-to-end tests, so the unit tier runs where neither answers.
"""
