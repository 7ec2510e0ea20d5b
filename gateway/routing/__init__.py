"""Routing: classify a request into a profile, and the pure decision made for it."""
