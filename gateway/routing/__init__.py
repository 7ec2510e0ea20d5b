"""Routing: the live state of the fleet, and the pure decision made from it."""
