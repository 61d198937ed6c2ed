"""``fusefleet keys new NAME``: mint an API key; the token is printed once, the file keeps only its sha256."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from shared.api_keys import ApiKey, KeysFileError, key_table, load_keys, new_token, token_hash

TOKEN_NOTE = "the token (shown once: give it to the client; the fleet keeps only its sha256)"


def mint(name: str, rate_per_s: float | None, burst: int | None, max_queued: int | None) -> tuple[str, ApiKey]:
    """A new token and its key (``ValidationError`` for a bad name or limit)."""
    token = new_token()
    key = ApiKey(name=name, sha256=token_hash(token), rate_per_s=rate_per_s, burst=burst, max_queued=max_queued)
    return token, key


def append_key(path: Path, key: ApiKey) -> None:
    """Add ``key``'s table to the keys file at ``path`` (created when missing); ``KeysFileError`` when the file is
    invalid or already has a key of that name (nothing is written then)."""
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    if existing.strip():
        names = {known.name for known in load_keys(path).keys}
        if key.name in names:
            raise KeysFileError(f"{path} already has a key named {key.name!r}: remove its table first to replace it")
    separator = "" if not existing or existing.endswith("\n\n") else ("\n" if existing.endswith("\n") else "\n\n")
    with path.open("a", encoding="utf-8") as file:
        file.write(separator + key_table(key))


def run_new(name: str, rate_per_s: float | None, burst: int | None, max_queued: int | None, file: Path | None) -> int:
    """The command: print the token and the table (or add the table to ``file``); 2 for a bad name, limit or file."""
    try:
        token, key = mint(name, rate_per_s, burst, max_queued)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'key'}: {e['msg']}" for e in exc.errors())
        typer.echo(f"error: {problems}", err=True)
        return 2
    if file is not None:
        try:
            append_key(file, key)
        except (KeysFileError, OSError) as exc:
            typer.echo(f"error: {exc}", err=True)
            return 2
    typer.echo(f"# {TOKEN_NOTE}:", err=True)
    typer.echo(token)
    if file is not None:
        typer.echo(f"# added [keys.{key.name}] to {file}; api processes read it within 1 s", err=True)
    else:
        typer.echo("# add to the API keys file (FUSEFLEET_API_KEYS_FILE):", err=True)
        typer.echo(key_table(key), nl=False)
    return 0
