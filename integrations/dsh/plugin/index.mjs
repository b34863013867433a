// AgentTavern for DeepSeek Harness 0.1.0-rc.6.
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

export const name = 'agent-tavern'
export const inject = ['tools', 'systemPrompt']

function startBridge(config, logger) {
  const args = ['--data', config.data, '--user', config.user ?? 'User']
  if (config.assets) args.push('--assets', config.assets)
  for (const world of config.worlds ?? []) args.push('--world', world)
  const child = spawn(config.bridge, args, { stdio: ['pipe', 'pipe', 'inherit'] })
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
  child.on('exit', (code) => fail(`exited with code ${code}`))
  child.on('error', (e) => fail(`failed: ${e.message}`))
  const write = (frame) => { if (!closed) child.stdin.write(JSON.stringify(frame) + '\n') }
  return {
    call(method, params) {
      if (closed) return Promise.reject(new Error('agent-tavern bridge is not running'))
      const id = next++
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject })
        write({ id, method, params })
      })
    },
    notify(method, params) { write({ method, params }) },
    async stop() {
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

export async function apply(ctx, config) {
  const logger = ctx.logger?.('agent-tavern') ?? console
  const bridge = startBridge(config, logger)
  ctx.effect(() => () => { bridge.stop() })

  const hello = await bridge.call('handshake', {
    protocol: 1,
    host: 'dsh',
    hostVersion: config.hostVersion ?? '0.1.0-rc.6',
    sessionsRoot: config.sessionsRoot,
  })

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
        const onAbort = () => bridge.notify('tool/cancel', { callId })
        exec.signal?.addEventListener?.('abort', onAbort, { once: true })
        try {
          return await bridge.call('tool/call', { tool: tool.name, args, callId, session: exec.agent.id })
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
  const bind = (id) => config.character && bindable.test(id)
    ? { character: config.character, chatId: `${config.chatPrefix ?? config.character} - ${id}`.slice(0, 80) }
    : undefined
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
    try { result = await bridge.call('prompt', { agent: id }) } catch (e) { logger.warn?.('agent-tavern: prompt failed: %s', e.message) }
    if (result?.text == null) {
      // Not an AgentTavern session (or the bridge is down): headless registers tools globally,
      // so take ours out of this agent's request; the bridge would refuse them anyway.
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
    prompts.set(id, { persona: '', kernel: '' })
    // Events logged while the session was set up or loaded (a resumed session's seed) are
    // not all re-emitted: hand the bridge the session's log so far (repeats are ignored).
    for (const event of agent.session?.events ?? []) bridge.notify('event', { session: id, event })
    // These frames are written before this listener returns, so the bridge sees the agent
    // before any event, prompt request or tool call of its first turn.
    bridge.call('agent/created', { agent: id, bind: bind(id) })
      .catch((e) => logger.warn?.('agent-tavern: agent/created failed: %s', e.message))
  })
  ctx.on('agent/disposed', ({ agent }) => {
    prompts.delete(agent.id)
    bridge.notify('agent/disposed', { agent: agent.id })
  })
  ctx.on('agent/status', ({ agent, status }) => {
    bridge.notify('agent/status', { agent: agent.id, status })
  })
  ctx.on('session/event', (session, event) => {
    bridge.notify('event', { session: session.id, event })
  })

  // Tavern mode's route, where the profile has a web server (DSH rc.6: `web` only). rc.6 has no
  // admission API: a caller is admitted with `Authorization: Bearer <routeToken>` when a token
  // is configured, otherwise only from loopback.
  const web = ctx.get('webServer')
  if (web) {
    ctx.effect(() => web.register({
      kind: 'exact',
      path: '/tavern-mode/system-prompt',
      handler: async (req, res) => {
        // Admission first: an unauthenticated caller learns nothing, not even that its body
        // was too long, and its body is never read.
        const loopback = ['127.0.0.1', '::1', '::ffff:127.0.0.1'].includes(req.socket?.remoteAddress)
        const admitted = config.routeToken ? bearerMatches(req.headers.authorization, config.routeToken) : loopback
        if (!admitted) {
          res.writeHead(401, { 'content-type': 'application/json', connection: 'close' })
          res.end(JSON.stringify({ ok: false, error: 'unauthorized', message: 'not admitted' }))
          req.resume()
          return
        }
        const chunks = []
        let size = 0
        for await (const chunk of req) {
          size += chunk.length
          if (size > 1 << 20) break
          chunks.push(chunk)
        }
        let reply
        try {
          reply = size > 1 << 20
            ? { status: 413, body: { ok: false, error: 'too-long', message: 'the body is over 1 MiB' } }
            : await bridge.call('tavern-mode/route', { method: req.method, admitted, body: Buffer.concat(chunks).toString('utf8') })
        } catch (e) {
          reply = { status: 500, body: { ok: false, error: 'save-failed', message: e.message } }
        }
        res.writeHead(reply.status, { 'content-type': 'application/json' })
        res.end(JSON.stringify(reply.body))
      },
    }))
  }
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
