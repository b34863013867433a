// The plugin under hostile conditions (issue 30): a bridge that never answers `prompt` costs
// a model request at most `promptTimeoutMs`, and that request goes without AgentTavern's
// sections and tools, with a warning; the tavern-mode route refuses cross-site requests unread and
// gives up on stalled bodies. Runs the real plugin against a fake host context and the
// strict fake bridge next to this file. `node --test integrations/dsh/plugin/test/`
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { apply, packagedBridge, startupReport } from '../index.mjs'

/** A temporary directory that is removed when test `t` ends, whatever its outcome. */
function scratch (t, prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

function fakeHost() {
  const handlers = new Map()
  const warnings = []
  // Resolved with the next warning or error logged (for what the plugin logs after a reply).
  let logged = []
  const said = (line) => { warnings.push(line); for (const w of logged) w(line); logged = [] }
  const disposers = []
  const routes = []
  const ctx = {
    get: (name) => (name === 'webServer' ? { register: (route) => { routes.push(route); return () => {} } } : undefined),
    logger: () => ({ info() {}, warn: (...a) => said(a.join(' ')), error: (...a) => said(a.join(' ')) }),
    effect: (f) => { const d = f(); if (typeof d === 'function') disposers.push(d) },
    on: (name, handler) => { handlers.set(name, handler); return () => {} },
    systemPrompt: { variable: () => () => {}, section: () => () => {} },
    tools: { register: () => () => {} },
  }
  const nextWarning = () => new Promise((resolve) => logged.push(resolve))
  return { ctx, handlers, warnings, routes, nextWarning, dispose: () => Promise.all(disposers.map((d) => d())) }
}

/** A request the route's handler reads: headers, a loopback socket, and a body that arrives
 * whole, or never (`stall`). */
function request(method, headers, body, { stall = false, url = '/' } = {}) {
  let destroyed = false
  let wake = () => {}
  return {
    method,
    url,
    headers: { host: '127.0.0.1:8080', ...headers },
    socket: { remoteAddress: '127.0.0.1' },
    read: false,
    resume() {},
    destroy() { destroyed = true; wake() },
    async *[Symbol.asyncIterator]() {
      this.read = true
      if (stall) {
        await new Promise((resolve) => { wake = resolve; if (destroyed) resolve() })
        throw new Error('aborted')
      }
      if (body) yield Buffer.from(body)
    },
  }
}

function response() {
  let finished
  const done = new Promise((resolve) => { finished = resolve })
  return {
    done,
    writeHead(status) { this.status = status },
    end(text) { this.body = JSON.parse(text); finished() },
  }
}

test('a prompt the bridge never answers times out into a request without tavern sections', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  await apply(host.ctx, { bridge, data, assets: join(data, 'none'), character: 'Mira', hostVersion: '0.1.0-rc.8', promptTimeoutMs: 150 })
  assert.ok(host.handlers.has('system-prompt/assemble'), `the plugin did not start: ${host.warnings}`)
  await host.handlers.get('agent/created')({ agent: { id: 'a1', session: { events: [] } } })

  const stale = { tools: [{ name: 'tavern_lore_search' }, { name: 'bash' }], variables: { tavern_persona: 'old persona', tavern_kernel: 'old kernel' } }
  const assembled = await host.handlers.get('system-prompt/assemble')({}, { scope: { id: 'a1' } }, async () => stale)

  assert.equal(assembled.variables.tavern_persona, '')
  assert.equal(assembled.variables.tavern_kernel, '')
  assert.deepEqual(assembled.tools.map((t) => t.name), ['bash'])
  assert.ok(host.warnings.some((w) => w.includes('prompt timed out after 150 ms')), host.warnings.join('\n'))
  host.dispose()
})

test('the tavern-mode route refuses what a web page on another origin can send, unread', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  await apply(host.ctx, { bridge, data, assets: join(data, 'none'), hostVersion: '0.1.0-rc.8' })
  const route = host.routes.find((r) => r.path === '/tavern-mode/system-prompt')
  assert.ok(route, `no route: ${host.warnings}`)
  const save = JSON.stringify({ action: 'save', sessionId: 's1', text: 'pwned' })
  for (const [headers, status, error] of [
    [{ origin: 'http://evil.example', 'content-type': 'application/json' }, 403, 'cross-site'],
    [{ origin: 'null', 'content-type': 'application/json' }, 403, 'cross-site'],
    [{ 'content-type': 'text/plain' }, 415, 'unsupported-media-type'],
    [{ 'content-type': 'application/x-www-form-urlencoded' }, 415, 'unsupported-media-type'],
    [{}, 415, 'unsupported-media-type'],
  ]) {
    const req = request('POST', headers, save)
    const res = response()
    await route.handler(req, res)
    await res.done
    assert.equal(res.status, status, JSON.stringify(headers))
    assert.equal(res.body.error, error)
    assert.equal(req.read, false, 'the body of a refused request is never read')
  }
  host.dispose()
})

test('the management API is forwarded to the bridge under /agent-tavern, behind the same admission', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  await apply(host.ctx, { bridge, data, assets: join(data, 'none'), hostVersion: '0.1.0-rc.8' })
  const route = host.routes.find((r) => r.path === '/agent-tavern')
  assert.equal(route?.kind, 'prefix', `no api route: ${host.warnings}`)
  const res = response()
  await route.handler(request('GET', {}, null, { url: '/agent-tavern/api/v1/memories?scope=global' }), res)
  await res.done
  assert.equal(res.status, 200)
  assert.deepEqual(res.body.forwarded, { method: 'GET', path: '/api/v1/memories?scope=global', body: '', base: '/agent-tavern' })
  const put = response()
  const body = JSON.stringify({ text: '你是{{char}}' })
  await route.handler(request('PUT', { 'content-type': 'application/json' }, body, { url: '/agent-tavern/api/v1/sessions/s1/prompt' }), put)
  await put.done
  assert.deepEqual(put.body.forwarded, { method: 'PUT', path: '/api/v1/sessions/s1/prompt', contentType: 'application/json', body, base: '/agent-tavern' })
  // A page elsewhere cannot write through it, and its body is never read.
  const form = request('POST', { 'content-type': 'application/x-www-form-urlencoded' }, 'id=x', { url: '/agent-tavern/api/v1/memories' })
  const refused = response()
  await route.handler(form, refused)
  await refused.done
  assert.equal(refused.status, 415)
  assert.equal(form.read, false)
  // The panel's forms are forms: accepted there (the panel checks their CSRF token), with the
  // user's language cookie passed along; still refused from another origin, unread.
  const panelForm = response()
  await route.handler(request('POST', { 'content-type': 'application/x-www-form-urlencoded', cookie: 'tavern_lang=zh' }, 'csrf=t&revision=r',
    { url: '/agent-tavern/panel/memories/m1/forget?scope=global' }), panelForm)
  await panelForm.done
  assert.equal(panelForm.status, 200)
  assert.equal(panelForm.body.forwarded.cookie, 'tavern_lang=zh')
  assert.equal(panelForm.body.forwarded.path, '/panel/memories/m1/forget?scope=global')
  const foreign = request('POST', { 'content-type': 'application/x-www-form-urlencoded', origin: 'http://evil.example' }, 'csrf=t',
    { url: '/agent-tavern/panel/memories/m1/forget?scope=global' })
  const foreignRes = response()
  await route.handler(foreign, foreignRes)
  await foreignRes.done
  assert.equal(foreignRes.status, 403)
  assert.equal(foreign.read, false)
  // DNS rebinding: a page on evil.example resolved to 127.0.0.1 is its own origin and connects
  // from loopback, but its Host header names it.
  const rebound = request('GET', { host: 'evil.example:3080', origin: 'http://evil.example:3080' }, null, { url: '/agent-tavern/panel/memories' })
  const reboundRes = response()
  await route.handler(rebound, reboundRes)
  await reboundRes.done
  assert.equal(reboundRes.status, 403)
  assert.equal(reboundRes.body.error, 'forbidden-host')
  host.dispose()

  const guarded = fakeHost()
  await apply(guarded.ctx, { bridge, data, assets: join(data, 'none'), hostVersion: '0.1.0-rc.8', routeToken: 'k7Qm2vX9pL4sT8wZ' })
  const api = guarded.routes.find((r) => r.path === '/agent-tavern')
  for (const [auth, status] of [[undefined, 401], ['Bearer nope', 401], ['Bearer k7Qm2vX9pL4sT8wZ', 200]]) {
    const r = response()
    await api.handler(request('GET', auth ? { authorization: auth } : {}, null, { url: '/agent-tavern/api/v1/settings' }), r)
    await r.done
    assert.equal(r.status, status, String(auth))
  }
  // A browser on the panel sends no bearer header: its request goes to the bridge unadmitted,
  // naming the token the panel's sign-in checks; the JSON API stays closed without the header.
  const browser = response()
  await api.handler(request('GET', {}, null, { url: '/agent-tavern/panel/memories?lang=zh' }), browser)
  await browser.done
  assert.equal(browser.status, 200)
  assert.equal(browser.body.forwarded.signInToken, 'k7Qm2vX9pL4sT8wZ')
  const bearer = response()
  await api.handler(request('GET', { authorization: 'Bearer k7Qm2vX9pL4sT8wZ' }, null, { url: '/agent-tavern/panel' }), bearer)
  await bearer.done
  assert.equal(bearer.body.forwarded.signInToken, undefined, 'an admitted caller needs no sign-in')
  const lookalike = response()
  await api.handler(request('GET', {}, null, { url: '/agent-tavern/panelx' }), lookalike)
  await lookalike.done
  assert.equal(lookalike.status, 401)
  const foreignSignIn = request('POST', { 'content-type': 'application/x-www-form-urlencoded', origin: 'http://evil.example' }, 'token=x',
    { url: '/agent-tavern/panel/login' })
  const foreignSignInRes = response()
  await api.handler(foreignSignIn, foreignSignInRes)
  await foreignSignInRes.done
  assert.equal(foreignSignInRes.status, 403, 'another origin cannot sign in either')
  // A panel write without the sign-in cookie is refused unread.
  const anonymousWrite = request('POST', { 'content-type': 'application/x-www-form-urlencoded' }, 'csrf=t',
    { url: '/agent-tavern/panel/memories/m1/forget?scope=global' })
  const anonymousWriteRes = response()
  await api.handler(anonymousWrite, anonymousWriteRes)
  await anonymousWriteRes.done
  assert.equal(anonymousWriteRes.status, 401)
  assert.equal(anonymousWrite.read, false)
  // Stalled sign-in bodies take their own two slots only: a third is told the panel is busy,
  // and a caller with the token is still served.
  const stalled = Array.from({ length: 2 }, () => {
    const res = response()
    api.handler(request('POST', { 'content-type': 'application/x-www-form-urlencoded' }, null,
      { stall: true, url: '/agent-tavern/panel/login' }), res)
    return res
  })
  const third = response()
  await api.handler(request('POST', { 'content-type': 'application/x-www-form-urlencoded' }, 'token=x',
    { url: '/agent-tavern/panel/login' }), third)
  assert.equal(third.status, 503)
  const served = response()
  await api.handler(request('GET', { authorization: 'Bearer k7Qm2vX9pL4sT8wZ' }, null, { url: '/agent-tavern/api/v1/settings' }), served)
  await served.done
  assert.equal(served.status, 200, 'the token holder is not kept waiting')
  for (const res of stalled) {
    await res.done
    assert.equal(res.status, 408)
  }
  guarded.dispose()
})

test('a request the bridge never answers is given up on with 503 after routeCallTimeoutMs', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  await apply(host.ctx, { bridge, data, assets: join(data, 'none'), hostVersion: '0.1.0-rc.8', routeCallTimeoutMs: 200 })
  const route = host.routes.find((r) => r.path === '/agent-tavern')
  const stuck = response()
  const started = Date.now()
  await route.handler(request('GET', {}, null, { url: '/agent-tavern/api/v1/stall' }), stuck)
  await stuck.done
  assert.equal(stuck.status, 503)
  assert.equal(stuck.body.error.code, 'host_unavailable')
  assert.ok(Date.now() - started < 10000, 'answered at the timeout, not held')
  // The bridge still answers what it can.
  const fine = response()
  await route.handler(request('GET', {}, null, { url: '/agent-tavern/api/v1/settings' }), fine)
  await fine.done
  assert.equal(fine.status, 200)
  host.dispose()
})

test('a route body that stalls is given up on, and frees its slot', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  await apply(host.ctx, { bridge, data, assets: join(data, 'none'), hostVersion: '0.1.0-rc.8', routeBodyTimeoutMs: 100 })
  const route = host.routes.find((r) => r.path === '/tavern-mode/system-prompt')
  // Eight stalled bodies at once fill the slots: a ninth caller is told the route is busy.
  const stalled = Array.from({ length: 8 }, () => {
    const res = response()
    route.handler(request('POST', { 'content-type': 'application/json' }, null, { stall: true }), res)
    return res
  })
  const busy = response()
  await route.handler(request('POST', { 'content-type': 'application/json' }, '{}'), busy)
  assert.equal(busy.status, 503)
  for (const res of stalled) {
    await res.done
    assert.equal(res.status, 408)
    assert.equal(res.body.error, 'timeout')
  }
  host.dispose()
})

test('a missing assets folder or a mistyped character is a warning at start, with the nearest names', (t) => {
  const dir = scratch(t, 'tavern-plugin-')
  const missing = startupReport({ assets: join(dir, 'none'), data: dir, character: '' }, 14)
  assert.equal(missing.warnings.length, 1)
  assert.match(missing.warnings[0], /assets folder .* does not exist/)
  assert.match(missing.info, /^agent-tavern is on: 14 tools, the store at .*, 0 cards and 0 world books in .*, no automatic binding$/)

  mkdirSync(join(dir, 'characters'))
  mkdirSync(join(dir, 'worlds'))
  for (const f of ['Mira.json', 'Seraphina.png', 'Megumin.png']) writeFileSync(join(dir, 'characters', f), '{}')
  writeFileSync(join(dir, 'worlds', 'Eldoria.json'), '{}')
  const typo = startupReport({ assets: dir, data: dir, character: 'Mirra' }, 14)
  assert.equal(typo.warnings.length, 1, typo.warnings.join('\n'))
  assert.match(typo.warnings[0], /no card for character "Mirra".*nearest: Mira, .*new sessions are not bound/)
  assert.match(typo.info, /3 cards and 1 world books in .*, no session bound \(no card for Mirra\)$/)

  const fine = startupReport({ assets: dir, data: dir, character: 'Mira' }, 14)
  assert.deepEqual(fine.warnings, [])
})

test('a session the bridge refuses to bind is said so once and runs without AgentTavern', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  await apply(host.ctx, { bridge, data, assets: join(data, 'none'), character: 'Mirra', hostVersion: '0.1.0-rc.8', promptTimeoutMs: 60000 })
  t.after(() => host.dispose())
  assert.ok(host.handlers.has('system-prompt/assemble'), `the plugin did not start: ${host.warnings}`)
  const refused = host.nextWarning()
  await host.handlers.get('agent/created')({ agent: { id: 's1', session: { events: [] } } })
  assert.match(await refused, /session s1 runs without AgentTavern: no new chat of "Mirra": no card of that name/)
  // Its requests do not ask the bridge for sections (this bridge never answers `prompt`: a
  // request that asked would wait the whole minute), and carry none of its tools (headless
  // registers them for every agent), request after request.
  for (let i = 0; i < 2; i++) {
    const assembly = { tools: [{ name: 'tavern_lore_search' }, { name: 'bash' }], variables: { tavern_persona: 'old', tavern_kernel: 'old' } }
    const out = await host.handlers.get('system-prompt/assemble')(assembly, { scope: { id: 's1' } }, async () => assembly)
    assert.deepEqual(out.tools.map((t) => t.name), ['bash'])
    assert.equal(out.variables.tavern_persona, '')
    assert.equal(out.variables.tavern_kernel, '')
  }
  assert.equal(host.warnings.filter((w) => w.includes('prompt failed')).length, 0, host.warnings.join('\n'))
})

test('`chat` continues an existing chat in every new session; `chatFolder` goes to the bridge', async (t) => {
  const host = fakeHost()
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const data = scratch(t, 'tavern-plugin-')
  const log = join(data, 'bridge.log')
  process.env.FAKE_BRIDGE_LOG = log
  try {
    await apply(host.ctx, {
      bridge, data, assets: data, chatFolder: data, hostVersion: '0.1.0-rc.8',
      character: 'default_Seraphina', chat: 'Seraphina - 2024-09-19@20h03m29s', bindPattern: '^e2e-',
    })
    await host.handlers.get('agent/created')({ agent: { id: 'e2e-1', session: { events: [] } } })
    await host.handlers.get('agent/created')({ agent: { id: 'other', session: { events: [] } } })
    // Stopping waits for the bridge to answer `shutdown`, after every frame before it.
    await host.dispose()
  } finally {
    delete process.env.FAKE_BRIDGE_LOG
  }
  const frames = readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l))
  const argv = frames.find((f) => f.argv).argv
  assert.equal(after(argv, '--chat-folder'), data)
  const created = frames.filter((f) => f.agent)
  assert.deepEqual(created.find((f) => f.agent === 'e2e-1').bind,
    { character: 'default_Seraphina', chatId: 'Seraphina - 2024-09-19@20h03m29s', existing: true })
  assert.equal(created.find((f) => f.agent === 'other').bind, undefined, 'bindPattern still decides')

  const noCharacter = startupReport({ assets: data, data, character: '', chat: 'x' }, 14)
  assert.match(noCharacter.warnings.join('\n'), /`chat` \("x"\) needs `character`/)
  const missingFolder = startupReport({ assets: data, data, character: '', chatFolder: join(data, 'nope') }, 14)
  assert.match(missingFolder.warnings.join('\n'), /chat folder .* does not exist/)
})

/** The command line the plugin starts the (fake) bridge with under `config`, logged to `name`. */
async function bridgeArgv(data, config, name) {
  const bridge = fileURLToPath(new URL('./fake-bridge.mjs', import.meta.url))
  const host = fakeHost()
  const log = join(data, name)
  process.env.FAKE_BRIDGE_LOG = log
  try {
    await apply(host.ctx, { bridge, data, assets: data, hostVersion: '0.1.0-rc.8', ...config })
    await host.dispose()
  } finally {
    delete process.env.FAKE_BRIDGE_LOG
  }
  const frames = readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l))
  return frames.find((f) => f.argv).argv
}

/** The value the plugin gives `flag` in `argv` (always as `--flag=value`), if any. */
const after = (argv, flag) => {
  const given = argv.filter((a) => a === flag || a.startsWith(`${flag}=`))
  if (given.length > 1) throw new Error(`${flag} given ${given.length} times: ${argv.join(' ')}`)
  if (given.length === 0) return undefined
  if (given[0] === flag) throw new Error(`${flag} given apart from its value: ${argv.join(' ')}`)
  return given[0].slice(flag.length + 1)
}

test('word vectors and their weight go to the bridge, and only when set', async (t) => {
  const data = scratch(t, 'tavern-plugin-')
  const argvOf = (config, name) => bridgeArgv(data, config, name)
  const vectors = join(data, 'glove.txt')
  const set = await argvOf({ wordVectors: vectors }, 'a.log')
  assert.equal(after(set, '--word-vectors'), vectors)
  assert.equal(after(set, '--vector-weight'), '0.5', 'the default weight')
  const weighted = await argvOf({ wordVectors: vectors, vectorWeight: 0.3 }, 'b.log')
  assert.equal(after(weighted, '--vector-weight'), '0.3')
  // A value that starts with a hyphen stays the flag's value, never a flag of its own.
  const negative = await argvOf({ wordVectors: '-vectors.txt', vectorWeight: -0.2, personaDescription: '- likes tea' }, 'n.log')
  assert.equal(after(negative, '--vector-weight'), '-0.2')
  assert.equal(after(negative, '--word-vectors'), '-vectors.txt')
  assert.equal(after(negative, '--persona-description'), '- likes tea')
  const unset = await argvOf({ vectorWeight: 0.3 }, 'c.log')
  assert.equal(after(unset, '--word-vectors'), undefined)
  assert.equal(after(unset, '--vector-weight'), undefined, 'no vectors: no weight')
  // A sentence encoder, with its own weight.
  const model = join(data, 'all-MiniLM-L6-v2')
  const encoder = await argvOf({ sentenceEncoder: model }, 'd.log')
  assert.equal(after(encoder, '--sentence-encoder'), model)
  assert.equal(after(encoder, '--word-vectors'), undefined)
  assert.equal(after(encoder, '--vector-weight'), '0.6', 'the encoder\'s default weight')
  const encoderWeighted = await argvOf({ sentenceEncoder: model, sentenceWeight: 0.4, vectorWeight: 0.3 }, 'e.log')
  assert.equal(after(encoderWeighted, '--vector-weight'), '0.4')
  // Both: both go (the bridge refuses the pair by name), with one weight.
  const both = await argvOf({ sentenceEncoder: model, wordVectors: vectors }, 'f.log')
  assert.equal(after(both, '--sentence-encoder'), model)
  assert.equal(after(both, '--word-vectors'), vectors)
  assert.equal(after(both, '--vector-weight'), '0.5')
})

test('a PostgreSQL store\'s image folder and scope bound go to the bridge, and only with a store', async (t) => {
  const data = scratch(t, 'tavern-plugin-')
  const argvOf = (config, name) => bridgeArgv(data, config, name)
  const images = join(data, 'images')
  const shared = await argvOf({ store: 'host=/nowhere dbname=t', storeImageDir: images }, 'a.log')
  assert.equal(after(shared, '--store-image-dir'), images)
  assert.equal(after(shared, '--store-max-loaded-memories'), undefined, 'unset: every memory is held')
  const scoped = await argvOf({ store: 'host=/nowhere dbname=t', storeMaxLoadedMemories: 5000 }, 'b.log')
  assert.equal(after(scoped, '--store-max-loaded-memories'), '5000')
  assert.equal(after(scoped, '--store-image-dir'), undefined)
  // The settings travel in the environment, never on the command line.
  assert.ok(!scoped.join(' ').includes('nowhere'), scoped.join(' '))
  const files = await argvOf({ storeImageDir: images, storeMaxLoadedMemories: 5000 }, 'c.log')
  assert.equal(after(files, '--store-image-dir'), undefined, 'no store: the files under data')
  assert.equal(after(files, '--store-max-loaded-memories'), undefined)
})

test('the default bridge is the prebuilt one of the platform package installed beside the plugin', (t) => {
  // A hoisted install as pnpm makes it in a DSH profile: the plugin and its platform package.
  const root = scratch(t, 'at-pkg-')
  const plugin = join(root, 'node_modules', '@agent-tavern', 'dsh-plugin')
  const platform = join(root, 'node_modules', '@agent-tavern', 'bridge-linux-x64')
  mkdirSync(plugin, { recursive: true })
  mkdirSync(join(platform, 'bin'), { recursive: true })
  writeFileSync(join(plugin, 'index.mjs'), '')
  const from = pathToFileURL(join(plugin, 'index.mjs')).href
  writeFileSync(join(platform, 'package.json'), JSON.stringify({ name: '@agent-tavern/bridge-linux-x64', version: '0.1.0' }))
  // The package without its binary is no bridge.
  assert.equal(packagedBridge('linux', 'x64', from), null)
  writeFileSync(join(platform, 'bin', 'tavern-bridge'), '#!/bin/sh\n')
  chmodSync(join(platform, 'bin', 'tavern-bridge'), 0o755)
  assert.equal(packagedBridge('linux', 'x64', from), join(platform, 'bin', 'tavern-bridge'))
  // Another platform's package is not installed: no bridge, and the plugin falls back to PATH.
  assert.equal(packagedBridge('linux', 'arm64', from), null)
})

test('the startup line says which bridge runs', (t) => {
  const dir = scratch(t, 'at-src-')
  const report = startupReport({ assets: dir, data: dir, character: '' }, 14, 'the prebuilt bridge for linux-x64')
  assert.match(report.info, /^agent-tavern is on: 14 tools, .*, the prebuilt bridge for linux-x64$/)
})

