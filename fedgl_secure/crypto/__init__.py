"""Cryptography: CKKS packing, upload receipts, sealed storage, the key authority's rules."""
