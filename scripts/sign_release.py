"""Sign the shipped demo adapter with the release key: `python scripts/sign_release.py KEY`.

KEY is the release private key (PEM, ECDSA P-256), which is not in the repository: its
public half is resources/keys/release.pub. A retrained demo (resources/demo/adapter.gguf
and provenance.json) must be signed again, or the app will not add it (curated entries
need a valid signature by the release key). Writes resources/demo/signature.sig, then
verifies it against the shipped public key.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.catalog.trust.sign import sign_folder  # noqa: E402
from engine.catalog.trust.trust_list import trusted_keys  # noqa: E402
from engine.catalog.trust.verify import verify_folder  # noqa: E402
from engine.curated import demo  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    folder = demo.resources_dir()
    files = sign_folder(folder, Path(argv[0]))
    release = [k for k in trusted_keys() if k.shipped]
    verdict = verify_folder(folder, release)
    print(f"signed {', '.join(files)} in {folder}: {verdict.status} ({verdict.reason})")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
