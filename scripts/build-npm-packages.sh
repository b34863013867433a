#!/usr/bin/env bash
# Builds the npm artefacts a DSH user installs without a Rust toolchain, from this checkout:
#   - @agent-tavern/bridge-<os>-<cpu>: the prebuilt `tavern-bridge` and `tavern` for one
#     platform (os/cpu set, so a package manager installs only the one matching the machine);
#   - @agent-tavern/dsh-plugin: the DSH plugin, listing every platform package in
#     `optionalDependencies` at its own version (esbuild's and biome's way of shipping binaries).
# Every package's version is the crates' (workspace.package.version in Cargo.toml).
#
#   scripts/build-npm-packages.sh [--out DIR] [--platforms linux-x64,linux-arm64]
#
# Defaults: target/npm, linux-x64. Prints the tarballs it wrote. linux-x64 builds with this
# machine's toolchain; linux-arm64 cross-builds with Debian's rustc-web and its aarch64 std
# (`--install-cross` installs them with apt) and, where qemu-user is installed, runs the
# binaries once under emulation. See docs/RELEASING.md.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/target/npm"
platforms=linux-x64
install_cross=false
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --platforms) platforms=${2:?--platforms needs a list}; shift 2 ;;
    --platforms=*) platforms=${1#--platforms=}; shift ;;
    --install-cross) install_cross=true; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

build_x64() {
  echo "build-npm-packages: building tavern-bridge and tavern $version for linux-x64" >&2
  cargo build --release --locked -p tavern-dsh-adapter --bin tavern-bridge -p tavern-cli --bin tavern >&2
  platform_package linux x64 "$repo/target/release"
}

# Debian's rustc-web and its aarch64 standard library (rustup cannot fetch targets here), with
# the cross linker; its own target folder, since the compiler differs from the host build's.
build_arm64() {
  local std=/usr/lib/rustlib/aarch64-unknown-linux-gnu
  if [ ! -d "$std" ] || ! command -v aarch64-linux-gnu-gcc > /dev/null; then
    if $install_cross; then
      dpkg --add-architecture arm64
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user > /dev/null
    else
      echo "build-npm-packages: linux-arm64 needs Debian's aarch64 Rust std and cross linker; rerun with --install-cross (as root) or: dpkg --add-architecture arm64 && apt-get update && apt-get install rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross" >&2
      exit 1
    fi
  fi
  echo "build-npm-packages: building tavern-bridge and tavern $version for linux-arm64 with $(/usr/bin/rustc --version)" >&2
  RUSTC=/usr/bin/rustc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
    cargo build --release --locked --target aarch64-unknown-linux-gnu --target-dir "$repo/target/cross-arm64" \
      -p tavern-dsh-adapter --bin tavern-bridge -p tavern-cli --bin tavern >&2
  local bins="$repo/target/cross-arm64/aarch64-unknown-linux-gnu/release"
  if command -v qemu-aarch64 > /dev/null; then
    # The binaries start and answer on the target architecture.
    qemu-aarch64 -L /usr/aarch64-linux-gnu "$bins/tavern" --version >&2
    qemu-aarch64 -L /usr/aarch64-linux-gnu "$bins/tavern-bridge" --help > /dev/null
  fi
  platform_package linux arm64 "$bins"
}

for p in ${platforms//,/ }; do
  case "$p" in
    linux-x64) build_x64 ;;
    linux-arm64) build_arm64 ;;
    *) echo "build-npm-packages: no build for platform '$p' (linux-x64, linux-arm64)" >&2; exit 2 ;;
  esac
done

# The plugin: its own files and the licences.
plugin="$stage/dsh-plugin"
mkdir -p "$plugin"
cp integrations/dsh/plugin/index.mjs integrations/dsh/plugin/cordis.patch.yml \
  integrations/dsh/plugin/roleplay.patch.yml LICENSE-MIT LICENSE-APACHE "$plugin/"
# The plugin's manifest already names every platform package (so `npm pack` of the folder
# itself is complete); each must be at the crates' version.
node -e '
  const [src, version] = process.argv.slice(1)
  const pkg = JSON.parse(require("node:fs").readFileSync(src, "utf8"))
  const want = ["linux-x64", "linux-arm64"].map((p) => `@agent-tavern/bridge-${p}`)
  const have = pkg.optionalDependencies ?? {}
  const wrong = want.filter((n) => have[n] !== version)
  if (wrong.length) {
    console.error(`build-npm-packages: the plugin must list ${wrong.join(", ")} at ${version} in optionalDependencies`)
    process.exit(1)
  }
' integrations/dsh/plugin/package.json "$version"
cp integrations/dsh/plugin/package.json "$plugin/package.json"
(cd "$out" && npm pack --silent "$plugin" > /dev/null)
echo "$out/agent-tavern-dsh-plugin-$version.tgz"
rm -rf "$stage"
