"""``python -m fedgl_secure`` = the ``fedgl-secure`` command (how ``consortium up`` starts nodes)."""

from fedgl_secure.cli import main

main()
