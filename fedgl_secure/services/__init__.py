"""Network services of the secure consortium (DESIGN §5): key authority, aggregator, banks."""
