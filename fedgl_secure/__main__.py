"""``python -m fedgl_secure`` = the ``fedgl-secure`` command (how ``consortium up`` starts nodes)."""

from fedgl_secure.cli import main

if __name__ == "__main__":  # not when a spawned worker process re-imports the main module
    main()
