"""What travels between the parties and how it is encoded, below the services that carry it (DESIGN §2)."""
