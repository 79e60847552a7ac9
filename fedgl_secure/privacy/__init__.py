"""Privacy policies (and, later, mechanisms, accounting and audit)."""
