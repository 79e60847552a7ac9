"""The research datasets (Planetoid's Cora/Citeseer/PubMed, ACM, Wiki) and the synthetic graphs: loaders that
turn files from a data directory into the same ``GraphDataset`` a bank's own tables become
(``data/sources``). For reproducing papers and for tests; ``data/registry.py`` picks one by name."""
