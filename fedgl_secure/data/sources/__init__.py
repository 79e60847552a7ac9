"""A bank's own customer graph (files or SQL), validated against the consortium's feature schema."""
