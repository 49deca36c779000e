"""Helpers for tests: running forgeflow on a real socket, signing deliveries."""
