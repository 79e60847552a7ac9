"""The final model a bank keeps for `fedgl-secure predict`: read back only when whole and of this federation."""

from __future__ import annotations

from fedgl_secure.consortium.bank_state import FINAL_META_FILE, FINAL_MODEL_FILE, load_final_model, save_final_model


def test_a_saved_final_model_is_read_back_only_when_intact(tmp_path):
    save_final_model(tmp_path, "fed", 7, b"model bytes")
    assert load_final_model(tmp_path, "fed") == (7, b"model bytes")
    assert load_final_model(tmp_path, "another-federation") is None
    (tmp_path / FINAL_MODEL_FILE).write_bytes(b"model bytez")  # altered after saving: digest mismatch
    assert load_final_model(tmp_path, "fed") is None
    save_final_model(tmp_path, "fed", 7, b"model bytes")
    (tmp_path / FINAL_META_FILE).write_text('{"federation": "fed", "vers')  # torn note: fetch again, no crash
    assert load_final_model(tmp_path, "fed") is None
    (tmp_path / FINAL_META_FILE).unlink()
    assert load_final_model(tmp_path, "fed") is None
