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

# Cargo verifies each crate against the others' fresh tarballs through a local overlay, but
# unpacks them under CARGO_HOME's registry/src and reuses an unpacked copy of the same version
# from an earlier run: a stale copy of our own unpublished crates would be verified instead of
# this checkout; and it never rebuilds a registry crate it compiled before under
# target/package. Drop both first (only our crates, only this version).
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for member in tavern-core tavern-search tavern-store tavern-tools tavern-projector tavern-runtime tavern-api tavern-dsh-adapter tavern-cli; do
  rm -rf "$cargo_home"/registry/src/*/"$member-$version" "$cargo_home"/registry/cache/*/"$member-$version.crate"
done
rm -rf target/package
# Verification builds in the workspace's target dir, where a registry crate is never rebuilt
# once compiled: forget our crates' builds from the overlay (their .d files name registry/src).
for dep in target/debug/deps/tavern_*.d; do
  [ -f "$dep" ] || continue
  if grep -q "registry/src" "$dep"; then
    stem=$(basename "$dep" .d)           # tavern_projector-<hash>
    name=${stem%-*}; hash=${stem##*-}
    rm -rf "target/debug/.fingerprint/${name//_/-}-$hash" target/debug/deps/"lib$stem".* "$dep"
  fi
done
cargo package --workspace --exclude tavern-examples --locked "$@"
ls -1 target/package/*-"$version".crate
