"""fedgl-secure: privacy-hardened federated graph learning (FedGL) between institutions."""

__version__ = "0.1.0"
