"""``gateway keys create|list|revoke``: manage API keys in the configured store, or in a
running gateway through its admin API (``--url``).

The command uses only ``store`` and ``keys`` of the config file (and ``GATEWAY__*``
overrides), though it checks all of it. Keys need a store that outlives the command:
SQLite (``store: sqlite``, the default: the same file as the gateway's, so no config is needed
for ``make run``'s gateway), Redis (``store: redis://...``, shared by every replica) or
``keys.file``. With ``--url`` no store is opened: the gateway at that URL does the
work, given the admin key (``--admin-key``, else ``$GATEWAY_ADMIN_KEY``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Iterable

from priority_gateway.config import KeysConfig, load_config
from priority_gateway.keys import KeySpecError, new_key
from priority_gateway.keys.remote import AdminError, RemoteKeys
from priority_gateway.store import Store, StoreUnavailable, open_store
from priority_gateway.store.records import ApiKey


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_command", required=True)
    create = sub.add_parser("create", help="create a key and print its secret (shown only once)")
    create.add_argument("--name", required=True)
    create.add_argument("--classes", default="interactive,batch", help="comma-separated: interactive,batch")
    create.add_argument("--default-class", help="class of requests without X-Priority (default: the first)")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute (prompt + completion)")
    create.add_argument("--tenant", help="tenant charged in fair queueing (default: the key itself)")
    create.add_argument("--weight", type=float, default=1.0, help="the tenant's fair-queueing weight (default 1)")
    create.add_argument("--max-concurrency", type=int, help="most requests of the tenant in flight at once")
    listing = sub.add_parser("list", help="list keys (never their secrets)")
    revoke = sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    for command in (create, listing, revoke):
        command.add_argument("--config", help="YAML config file (its store and keys sections are used)")
        command.add_argument("--url", help="a running gateway's base URL: manage keys through its admin API")
        command.add_argument(
            "--admin-key", default=os.environ.get("GATEWAY_ADMIN_KEY"), help="with --url (default $GATEWAY_ADMIN_KEY)"
        )
        command.add_argument("--ca-file", help="with an https:// --url: CA bundle that signs the gateway's certificate")


def store_settings(path: str | None) -> tuple[str, KeysConfig, str | None, tuple[str, ...]]:
    config = load_config(path, pools_required=False)
    return config.store, config.keys, config.data_dir, tuple(config.classes.by_name())


def main(args: argparse.Namespace) -> int:
    if args.url is not None:
        return _remote(args)
    url, keys, data_dir, classes = store_settings(args.config)
    if url == "memory" and not keys.file:
        print(
            "gateway keys: the in-process store forgets keys when this command ends; "
            "set store: sqlite (the default), redis://... or keys.file in the config",
            file=sys.stderr,
        )
        return 2
    store = open_store(url, keys.file, data_dir)
    try:
        return asyncio.run(_run(store, args, classes))
    except StoreUnavailable as exc:
        print(f"gateway keys: the store is unreachable ({exc})", file=sys.stderr)
        return 1


async def _run(store: Store, args: argparse.Namespace, classes: tuple[str, ...]) -> int:
    await store.open()
    try:
        if args.keys_command == "create":
            try:
                key, secret = new_key(
                    args.name,
                    args.classes.split(","),
                    args.default_class,
                    args.rpm,
                    args.tpm,
                    tenant=args.tenant,
                    weight=args.weight,
                    max_concurrency=args.max_concurrency,
                    known=classes,
                )
            except KeySpecError as exc:
                print(f"gateway keys: {exc}", file=sys.stderr)
                return 2
            await store.put_key(key)
            _created(key, secret)
            return 0
        if args.keys_command == "list":
            _listing(await store.list_keys())
            return 0
        if await store.revoke_key(args.key_id, int(time.time())):
            print(f"revoked {args.key_id}")
            return 0
        known = await store.get_key(args.key_id)
        print(f"gateway keys: {args.key_id} is {'already revoked' if known else 'not a key'}", file=sys.stderr)
        return 1
    finally:
        await store.close()


def _remote(args: argparse.Namespace) -> int:
    if args.config is not None:
        print("gateway keys: give --config (the store) or --url (a gateway's admin API), not both", file=sys.stderr)
        return 2
    if not args.admin_key:
        print("gateway keys: --url needs the admin key: --admin-key, or $GATEWAY_ADMIN_KEY", file=sys.stderr)
        return 2
    try:
        with RemoteKeys(args.url, args.admin_key, args.ca_file) as remote:
            if args.keys_command == "create":
                classes = args.classes.split(",")
                _created(
                    *remote.create(
                        args.name,
                        classes,
                        args.default_class,
                        args.rpm,
                        args.tpm,
                        args.tenant,
                        args.weight,
                        args.max_concurrency,
                    )
                )
            elif args.keys_command == "list":
                _listing(remote.list())
            elif remote.revoke(args.key_id) is None:
                print(f"gateway keys: {args.key_id} is not a key", file=sys.stderr)
                return 1
            else:
                print(f"revoked {args.key_id}")
    except AdminError as exc:
        print(f"gateway keys: {exc.message}", file=sys.stderr)
        return 2 if exc.status == 400 else 1
    return 0


def _created(key: ApiKey, secret: str) -> None:
    print(f"key_id: {key.id}")
    print(f"secret: {secret}")
    print("The secret is shown only now; the gateway keeps only its SHA-256.", file=sys.stderr)


def _listing(keys: Iterable[ApiKey]) -> None:
    print(
        f"{'KEY_ID':<18} {'NAME':<20} {'CLASSES':<20} {'DEFAULT':<12} {'RPM':>7} {'TPM':>9}  "
        f"{'TENANT':<18} {'WEIGHT':>6} {'MAX_CONC':>8}  STATUS"
    )
    for key in keys:
        status = "active" if key.active else "revoked " + time.strftime("%Y-%m-%d", time.gmtime(key.revoked_at))
        tenant = key.tenant or "(itself)"
        print(
            f"{key.id:<18} {key.name[:20]:<20} {','.join(key.classes):<20} {key.default_class:<12} "
            f"{key.rpm or '-':>7} {key.tpm or '-':>9}  {tenant[:18]:<18} {key.weight:>6g} "
            f"{key.max_concurrency or '-':>8}  {status}"
        )
