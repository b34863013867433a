#!/usr/bin/env bash
# Builds the npm artefacts a DSH user installs without a Rust toolchain, from this checkout:
#   - @agent-tavern/bridge-<os>-<cpu>: the prebuilt `tavern-bridge` and `tavern` for one
#     platform (os/cpu set, so a package manager installs only the one matching the machine);
#   - @agent-tavern/dsh-plugin: the DSH plugin, listing every platform package in
#     `optionalDependencies` at its own version (esbuild's and biome's way of shipping binaries).
# Every package's version is the crates' (workspace.package.version in Cargo.toml).
#
#   scripts/build-npm-packages.sh [--out DIR]     (default: target/npm)
#
# Prints the tarballs it wrote. Platforms built: linux-x64 (this machine's toolchain). The
# plugin names linux-arm64 too, which this script does not build yet (see docs/RELEASING.md).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/target/npm"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-npm-packages: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
cd "$repo"
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "build-npm-packages: no version in [workspace.package] of Cargo.toml" >&2; exit 1; }
plugin_version=$(node -p 'require("./integrations/dsh/plugin/package.json").version')
if [ "$plugin_version" != "$version" ]; then
  echo "build-npm-packages: integrations/dsh/plugin/package.json has version $plugin_version, the crates $version" >&2
  exit 1
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage"

# One platform package from binaries built for it.
platform_package() { # <os> <cpu> <directory holding tavern-bridge and tavern>
  local os=$1 cpu=$2 bins=$3 dir="$stage/bridge-$1-$2"
  mkdir -p "$dir/bin"
  cp "$bins/tavern-bridge" "$bins/tavern" "$dir/bin/"
  cp LICENSE-MIT LICENSE-APACHE "$dir/"
  cat > "$dir/package.json" <<JSON
{
  "name": "@agent-tavern/bridge-$os-$cpu",
  "version": "$version",
  "description": "Prebuilt AgentTavern binaries for $os-$cpu: the tavern-bridge sidecar of the DSH plugin and the tavern command.",
  "license": "MIT OR Apache-2.0",
  "os": ["$os"],
  "cpu": ["$cpu"],
  "files": ["bin/", "LICENSE-MIT", "LICENSE-APACHE"],
  "bin": { "tavern": "bin/tavern" }
}
JSON
  (cd "$out" && npm pack --silent "$dir" > /dev/null)
  echo "$out/agent-tavern-bridge-$os-$cpu-$version.tgz"
}

echo "build-npm-packages: building tavern-bridge and tavern $version for linux-x64" >&2
cargo build --release --locked -p tavern-dsh-adapter --bin tavern-bridge -p tavern-cli --bin tavern >&2
platform_package linux x64 "$repo/target/release"

# The plugin: its own files, the licences, and the platform packages at this version.
plugin="$stage/dsh-plugin"
mkdir -p "$plugin"
cp integrations/dsh/plugin/index.mjs integrations/dsh/plugin/cordis.patch.yml \
  integrations/dsh/plugin/roleplay.patch.yml LICENSE-MIT LICENSE-APACHE "$plugin/"
node -e '
  const [src, dst, version] = process.argv.slice(1)
  const fs = require("node:fs")
  const pkg = JSON.parse(fs.readFileSync(src, "utf8"))
  pkg.optionalDependencies = Object.fromEntries(
    ["linux-x64", "linux-arm64"].map((p) => [`@agent-tavern/bridge-${p}`, version]))
  fs.writeFileSync(dst, JSON.stringify(pkg, null, 2) + "\n")
' integrations/dsh/plugin/package.json "$plugin/package.json" "$version"
(cd "$out" && npm pack --silent "$plugin" > /dev/null)
echo "$out/agent-tavern-dsh-plugin-$version.tgz"
rm -rf "$stage"
