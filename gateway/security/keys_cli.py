"""``rerank-gateway keys``: make API keys and the config entries that hold only their hashes.

``keys create`` prints the new key once (first line of stdout) and the ``[[auth.keys]]`` entry
to paste into the config; the gateway never sees or stores the key itself. ``keys hash`` reads
an existing key from stdin (not from argv, which other users can see in ``ps``) and prints its
hash, for keys made elsewhere or to find which entry a key belongs to.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

__all__ = ("add_parser", "format_entry")


def _json_str(text: str) -> str:
    # A JSON string is a valid TOML basic string (same quotes and escapes).
    import msgspec

    return msgspec.json.encode(text).decode()


def format_entry(entry: dict[str, object]) -> str:
    """The ``[[auth.keys]]`` TOML block of one validated key entry."""
    lines = ["[[auth.keys]]"]
    for name, value in entry.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = _json_str(value)
        elif isinstance(value, datetime):
            text = _utc_text(value)
        elif isinstance(value, list | tuple):
            text = "[" + ", ".join(_json_str(v) for v in value) + "]"
        else:
            text = str(value)
        lines.append(f"{name} = {text}")
    return "\n".join(lines) + "\n"


def _utc_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _models(values: list[str]) -> list[str]:
    # Accept both `--models a b` and `--models a,b`.
    return [m.strip() for v in values for m in v.split(",") if m.strip()]


def _create(args: argparse.Namespace) -> int:
    import msgspec

    from gateway.config.settings import ConfigError
    from gateway.security.auth import generate_key, hash_key
    from schemas.config import ApiKeyConfig

    expires_at: datetime | None = None
    if args.expires_at:
        try:
            expires_at = datetime.fromisoformat(args.expires_at)
        except ValueError:
            raise ConfigError(f"--expires-at: not an ISO 8601 date/time: {args.expires_at!r}") from None
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        try:
            expires_at = expires_at.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:00-02:00 parses, but its UTC time does not exist
            raise ConfigError(
                f"--expires-at: {args.expires_at!r} is outside the years 1-9999 once converted to UTC; "
                "give another, or leave it out for a key that does not expire"
            ) from None
        if expires_at <= datetime.now(UTC):  # the gateway would refuse the key from its first request
            raise ConfigError(
                f"--expires-at: {_utc_text(expires_at)} is in the past (a time without an offset is UTC); "
                "give a later one, or leave it out for a key that does not expire"
            )
    elif args.expires_in_days:
        try:
            expires_at = (datetime.now(UTC) + timedelta(days=args.expires_in_days)).replace(microsecond=0)
        except OverflowError:
            raise ConfigError(
                f"--expires-in-days: {args.expires_in_days} days from now is past the year 9999; "
                "give fewer, or leave it out for a key that does not expire"
            ) from None
    key = generate_key()
    entry: dict[str, object] = {
        "id": args.name,
        "hash": hash_key(key),
        "models": _models(args.models),
        "expires_at": expires_at,
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_concurrent": args.max_concurrent,
        "tokens_per_day": args.tokens_per_day,
        "tokens_per_month": args.tokens_per_month,
        "search_units_per_day": args.search_units_per_day,
        "search_units_per_month": args.search_units_per_month,
        "admin": True if args.admin else None,
    }
    try:  # the same validation the gateway applies when it reads the entry
        msgspec.convert({k: v for k, v in entry.items() if v is not None}, ApiKeyConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid key entry: {exc}") from None
    print(
        "New API key below, shown only this once: store it in your secret manager. "
        "Only its hash goes into the gateway config.",
        file=sys.stderr,
    )
    print(key)
    print()
    print(format_entry(entry), end="")
    return 0


def _hash(args: argparse.Namespace) -> int:
    from gateway.security.auth import hash_key

    key = sys.stdin.readline().strip()
    if not key:
        print("rerank-gateway: keys hash: no key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys",
        help="create API keys and hash them for the config",
        description="Make API keys for the gateway. The config holds only their SHA-256 hashes "
        "([[auth.keys]]); the key itself is printed once, by `keys create`.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="print a new random key once, and its [[auth.keys]] entry")
    create.add_argument("--name", "--id", required=True, help="key id shown in logs and metrics (not secret)")
    create.add_argument(
        "--models", nargs="+", required=True, help="canonical model names or globs it may use ('*' for all)"
    )
    create.add_argument("--rpm", type=_positive, help="requests per minute")
    create.add_argument("--tpm", type=_positive, help="input tokens per minute, as the engine counts them")
    create.add_argument("--max-concurrent", type=_positive, help="requests in flight at once")
    for metric, what in (("tokens", "input tokens"), ("search-units", "search units")):
        for period in ("day", "month"):
            create.add_argument(
                f"--{metric}-per-{period}",
                type=_positive,
                help=f"quota: {what} per calendar {period} (limits.quota_timezone)",
            )
    create.add_argument("--admin", action="store_true", help="may call the admin API (/admin/v1/...)")
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument("--expires-at", help="ISO 8601 date/time, in the future (UTC if no offset)")
    expiry.add_argument(
        "--expires-in-days", type=_positive, metavar="DAYS", help="the key expires this many days from now (UTC)"
    )
    create.set_defaults(func=_create)
    hash_cmd = keys_sub.add_parser("hash", help="read a key on stdin and print its sha256:<hex> config hash")
    hash_cmd.set_defaults(func=_hash)
