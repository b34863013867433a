// AgentTavern for DeepSeek Harness 0.1.0-rc.6 and 0.1.0-rc.8.
//
// A thin Cordis plugin that imports nothing from DSH: it spawns the Rust sidecar
// (`tavern-bridge`) and speaks its newline-delimited JSON protocol (docs/HOST_INTEGRATION.md).
// All AgentTavern logic stays in Rust; this file only moves frames:
//   - handshake → register every tool with ctx.tools (output schema + render);
//   - agent/created → the bridge decides whether AgentTavern mounts on that agent;
//   - sections {{tavern_persona}} (order 0) and {{tavern_kernel}} (order 50) whose variables
//     the system-prompt/assemble waterfall fills per agent and request from the bridge: rc.6
//     interpolation is strict and never re-scans variable values, so {{char}} in a custom
//     prompt stays literal;
//   - the same waterfall removes AgentTavern's tools from requests of agents it did not mount
//     (headless registers tools globally);
//   - tool execution → `tool/call` with exec.agent.id as the only identity, plus cancellation;
//   - every session/event, agent/status and agent/disposed → notifications for the projector.
// The child process is tied to the plugin's life with ctx.effect and shut down in order.

import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { timingSafeEqual } from 'node:crypto'
import { existsSync, readdirSync, readFileSync, realpathSync, statSync } from 'node:fs'
import { homedir } from 'node:os'
import { delimiter, dirname, isAbsolute, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'

export const name = 'agent-tavern'
export const inject = ['tools', 'systemPrompt']

const here = dirname(fileURLToPath(import.meta.url))

/** DSH's home, as DSH resolves it: `$DSH_HOME` when set and not blank, else `~/.dsh`. */
function dshHome() {
  const env = process.env.DSH_HOME
  return resolve(env && env.trim() ? env : join(homedir(), '.dsh'))
}

/**
 * The plugin's settings with their defaults and what each means. `Config` below is a Standard
 * Schema (what Cordis validates a row's config with): a wrong type is refused with the setting's
 * name before the plugin starts, and every unset setting gets its default — so a config patch
 * that sets only `bridge` keeps the rest.
 */
export const settings = {
  bridge: { type: 'string', default: 'tavern-bridge', description: 'The tavern-bridge executable: an absolute path, a path relative to this plugin, or a name found on PATH. The default uses the prebuilt bridge the plugin package installed for this platform, else tavern-bridge on PATH.' },
  data: { type: 'string', default: () => join(dshHome(), 'agent-tavern'), description: "AgentTavern's store (memories, variables, chats). Default: agent-tavern/ under the DSH home." },
  store: { type: 'string', default: '', description: 'A PostgreSQL store shared by several hosts (postgres:// URL or key=value settings) instead of `data`; empty: the files under `data`. May also come from TAVERN_STORE in the host environment.' },
  storePasswordFile: { type: 'string', default: '', description: 'A file whose first line is the PostgreSQL password, to keep it out of `store`.' },
  storeCaFile: { type: 'string', default: '', description: 'A PEM file of CA certificates trusted (besides the Mozilla roots) when `store` says sslmode=require.' },
  storeImageDir: { type: 'string', default: '', description: 'With `store`: a local folder (created when missing) where the bridge keeps an image of the memories it read, so the next start fetches only those written since. One folder per database. Empty: no image.' },
  storeMaxLoadedMemories: { type: 'number', default: -1, description: "With `store`: hold only the memories of the scopes this host's sessions use, about this many records beyond what one call needs (the least recently used scopes are dropped past it), so hosts sharing a large database each hold their players' memories, not everyone's. Negative: every memory is held. Not with storeImageDir." },
  wordVectors: { type: 'string', default: '', description: 'Word vectors (GloVe or fastText as text: `word v1 v2 …` per line) to rank memory, history and lore search by meaning as well as words ("photography" finds the camera and the lens). Read when the bridge starts (about 1.3 s for GloVe\'s 400,000 words). Empty: words alone.' },
  vectorWeight: { type: 'number', default: 0.5, description: 'With `wordVectors`: the share of a result\'s score that comes from the vectors, 0 to 0.95.' },
  sentenceEncoder: { type: 'string', default: '', description: 'A sentence encoder folder (all-MiniLM-L6-v2 as the repository\'s scripts/sentence-encoder.sh fetches it) to reorder what memory, history and lore search found by words by what whole sentences mean (of the memories that share only "setup" with "accessories for my photography setup", the camera one comes first; a text that shares no word with the query is still not found). Each text is encoded once, with no lock held and two searches at a time: a first search by meaning is slower (about a second for 100 new memories; one that waits 10 s for its turn ranks by words), other calls are not. Read at start (0.2 s, about 100 MiB). English only in effect. Instead of `wordVectors`. Empty: words alone.' },
  sentenceWeight: { type: 'number', default: 0.6, description: 'With `sentenceEncoder`: the share of a result\'s score that comes from the sentence vectors, 0 to 0.95.' },
  assets: { type: 'string', default: () => join(dshHome(), 'agent-tavern-assets'), description: 'A SillyTavern-style folder with characters/ and worlds/.' },
  user: { type: 'string', default: 'User', description: "The user's display name in chats (a SillyTavern settings.json in assets with personas wins over it)." },
  personaDescription: { type: 'string', default: '', description: "The user's persona description, for a setup without a SillyTavern settings.json in assets." },
  utcOffset: { type: 'string', default: '', description: "The user's time zone for SillyTavern's time macros ({{time}}, {{date}}, {{idle_duration}}): a fixed offset such as +08:00; empty: the system's zone." },
  worlds: { type: 'array', default: () => [], description: 'World books active in every chat (names under assets/worlds).' },
  character: { type: 'string', default: '', description: 'Bind new sessions whose id matches bindPattern to a chat with this character (empty: bind nothing).' },
  chat: { type: 'string', default: '', description: "Continue this existing chat of `character` (a SillyTavern chat id, e.g. 'Seraphina - 2024-09-19@20h03m29s') in new sessions instead of starting a chat per session; the session's messages are appended to it. Empty: a new chat per session." },
  chatFolder: { type: 'string', default: '', description: 'A SillyTavern user folder (e.g. SillyTavern/data/default-user) to write chats into, where SillyTavern opens them (chats/<character>/<chat>.jsonl); a running SillyTavern\'s own saves are detected, never overwritten. Usually the same folder as `assets`. Empty: chats stay in `data`.' },
  chatPrefix: { type: 'string', default: '', description: 'Prefix of the chat names of new sessions (default: the character).' },
  bindPattern: { type: 'string', default: '.*', description: 'Which new session ids are bound to character.' },
  sessionsRoot: { type: 'string', default: () => join(dshHome(), 'sessions'), description: "Where DSH keeps session logs, read to catch up after a restart: stock DSH's sessions/ under the DSH home (zstd logs are read as they are). Set it when a patch moves `session-persistence-jsonl`'s root." },
  routeToken: { type: 'string', default: '', description: "Bearer token admitting callers of the tavern-mode route and the management API under /agent-tavern/api/v1; a browser types it once into the panel's sign-in page at /agent-tavern/panel (empty: loopback only)." },
  hostVersion: { type: 'string', default: '', description: 'The DSH release (default: read from the running launcher), reported to the bridge; releases known not to work are refused.' },
  restarts: { type: 'number', default: 3, description: 'How often a bridge that dies is started again before AgentTavern turns itself off.' },
  routeCallTimeoutMs: { type: 'number', default: 30000, description: 'How long the tavern-mode route and the management API wait for the bridge to answer; past it the caller gets 503 (a stuck bridge holds no connection forever).' },
  routeBodyTimeoutMs: { type: 'number', default: 10000, description: "How long the tavern-mode route waits for a request's body before answering 408 (stalled callers hold no memory past it)." },
  promptTimeoutMs: { type: 'number', default: 2000, description: "How long a model request waits for AgentTavern's prompt sections; past it the request goes without them (and without AgentTavern's tools), with a warning." },
}

export const Config = {
  '~standard': {
    version: 1,
    vendor: 'agent-tavern',
    validate(input) {
      const raw = input ?? {}
      if (typeof raw !== 'object' || Array.isArray(raw)) return { issues: [{ message: 'agent-tavern: the config must be an object' }] }
      const value = { ...raw }
      const issues = []
      for (const [key, spec] of Object.entries(settings)) {
        if (value[key] === undefined || value[key] === null) {
          value[key] = typeof spec.default === 'function' ? spec.default() : spec.default
          continue
        }
        const ok = spec.type === 'array' ? Array.isArray(value[key]) : typeof value[key] === spec.type
        if (!ok) issues.push({ message: `agent-tavern: ${key} must be a ${spec.type} (${spec.description})`, path: [key] })
      }
      return issues.length ? { issues } : { value }
    },
  },
  description: 'AgentTavern: SillyTavern-style roleplay in the agent loop, served by the tavern-bridge sidecar.',
  dict: settings,
}

/**
 * The prebuilt bridge of this platform's package (`@agent-tavern/bridge-linux-x64`, …), which
 * the plugin package lists in `optionalDependencies` so that the package manager installs only
 * the one matching the machine (as esbuild and biome ship their binaries); `null` without one.
 */
export function packagedBridge(platform = process.platform, arch = process.arch, from = import.meta.url) {
  const name = `@agent-tavern/bridge-${platform}-${arch}`
  try {
    const manifest = createRequire(from).resolve(`${name}/package.json`)
    const exe = join(dirname(manifest), 'bin', platform === 'win32' ? 'tavern-bridge.exe' : 'tavern-bridge')
    return statSync(exe).isFile() ? exe : null
  } catch {
    return null
  }
}

/**
 * The bridge executable: absolute, relative to this plugin, or a name — for the default name,
 * the prebuilt bridge of the installed platform package first, then PATH; `null` if none.
 */
function findBridge(configured) {
  const runnable = (p) => { try { return statSync(p).isFile() } catch { return false } }
  if (isAbsolute(configured)) return runnable(configured) ? configured : null
  if (configured.includes('/') || configured.includes('\\')) {
    const local = resolve(here, configured)
    return runnable(local) ? local : null
  }
  if (configured === 'tavern-bridge') {
    const packaged = packagedBridge()
    if (packaged) return packaged
  }
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir && runnable(join(dir, configured))) return join(dir, configured)
  }
  const local = join(here, configured)
  return existsSync(local) && runnable(local) ? local : null
}

function startBridge(path, config, logger, onExit) {
  // A PostgreSQL store replaces `data`; its settings travel in the child's environment
  // (TAVERN_STORE), never on a command line other users can read.
  const store = config.store || process.env.TAVERN_STORE || ''
  // Every value rides in its flag (`--flag=value`): a persona that starts with "- ", a
  // negative weight or a path like "-old" is then a value, never read as another flag.
  const args = []
  const opt = (flag, value) => args.push(`${flag}=${value}`)
  if (!store) opt('--data', config.data)
  opt('--user', config.user ?? 'User')
  if (config.personaDescription) opt('--persona-description', config.personaDescription)
  if (config.storePasswordFile) opt('--store-password-file', config.storePasswordFile)
  if (config.storeCaFile) opt('--store-ca-file', config.storeCaFile)
  if (store && config.storeImageDir) opt('--store-image-dir', config.storeImageDir)
  if (store && config.storeMaxLoadedMemories >= 0) opt('--store-max-loaded-memories', Math.floor(config.storeMaxLoadedMemories))
  // Both set: both go, and the bridge refuses the pair by name rather than one being dropped.
  if (config.wordVectors) opt('--word-vectors', config.wordVectors)
  if (config.sentenceEncoder) opt('--sentence-encoder', config.sentenceEncoder)
  if (config.wordVectors) opt('--vector-weight', config.vectorWeight ?? 0.5)
  else if (config.sentenceEncoder) opt('--vector-weight', config.sentenceWeight ?? 0.6)
  if (config.assets && existsSync(config.assets)) opt('--assets', config.assets)
  if (config.chatFolder && !store) opt('--chat-folder', config.chatFolder)
  for (const world of config.worlds ?? []) opt('--world', world)
  if (config.utcOffset) opt('--utc-offset', config.utcOffset)
  const env = store ? { ...process.env, TAVERN_STORE: store } : process.env
  const child = spawn(path, args, { stdio: ['pipe', 'pipe', 'inherit'], env })
  const pending = new Map()
  let next = 1
  let closed = false
  const lines = createInterface({ input: child.stdout })
  lines.on('line', (line) => {
    let frame
    try { frame = JSON.parse(line) } catch { logger.warn?.('agent-tavern: bad frame from bridge: %s', line); return }
    if (frame.id != null && pending.has(frame.id)) {
      const { resolve, reject } = pending.get(frame.id)
      pending.delete(frame.id)
      if (frame.error) reject(Object.assign(new Error(frame.error.message), { code: frame.error.code }))
      else resolve(frame.result)
    } else if (frame.method === 'log') {
      (frame.params.level === 'info' ? logger.info : logger.warn)?.call(logger, 'agent-tavern: %s', frame.params.message)
    } else if (frame.error) {
      logger.warn?.('agent-tavern: %s', frame.error.message)
    }
  })
  const fail = (why) => {
    closed = true
    for (const { reject } of pending.values()) reject(new Error(`agent-tavern bridge ${why}`))
    pending.clear()
  }
  let stopping = false
  child.on('exit', (code) => { fail(`exited with code ${code}`); if (!stopping) onExit(code) })
  child.on('error', (e) => { fail(`failed: ${e.message}`); if (!stopping) onExit(null) })
  child.stdin.on('error', () => {})
  const write = (frame) => { if (!closed) child.stdin.write(JSON.stringify(frame) + '\n') }
  return {
    /** Calls the bridge; with `timeoutMs`, gives up after that long (a late answer is dropped). */
    call(method, params, timeoutMs) {
      if (closed) return Promise.reject(new Error('agent-tavern bridge is not running'))
      const id = next++
      return new Promise((resolve, reject) => {
        let timer
        const done = (f) => (v) => { clearTimeout(timer); f(v) }
        pending.set(id, { resolve: done(resolve), reject: done(reject) })
        if (timeoutMs > 0) {
          timer = setTimeout(() => {
            pending.delete(id)
            reject(new Error(`${method} timed out after ${timeoutMs} ms`))
          }, timeoutMs)
        }
        write({ id, method, params })
      })
    },
    notify(method, params) { write({ method, params }) },
    async stop() {
      stopping = true
      if (closed) return
      try { await this.call('shutdown', {}) } catch {}
      child.stdin.end()
      await new Promise((resolve) => {
        if (child.exitCode !== null) return resolve()
        const timer = setTimeout(() => { child.kill(); resolve() }, 5000)
        child.once('exit', () => { clearTimeout(timer); resolve() })
      })
    },
  }
}

/** Releases the end-to-end test runs against (docs/HOST_INTEGRATION.md). */
const TESTED_RELEASES = ['0.1.0-rc.6', '0.1.0-rc.8']

/** Releases the plugin refuses, each with the reason an operator reads. */
const REFUSED_RELEASES = {
  '0.1.5-rc.2': 'its @deepseek-ai/dsh-* packages at 0.1.5-rc.2 are not published, so it cannot be installed and this plugin has never run in it (it also moves to Cordis 4.0.2, whose plugin surface is unverified); use 0.1.0-rc.6 or 0.1.0-rc.8',
}

/**
 * The DSH release this process runs: the version of the `@deepseek-ai/dsh` package that holds
 * the launcher script, found by walking up from it; empty when it cannot be told.
 */
function runningRelease() {
  try {
    let dir = dirname(realpathSync(process.argv[1] ?? ''))
    for (let i = 0; i < 8; i++) {
      const file = join(dir, 'package.json')
      if (existsSync(file)) {
        const pkg = JSON.parse(readFileSync(file, 'utf8'))
        if (pkg.name === '@deepseek-ai/dsh') return String(pkg.version ?? '')
      }
      const up = dirname(dir)
      if (up === dir) break
      dir = up
    }
  } catch {}
  return ''
}

/** Edit distance, for "did you mean" (names are short: a plain table is fine). */
function distance(a, b) {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0]
    row[0] = i
    for (let j = 1; j <= b.length; j++) {
      const kept = row[j]
      row[j] = Math.min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1))
      prev = kept
    }
  }
  return row[b.length]
}

/** The names (file stems) of a folder's files with these extensions; [] when it is missing. */
function stems(dir, exts) {
  try {
    return readdirSync(dir)
      .filter((f) => exts.some((e) => f.toLowerCase().endsWith(e)))
      .map((f) => f.slice(0, f.lastIndexOf('.')))
      .sort()
  } catch {
    return []
  }
}

/**
 * What a user should hear at start (#29): a missing assets folder, a `character` with no card
 * (with the nearest names), and one line saying AgentTavern is on, with what.
 */
export function startupReport(config, toolCount, bridgeSource = '') {
  const warnings = []
  const assetsThere = existsSync(config.assets) && statSync(config.assets).isDirectory()
  const cards = assetsThere ? stems(join(config.assets, 'characters'), ['.png', '.json']) : []
  const worlds = assetsThere ? stems(join(config.assets, 'worlds'), ['.json']) : []
  if (!assetsThere) {
    warnings.push(`the assets folder ${config.assets} does not exist: no cards or world books (set \`assets\`, or run tavern import-st)`)
  }
  if (config.character && !cards.includes(config.character)) {
    const near = cards
      .map((name) => [distance(name.toLowerCase(), config.character.toLowerCase()), name])
      .sort((a, b) => a[0] - b[0] || a[1].localeCompare(b[1]))
      .slice(0, 3)
      .map(([, name]) => name)
    warnings.push(`no card for character ${JSON.stringify(config.character)} in the assets folder` +
      (near.length ? `; nearest: ${near.join(', ')}` : '') + (config.chat
        ? ' (its chat is continued without the card)'
        // The bridge gets `--assets` only for a folder that is there, and then refuses.
        : assetsThere
          ? " (new sessions are not bound: the bridge refuses a new chat without its card; `character` is the card's file name)"
          : ' (sessions are bound to it without a card)'))
  }
  const pg = Boolean(config.store || process.env.TAVERN_STORE)
  if (config.chat && !config.character) {
    warnings.push(`\`chat\` (${JSON.stringify(config.chat)}) needs \`character\`, the card whose chat it is; no session is bound`)
  }
  if (config.chatFolder && pg) {
    warnings.push('`chatFolder` is ignored with a PostgreSQL store: chats stay in the database')
  } else if (config.chatFolder && !(existsSync(config.chatFolder) && statSync(config.chatFolder).isDirectory())) {
    warnings.push(`the chat folder ${config.chatFolder} does not exist: the bridge will not start (set \`chatFolder\` to a SillyTavern user folder, e.g. SillyTavern/data/default-user)`)
  }
  const store = pg ? 'a PostgreSQL store' : `the store at ${config.data}` + (config.chatFolder ? ` with chats in ${config.chatFolder}` : '')
  const refused = config.character && !config.chat && assetsThere && !cards.includes(config.character)
  const binding = !config.character
    ? 'no automatic binding'
    : config.chat ? `new sessions continue ${config.character}'s chat ${JSON.stringify(config.chat)}`
      : refused ? `no session bound (no card for ${config.character})` : `new sessions bound to ${config.character}`
  const info = `agent-tavern is on: ${toolCount} tools, ${store}, ${cards.length} cards and ${worlds.length} world books in ${config.assets}, ${binding}` +
    (bridgeSource ? `, ${bridgeSource}` : '')
  return { warnings, info }
}

/** Says once, where an operator sees it (the host's log and stderr), that AgentTavern is off. */
function off(logger, format, ...args) {
  const line = format.replace(/%[sd]/g, () => String(args.shift()))
  logger.error?.(line)
  process.stderr.write(`${line}\n`)
}

export async function apply(ctx, rawConfig) {
  const logger = ctx.logger?.('agent-tavern') ?? console
  // Cordis validated the config with `Config`; apply it again for hosts that do not.
  const checked = Config['~standard'].validate(rawConfig)
  if (checked.issues) {
    off(logger, 'agent-tavern is off: %s', checked.issues.map((i) => i.message).join('; '))
    return
  }
  const config = checked.value
  // The release decides what the plugin can rely on; one it is known not to work in is refused
  // with its reason before anything starts.
  const release = config.hostVersion || runningRelease()
  if (REFUSED_RELEASES[release]) {
    off(logger, 'agent-tavern is off: DeepSeek Harness %s is not supported: %s', release, REFUSED_RELEASES[release])
    return
  }
  if (release && !TESTED_RELEASES.includes(release)) {
    logger.warn?.('agent-tavern: DeepSeek Harness %s is untested (tested: %s); continuing', release, TESTED_RELEASES.join(', '))
  }
  // A missing or failing bridge turns AgentTavern off with one clear line; the host and every
  // other plugin keep running.
  const path = findBridge(config.bridge)
  if (!path) {
    off(logger, 'agent-tavern is off: no tavern-bridge executable at %s (no prebuilt bridge for %s-%s came with the plugin package; set `bridge` to its path, or build it with cargo build --release -p tavern-dsh-adapter --bin tavern-bridge)', config.bridge, process.platform, process.arch)
    return
  }
  const handshake = {
    protocol: 1,
    host: 'dsh',
    hostVersion: release || 'unknown',
    sessionsRoot: config.sessionsRoot,
  }
  // The live bridge; restarted (a bounded number of times) if it dies mid-session.
  let restartsLeft = config.restarts
  let disposed = false
  let bridge
  const known = new Set()
  const launch = () => startBridge(path, config, logger, (code) => {
    if (disposed) return
    if (restartsLeft <= 0) {
      off(logger, 'agent-tavern is off: the bridge exited (code %s) and was restarted %d times', code, config.restarts)
      return
    }
    restartsLeft -= 1
    logger.warn?.('agent-tavern: the bridge exited (code %s); starting it again (%d restarts left)', code, restartsLeft)
    bridge = launch()
    bridge.call('handshake', handshake)
      .then(() => Promise.all([...known].map((agent) => bridge.call('agent/created', { agent }).catch(() => {}))))
      .then(() => Promise.all([...known].map((session) => bridge.call('resume', { session }).catch(() => {}))))
      .catch((e) => logger.warn?.('agent-tavern: restarted bridge failed its handshake: %s', e.message))
  })
  bridge = launch()
  ctx.effect(() => () => { disposed = true; return bridge.stop() })

  let hello
  try {
    hello = await bridge.call('handshake', handshake)
  } catch (e) {
    disposed = true
    await bridge.stop()
    off(logger, 'agent-tavern is off: the bridge did not start (%s)', e.message)
    return
  }

  const source = path === packagedBridge() ? `the prebuilt bridge for ${process.platform}-${process.arch}` : config.bridge === 'tavern-bridge' ? 'tavern-bridge from PATH' : 'the bridge at the configured path'
  const report = startupReport(config, hello.tools.length, source)
  // The host's logger, and stderr as for `off`: headless DSH prints neither info nor warnings
  // of plugins, and an operator must see what runs and what is wrong.
  for (const w of report.warnings) {
    logger.warn?.('agent-tavern: %s', w)
    process.stderr.write(`agent-tavern: ${w}\n`)
  }
  logger.info?.('%s', report.info)
  process.stderr.write(`${report.info}\n`)

  for (const tool of hello.tools) {
    ctx.effect(() => ctx.tools.register({
      name: tool.name,
      description: tool.description,
      parameters: tool.parameters,
      timeoutMs: tool.timeoutMs,
      output: {
        schema: tool.outputSchema,
        render: (_args, value) => [{ type: 'text', text: JSON.stringify(value) }],
      },
      async execute(args, exec) {
        const callId = exec.callId
        const onAbort = () => bridge.notify('tool/cancel', { callId, session: exec.agent.id })
        exec.signal?.addEventListener?.('abort', onAbort, { once: true })
        try {
          return await bridge.call('tool/call', { tool: tool.name, args, callId, session: exec.agent.id })
        } catch (e) {
          // The bridge is down or restarting: a tool error the model can read, not a crash.
          return { error: { code: 'unavailable', message: `agent-tavern is unavailable: ${e.message}` } }
        } finally {
          exec.signal?.removeEventListener?.('abort', onAbort)
        }
      },
    }))
  }

  // Prompt text per agent. The sections and variables are registered once; each assembly's
  // context names the agent (`context.scope`), and the awaited `system-prompt/assemble`
  // waterfall writes that agent's current text into the assembled variables. Agents
  // AgentTavern did not mount get empty text, and empty sections are dropped.
  const prompts = new Map()
  const bindable = new RegExp(config.bindPattern ?? '.*')
  const bind = (id) => {
    if (!config.character || !bindable.test(id)) return undefined
    // An existing chat is continued as it is (the bridge refuses one that does not exist,
    // naming the nearest); otherwise each session gets its own new chat.
    if (config.chat) return { character: config.character, chatId: config.chat, existing: true }
    return { character: config.character, chatId: `${config.chatPrefix || config.character} - ${id}`.slice(0, 80) }
  }
  const ours = new Set(hello.tools.map((t) => t.name))
  ctx.effect(() => ctx.systemPrompt.variable('tavern_persona', (c) => prompts.get(c?.scope?.id)?.persona ?? ''))
  ctx.effect(() => ctx.systemPrompt.variable('tavern_kernel', (c) => prompts.get(c?.scope?.id)?.kernel ?? ''))
  ctx.effect(() => ctx.systemPrompt.section({ name: 'deployment:persona-prefix', order: 0, text: '{{tavern_persona}}' }))
  ctx.effect(() => ctx.systemPrompt.section({ name: 'agent-tavern:kernel', order: 50, text: '{{tavern_kernel}}' }))
  ctx.on('system-prompt/assemble', async (_assembly, context, next) => {
    const assembly = await next()
    const id = context?.scope?.id
    if (!id || !prompts.has(id)) return assembly
    let result = null
    // A session the bridge refused to bind has nothing to ask for.
    if (!prompts.get(id).off) {
      try {
        result = await bridge.call('prompt', { agent: id }, config.promptTimeoutMs)
      } catch (e) {
        logger.warn?.("agent-tavern: prompt failed (%s); this request goes without AgentTavern's sections and tools", e.message)
      }
    }
    if (result?.text == null) {
      // Not an AgentTavern session (or the bridge is down or too slow): no sections from an
      // earlier request, and, since headless registers tools globally, none of our tools in
      // this agent's request; the bridge would refuse them anyway.
      assembly.variables.tavern_persona = ''
      assembly.variables.tavern_kernel = ''
      assembly.tools = assembly.tools.filter((t) => !ours.has(t.name))
      return assembly
    }
    const text = splitPrompt(result)
    prompts.set(id, text)
    assembly.variables.tavern_persona = text.persona
    assembly.variables.tavern_kernel = text.kernel
    return assembly
  })

  ctx.on('agent/created', ({ agent }) => {
    const id = agent.id
    known.add(id)
    prompts.set(id, { persona: '', kernel: '' })
    // Events logged while the session was set up or loaded (a resumed session's seed) are
    // not all re-emitted: hand the bridge the session's log so far (repeats are ignored).
    for (const event of agent.session?.events ?? []) bridge.notify('event', { session: id, event })
    // These frames are written before this listener returns, so the bridge sees the agent
    // before any event, prompt request or tool call of its first turn.
    bridge.call('agent/created', { agent: id, bind: bind(id) })
      .catch((e) => {
        // Refused (a `character` with no card) or failed: not an AgentTavern session. Said
        // where an operator sees it (headless DSH prints no plugin warnings), once, and its
        // requests no longer ask the bridge for sections it has none of.
        prompts.set(id, { off: true })
        off(logger, 'agent-tavern: session %s runs without AgentTavern: %s', id, e.message)
      })
  })
  ctx.on('agent/disposed', ({ agent }) => {
    known.delete(agent.id)
    prompts.delete(agent.id)
    bridge.notify('agent/disposed', { agent: agent.id })
  })
  ctx.on('agent/status', ({ agent, status }) => {
    bridge.notify('agent/status', { agent: agent.id, status })
  })
  ctx.on('session/event', (session, event) => {
    bridge.notify('event', { session: session.id, event })
  })

  // Tavern mode's route and the management API, where the profile has a web server (DSH rc.6:
  // `web` only). rc.6 has no admission API: a caller is admitted with
  // `Authorization: Bearer <routeToken>` when a token is configured, otherwise only from
  // loopback; both routes share that rule, the cross-site refusal and the body limits.
  const web = ctx.get('webServer')
  if (web) {
    const admit = admittedRoute(config)
    ctx.effect(() => web.register({
      kind: 'exact',
      path: '/tavern-mode/system-prompt',
      handler: admit(async (req, res, body, admitted) => {
        let reply
        try {
          reply = await bridge.call('tavern-mode/route', { method: req.method, admitted, body }, config.routeCallTimeoutMs)
        } catch (e) {
          reply = { status: 500, body: { ok: false, error: 'save-failed', message: e.message } }
        }
        res.writeHead(reply.status, { 'content-type': 'application/json' })
        res.end(JSON.stringify(reply.body))
      }),
    }))
    // The management API (`tavern-api`) and its panel: `/agent-tavern/api/v1/…` and
    // `/agent-tavern/panel/` are answered by the bridge's handlers — the same ones `tavern
    // serve` runs. The panel's forms (which work without JavaScript) are the one non-JSON body
    // accepted; each carries the panel's CSRF token, and another origin is still refused.
    ctx.effect(() => web.register({
      kind: 'prefix',
      path: API_PREFIX,
      handler: admit(async (req, res, body, admitted) => {
        const path = String(req.url ?? '/').slice(API_PREFIX.length) || '/'
        let reply
        try {
          reply = await bridge.call('api/request', {
            method: req.method, path, contentType: req.headers['content-type'], body, base: API_PREFIX,
            cookie: req.headers.cookie, acceptLanguage: req.headers['accept-language'],
            // Not admitted (a browser on the panel without the bearer header): the token it
            // must sign in with.
            ...(admitted ? {} : { signInToken: config.routeToken }),
          }, config.routeCallTimeoutMs)
        } catch (e) {
          reply = { status: 503, contentType: 'application/json', body: JSON.stringify({ error: { code: 'host_unavailable', message: `the bridge did not answer: ${e.message}` } }) }
        }
        const headers = { 'content-type': reply.contentType }
        if (reply.location) headers.location = reply.location
        if (reply.setCookie) headers['set-cookie'] = reply.setCookie
        res.writeHead(reply.status, headers)
        res.end(reply.body)
      }),
    }))
  }
}

/** Where the management API is mounted on DSH's web server. */
const API_PREFIX = '/agent-tavern'

/**
 * Wraps a route's handler in the admission every AgentTavern route shares: the token or
 * loopback rule, the cross-site refusal (before the body is read), at most `MAX_BODIES` bodies
 * read at once, each within `routeBodyTimeoutMs` and 1 MiB. The handler gets the body as text.
 */
function admittedRoute(config) {
  let reading = 0
  // Bodies of panel requests the token did not admit (a browser signing in, or signed in with
  // the panel's cookie) are read in their own few slots, with a shorter wait: anyone who can
  // reach the port can send them, so they must not take the admitted callers' slots.
  let readingUnadmitted = 0
  const refuse = (req, res, status, error, message) => {
    res.writeHead(status, { 'content-type': 'application/json', connection: 'close' })
    res.end(JSON.stringify({ ok: false, error, message }))
    req.resume()
  }
  return (handle) => async (req, res) => {
    // Admission first: an unauthenticated caller learns nothing, not even that its body was
    // too long, and its body is never read — except the panel's sign-in form and a signed-in
    // browser's forms (below), read in their own two slots within 5 s.
    const loopback = ['127.0.0.1', '::1', '::ffff:127.0.0.1'].includes(req.socket?.remoteAddress)
    const admitted = config.routeToken ? bearerMatches(req.headers.authorization, config.routeToken) : loopback
    // A browser sends no bearer header with a link or a form: with a routeToken, the panel's
    // pages go to the bridge unadmitted, where only its sign-in (checking the routeToken) and
    // the session cookie it gives open them.
    const signIn = !admitted && Boolean(config.routeToken) && isPanelPath(req.url)
    if (!admitted && !signIn) return refuse(req, res, 401, 'unauthorized', 'not admitted')
    // Unadmitted, only the sign-in form and a signed-in browser's forms carry a body; any
    // other is refused unread (the bridge checks the cookie itself).
    const writes = req.method !== 'GET' && req.method !== 'HEAD'
    if (signIn && writes) {
      const login = String(req.url ?? '').split('?')[0] === `${API_PREFIX}/panel/login`
      const cookie = /(?:^|;\s*)tavern_session=/.test(String(req.headers.cookie ?? ''))
      if (!login && !cookie) return refuse(req, res, 401, 'unauthorized', 'sign in at /agent-tavern/panel/login first')
    }
    // Without a token, the request must also name a loopback host: a page elsewhere that
    // points its own name at 127.0.0.1 (DNS rebinding) connects from loopback and is its own
    // origin, but cannot make its Host header say localhost.
    if (!config.routeToken && !isLoopbackName(req.headers.host)) {
      return refuse(req, res, 403, 'forbidden-host', 'without a routeToken only loopback names (localhost, 127.0.0.1, [::1]) are answered')
    }
    // A web page the user visits can POST to loopback: a request from another origin, or
    // with a body that is not JSON (the "simple" requests a page may send without asking),
    // is refused before its body is read.
    const refusal = crossSite(req, { forms: isPanelPath(req.url) })
    if (refusal) return refuse(req, res, refusal.status, refusal.error, refusal.message)
    // A body that stalls is given up on after routeBodyTimeoutMs, and only so many are read
    // at once, so stalled callers cannot hold the host's memory.
    if (signIn && !writes) {
      // A page view: its body (if any) means nothing and is not read.
      req.resume()
      return handle(req, res, '', admitted)
    }
    if (signIn ? readingUnadmitted >= MAX_UNADMITTED_BODIES : reading >= MAX_BODIES) {
      return refuse(req, res, 503, 'busy', `${signIn ? MAX_UNADMITTED_BODIES : MAX_BODIES} requests are already being read`)
    }
    if (signIn) readingUnadmitted += 1
    else reading += 1
    const wait = signIn ? Math.min(config.routeBodyTimeoutMs, UNADMITTED_BODY_TIMEOUT_MS) : config.routeBodyTimeoutMs
    const chunks = []
    let size = 0
    let stalled = false
    const timer = setTimeout(() => { stalled = true; req.destroy?.() }, wait)
    try {
      for await (const chunk of req) {
        size += chunk.length
        if (size > 1 << 20) break
        chunks.push(chunk)
      }
    } catch {
      stalled = true
    } finally {
      clearTimeout(timer)
      if (signIn) readingUnadmitted -= 1
      else reading -= 1
    }
    if (stalled) {
      res.writeHead(408, { 'content-type': 'application/json', connection: 'close' })
      res.end(JSON.stringify({ ok: false, error: 'timeout', message: `the body did not arrive within ${wait} ms` }))
      return
    }
    if (size > 1 << 20) {
      res.writeHead(413, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ ok: false, error: 'too-long', message: 'the body is over 1 MiB' }))
      return
    }
    await handle(req, res, Buffer.concat(chunks).toString('utf8'), admitted)
  }
}

/** Whether a request's URL is the panel's (`/agent-tavern/panel` and below). */
function isPanelPath(url) {
  const path = String(url ?? '').split('?')[0]
  return path === `${API_PREFIX}/panel` || path.startsWith(`${API_PREFIX}/panel/`)
}

/** Most route bodies read at once. */
const MAX_BODIES = 8

/** Most bodies of unadmitted panel requests (sign-in, a signed-in browser's forms) read at once. */
const MAX_UNADMITTED_BODIES = 2

/** Longest wait for an unadmitted panel request's body, in milliseconds. */
const UNADMITTED_BODY_TIMEOUT_MS = 5000

/**
 * Why a route request is refused as cross-site, or `null`: an `Origin` other than the host the
 * request was sent to, or a body that is not `application/json` (a page can send `text/plain`
 * or a form to any address without the browser asking first; JSON it cannot).
 */
function crossSite(req, { forms = false } = {}) {
  const origin = req.headers.origin
  if (origin && origin !== 'null') {
    let host = null
    try { host = new URL(origin).host } catch {}
    if (host !== req.headers.host) return { status: 403, error: 'cross-site', message: `requests from ${origin} are not accepted` }
  } else if (origin === 'null') {
    return { status: 403, error: 'cross-site', message: 'requests from an opaque origin are not accepted' }
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    const type = String(req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase()
    if (type !== 'application/json' && !(forms && type === 'application/x-www-form-urlencoded')) return { status: 415, error: 'unsupported-media-type', message: 'the body must be application/json' }
  }
  return null
}

/** `localhost`, `127.x.y.z` or `[::1]`, with or without a port. */
function isLoopbackName(host) {
  const h = String(host ?? '').toLowerCase()
  const name = h.startsWith('[') ? h.slice(1, h.indexOf(']')) : h.replace(/:\d+$/, '')
  return name === 'localhost' || name === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(name)
}

/** `Authorization: Bearer <token>` (the scheme in any case, RFC 7235), compared in constant time. */
function bearerMatches(header, token) {
  const m = /^bearer\s+(.+)$/i.exec(String(header ?? '').trim())
  if (!m) return false
  const given = Buffer.from(m[1])
  const want = Buffer.from(String(token))
  return given.length === want.length && timingSafeEqual(given, want)
}

/** The bridge's prompt sections, split into the persona and the kernel text. */
function splitPrompt(result) {
  const sections = result?.sections ?? []
  const text = (name) => sections.find((s) => s.name === name)?.text ?? ''
  return { persona: text(result?.personaSection ?? 'deployment:persona-prefix'), kernel: text('agent-tavern:kernel') }
}
