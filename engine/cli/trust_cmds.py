"""The signature commands: key, trust, sign, verify, policy (see docs/security.md).

Key material is never printed: only names, fingerprints and paths.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.catalog.store import Catalog
from engine.catalog.trust.keys import create_key, export_key, list_keys
from engine.catalog.trust.policy import policy as signature_policy
from engine.catalog.trust.policy import set_policy
from engine.catalog.trust.records import sign_adapter, verify_adapter, verify_backend_file
from engine.catalog.trust.trust_list import trust_add, trust_remove, trusted_keys
from engine.cli.output import emit_json
from engine.errors import RefusedError

POLICY_TEXT = {
    "off": "signatures are checked and shown where present, never required",
    "warn": "an unsigned or invalid adapter is imported and served with a warning",
    "require": "only adapters signed by a trusted key are imported and served",
}


def _short(fingerprint: str | None) -> str:
    return f"{fingerprint[:16]}…" if fingerprint else "?"


def cmd_key(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "create":
        info = create_key(args.name)
        print(f"created key {info.name} (ECDSA P-256, fingerprint {_short(info.fingerprint)})")
        print(f"  private key: {info.private_key} (mode {info.mode}: only you can read it)")
        print(f"  public key:  {info.public_key}")
        print(f"  trusted as {info.name} (`variant-studio trust remove {info.name}` undoes it)")
        return 0
    if args.action == "export":
        info = export_key(args.name, args.out)
        print(f"wrote the public key of {info.name} to {Path(args.out).expanduser()} "
              f"(fingerprint {_short(info.fingerprint)})")
        return 0
    keys = list_keys()
    if args.json:
        emit_json([k.to_dict() for k in keys])
        return 0
    if not keys:
        print("no keys (`variant-studio key create NAME` makes one)")
    for k in keys:
        print(f"  {k.name:<24} {_short(k.fingerprint)}  {k.private_key} ({k.mode})  "
              f"{'trusted' if k.trusted else 'not trusted'}")
    return 0


def cmd_trust(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "add":
        key = trust_add(args.file, args.name)
        print(f"trusted {key.name} (fingerprint {_short(key.fingerprint)})")
        return 0
    if args.action == "remove":
        trust_remove(args.name)
        print(f"removed {args.name} from the trust list")
        return 0
    keys = trusted_keys()
    if args.json:
        emit_json([{"name": k.name, "fingerprint": k.fingerprint, "shipped": k.shipped}
                   for k in keys])
        return 0
    for k in keys:
        note = "shipped release key (curated entries)" if k.shipped else "trusted"
        print(f"  {k.name:<24} {_short(k.fingerprint)}  {note}")
    return 0


def cmd_sign(catalog: Catalog, args: argparse.Namespace) -> int:
    verdict = sign_adapter(catalog, args.name, args.key)
    print(f"signed adapter {args.name} with key {args.key} ({', '.join(verdict.files) or '?'})")
    if verdict.ok:
        print(f"  verifies: {verdict.reason}")
    else:
        print(f"  ! verify reports {verdict.status}: {verdict.reason}")
    return 0


def cmd_verify(catalog: Catalog, args: argparse.Namespace) -> int:
    record = catalog.adapter(args.name)
    keys = trusted_keys()
    primary = verify_adapter(catalog, args.name, keys)
    backends = {b: verify_backend_file(catalog, args.name, b, keys, primary)
                for b in record.get("files", {})}
    policy = signature_policy(catalog)
    required = bool(record.get("curated")) or policy == "require"
    ok = primary.ok and all(v.ok for v in backends.values())
    if args.json:
        emit_json({"name": args.name, **primary.to_dict(), "policy": policy,
                   "required": required, "curated": bool(record.get("curated")),
                   "backends": {b: v.to_dict() for b, v in backends.items()}})
        return 0 if ok else RefusedError.exit_code
    who = f", signed by {primary.signer} ({_short(primary.fingerprint)})" if primary.ok else ""
    print(f"adapter {args.name}: {primary.status}{who}: {primary.reason}")
    for backend, verdict in backends.items():
        print(f"  file for {backend}: {verdict.status}: {verdict.reason}")
    if not ok:
        print(f"  policy {policy}: " + ("refused at import and at session open" if required
                                        else "served" + (" with a warning" if policy == "warn"
                                                         else "")))
    return 0 if ok else RefusedError.exit_code


def cmd_policy(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "set":
        set_policy(catalog, args.value)
    value = signature_policy(catalog)
    if getattr(args, "json", False):
        emit_json({"policy": value, "meaning": POLICY_TEXT[value],
                   "trusted": [k.name for k in trusted_keys()]})
        return 0
    print(f"signature policy: {value} ({POLICY_TEXT[value]}); curated entries always need "
          "the release key's signature")
    return 0
