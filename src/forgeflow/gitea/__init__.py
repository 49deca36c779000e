"""Gitea adapters: webhook verification/normalisation and the REST client."""
