// E2E runner: a Cordis plugin replacing the headless one-shot driver. For each configured
// session it creates (or resumes) an agent with that session id, sends the messages one by
// one, waits for idle after each, flushes the session log, then requests process exit.
// Imports nothing from DSH (plain module identity).

import { randomUUID } from 'node:crypto'
import { writeFileSync } from 'node:fs'

export const name = 'agent-tavern-e2e-runner'
export const inject = ['agents', 'sessions', 'agentDefaultModel']

export function apply(ctx, config) {
  const exit = ctx.get('appExit')
  run(ctx, config).then(
    () => exit(0),
    (error) => { process.stderr.write(`e2e runner: ${error?.stack ?? error}\n`); exit(1) },
  )
}

async function run(ctx, config) {
  await ctx.get('loader')?.await()
  const selection = ctx.agentDefaultModel.currentSelection()
  const agentOptions = { provider: selection.provider, model: selection.model }
  const report = []
  for (const s of config.sessions) {
    const { agent } = s.resume
      ? await ctx.agents.resume({ resumeSessionId: s.sessionId, agentOptions })
      : await ctx.agents.create({ sessionId: s.sessionId, meta: { cwd: config.cwd }, agentOptions })
    await agent.whenIdle()
    for (const text of s.messages) {
      agent.followup({ id: randomUUID(), role: 'user', content: [{ type: 'text', text }], source: { kind: 'user' } })
      await agent.whenIdle()
    }
    await ctx.sessions.flush(agent.session)
    report.push({ sessionId: s.sessionId, seq: agent.session.seq })
  }
  writeFileSync(config.out, JSON.stringify(report))
}
