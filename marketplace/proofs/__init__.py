"""Proof-of-learning segment checks (issue 35): see services.py."""
