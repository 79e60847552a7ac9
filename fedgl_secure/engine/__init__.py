"""The FedGL engine: equations, clients, server, methods, simulation and evaluation."""
