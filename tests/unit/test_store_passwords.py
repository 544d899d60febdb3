"""The stores' password files and the scrubbing of command output (no servers needed)."""

from __future__ import annotations

import base64
import stat
import sys
from pathlib import Path

import pytest

from im_server.runtime.ownership import StoreUser, write_private
from im_server.runtime.passwords import (
    PASSWORD_FILE,
    load_or_create_password,
    read_password,
    scram_sha256_verifier,
)
from im_server.runtime.processes import EmbeddedRuntimeError, run


def test_password_is_made_once_kept_private_and_reused(tmp_path: Path) -> None:
    first = load_or_create_password(tmp_path, StoreUser())
    path = tmp_path / PASSWORD_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_password(tmp_path) == first and len(first) >= 40
    assert load_or_create_password(tmp_path, StoreUser()) == first
    assert [p.name for p in tmp_path.iterdir()] == [PASSWORD_FILE]  # no temp file left
    path.chmod(0o644)  # loosened by hand: tightened on the next read
    assert load_or_create_password(tmp_path, StoreUser()) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_empty_file_gets_a_new_password_and_a_bad_one_is_not_shown(tmp_path: Path) -> None:
    path = tmp_path / PASSWORD_FILE
    path.write_text("\n")
    made = load_or_create_password(tmp_path, StoreUser())
    assert len(made) >= 40 and read_password(tmp_path) == made
    bad = "short"
    path.write_text(bad)
    with pytest.raises(EmbeddedRuntimeError) as e:
        load_or_create_password(tmp_path, StoreUser())
    assert bad not in str(e.value)


def test_a_symlinked_password_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("a-password-somewhere-else-0123")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / PASSWORD_FILE).symlink_to(target)
    with pytest.raises(EmbeddedRuntimeError, match="cannot read"):
        load_or_create_password(tmp_path / "store", StoreUser())
    write_private(tmp_path / "store" / PASSWORD_FILE, "replaced\n", StoreUser())
    assert target.read_text() == "a-password-somewhere-else-0123"  # the link was replaced


def test_failed_command_output_is_scrubbed() -> None:
    secret = "s3cret-value-that-must-not-leak"
    script = "import sys; print('hash', sys.argv[1]); sys.exit(3)"
    with pytest.raises(EmbeddedRuntimeError) as e:
        run([sys.executable, "-c", script, secret], what="probe", timeout=30, hide=(secret,))
    assert secret not in str(e.value) and "hash ***" in str(e.value)
    assert "exit status 3" in str(e.value)


def test_scram_verifier_shape() -> None:
    v = scram_sha256_verifier("pencil", salt=b"0123456789abcdef")
    head, keys = v.rsplit("$", 1)
    scheme, params = head.split("$")
    iterations, salt = params.split(":")
    stored, server = keys.split(":")
    assert (scheme, iterations) == ("SCRAM-SHA-256", "4096")
    assert base64.b64decode(salt) == b"0123456789abcdef"
    assert len(base64.b64decode(stored)) == len(base64.b64decode(server)) == 32
    assert v == scram_sha256_verifier("pencil", salt=b"0123456789abcdef")
    assert v != scram_sha256_verifier("pencil2", salt=b"0123456789abcdef")
