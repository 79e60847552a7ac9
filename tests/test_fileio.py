"""write_atomically: whole files only, and a secret's permission from the first byte."""

from __future__ import annotations

import os
import stat

from fedgl_secure.fileio import PRIVATE_FILE_MODE, write_atomically


def test_a_private_file_is_never_readable_by_others_even_over_a_stale_temporary(tmp_path):
    target = tmp_path / "secret.key"
    stale = tmp_path / "secret.key.tmp"  # a crash's leftover, world-readable: O_CREAT alone would keep 0o644
    stale.write_bytes(b"half")
    os.chmod(stale, 0o644)
    write_atomically(target, b"key material", mode=PRIVATE_FILE_MODE)
    assert target.read_bytes() == b"key material"
    assert stat.S_IMODE(target.stat().st_mode) == PRIVATE_FILE_MODE
    assert not stale.exists()


def test_a_rewrite_replaces_the_whole_file(tmp_path):
    target = tmp_path / "ledger.json"
    write_atomically(target, b"a much longer first version")
    write_atomically(target, b"short")
    assert target.read_bytes() == b"short"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ledger.json"]
