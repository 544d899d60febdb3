"""Supervision of the embedded PostgreSQL and Redis processes."""
