"""The bottom floor (DESIGN §2): the privacy policy's schema and its validation — HE parameters checked
against the HomomorphicEncryption.org table, the packing layout they imply, DP settings and budgets. Every layer
reads it; it imports nothing above ``errors``, ``kinds`` and ``tomlio``."""
