#!/usr/bin/env bash
# Packs every publishable crate as crates.io would receive it (`cargo package`, which builds
# each packed crate from its .crate file against the others packed beside it), after checking
# that the versions our crates name for each other equal the workspace version.
#   scripts/package-crates.sh            pack and verify (a full build of the packed sources)
#   scripts/package-crates.sh --no-verify  pack and list only
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
if [ -z "$version" ]; then
  echo "error: no version in [workspace.package] of Cargo.toml" >&2
  exit 1
fi
stale=$(grep -E '^tavern-[a-z-]+ = \{ path = ' Cargo.toml | grep -v "version = \"$version\"" || true)
if [ -n "$stale" ]; then
  echo "error: these workspace dependencies do not name version $version:" >&2
  echo "$stale" >&2
  exit 1
fi
for f in LICENSE-MIT LICENSE-APACHE; do
  [ -f "$f" ] || { echo "error: $f is missing at the root" >&2; exit 1; }
done

cargo package --workspace --exclude tavern-examples --locked "$@"
ls -1 target/package/*-"$version".crate
